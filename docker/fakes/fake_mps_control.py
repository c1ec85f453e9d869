"""Test-only stand-in for NVIDIA's nvidia-cuda-mps-control (legacy v2 interface).

The command is the stub ``nvidia-cuda-mps-control`` beside this module, which
imports it so that its bytecode is cached (a script that is run is compiled on
every start: ~26 M instructions for this one, three times per MPS job in the
node hooks, bench/node_hooks.py). Both are installed only in the test image
(docker/Dockerfile), in one directory. It speaks the real
syntax for what slurm-gpushare uses, keeps state, and refuses everything
else loudly (exit 1, naming what it does support):

  nvidia-cuda-mps-control -d        start a control daemon in the background
  nvidia-cuda-mps-control -f        ... in the foreground
  nvidia-cuda-mps-control           client: commands on stdin, one per line
      get_server_list                          PIDs of its servers, one per line
      start_server -uid UID                    start a server for UID
      set_default_active_thread_percentage P   reply "P.0"; next server only
      get_default_active_thread_percentage     reply e.g. "25.0"
      set_default_device_pinned_mem_limit DEV VALUE   VALUE: integer + M or G; no reply
      get_default_device_pinned_mem_limit DEV
      quit                                     stop the servers and the daemon

The daemon listens on the unix socket $CUDA_MPS_PIPE_DIRECTORY/control
(default /tmp/nvidia-mps) and logs to $CUDA_MPS_LOG_DIRECTORY/control.log
(default /var/log/nvidia-mps) in the real line format
``[YYYY-MM-DD HH:MM:SS.mmm Control PID] message``. Servers are real child
processes running as the user (``nvidia-cuda-mps-control --server UID``, an
internal form; comm "nvidia-cuda-mps", as the real server's is truncated
to), so a leftover is visible with pgrep. The client/daemon
wire protocol is this fake's own (a line per command: exit status, reply
unicode_escape'd).

The daemon also records its state (pid, servers, defaults) in
``<pipe>/.fake-state.json`` for tests to read.

Files, as NVIDIA documents them (docs/admins/mps-security.md): the daemon
creates the ``control`` socket in the pipe dir (mode 0777 from bind under a
zero umask: no chmod by name) and writes ``control.log`` in the log dir;
a server that fails to start writes ``server.log`` there. The daemon runs as
root and keeps writing into a pipe dir that becomes the job user's, so its
state file is created afresh with O_EXCL | O_NOFOLLOW and renamed into place:
nothing is written through a link the user planted.

Compute mode (NVIDIA MPS docs, "Provisioning": one server per GPU in
EXCLUSIVE_PROCESS mode; nvidia-smi -c): a server holds a CUDA context on each
GPU its daemon's CUDA_VISIBLE_DEVICES names (all GPUs when unset), so it can
start only where the GPU's compute mode lets it: DEFAULT any number of
servers, EXCLUSIVE_PROCESS only when no other process (no server of any
control daemon on the node) holds the GPU, PROHIBITED none. The mode is read
from the node's fake NVML state ($GPUSHARE_FAKE_NVML, else ``fake_nvml:`` in
$GPUSHARE_NODE_CONFIG or /etc/gpushare/node.yaml); servers that hold GPUs are
registered in ``<state>.mps-contexts/<pid>.json``, which is how daemons see
each other's servers. Without a fake NVML state no rule applies (unit tests
of the daemon alone). A refused server fails as a real one does (assumed from
NVIDIA's logs, not confirmed for this cause): ``start_server`` is acknowledged,
the server logs ``Failed to start : all CUDA-capable devices are busy or
unavailable`` in server.log and exits with status 1, and the daemon logs
``Server encountered a fatal exception. Shutting down`` and ``Server PID
exited with status 1`` in control.log; the server is then not in
``get_server_list``.
"""

from __future__ import annotations

import _socket  # the client's only module beyond os and sys (see _daemon_modules)
import os
import sys

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
CONTROL = os.path.join(PIPE, "control")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")
COMMANDS = (
    "get_server_list",
    "start_server",
    "set_default_active_thread_percentage",
    "get_default_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "get_default_device_pinned_mem_limit",
    "quit",
)


