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


def _swap_for_link_at_fsync(monkeypatch, tmp_path, victim):
    """Play a writer of the directory: once the temporary is written (its fsync), put a link to ``victim``
    under the temporary's name, as an attacker racing the chmod would."""
    real_fsync = os.fsync

    def fsync(fd):
        real_fsync(fd)
        for tmp in tmp_path.glob(".target.*"):
            if not tmp.is_symlink():
                tmp.unlink()
                tmp.symlink_to(victim)

    monkeypatch.setattr(atomic.os, "fsync", fsync)


def test_the_mode_goes_to_the_file_written_never_through_a_name_swapped_for_a_link(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    os.chmod(victim, 0o600)
    _swap_for_link_at_fsync(monkeypatch, tmp_path, victim)
    with pytest.raises(OSError, match="replaced while it was written .*a symbolic link"):
        atomic_write(tmp_path / "target", "data", mode=0o644)
    assert oct(os.stat(victim).st_mode & 0o777) == "0o600"  # a chmod by name would have made it 0644
    assert victim.read_text() == "secret"
    assert not (tmp_path / "target").exists() and not (tmp_path / "target").is_symlink()  # the link not renamed in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # and the link removed


def test_the_mode_is_set_on_the_descriptor(tmp_path, monkeypatch):
    def no_chmod_by_name(*args, **kwargs):
        raise AssertionError(f"chmod by name: {args}")

    monkeypatch.setattr(atomic.os, "chmod", no_chmod_by_name)
    atomic_write(tmp_path / "f", "x", mode=0o600)
    assert oct(os.stat(tmp_path / "f").st_mode & 0o777) == "0o600"
