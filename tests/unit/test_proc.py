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
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run([sys.executable, "-c", code], timeout=0.5)
    assert time.monotonic() - t0 < 10