def _daemon_modules() -> None:
    """What the daemon and server paths use beyond the client's modules, imported only there: ``signal`` is the
    C module ``_signal``, whose signal(), pause() and SIGTERM are the ones these paths call (the Python layer
    adds enums: 19 M instructions in a ``-I -S`` interpreter). The daemon also does without ``json`` (28 M, ``re``
    with it: the state file is written by ``_json``), ``re`` and ``socket`` (``_socket``), so that a daemon or
    server start costs about a bare interpreter start, as a client's does; the real tools are C binaries that
    start in ~1 ms (bench/node_hooks.py). ``-d`` imports them once its daemon listens (``time`` is built in)."""
    global signal, time
    import _signal as signal
    import time


def _name(comm: bytes) -> None:
    try:
        with open("/proc/self/comm", "wb") as fh:  # as prctl(PR_SET_NAME): the kernel keeps 15 bytes
            fh.write(comm)
    except OSError:
        pass


def log(kind: str, message: str, name: str = "control.log") -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    try:
        with open(os.path.join(LOG, name), "a", encoding="utf-8") as fh:
            fh.write(f"[{stamp} {kind:<10} {os.getpid()}] {message}\n")
    except OSError:
        pass


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json(value) -> str:
    """``json.dumps(value)`` for the state file's values (dicts with string keys, strings, ints, finite floats),
    written here so that the daemon does without ``json`` (see ``_daemon_modules``); anything else is refused.
    Strings as json escapes them by default (ensure_ascii): outside space..~ as \\uXXXX, surrogate pairs above
    U+FFFF. tests/unit/hooks/test_fakes.py holds it to json.dumps."""
    if isinstance(value, dict) and all(type(k) is str for k in value):
        return "{" + ", ".join(f"{_json(k)}: {_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return '"' + "".join(_ESCAPES.get(c) or (c if " " <= c <= "~" else _json_u(ord(c))) for c in value) + '"'
    if type(value) is int or (type(value) is float and value - value == 0):
        return repr(value)
    raise TypeError(f"fake nvidia-cuda-mps-control: no JSON form for {value!r} in the state file")


def _json_u(code: int) -> str:
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"
    return f"\\u{code:04x}"


def _mem_limit(value: str) -> bool:
    """``re.fullmatch(r"[0-9]+[MG]", value)``: an integer followed by M or G (ASCII digits only)."""
    digits = value[:-1]
    return value[-1:] in ("M", "G") and digits.isascii() and digits.isdigit()


# ---- daemon -------------------------------------------------------------------------


class Daemon:
    def __init__(self):
        self.servers: dict[int, int] = {}  # pid -> uid
        self.percentage = 100.0
        self.mem_limits: dict[str, str] = {}
        self.running = True

    def save(self) -> None:
        state = {
            "pid": os.getpid(),
            "servers": {str(p): u for p, u in self.servers.items()},
            "default_active_thread_percentage": self.percentage,
            "default_device_pinned_mem_limit": self.mem_limits,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }
        # the pipe dir is the job user's once the daemon is up: the temporary is created afresh (O_EXCL, no link
        # followed), its mode set on the descriptor, and renamed over whatever the name is (rename never follows)
        tmp = os.path.join(PIPE, ".fake-state.json.tmp")
        try:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "w", encoding="utf-8") as fh:
                fh.write(_json(state))
                os.fchmod(fh.fileno(), 0o644)
            os.replace(tmp, os.path.join(PIPE, ".fake-state.json"))
        except OSError:
            pass

    def reap(self) -> None:
        while self.servers:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status = os.waitstatus_to_exitcode(_)
            if self.servers.pop(pid, None) is not None:
                if status:
                    log("Control", "Server encountered a fatal exception. Shutting down")
                    log("Control", f"Server {pid} exited with status {status}")
                else:
                    log("Control", f"Server {pid} exited")
                _release(pid)
                self.save()

    def handle(self, line: str) -> tuple[int, str]:
        words = line.split()
        if not words:
            return 0, ""
        cmd, args = words[0], words[1:]
        if cmd == "get_server_list" and not args:
            self.reap()  # a server that failed to start is not listed
            return 0, "\n".join(str(p) for p in sorted(self.servers))
        if cmd == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            return self.start_server(int(args[1]))
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return 1, f"Invalid active thread percentage {args[0]!r}"
            self.percentage = value
            return 0, f"{value:.1f}"
        if cmd == "get_default_active_thread_percentage" and not args:
            return 0, f"{self.percentage:.1f}"
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not _mem_limit(args[1]):
                return 1, f"Invalid memory limit {args[1]!r}: an integer followed by M or G"
            self.mem_limits[args[0]] = args[1]
            return 0, ""
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return 0, self.mem_limits.get(args[0], "")
        if cmd == "quit" and not args:
            self.running = False
            return 0, ""
        return 1, (
            f"fake nvidia-cuda-mps-control: unknown or malformed command {line.strip()!r}; "
            f"this fake supports: {', '.join(COMMANDS)}"
        )

    def start_server(self, uid: int) -> tuple[int, str]:
        if uid in self.servers.values():
            return 1, f"A server for user {uid} is already running"
        if self.servers:
            return 1, (
                f"fake nvidia-cuda-mps-control: a server for user {next(iter(self.servers.values()))} is "
                "running; switching users is not modelled"
            )
        # SIGTERM blocked across the fork: a quit's SIGTERM that reached the child before exec would run this
        # daemon's inherited Python handler there (setting a flag, closing whatever fd now has the listener's
        # number) and the server would exec and run on, never reaped; the child restores the default action
        # before it unblocks, so a SIGTERM sent meanwhile ends it as it ends an exec'd server
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                _exec_server(uid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        self.servers[pid] = uid
        log("Control", f"Starting new server {pid} for user {uid}")
        log("Control", f"NEW SERVER {pid}: Ready")
        self.save()
        return 0, ""

    def stop_servers(self, grace: float = 5.0) -> None:
        """SIGTERM each server and reap it; one still there after ``grace`` seconds is SIGKILLed (and logged:
        a fake server that outlives SIGTERM is a fault of this fake), so quit never hangs on a server."""
        for pid in list(self.servers):
            try:
                os.kill(pid, signal.SIGTERM)
                deadline, pause = time.monotonic() + grace, 0.0005
                while os.waitpid(pid, os.WNOHANG) == (0, 0):
                    if time.monotonic() > deadline:
                        log("Control", f"Server {pid} did not exit on SIGTERM within {grace:g} s: killed")
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        break
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)  # a server ends within a ms of SIGTERM: no 5 ms on every quit
            except (ProcessLookupError, ChildProcessError):
                pass
            log("Control", f"Server {pid} exited")
            _release(pid)
        self.servers.clear()


