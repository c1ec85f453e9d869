"""Node metrics: the textfile collector file and dcgm-exporter's job mapping directory, written by the
prolog and epilog (real hook runs on the fake NVML) and repaired by `gpushare node reconcile`."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.node import node as node_cli
from slurm_gpushare.errors import PolicyError
from slurm_gpushare.gpu.backend import MigDevice
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hooks import Seen
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.hooks._common import load
from slurm_gpushare.hooks._metrics import after_run
from slurm_gpushare.metrics import dcgmjobs, textfile
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.nodeconfig import GpuSpec
from slurm_gpushare.node.observed import ObservedGpu
from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.share import Mode, Share
from tests.unit.hooks_support import ROOT, HookNode, no_scontrol, stop_daemons

prometheus_parser = pytest.importorskip("prometheus_client.parser")


def metered(
    tmp: Path,
    name: str,
    textfile_dir: str | None = "prom",
    mapping_dir: str | None = "dcgm",
    policy: Path = ROOT / "etc" / "small-lab.yaml",
) -> HookNode:
    """A test node whose policy turns the node metrics on (directories under tmp)."""
    node = HookNode(tmp, name, policy)
    raw = yaml.safe_load(node.policy.read_text())
    raw["cluster"]["metrics"] = {
        "textfile_dir": textfile_dir and str(tmp / textfile_dir),
        "dcgm_job_mapping_dir": mapping_dir and str(tmp / mapping_dir),
    }
    node.policy.write_text(yaml.safe_dump(raw))
    node.prom, node.dcgm = tmp / (textfile_dir or "-") / "gpushare.prom", tmp / (mapping_dir or "-")
    return node


def samples(path: Path) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, through prometheus_client's own parser."""
    found = {}
    for family in prometheus_parser.text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(path: Path, name: str, **labels) -> float | None:
    return samples(path).get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def mapping(node: HookNode) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(node.dcgm.iterdir()) if not p.name.startswith(".")}


def run_prolog(node, job, gpus):
    return prolog_hook.main(node.env(job, gpus), runner=no_scontrol, mps=node.mps)


def run_epilog(node, job, gpus):
    return epilog_hook.main(node.env(job, gpus), runner=no_scontrol, mps=node.mps)


# ---- hooks on a test node ------------------------------------------------------------------------


def test_whole_gpu_prolog_writes_its_mapping_file_and_metrics(tmp_path):
    node = metered(tmp_path, "lab-excl01")
    assert run_prolog(node, 7, "1") == 0
    assert mapping(node) == {"1": "7\n"}
    uuid = JournalStore(node.state_dir).read(7).devices[0].gpu_uuid
    assert (
        value(
            node.prom,
            "gpushare_node_job_gpu_info",
            job_id=7,
            gpu=1,
            uuid=uuid,
            mig_uuid="",
            gpu_instance_id="",
            compute_instance_id="",
        )
        == 1
    )
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 1
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="epilog", result="ok") == 0
    assert value(node.prom, "gpushare_node_journals_present") == 1
    assert value(node.prom, "gpushare_node_mps_daemons_running") == 0
    assert value(node.prom, "gpushare_node_hook_last_duration_seconds", hook="prolog") > 0
    assert os.stat(node.prom).st_mode & 0o777 == 0o644
    assert [p.name for p in node.prom.parent.iterdir()] == ["gpushare.prom"]  # no temporary left
    assert not any(k[0] == "gpushare_node_mig_layout_matches_policy" for k in samples(node.prom))  # no MIG GPU here


def test_mig_slice_maps_to_gpu_dot_gpu_instance_and_the_info_metric_names_it(tmp_path):
    node = metered(tmp_path, "lab-mig01")
    assert run_prolog(node, 8, "2") == 0
    (dev,) = JournalStore(node.state_dir).read(8).devices
    assert dev.mig_uuid and isinstance(dev.gi, int)
    assert mapping(node) == {f"0.{dev.gi}": "8\n"}  # never the parent GPU's file
    assert (
        value(
            node.prom,
            "gpushare_node_job_gpu_info",
            job_id=8,
            gpu=0,
            uuid=dev.gpu_uuid,
            mig_uuid=dev.mig_uuid,
            gpu_instance_id=dev.gi,
            compute_instance_id=dev.ci,
        )
        == 1
    )
    assert value(node.prom, "gpushare_node_mig_layout_matches_policy", gpu=0) == 1
    assert run_epilog(node, 8, "2") == 0
    assert mapping(node) == {}
    assert not any(k[0] == "gpushare_node_job_gpu_info" for k in samples(node.prom))
    assert value(node.prom, "gpushare_node_journals_present") == 0


