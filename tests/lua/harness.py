"""Run a generated job_submit.lua under lupa with a small fake ``slurm`` table.

The fake is what slurmctld's job_submit/lua gives a script, reduced to what
gpushare uses: SUCCESS, ERROR, ESLURM_INVALID_GRES (2072 in slurm_errno.h),
and log_user/log_info/log_error, which, like Slurm's, take a format string
(string.format(fmt, ...)), so a message passed as the format would break on
'%'. Every message is recorded for the test to read.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pytest

lupa = pytest.importorskip("lupa", reason="lupa is not installed (pip install -e '.[test]'): the lua tier needs it")

VERSIONS = ("lua51", "lua54")  # Debian's slurmctld links Lua 5.1; current Lua is 5.4
ESLURM_INVALID_GRES = 2072

FAKE_SLURM = (
    """
gpushare_test = { user = {}, info = {}, error = {} }
slurm = {
  SUCCESS = 0,
  ERROR = -1,
  ESLURM_INVALID_GRES = """
    + str(ESLURM_INVALID_GRES)
    + """,
  log_user = function(fmt, ...) table.insert(gpushare_test.user, string.format(fmt, ...)) end,
  log_info = function(fmt, ...) table.insert(gpushare_test.info, string.format(fmt, ...)) end,
  log_error = function(fmt, ...) table.insert(gpushare_test.error, string.format(fmt, ...)) end,
}
"""
)


def runtime(version: str):
    """A fresh Lua state of that version; a missing runtime fails (lupa >= 2.0 ships both)."""
    module = importlib.import_module(f"lupa.{version}")
    return module.LuaRuntime(unpack_returned_tuples=True)


@dataclass
class Result:
    rc: object
    job: dict
    user: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    error: list[str] = field(default_factory=list)


class Script:
    """One loaded job_submit.lua; calls reuse the state, as slurmctld's single lua_State does."""

    def __init__(self, version: str, source: str, fake: str = FAKE_SLURM):
        self.lua = runtime(version)
        self.lua.execute(fake)
        self.lua.execute(source)
        self.g = self.lua.globals()

    def _call(self, fn, job: dict, *rest) -> Result:
        self.lua.execute("gpushare_test.user, gpushare_test.info, gpushare_test.error = {}, {}, {}")
        desc = self.lua.table_from(job)
        rc = fn(desc, *rest)
        t = self.g.gpushare_test
        return Result(rc, dict(desc.items()), list(t.user.values()), list(t.info.values()), list(t.error.values()))

    def submit(self, job: dict, uid: int = 1000) -> Result:
        return self._call(self.g.slurm_job_submit, job, self.lua.table(), uid)

    def modify(self, job: dict, job_rec: dict, uid: int = 1000) -> Result:
        return self._call(self.g.slurm_job_modify, job, self.lua.table_from(job_rec), self.lua.table(), uid)


def codes_of(user_message: str | None) -> list[str]:
    """The violation codes in a rejection message: 'CODE: explanation' lines after the first."""
    if not user_message or not user_message.startswith("gpushare rejected"):
        return []
    return [line.split(": ", 1)[0] for line in user_message.split("\n")[1:]]
