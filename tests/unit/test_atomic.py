"""atomic_write makes its temporary file itself (no tempfile import in the node hooks): check what mkstemp gave."""

from __future__ import annotations

import os

import pytest

from slurm_gpushare import atomic
from slurm_gpushare.atomic import atomic_write


def test_atomic_write_mode_content_and_no_temporary_left(tmp_path):
    target = tmp_path / "sub" / "file.json"
    atomic_write(target, "one", mode=0o640)
    atomic_write(target, "two", mode=0o640)
    assert target.read_text() == "two"
    assert oct(os.stat(target).st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.json"]


def test_temporary_is_new_private_and_hidden(tmp_path):
    fd, tmp = atomic._create_temp(tmp_path / "x.json")
    os.close(fd)
    name = os.path.basename(tmp)
    assert name.startswith(".x.json.") and len(name) > len(".x.json.")
    assert oct(os.stat(tmp).st_mode & 0o777) == "0o600"
    fd2, tmp2 = atomic._create_temp(tmp_path / "x.json")
    os.close(fd2)
    assert tmp2 != tmp


def test_a_failed_write_removes_its_temporary(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        atomic_write(tmp_path / "y.json", "data")
    assert list(tmp_path.iterdir()) == []
