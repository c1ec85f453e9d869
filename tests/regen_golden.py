"""Regenerate the golden rendered files: python tests/regen_golden.py

Run it after an intended change to the templates or an example policy, then
review `git diff tests/golden` before committing. A golden job_submit.lua holds
what is generated (the header and the prelude): the rendered file is that
followed by the static program, slurm_gpushare/submit/job_submit.lua, byte for
byte (tests/unit/render/test_golden.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render import render_all  # noqa: E402
from slurm_gpushare.render.jobsubmit import NAME as JOB_SUBMIT  # noqa: E402
from slurm_gpushare.render.jobsubmit import program  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
VERSIONS = ("24.11", "26.05")
COMMAND = "python tests/regen_golden.py"


def examples() -> list[Path]:
    return sorted((ROOT / "etc").glob("*.yaml"))


def expected(example: Path, version: str) -> dict[str, str]:
    return render_all(load_file(example, version))


def stored(name: str, text: str) -> str:
    """What the golden file of a rendered file holds: job_submit.lua without its static program."""
    if name != JOB_SUBMIT:
        return text
    if not text.endswith(program()):
        raise AssertionError(f"{JOB_SUBMIT} does not end with the static program")
    return text[: len(text) - len(program())]


def main() -> None:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for example in examples():
        for version in VERSIONS:
            out = GOLDEN / example.stem / version
            out.mkdir(parents=True)
            for name, text in expected(example, version).items():
                (out / name).write_text(stored(name, text), encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