def test_two_shard_jobs_share_one_file_and_epilogs_remove_them_one_by_one(tmp_path):
    node = metered(tmp_path, "lab-shard01")
    assert run_prolog(node, 12, "0") == 0 and run_prolog(node, 11, "0") == 0
    assert mapping(node) == {"0": "11\n12\n"}
    assert run_prolog(node, 11, "0") == 0  # a rerun adds nothing
    assert mapping(node) == {"0": "11\n12\n"}
    assert run_epilog(node, 11, "0") == 0
    assert mapping(node) == {"0": "12\n"}
    assert run_epilog(node, 12, "0") == 0
    assert mapping(node) == {}
    assert run_epilog(node, 12, "0") == 0  # second epilog: a no-op
    assert mapping(node) == {}
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 3
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="epilog", result="ok") == 3
    assert value(node.prom, "gpushare_node_journals_present") == 0


def test_mps_daemon_counted_while_it_runs(mps_node, tmp_path):
    raw = yaml.safe_load(mps_node.policy.read_text())
    raw["cluster"]["metrics"] = {"textfile_dir": str(tmp_path / "prom")}
    mps_node.policy.write_text(yaml.safe_dump(raw))
    prom = tmp_path / "prom" / "gpushare.prom"
    assert prolog_hook.main(mps_node.env(3, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    assert value(prom, "gpushare_node_mps_daemons_running") == 1
    assert epilog_hook.main(mps_node.env(3, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    assert value(prom, "gpushare_node_mps_daemons_running") == 0


def test_refused_prolog_counts_a_failure_with_its_reason(tmp_path):
    node = metered(tmp_path, "lab-excl01")
    FakeNvml(node.state).add_process(1, 4242)
    assert run_prolog(node, 9, "1") == 1
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="prolog", result="failed") == 1
    assert value(node.prom, "gpushare_node_hook_failures_total", hook="prolog", reason="unsafe") == 1
    assert value(node.prom, "gpushare_node_hook_failures_total", hook="prolog", reason="mps") == 0
    assert not node.dcgm.exists() or mapping(node) == {}


def test_metrics_write_failures_never_fail_the_hook(tmp_path, capsys):
    node = metered(tmp_path, "lab-excl01", textfile_dir="prom", mapping_dir="dcgm")
    (tmp_path / "prom").write_text("a file where the directory should be")
    (tmp_path / "dcgm").write_text("likewise")
    assert run_prolog(node, 7, "1") == 0
    assert run_epilog(node, 7, "1") == 0
    err = capsys.readouterr().err
    assert f"gpushare-prolog: metrics file in {tmp_path / 'prom'} not written" in err
    assert f"gpushare-prolog: dcgm-exporter job mapping in {tmp_path / 'dcgm'} not updated" in err
    assert node.journals() == []  # the job itself went through
    # the counters were still kept: a later run with a usable directory shows them, and the mapping error
    (tmp_path / "prom").unlink()
    assert run_prolog(node, 8, "1") == 0
    assert value(tmp_path / "prom" / "gpushare.prom", "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 2
    assert value(tmp_path / "prom" / "gpushare.prom", "gpushare_node_dcgm_mapping_errors_total") == 2


def test_what_a_run_saw_is_a_record_of_four_fields():
    seen = Seen()
    assert (seen.spec, seen.job_id, seen.live, seen.journal) == (None, None, None, None)
    seen.job_id = 7
    assert "job_id=7" in repr(seen)
    with pytest.raises(AttributeError):
        seen.jobid = 7  # a misspelt field is an error, not a key nobody reads
    with pytest.raises(AttributeError):
        seen.mig  # noqa: B018


def test_a_prolog_fills_what_it_saw_and_the_epilog_its_job(tmp_path):
    node = metered(tmp_path, "lab-excl01")
    seen = Seen()
    prolog_hook.prolog(node.env(7, "1"), runner=no_scontrol, mps=node.mps, seen=seen)
    assert seen.spec.node == "lab-excl01" and seen.journal.job_id == 7 and 1 in seen.live.gpus
    assert seen.job_id is None
    seen = Seen()
    epilog_hook.epilog(node.env(7, "1"), runner=no_scontrol, mps=node.mps, seen=seen)
    assert seen.job_id == 7 and seen.journal is None


def test_a_field_the_metrics_read_and_the_record_lacks_fails_loudly(tmp_path):
    """A renamed field stops the metrics with an error, not silently (only the node's write errors are kept quiet)."""

    class Renamed:  # Seen with `live` renamed: what the metrics read is gone
        __slots__ = ("spec", "job_id", "observed", "journal", "slice_seconds", "slice_refused")

    node = metered(tmp_path, "lab-excl01", mapping_dir=None)
    run = Renamed()
    run.spec, run.job_id, run.observed, run.journal = load(node.env(7, "1"))[1], None, None, None
    run.slice_seconds = run.slice_refused = None
    with pytest.raises(AttributeError, match="live"):
        after_run("gpushare-prolog", "prolog", run, None, 0.1)


def test_a_bug_in_the_metrics_is_said_as_a_bug_a_write_error_is_one_line(tmp_path, monkeypatch, capsys):
    """Neither fails the job nor drains the node: the metrics are not worth a node; a bug says it is one."""
    node = metered(tmp_path, "lab-excl01")

    def failing(error):
        def record(*args, **kwargs):
            raise error

        return record

    monkeypatch.setattr(textfile, "record", failing(ValueError("hook 'prologue' is not one the textfile counts")))
    assert run_prolog(node, 7, "1") == 0
    err = capsys.readouterr().err
    assert "the metrics step failed (a bug; the job is not affected): ValueError: hook 'prologue'" in err
    monkeypatch.setattr(textfile, "record", failing(PermissionError(13, "denied")))
    assert run_prolog(node, 8, "0") == 0
    assert f"metrics file in {tmp_path / 'prom'} not written: PermissionError" in capsys.readouterr().err


def test_metrics_off_by_default_write_nothing(tmp_path):
    node = HookNode(tmp_path, "lab-shard01")
    assert run_prolog(node, 5, "0") == 0 and run_epilog(node, 5, "0") == 0
    assert not (node.state_dir / textfile.STATE_NAME).exists() and not list(tmp_path.rglob("*.prom"))


# ---- reconcile ---------------------------------------------------------------------------------


def test_reconcile_repairs_a_stale_and_a_missing_mapping_entry(tmp_path, monkeypatch):
    node = metered(tmp_path, "lab-shard01")
    assert run_prolog(node, 21, "0") == 0 and run_prolog(node, 22, "0") == 0
    (node.dcgm / "0").write_text("21\n99\n")  # 99: a job that is gone; 22: lost
    (node.dcgm / "3").write_text("98\n")  # a file for a GPU no running job holds
    monkeypatch.setattr("slurm_gpushare.node.reconcile.running_jobs", lambda _runner, name: {21, 22})
    args = ["reconcile", "--policy", str(node.policy), "--node", "lab-shard01", "--fake-nvml", str(node.state)]
    dry = CliRunner().invoke(node_cli, args + ["--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would: node lab-shard01: dcgm job mapping" in dry.output and mapping(node)["0"] == "21\n99\n"
    result = CliRunner().invoke(node_cli, args)
    assert result.exit_code == 0, result.output
    assert mapping(node) == {"0": "21\n22\n"}
    assert (
        f"{node.dcgm / '0'}: removed job(s) 99" in result.output
        and f"{node.dcgm / '0'}: added job(s) 22" in result.output
    )
    assert f"{node.dcgm / '3'}: removed job(s) 98" in result.output
    assert (
        value(node.prom, "gpushare_node_hook_runs_total", hook="reconcile", result="ok") == 1
    )  # the dry run not counted
    again = CliRunner().invoke(node_cli, args)
    assert "nothing to reconcile" in again.output and mapping(node) == {"0": "21\n22\n"}


def test_reconcile_records_mig_layout_and_drift_as_a_failure(tmp_path, monkeypatch):
    node = metered(tmp_path, "lab-mig01")
    monkeypatch.setattr("slurm_gpushare.node.reconcile.running_jobs", lambda _runner, name: set())
    args = ["reconcile", "--policy", str(node.policy), "--node", "lab-mig01", "--fake-nvml", str(node.state)]
    assert CliRunner().invoke(node_cli, args).exit_code == 0
    assert value(node.prom, "gpushare_node_mig_layout_matches_policy", gpu=0) == 1
    raw = yaml.safe_load(node.policy.read_text())  # the policy now wants another layout than the GPU has
    raw["node_groups"][2]["sharing"][0]["layout"] = ["1g.5gb"] * 6
    node.policy.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(node_cli, args)
    assert result.exit_code == 1 and "MIG layout" in result.output
    assert value(node.prom, "gpushare_node_mig_layout_matches_policy", gpu=0) == 0
    assert value(node.prom, "gpushare_node_hook_failures_total", hook="reconcile", reason="mig_drift") == 1


def test_health_check_removes_mapping_entries_of_jobs_that_ended_unseen(tmp_path):
    """The soak's leftover: lab-excl01's slurmd was killed under a job; its epilog never ran, the journal went
    (reconcile, or a requeue that ran elsewhere) and the mapping still named the job after the queue drained.
    The health check rewrites the mapping as reconcile does, every run, and the textfile's job rows."""
    from slurm_gpushare.hooks import health as health_hook
    from tests.unit.hooks.test_repair import FakeSlurm

    node = metered(tmp_path, "lab-excl01")
    assert run_prolog(node, 11, "1") == 0 and run_prolog(node, 12, "0") == 0
    (node.dcgm / "1").write_text("11\n410\n")  # 410: no journal, not running (the CI run's leftover)
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2", jobs={12: "gres/gpu:1"})  # job 11 ended, its epilog never ran
    lines: list[str] = []
    env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config)}
    report = health_hook.health(env, runner=slurm, mps=node.mps, is_device=lambda _p: True, out=lines.append)
    assert mapping(node) == {"0": "12\n"} and node.journals() == ["12.json"]
    assert f"node lab-excl01: repaired: dcgm job mapping {node.dcgm / '1'}: removed job(s) 11, 410" in lines
    assert str(report.decision) == "healthy"  # a repaired mapping is no reason to drain
    info = {dict(labels)["job_id"] for (name, labels) in samples(node.prom) if name == "gpushare_node_job_gpu_info"}
    assert info == {"12"} and value(node.prom, "gpushare_node_journals_present") == 1
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 2  # no run counted
    health_hook.health(env, runner=slurm, mps=node.mps, is_device=lambda _p: True, out=lines.append)
    assert mapping(node) == {"0": "12\n"}


def test_health_check_with_an_unusable_mapping_dir_notes_it_and_does_not_drain(tmp_path):
    from slurm_gpushare.hooks import health as health_hook
    from tests.unit.hooks.test_repair import FakeSlurm

    node = metered(tmp_path, "lab-excl01", mapping_dir="dcgm")
    node.dcgm.write_text("a file where the directory should be\n")  # root writes anywhere: a file stops it
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    lines: list[str] = []
    report = health_hook.health(
        {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config)},
        runner=slurm,
        mps=node.mps,
        is_device=lambda _p: True,
        out=lines.append,
    )
    assert str(report.decision) == "healthy" and not any(c[:2] == ["scontrol", "update"] for c in slurm.calls)
    assert any(
        line.startswith(f"node lab-excl01: note: dcgm job mapping {node.dcgm} not repaired: ") for line in lines
    ), lines
    assert value(node.prom, "gpushare_node_journals_present") == 0  # the textfile is still written


# ---- the pieces --------------------------------------------------------------------------------


def test_counters_survive_across_runs_and_the_state_file(tmp_path):
    for n in range(3):
        textfile.record(tmp_path / "state", tmp_path / "prom", "epilog", "ok", None, 0.25, now=1000.0 + n)
    textfile.record(tmp_path / "state", tmp_path / "prom", "epilog", "failed", "mps", 0.5, now=2000.0)
    prom = tmp_path / "prom" / "gpushare.prom"
    assert value(prom, "gpushare_node_hook_runs_total", hook="epilog", result="ok") == 3
    assert value(prom, "gpushare_node_hook_runs_total", hook="epilog", result="failed") == 1
    assert value(prom, "gpushare_node_hook_failures_total", hook="epilog", reason="mps") == 1
    assert value(prom, "gpushare_node_hook_last_duration_seconds", hook="epilog") == 0.5
    assert value(prom, "gpushare_node_hook_last_run_timestamp_seconds", hook="epilog") == 2000.0
    (tmp_path / "state" / textfile.STATE_NAME).write_text("{garbage")  # an unreadable state restarts at zero
    textfile.record(tmp_path / "state", tmp_path / "prom", "epilog", "ok", None, 0.1)
    assert value(prom, "gpushare_node_hook_runs_total", hook="epilog", result="ok") == 1


def _hammer(state: str, prom: str, n: int) -> None:
    for _ in range(n):
        textfile.record(state, prom, "prolog", "ok", None, 0.01)


def test_concurrent_increments_are_not_lost(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path / "s"), str(tmp_path / "p"), 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert value(tmp_path / "p" / "gpushare.prom", "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 60


def test_textfile_parses_with_every_family_typed(tmp_path):
    snap = textfile.NodeObservation(
        journals_present=2,
        mps_daemons_running=1,
        mig={0: True, 1: False},
        jobs=[textfile.JobDevice(5, 0, 'GPU-"x"\\y', "MIG-1", 3, 0), textfile.JobDevice(6, 1, "GPU-b")],
    )
    path = textfile.record(tmp_path, tmp_path / "prom", "reconcile", "ok", None, 1.5, snap)
    families = {f.name: f.type for f in prometheus_parser.text_string_to_metric_families(path.read_text())}
    assert families == {
        "gpushare_node_hook_runs": "counter",
        "gpushare_node_hook_failures": "counter",
        "gpushare_node_hook_last_duration_seconds": "gauge",
        "gpushare_node_hook_last_run_timestamp_seconds": "gauge",
        "gpushare_node_mps_daemons_running": "gauge",
        "gpushare_node_journals_present": "gauge",
        "gpushare_node_mig_layout_matches_policy": "gauge",
        "gpushare_node_job_gpu_info": "gauge",
        "gpushare_node_dcgm_mapping_errors": "counter",
    }
    assert (
        value(
            path,
            "gpushare_node_job_gpu_info",
            job_id=5,
            gpu=0,
            uuid='GPU-"x"\\y',
            mig_uuid="MIG-1",
            gpu_instance_id=3,
            compute_instance_id=0,
        )
        == 1
    )
    assert value(path, "gpushare_node_mig_layout_matches_policy", gpu=1) == 0
    runs = [k for k in samples(path) if k[0] == "gpushare_node_hook_runs_total"]
    assert len(runs) == len(textfile.HOOKS) * len(textfile.RESULTS)  # all at 0 from the start


def test_update_refuses_unbounded_labels():
    with pytest.raises(ValueError, match="reason 'disk full at /x'"):
        textfile.update(
            textfile.empty_state(), "prolog", "failed", "disk full at /x", 0.1, 0.0, textfile.NodeObservation()
        )
    with pytest.raises(ValueError, match="hook 'taskprolog'"):
        textfile.update(textfile.empty_state(), "taskprolog", "ok", None, 0.1, 0.0, textfile.NodeObservation())


def test_failure_reasons_by_error_class():
    from slurm_gpushare.node.epilog import EpilogRefused
    from slurm_gpushare.node.journal import JournalError
    from slurm_gpushare.node.mps import MpsError
    from slurm_gpushare.node.nodeconfig import NodeConfigError
    from slurm_gpushare.slurm.cli_backend import SlurmClientError

    assert textfile.failure_reason(EpilogRefused(1, "n", ["x"])) == "unsafe"
    assert textfile.failure_reason(MpsError("x")) == "mps"
    assert textfile.failure_reason(JournalError("x")) == "journal"
    assert textfile.failure_reason(NodeConfigError("x")) == "config"
    assert textfile.failure_reason(SlurmClientError("x")) == "slurm"
    assert textfile.failure_reason(KeyError("x")) == "internal"
    assert {r for _, r in textfile._BY_CLASS} | {"internal"} <= set(textfile.REASONS)


def test_mig_matches_compares_profile_multisets():
    spec = (GpuSpec(0, "A100-SXM4-40GB", Share(Mode.MIG, ("3g.20gb", "1g.5gb"))), GpuSpec(1, "A100", Share()))

    def dev(gi, p):
        return MigDevice(f"MIG-{gi}", gi, 0, f"NVIDIA A100-SXM4-40GB MIG {p}", 1)

    good = ObservedGpu(0, "GPU-a", 0, 40960, True, (dev(1, "1g.5gb"), dev(2, "3g.20gb")))
    drifted = ObservedGpu(0, "GPU-a", 0, 40960, True, (dev(1, "1g.5gb"), dev(2, "1g.5gb")))
    unseen = ObservedGpu(0, "GPU-a", 0, 40960, True)
    off = ObservedGpu(0, "GPU-a", 0, 40960, False)
    whole = ObservedGpu(1, "GPU-b", 1, 40960, False)
    assert textfile.mig_matches([good, whole], spec) == {0: True}
    assert textfile.mig_matches([drifted], spec) == {0: False}
    assert textfile.mig_matches([unseen], spec) == {}
    assert textfile.mig_matches([off], spec) == {0: False}


def test_dcgm_mapping_files_and_repair(tmp_path):
    class D:
        def __init__(self, gpu, mig=None, gi=None):
            self.gpu_index, self.mig_uuid, self.gi = gpu, mig, gi

    class J:
        def __init__(self, job_id, *devices):
            self.job_id, self.devices = job_id, devices

    d = tmp_path / "map"
    assert dcgmjobs.add_job(d, J(4, D(0), D(1, "MIG-x", 5))) == ["0", "1.5"]
    assert dcgmjobs.add_job(d, J(4, D(0), D(1, "MIG-x", 5))) == []  # idempotent
    assert dcgmjobs.read_dir(d) == {"0": {4}, "1.5": {4}}
    (d / "notes.txt").write_text("9\n")  # not a name dcgm-exporter reads: left alone
    assert dcgmjobs.remove_job(d, 4) == ["0", "1.5"] and dcgmjobs.remove_job(d, 4) == []
    assert sorted(p.name for p in d.iterdir()) == [".lock", "notes.txt"]
    assert dcgmjobs.remove_job(tmp_path / "absent", 4) == []
    removed, added = dcgmjobs.repair(d, [J(4, D(0)), J(5, D(0))], running={4})
    assert (removed, added) == ([], [f"dcgm job mapping {d / '0'}: added job(s) 4"]) and (d / "0").read_text() == "4\n"


# ---- the policy ----------------------------------------------------------------------------------


def _policy_problems(metrics: dict) -> str:
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["cluster"]["metrics"] = metrics
    try:
        build_site(raw, "t.yaml")
    except PolicyError as exc:
        return exc.report()
    return ""


@pytest.mark.parametrize(
    "metrics, fragment",
    [
        ({"textfile_dir": "var/lib/x"}, "cluster.metrics.textfile_dir: String should match pattern"),
        ({"dcgm_job_mapping_dir": "/run/$HOME"}, "cluster.metrics.dcgm_job_mapping_dir: String should match pattern"),
        ({"textfile_dir": "/"}, "textfile_dir: '/' is the root directory"),
        ({"dcgm_job_mapping_dir": "/run/../etc"}, "dcgm_job_mapping_dir: '/run/../etc' climbs with '..'"),
        (
            {"textfile_dir": "/x", "dcgm_job_mapping_dir": "/x/"},
            "textfile_dir and dcgm_job_mapping_dir are the same directory",
        ),
        ({"textfile": "/x"}, "cluster.metrics.textfile: unknown key; allowed here: dcgm_job_mapping_dir, textfile_dir"),
    ],
)
def test_policy_metrics_errors_name_the_field(metrics, fragment):
    assert fragment in _policy_problems(metrics)


def test_policy_metrics_reach_the_node_spec(tmp_path):
    node = metered(tmp_path, "lab-excl01")
    assert run_prolog(node, 1, "0") == 0
    spec = yaml.safe_load((node.config.parent / "node-spec.json").read_text())
    assert (spec["textfile_dir"], spec["dcgm_job_mapping_dir"]) == (str(tmp_path / "prom"), str(tmp_path / "dcgm"))
    assert (
        _policy_problems(
            {
                "textfile_dir": "/var/lib/prometheus/node-exporter",
                "dcgm_job_mapping_dir": "/run/gpushare/dcgm-job-mapping",
            }
        )
        == ""
    )
    stop_daemons(node.state_dir)
