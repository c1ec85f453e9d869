"""The one place that runs subprocesses.

Never through a shell; always with a timeout that kills the whole process
group; failures carry the command, exit code, stdout and stderr. Callers get
a ``Runner`` passed in (created at the entry point), so tests substitute a
faithful fake at this one seam.
"""

from __future__ import annotations

import os
import signal
import subprocess

from .errors import GpushareError
from .records import dataclass

TYPE_CHECKING = False  # typing costs the node hooks a few ms at start-up: for type checkers only (Runner is a
#                        Protocol to them, a plain class at run time)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Protocol
else:
    Protocol = object


@dataclass(frozen=True)
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
    def __call__(self, argv: Sequence[str], *, input: str | None = None, timeout: float = 60.0,
                 check: bool = True, env: Mapping[str, str] | None = None) -> Result: ...


def run(argv: Sequence[str], *, input: str | None = None, timeout: float = 60.0, check: bool = True,
        env: Mapping[str, str] | None = None) -> Result:
    """Run ``argv`` (a list, never a shell string); raise CommandError on failure when ``check``."""
    if isinstance(argv, str):
        raise TypeError("run() takes an argument list, not a shell string")
    argv = tuple(str(a) for a in argv)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise CommandError(Result(argv, 127, "", str(exc)), f"could not start ({exc.strerror})") from None
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise CommandError(Result(argv, -9, out, err), f"timed out after {timeout:g} s") from None
    result = Result(argv, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandError(result)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
