"""The one place that runs subprocesses.

Never through a shell; always with a timeout that kills the whole process
group; failures carry the command, exit code, stdout and stderr. Callers get
a ``Runner`` passed in (created at the entry point), so tests substitute a
faithful fake at this one seam.

The child is started with ``os.posix_spawn``, not the ``subprocess`` module:
importing subprocess (with signal, threading, selectors, locale) costs each
MPS node hook about as much as the work it does (bench/node_hooks.py). The
semantics are ``subprocess.run(argv, input=..., capture_output=True,
text=True, start_new_session=True, env=..., timeout=...)``'s: ``argv[0]``
looked up on the PATH of ``env`` when it has no slash, descriptors other
than 0-2 not inherited (``close_fds``), SIGPIPE and SIGXFSZ back to their
defaults (``restore_signals``), a new session, stdin from /dev/null without
``input``, output decoded as subprocess decodes it (UTF-8 mode, else the
locale's encoding; universal newlines), but an undecodable byte read as U+FFFD.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module (signal's Python layer imports enum): no stub
import os
import select
import sys
import time

from .errors import GpushareError
from .records import record

TYPE_CHECKING = False  # typing costs the node hooks a few ms at start-up: for type checkers only (Runner is a
#                        Protocol to them, a plain class at run time)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Protocol
else:
    Protocol = object

_CHUNK = 65536


@record
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(GpushareError):
    """A command failed or timed out; the message has what a person needs to see why."""

    exit_code = 1

    def __init__(self, result: Result, reason: str = ""):
        self.result = result
        why = reason or f"exited {result.returncode}"
        detail = (result.stderr or result.stdout).strip().splitlines()
        tail = f": {detail[-1]}" if detail else ""
        super().__init__(f"`{' '.join(result.argv)}` {why}{tail}")


class Runner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> Result: ...


def run(
    argv: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = 60.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> Result:
    """Run ``argv`` (a list, never a shell string); raise CommandError on failure when ``check``."""
    if isinstance(argv, str):
        raise TypeError("run() takes an argument list, not a shell string")
    argv = tuple(str(a) for a in argv)
    encoding = _text_encoding()
    data = None if input is None else input.encode(encoding)
    deadline = time.monotonic() + timeout
    try:
        child = _Child(argv, dict(os.environ) if env is None else dict(env), data is not None)
    except OSError as exc:
        raise CommandError(Result(argv, 127, "", str(exc)), f"could not start ({exc.strerror})") from None
    try:
        done = child.communicate(data, deadline)
        if not done:
            child.kill_group()
            child.communicate(None, None)
    except BaseException:
        child.kill_group()  # an interrupted hook must not leave the command running
        child.close()
        child.reap(block=True)
        raise
    out, err = _text(child.output[0], encoding), _text(child.output[1], encoding)
    if not done:
        raise CommandError(Result(argv, -9, out, err), f"timed out after {timeout:g} s")
    assert child.returncode is not None  # done: the child was reaped
    result = Result(argv, child.returncode, out, err)
    if check and child.returncode != 0:
        raise CommandError(result)
    return result


def _text_encoding() -> str:
    """subprocess's text encoding (``subprocess._text_encoding``): UTF-8 in UTF-8 mode, else the locale's."""
    if sys.flags.utf8_mode:
        return "utf-8"
    import _locale  # locale.getencoding itself, without the locale module's Python layer

    return _locale.getencoding()


def _text(data: bytes | bytearray, encoding: str) -> str:
    """As subprocess decodes text output (universal newlines), but a byte that does not decode reads as U+FFFD:
    commands print text that users chose (a job's name may be any bytes), and one such byte must not make the
    whole output unreadable."""
    return data.decode(encoding, errors="replace").replace("\r\n", "\n").replace("\r", "\n")


class _Child:
    """One started command: its pid, our ends of its pipes, what it wrote, its exit status."""

    def __init__(self, argv: tuple[str, ...], env: dict[str, str], stdin_pipe: bool):
        self.argv, self.pid = argv, 0
        self.returncode: int | None = None
        self.output = (bytearray(), bytearray())
        self.fds: dict[int, int] = {}  # our end -> 0 (child's stdin), 1 (stdout), 2 (stderr)
        self.pidfd = -1
        theirs: list[int] = []
        try:
            if stdin_pipe:
                r, w = _pipe()
                theirs.append(r)
                self.fds[w] = 0
            else:
                theirs.append(_high(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)))
            for stream in (1, 2):
                r, w = _pipe()
                theirs.append(w)
                self.fds[r] = stream
            actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(theirs)]
            actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds()]
            self.pid = _spawn(argv, env, actions)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            self.pidfd = os.pidfd_open(self.pid)  # readable once it exits: poll for output and exit at once
        except (AttributeError, OSError):  # no pidfd here: wait by polling waitpid (``reap``)
            self.pidfd = -1

    def communicate(self, data: bytes | None, deadline: float | None) -> bool:
        """Feed ``data`` to stdin, read stdout and stderr until both end, then collect the exit status;
        False if ``deadline`` (monotonic) passed first. As subprocess, the child is reaped only after its
        output ended, so until then its pid (the group that ``kill_group`` kills) cannot be reused."""
        data = data or b""  # none: stdin is closed below, never written
        poller = select.poll()
        offset, exited = 0, False
        for fd, stream in list(self.fds.items()):
            if stream == 0:
                if data:
                    os.set_blocking(fd, False)
                    poller.register(fd, select.POLLOUT)
                else:
                    self._close(fd)
            else:
                poller.register(fd, select.POLLIN)
        if self.pidfd >= 0:
            poller.register(self.pidfd, select.POLLIN)
        while self.fds:
            ready = poller.poll(_poll_ms(deadline))
            if not ready and _passed(deadline):
                return False
            for fd, _events in ready:
                if fd == self.pidfd:  # it exited; a child of its may still hold the pipes
                    poller.unregister(fd)
                    exited = True
                elif self.fds.get(fd) == 0:
                    try:
                        offset += os.write(fd, data[offset : offset + _CHUNK])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: as subprocess, not an error
                        offset = len(data)
                    if offset >= len(data):
                        poller.unregister(fd)
                        self._close(fd)
                else:
                    chunk = os.read(fd, _CHUNK)
                    if chunk:
                        self.output[self.fds[fd] - 1].extend(chunk)
                    else:
                        poller.unregister(fd)
                        self._close(fd)
        if exited:
            return self.reap(block=True)
        if self.pidfd < 0:
            return self._wait_polling(deadline)
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        while not poller.poll(_poll_ms(deadline)):
            if _passed(deadline):
                return False
        return self.reap(block=True)

    def _wait_polling(self, deadline: float | None) -> bool:
        """No pidfd (an old kernel, or a seccomp filter refused it): waitpid, pausing 0.5 ms doubling to 50 ms."""
        pause = 0.0005
        while not self.reap(block=deadline is None):
            if _passed(deadline):
                return False
            assert deadline is not None  # without one, reap blocks until it has the status
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)
        return True

    def reap(self, block: bool) -> bool:
        """Collect the exit status; True once it has one."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): as subprocess, status 0
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self.pidfd >= 0:
                    os.close(self.pidfd)
                    self.pidfd = -1
        return self.returncode is not None

    def kill_group(self) -> None:
        """SIGKILL its process group (its session: it was started with setsid). Only while it is not reaped."""
        if self.returncode is None:
            try:
                os.killpg(self.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self, fd: int) -> None:
        del self.fds[fd]
        os.close(fd)

    def close(self) -> None:
        for fd in list(self.fds):
            self._close(fd)


def _poll_ms(deadline: float | None) -> int | None:
    return None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)