def _exec_server(uid: int) -> None:
    """In the forked child: become the user, then exec the stand-in for nvidia-cuda-mps-server
    (its own command line, so pgrep tells servers from daemons)."""
    try:
        os.closerange(3, 65536)  # not the client's connection nor the listener: EOF must reach the client
        refused = _claim_gpus(os.getpid())  # as root still: the registry is the node's, not the user's
        if refused:
            log("Other", "Startup", "server.log")
            log("Other", "Initializing server process", "server.log")
            log("Server", f"Failed to start : {refused}", "server.log")
            os._exit(1)
        if os.geteuid() == 0 and uid != 0:
            import pwd

            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        # exec a link named nvidia-cuda-mps-server (the test image's link to the interpreter, next to this file):
        # the kernel names the process after the file it execs, so from exec on its comm is "nvidia-cuda-mps",
        # as the real C server's is; through python3 it would be "python3" for the interpreter's start-up
        # (tens of ms), in which a scan by name (node/mps.py leftover_processes) misses it
        exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvidia-cuda-mps-server")
        if not os.path.exists(exe):  # outside the image (unit tests): named only once server_main runs
            exe = sys.executable
        # through the stub beside this module, whose import of it reads the cached bytecode (this file run as a
        # script would be compiled again for every server)
        stub = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvidia-cuda-mps-control")
        os.execv(exe, [exe, "-I", "-S", stub, "--server", str(uid)])
    except BaseException as exc:  # a fake's own failure: said where a real server's would be
        log("Server", f"Failed to start : fake server could not start: {exc!r}", "server.log")
    finally:
        os._exit(127)


