"""The subprocess seam: no shell, timeouts kill the group, errors say what happened."""

from __future__ import annotations

import sys
import time

import pytest

from slurm_gpushare.proc import CommandError, run


def test_run_ok_with_input():
    res = run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], input="hi")
    assert res.stdout.strip() == "HI" and res.returncode == 0


def test_failure_carries_command_code_and_stderr():
    with pytest.raises(CommandError) as info:
        run([sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"])
    assert info.value.result.returncode == 3
    assert "exited 3: boom" in str(info.value)


def test_no_check_returns_result():
    assert run([sys.executable, "-c", "raise SystemExit(4)"], check=False).returncode == 4


def test_shell_string_refused():
    with pytest.raises(TypeError):
        run("echo hi")


def test_missing_binary():
    with pytest.raises(CommandError, match="could not start"):
        run(["/nonexistent/binary"])


def test_timeout_kills_process_group():
    t0 = time.monotonic()
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    )
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run([sys.executable, "-c", code], timeout=0.5)
    assert time.monotonic() - t0 < 10


# ---- the posix_spawn path keeps subprocess.run's semantics (proc.py's docstring) ----


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_same_result_as_subprocess_run():
    import subprocess

    cases = [
        (_py("import sys; sys.stdout.write('a\\r\\nb\\rc\\n'); sys.stderr.write('e\\n'); sys.exit(2)"), None),
        (_py("import sys; print(sys.stdin.read()[::-1])"), "hello\nworld"),
        (_py("import sys; print(repr(sys.stdin.read()))"), None),  # no input: stdin is /dev/null
        (_py("import sys; print(repr(sys.stdin.read()))"), ""),
        (_py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), None),
        (_py("print('\\u00e9t\\u00e9')"), None),
    ]
    for argv, data in cases:
        ours = run(argv, input=data, check=False)
        theirs = subprocess.run(argv, input=data, capture_output=True, text=True, start_new_session=True)
        assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr), argv


def test_large_input_and_output_at_once_do_not_deadlock():
    code = "import sys; d = sys.stdin.read(); sys.stdout.write(d * 2); sys.stderr.write('e' * 300000)"
    res = run(_py(code), input="x" * 1_000_000, timeout=30)
    assert len(res.stdout) == 2_000_000 and len(res.stderr) == 300_000


def test_command_found_on_the_path_of_env_not_ours(tmp_path):
    tool = tmp_path / "only-here"
    tool.write_text(f"#!{sys.executable}\nprint('found')\n")
    tool.chmod(0o755)
    assert run(["only-here"], env={"PATH": f"/nonexistent:{tmp_path}"}).stdout == "found\n"
    with pytest.raises(CommandError, match="could not start .No such file or directory.*only-here"):
        run(["only-here"], env={"PATH": "/nonexistent"})


def test_not_executable_reported_as_such(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o644)
    with pytest.raises(CommandError, match="could not start .Permission denied"):
        run([str(tool)])


def test_env_is_exactly_what_was_given():
    res = run(_py("import os; print(sorted(k for k in os.environ if k != 'LC_CTYPE'))"), env={"ONLY": "1"})
    assert res.stdout.strip() == "['ONLY']"


def test_child_in_new_session_with_default_sigpipe_and_no_inherited_fds():
    import os

    # read by programs that leave signals and descriptors as exec gave them (a Python child would ignore SIGPIPE)
    status = dict(line.split(":\t", 1) for line in run(["cat", "/proc/self/status"]).stdout.splitlines())
    ignored = int(status["SigIgn"], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1))  # SIGPIPE, SIGXFSZ back to SIG_DFL
    pid, _, rest = run(["cat", "/proc/self/stat"]).stdout.partition(" (")
    pgrp, session = rest.rsplit(")", 1)[1].split()[2:4]
    assert pid == pgrp == session  # its own session and group (the group kill_group kills)
    r, w = os.pipe()
    os.set_inheritable(w, True)  # as a descriptor slurmd left open would be: close_fds keeps it from the child
    try:
        fds = run(["ls", "/proc/self/fd"]).stdout.split()
    finally:
        os.close(r)
        os.close(w)
    assert sorted(fds) == ["0", "1", "2", "3"]  # 3: ls's own listing of the directory


def test_timeout_while_a_child_of_the_command_holds_its_output():
    # the command exits at once; what it started keeps stdout open: still the timeout, and the group is killed
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])"
    t0 = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run(_py(code), timeout=0.5)
    assert time.monotonic() - t0 < 10


def test_without_pidfd_waits_by_polling(monkeypatch):
    import os

    def no_pidfd(pid):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    assert (
        run(_py("import sys; sys.stdout.close(); import time; time.sleep(0.2); sys.exit(5)"), check=False).returncode
        == 5
    )
    t0 = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.3 s"):
        run(_py("import sys, time; sys.stdout.close(); sys.stderr.close(); time.sleep(30)"), timeout=0.3)
    assert time.monotonic() - t0 < 10


def test_timeout_keeps_the_output_so_far():
    with pytest.raises(CommandError) as info:
        run(_py("import sys, time; print('started', flush=True); time.sleep(30)"), timeout=0.5)
    assert info.value.result.returncode == -9 and info.value.result.stdout == "started\n"


def test_no_subprocess_import_and_no_descriptor_left_open():
    import subprocess

    code = (
        "import os, sys; from slurm_gpushare.proc import run; before = len(os.listdir('/proc/self/fd')); "
        "[run(['true'], input='x') for _ in range(20)]; "
        "print('subprocess' in sys.modules, len(os.listdir('/proc/self/fd')) - before)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "0"]
