"""Regenerate the golden rendered files: python tests/regen_golden.py

Run it after an intended change to the templates or an example policy, then
review `git diff tests/golden` before committing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render import render_all  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
VERSIONS = ("24.11", "26.05")
COMMAND = "python tests/regen_golden.py"


def examples() -> list[Path]:
    return sorted((ROOT / "etc").glob("*.yaml"))


def expected(example: Path, version: str) -> dict[str, str]:
    return render_all(load_file(example, version))


def main() -> None:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for example in examples():
        for version in VERSIONS:
            out = GOLDEN / example.stem / version
            out.mkdir(parents=True)
            for name, text in expected(example, version).items():
                (out / name).write_text(text, encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
