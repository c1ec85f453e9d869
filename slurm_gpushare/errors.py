"""One error hierarchy; the CLI translates it to exit codes in one place (cli/errors.py, which lists the codes)."""

from __future__ import annotations

from .records import record


class GpushareError(Exception):
    """Base of every error a person is meant to read. ``exit_code`` is what the CLI returns."""

    exit_code = 2

    def __str__(self) -> str:
        msg = super().__str__()
        cause = self.__cause__
        while cause is not None:
            msg += f": {cause}"
            cause = cause.__cause__
        return msg


@record(order=True)
class Problem:
    """One validation finding: where in the policy, and what is wrong / what is allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(GpushareError):
    """A policy file that cannot be used; carries every problem found, not just the first."""

    exit_code = 1

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = sorted(set(problems), key=lambda p: (_path_key(p.path), p.message))
        super().__init__(f"{source}: {len(self.problems)} problem(s)")

    def report(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


class RenderError(GpushareError):
    """Writing rendered files failed or would overwrite something we do not own."""

    exit_code = 1


def _path_key(path: str) -> tuple:
    """Sort 'node_groups[10].x' after 'node_groups[9].x'."""
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"[\[\].]+", path) if t)