def _passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _pipe() -> tuple[int, int]:
    """A pipe whose ends are not 0-2 (dup2 onto the child's 0-2 must not find one there) and close on exec."""
    r, w = os.pipe()
    return _high(r), _high(w)


def _high(fd: int) -> int:
    if fd > 2:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _inherited_fds() -> list[int]:
    """Our descriptors above 2 that an exec would pass on (ours are close-on-exec; one inherited from
    slurmd may not be): subprocess's ``close_fds`` closes them in the child."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in range(3, 1024)]
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:  # not open (listdir's own descriptor, closed by now)
                pass
    return found


def _spawn(argv: tuple[str, ...], env: dict[str, str], actions: list) -> int:
    """posix_spawn ``argv`` in a new session, trying each PATH entry of ``env`` as execvpe (and subprocess) do;
    an error names ``argv[0]`` as subprocess's does."""
    exe = argv[0]
    candidates = [exe] if os.path.dirname(exe) else [os.path.join(d, exe) for d in os.get_exec_path(env)]
    first_error: OSError | None = None
    last: OSError | None = None
    for path in candidates:
        try:
            return os.posix_spawn(
                path, argv, env, file_actions=actions, setsid=True, setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ)
            )
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:  # e.g. not executable: reported unless a later entry runs
            first_error = first_error or exc
    error = first_error or last or FileNotFoundError(2, os.strerror(2))
    raise type(error)(error.errno, error.strerror, exe)