# ---- compute mode: which servers hold which GPUs (see the module docstring) -----------------

_SHOWN = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


def _nvml_state() -> str | None:
    value = os.environ.get("GPUSHARE_FAKE_NVML")
    if value:
        return value
    config = os.environ.get("GPUSHARE_NODE_CONFIG") or "/etc/gpushare/node.yaml"
    try:
        with open(config, encoding="utf-8") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key.strip() == "fake_nvml" and rest.strip():
                    return rest.strip().strip("'\"")
    except OSError:
        pass
    return None


def _registry(state: str) -> str:
    return state + ".mps-contexts"


def _holders(registry: str) -> dict[int, list[str]]:
    """pid -> GPU UUIDs of the servers that hold GPUs now (entries of exited servers are dropped)."""
    import json

    found = {}
    for name in os.listdir(registry):
        if not name.endswith(".json"):
            continue
        pid = int(name[:-5])
        path = os.path.join(registry, name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                alive = fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except (OSError, IndexError):
            alive = False
        if not alive:
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        with open(path, encoding="utf-8") as fh:
            found[pid] = json.load(fh)["gpus"]
    return found


def _claim_gpus(pid: int) -> str | None:
    """Register server ``pid`` on its GPUs if their compute modes allow it; else why not (CUDA's words)."""
    state = _nvml_state()
    if state is None:
        return None
    import fcntl
    import json

    with open(state, encoding="utf-8") as fh:
        gpus = {g["uuid"]: g for g in json.load(fh)["gpus"]}
    visible = [u.strip() for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u.strip()] or list(gpus)
    unknown = [u for u in visible if u not in gpus]
    if unknown:
        return f"no CUDA-capable device is detected ({', '.join(unknown)} not on this node)"
    registry = _registry(state)
    os.makedirs(registry, 0o755, exist_ok=True)
    with open(os.path.join(registry, ".lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        holders = _holders(registry)
        for uuid in visible:
            mode = _SHOWN.get(gpus[uuid].get("compute_mode", 0), "?")
            others = sorted(p for p, held in holders.items() if uuid in held and p != pid)
            if mode == "PROHIBITED" or mode == "EXCLUSIVE_THREAD" or (mode == "EXCLUSIVE_PROCESS" and others):
                why = (
                    f" (held by server {', '.join(map(str, others))})" if others and mode == "EXCLUSIVE_PROCESS" else ""
                )
                log("Server", f"{uuid}: compute mode {mode}{why}", "server.log")
                return "all CUDA-capable devices are busy or unavailable"
        tmp = os.path.join(registry, f".{pid}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"gpus": visible, "pipe": PIPE}, fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(registry, f"{pid}.json"))
    return None


def _release(pid: int) -> None:
    state = _nvml_state()
    if state is not None:
        try:
            os.unlink(os.path.join(_registry(state), f"{pid}.json"))
        except OSError:
            pass


def server_main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _name(b"nvidia-cuda-mps-server")
    while True:
        signal.pause()


def serve(listener: _socket.socket) -> None:
    daemon = Daemon()
    signal.signal(signal.SIGTERM, lambda *_: setattr(daemon, "running", False) or listener.close())
    log("Control", f"Starting control daemon using socket {CONTROL}")
    log("Control", f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={PIPE}")
    daemon.save()
    _write_pid_file()  # last of what the daemon makes at start: the hooks hand the pipe dir over once it is there
    listener.settimeout(0.5)
    while daemon.running:
        daemon.reap()
        try:
            fd, _ = listener._accept()  # what socket.socket.accept does, on the C type (see _daemon_modules)
        except TimeoutError:
            continue
        except OSError:
            break
        conn = _socket.socket(fileno=fd)
        try:
            _session(daemon, conn)
        finally:
            conn.close()
    daemon.stop_servers()
    log("Control", "Exit")
    for path in (CONTROL, os.path.join(PIPE, ".fake-state.json"), PID_FILE):
        try:
            os.unlink(path)
        except OSError:
            pass


def _write_pid_file() -> None:
    """``nvidia-cuda-mps-control.pid`` in the pipe dir, as NVIDIA's daemon writes it (root's, its pid; gone when it
    stops), created afresh with O_EXCL | O_NOFOLLOW."""
    try:
        os.unlink(PID_FILE)
    except FileNotFoundError:
        pass
    fd = os.open(PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _session(daemon: Daemon, conn: _socket.socket) -> None:
    """One client connection: its command lines, a reply line each (exit status, reply unicode_escape'd)."""
    conn.settimeout(5)
    data = b""
    try:
        while chunk := conn.recv(4096):
            data += chunk
    except OSError:
        pass
    lines = data.decode("utf-8", "replace").splitlines()
    if not lines:
        return
    log("Control", "Accepting connection...")
    log("Control", "NEW UI")
    for line in lines:
        log("Control", f"Cmd:{line.strip()}")
        rc, out = daemon.handle(line)
        if out:
            log("Control", out)
        try:
            conn.sendall(f"{rc} ".encode() + out.encode("unicode_escape") + b"\n")
        except OSError:
            break
        if rc or not daemon.running:
            break
    log("Control", "UI closed")


def start_daemon(foreground: bool) -> int:
    if _connect() is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if not os.path.isdir(PIPE):
        os.makedirs(PIPE, 0o755, exist_ok=True)
    os.makedirs(LOG, 0o755, exist_ok=True)
    if os.path.exists(CONTROL):
        os.unlink(CONTROL)  # a stale socket from a daemon that died
    if foreground:
        _daemon_modules()
        _name(b"nvidia-cuda-mps-control")
        serve(_listen())
        return 0
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:  # the client: wait until the daemon listens
        os.close(ready_w)
        ok = os.read(ready_r, 1) == b"1"
        if not ok:
            print("fake nvidia-cuda-mps-control: daemon failed to start", file=sys.stderr)
        return 0 if ok else 1
    os.close(ready_r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.chdir("/")
    _name(b"nvidia-cuda-mps-control")
    try:
        listener = _listen()
    except OSError:
        os.write(ready_w, b"0")
        os._exit(1)
    os.write(ready_w, b"1")
    os.close(ready_w)
    _daemon_modules()  # the client that started it is on its way meanwhile; the next one waits in the backlog
    serve(listener)
    os._exit(0)


def _listen() -> _socket.socket:
    """Clients of any user connect (connecting needs write access to the socket);
    who may reach it at all is decided by the pipe directory's owner and mode."""
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    mask = os.umask(0)  # the socket file is made 0777 by bind itself: no chmod by name (a name can be a link)
    try:
        listener.bind(CONTROL)
    finally:
        os.umask(mask)
    listener.listen(8)
    return listener


def _connect() -> _socket.socket | None:
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(CONTROL)
    except OSError:
        conn.close()
        return None
    return conn


def client() -> int:
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    conn = _connect()
    if conn is None:
        print(f"Cannot find MPS control daemon process (no socket at {CONTROL})", file=sys.stderr)
        return 1
    try:
        conn.sendall("".join(f"{line}\n" for line in lines).encode())
        conn.shutdown(_socket.SHUT_WR)
        conn.settimeout(30)
        buf = b""
        while chunk := conn.recv(4096):
            buf += chunk
    finally:
        conn.close()
    rc = 0
    for raw in buf.splitlines():
        status, _, text = raw.partition(b" ")
        out = text.decode("unicode_escape")
        if out:
            print(out, file=sys.stderr if int(status) else sys.stdout)
        rc = rc or int(status)
    if len(buf.splitlines()) < len(lines) and not rc:
        rc = 1
    return rc


def main(argv: list[str]) -> int:
    if argv in ([], ["--"]):
        return client()
    if argv == ["-d"]:
        return start_daemon(foreground=False)
    _daemon_modules()
    if argv == ["-f"]:
        return start_daemon(foreground=True)
    if len(argv) == 2 and argv[0] == "--server" and argv[1].isdigit():  # internal: a server the daemon started
        return server_main()
    print(
        f"fake nvidia-cuda-mps-control: unsupported arguments {' '.join(argv)!r}; this fake supports -d, -f, "
        "or commands on stdin",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
