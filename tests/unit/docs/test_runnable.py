"""Every command block the documentation marks runnable (`<!-- runnable -->` or `<!-- runnable exit=N -->` on
the line before a ```sh block) runs, as written, and exits as marked.

Each block runs with bash -euo pipefail in a scratch directory that holds the checkout's etc/ and tests/
(the example policies and recorded Slurm outputs the examples read), with this environment's `gpushare`
first on PATH. Blocks that need a Slurm cluster are not marked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.docs_support import Block, pages, runnable_blocks

BLOCKS = [b for page in pages() for b in runnable_blocks(page)]
BIN = Path(sys.executable).parent


def run(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "TZ": "UTC"}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def scratch(tmp_path):
    for name in ("etc", "tests"):
        os.symlink(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_runnable_block(block, scratch):
    done = run(block, scratch)
    assert done.returncode == block.exit, (
        f"{block.id}: exited {done.returncode}, marked {block.exit}\n$ {block.script}\n{done.stdout}\n{done.stderr}"
    )


def test_the_docs_have_runnable_examples_for_every_reader():
    where = {b.page.split("/")[1] if b.page.startswith("docs/") else b.page for b in BLOCKS}
    assert {"users", "accounting", "reference"} <= where, where
    assert len(BLOCKS) >= 10, [b.id for b in BLOCKS]


def test_a_marker_must_be_followed_by_a_sh_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- runnable -->\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="followed at once by a ```sh block"):
        runnable_blocks(page)


def test_a_block_that_fails_is_reported(scratch):
    done = run(Block("x.md", 1, 0, "gpushare check --policy etc/small-lab.yaml -- --gres=shard:2"), scratch)
    assert done.returncode == 1 and "OVER shard=2" in done.stdout
