"""The node's metrics directories (the textfile collector's, dcgm-exporter's job mapping): root writes in them
only through a descriptor reached without following a link or blocking on a FIFO, and only when the directory
is root's (the writer's) and nobody else may write in it. ``textfile.OWNER`` stands in for root where a test
shows the owner refusal (the tests run as root, and the directories they make are the writer's)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from slurm_gpushare.metrics import dcgmjobs, textfile


def record(state: Path, where: Path):
    return textfile.record(state, where, "prolog", "ok", None, 0.1, now=1.0)


def test_the_file_is_written_with_its_mode_and_no_temporary_left(tmp_path):
    where = tmp_path / "textfile"
    assert record(tmp_path / "state", where) == where / textfile.FILE_NAME
    assert sorted(os.listdir(where)) == [textfile.FILE_NAME]
    assert stat.S_IMODE((where / textfile.FILE_NAME).stat().st_mode) == 0o644
    assert "gpushare_node_hook_runs_total" in (where / textfile.FILE_NAME).read_text()


def test_a_directory_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "textfile").symlink_to(elsewhere)
    with pytest.raises(OSError, match=r"textfile: its component 'textfile' is a symbolic link or not a directory"):
        record(tmp_path / "state", tmp_path / "textfile")
    assert os.listdir(elsewhere) == []


def test_a_link_anywhere_on_the_path_is_not_followed(tmp_path):
    real = tmp_path / "real"
    (real / "textfile").mkdir(parents=True, mode=0o755)
    (tmp_path / "via").symlink_to(real)
    with pytest.raises(OSError, match=r"its component 'via' is a symbolic link"):
        record(tmp_path / "state", tmp_path / "via" / "textfile")
    assert os.listdir(real / "textfile") == []


def test_a_fifo_where_the_directory_belongs_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "textfile")
    with pytest.raises(OSError, match="is a symbolic link or not a directory"):
        record(tmp_path / "state", tmp_path / "textfile")


def test_a_directory_others_may_write_in_is_refused(tmp_path):
    where = tmp_path / "textfile"
    where.mkdir()
    where.chmod(0o775)
    with pytest.raises(OSError, match=r"textfile is writable by its group or others \(mode 0775\)"):
        record(tmp_path / "state", where)
    assert os.listdir(where) == []


def test_a_directory_not_roots_is_refused(tmp_path, monkeypatch):
    where = tmp_path / "textfile"
    where.mkdir(mode=0o755)
    monkeypatch.setattr(textfile, "OWNER", os.geteuid() + 1)  # as if root were someone else: the dir is not its
    with pytest.raises(OSError, match=rf"textfile is owned by uid {os.geteuid()}, not uid {os.geteuid() + 1}"):
        record(tmp_path / "state", where)
    assert os.listdir(where) == []


def test_the_refusal_is_an_oserror_the_health_check_notes():
    assert issubclass(textfile.UnsafeDir, OSError)


class _Journal:
    def __init__(self, job_id, gpu):
        self.job_id = job_id
        self.devices = [type("D", (), {"gpu_index": gpu, "mig_uuid": None, "gi": None})()]


def test_dcgm_mapping_dir_that_is_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "mapping").symlink_to(elsewhere)
    with pytest.raises(OSError, match="is a symbolic link"):
        dcgmjobs.add_job(tmp_path / "mapping", _Journal(7, 0))
    assert os.listdir(elsewhere) == []


def test_a_fifo_in_the_dcgm_mapping_dir_is_skipped_not_read(tmp_path):
    """A FIFO named as a GPU file: opening it to read would block until a writer came."""
    mapping = tmp_path / "mapping"
    mapping.mkdir(mode=0o755)
    os.mkfifo(mapping / "1")
    (mapping / "2").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("99\n")
    out: list = []
    reader = threading.Thread(target=lambda: out.append(dcgmjobs.read_dir(mapping)), daemon=True)
    reader.start()
    reader.join(30)  # a guard against a hang, not a timing
    assert out == [{}]
