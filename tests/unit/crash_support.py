"""A process that stops after a chosen side effect, for the crash-recovery tests (live apply, node relayout).

``Crash`` is a BaseException, so no ``except Exception`` of the code under test takes it: the run stops there as a
killed process would, and the test then starts the next run on what is left.
"""

from __future__ import annotations


class Crash(BaseException):
    """The process stopped here."""


class Crasher:
    """Called after each side effect (``after(step)``): raises ``Crash`` once, after the step ``at``; records the
    steps it saw."""

    def __init__(self, at: str | None = None):
        self.at, self.fired, self.seen = at, False, []

    def after(self, step: str) -> None:
        self.seen.append(step)
        if step == self.at and not self.fired:
            self.fired = True
            raise Crash(step)
