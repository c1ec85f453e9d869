"""The controller exporter on real Slurm output (tests/data/slurm/recorded-*), with hand-computed expectations.

The recordings hold alice's running mix in physics (a whole L40S, an untyped
gpu:1 that Slurm put on a 1g.5gb slice of the A100-40GB, shard:1 of 4, mps:25
of 100) and bob's three held gpu:1 jobs. By hand, with the small-lab policy:
whole = 1, the slice 1/7 (what billing charges for it), the shard 1/4, mps:25
25/100; physics holds gres/gpu = 2 (the L40S and the slice) of its GrpTRES 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpushare import examples
from slurm_gpushare.cli import main
from slurm_gpushare.metrics import collect
from slurm_gpushare.metrics.exporter import SlurmCollector, exposition, parse_listen, registry_for
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import CommandError, Result
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.model import GresUse, Job, Node
from tests.unit.slurm_fakes import FakeSlurm

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
REC24 = DATA / "recorded-24.11.5"
RECORDINGS = sorted(p.parent for p in DATA.glob("recorded-*/squeue.json"))
NOW = 1796290000.0


class Recorded:
    """A Runner: squeue/scontrol --json from a recording, sshare and sacctmgr from the stateful FakeSlurm
    (loaded with the 24.11.5 recordings); a part listed in ``fail`` exits 1 as Slurm does when it cannot answer."""

    def __init__(self, where: Path, fail: tuple[str, ...] = ()):
        # the exporter reads squeue --Format (commands.job_summaries); the recordings have squeue --json of
        # the moment, which FakeSlurm prints as real squeue does (slurm_fakes.squeue_summaries, test_summaries.py)
        self.answers = {
            tuple(commands.SQUEUE_JSON): (where / "squeue.json").read_text(),
            tuple(commands.NODES_JSON): (where / "scontrol-show-node.json").read_text(),
        }
        self.slurm = FakeSlurm(cluster="lab", squeue_json=(where / "squeue.json").read_text())
        self.slurm.assocs = [
            ln.split("|") for ln in (REC24 / "sacctmgr-assoc-policy.parsable2").read_text().splitlines()
        ]
        self.slurm.sshare_text = (REC24 / "sshare.parsable2").read_text()
        self.fail = set(fail)

    def __call__(self, argv, **kw):
        argv = tuple(argv)
        if argv[0] in self.fail:
            res = Result(argv, 1, "", f"{argv[0]}: error: Unable to contact slurm controller (connect failure)\n")
            if kw.get("check", True):
                raise CommandError(res)
            return res
        if argv in self.answers:
            return Result(argv, 0, self.answers[argv], "")
        return self.slurm(argv, **kw)


def _site():
    return load_file(examples.example())


def scrape(where: Path = REC24, fail: tuple[str, ...] = (), collector: SlurmCollector | None = None):
    collector = collector or SlurmCollector(CliClient(Recorded(where, fail)), _site(), clock=lambda: NOW)
    text = exposition(registry_for(collector))
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }, text


def sample(fams, name, **labels):
    return fams[name][tuple(sorted(labels.items()))]


# ---- the recorded mix ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_gpu_equivalents_of_the_running_mix(where):
    fams, _ = scrape(where)
    got = fams["gpushare_gpu_equivalents_allocated"]
    lab = dict(tenant="physics", user="alice", tier="batch")
    assert got == pytest.approx(
        {
            tuple(sorted({**lab, "kind": "whole", "gres_type": "l40s"}.items())): 1.0,
            tuple(sorted({**lab, "kind": "mig", "gres_type": "a100_40g_1g.5gb"}.items())): 1 / 7,
            # gres_detail says 'shard:1' and 'mps:25'; the type is the one the policy gives those nodes' GPUs
            tuple(sorted({**lab, "kind": "shard", "gres_type": "l40s"}.items())): 0.25,
            tuple(sorted({**lab, "kind": "mps", "gres_type": "a30"}.items())): 0.25,
        }
    )


@pytest.mark.parametrize("where", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_supply_per_node_as_scontrol_says(where):
    fams, _ = scrape(where)
    want = {  # (node, gres, type): (configured, allocated, free)
        ("lab-excl01", "gpu", "l40s"): (2, 1, 1),
        ("lab-mig01", "gpu", "a100_40g_1g.5gb"): (7, 1, 6),
        ("lab-shard01", "gpu", "l40s"): (1, 0, 1),
        ("lab-shard01", "shard", "l40s"): (4, 1, 3),
        ("lab-mps01", "gpu", "a30"): (1, 0, 1),
        ("lab-mps01", "mps", "a30"): (100, 25, 75),
    }
    for (node, gres, gtype), (conf, used, free) in want.items():
        labels = dict(node=node, gres=gres, gres_type=gtype)
        assert sample(fams, "gpushare_gres_configured", **labels) == conf
        assert sample(fams, "gpushare_gres_allocated", **labels) == used
        assert sample(fams, "gpushare_gres_free", **labels) == free
    assert len(fams["gpushare_gres_configured"]) == len(want)
    assert fams["gpushare_node_info"] == {
        tuple(sorted(dict(node=n, state="MIXED", reason="").items())): 1.0
        for n in ("lab-excl01", "lab-mig01", "lab-mps01", "lab-shard01")
    }
    assert fams["gpushare_node_drained"] == {}


def test_pending_demand_and_age():
    fams, _ = scrape()
    held = dict(gres="gpu", gres_type="", reason="JobHeldUser")
    assert fams["gpushare_jobs_pending"] == {tuple(sorted(held.items())): 3.0}
    # untyped gpu:1 in batch (several GPU types there): a whole GPU each, as billing's converter says
    assert sample(fams, "gpushare_pending_gpu_equivalents", **held) == 3.0
    # bob's first held job was submitted at 1796288838 (squeue.json)
    assert sample(fams, "gpushare_pending_oldest_age_seconds", gres="gpu", gres_type="") == NOW - 1796288838


def test_stranded_units_of_the_mix():
    """bob's pending jobs ask gpu:1 (any type, batch): every free GPU or slice fits one; the free shards and MPS
    units fit no pending job, so they are stranded."""
    fams, _ = scrape()
    got = {k: v for k, v in fams["gpushare_stranded_units"].items() if v}
    assert got == {
        tuple(sorted(dict(node="lab-shard01", gres="shard", gres_type="l40s").items())): 3.0,
        tuple(sorted(dict(node="lab-mps01", gres="mps", gres_type="a30").items())): 75.0,
    }
    assert len(fams["gpushare_stranded_units"]) == 6  # every GRES of every available node, 0 where nothing is stuck


def test_fairshare_and_quota():
    fams, _ = scrape()
    assert sample(fams, "gpushare_fairshare_level_fs", account="physics", user="") == 0.893567
    assert sample(fams, "gpushare_fairshare_level_fs", account="physics", user="bob") == 5.967833
    assert sample(fams, "gpushare_fairshare_level_fs", account="root", user="root") == math.inf
    assert sample(fams, "gpushare_fairshare_factor", account="physics", user="bob") == 0.666667
    assert (("account", "physics"), ("user", "")) not in fams["gpushare_fairshare_factor"]  # Fair Tree: users only
    assert (("account", "chem"), ("user", "dave")) not in fams["gpushare_fairshare_level_fs"]  # FairShare=parent
    assert fams["gpushare_quota_limit"] == {(("account", "physics"), ("tres", "gres/gpu")): 2.0}
    # the L40S and the 1g.5gb slice; the shard and the MPS units are not gres/gpu
    assert fams["gpushare_quota_used"] == {(("account", "physics"), ("tres", "gres/gpu")): 2.0}


def test_own_metrics_on_a_good_scrape():
    fams, text = scrape()
    assert fams["gpushare_exporter_last_scrape_success"] == {(): 1.0}
    assert set(fams["gpushare_exporter_scrape_errors"].values()) == {0.0}
    assert 'gpushare_exporter_scrape_errors_total{part="jobs"} 0.0' in text
    assert fams["gpushare_exporter_scrape_duration_seconds"][()] >= 0
    assert "job_id" not in text and "jobid" not in text.lower()


# ---- a part failing ------------------------------------------------------------------------------


def test_a_failed_part_is_counted_and_the_rest_still_exported():
    collector = SlurmCollector(CliClient(Recorded(REC24, fail=("sshare",))), _site(), clock=lambda: NOW)
    fams, text = scrape(collector=collector)
    assert "gpushare_fairshare_level_fs" not in fams and "gpushare_fairshare_factor" not in fams
    assert sample(fams, "gpushare_exporter_scrape_errors", part="sshare") == 1.0
    assert sample(fams, "gpushare_exporter_scrape_errors", part="jobs") == 0.0
    assert sample(fams, "gpushare_exporter_part_up", part="sshare") == 0.0
    assert fams["gpushare_exporter_last_scrape_success"] == {(): 0.0}
    assert sample(fams, "gpushare_gres_free", node="lab-mig01", gres="gpu", gres_type="a100_40g_1g.5gb") == 6
    assert fams["gpushare_quota_used"]  # associations and jobs were read
    fams, _ = scrape(collector=collector)
    assert sample(fams, "gpushare_exporter_scrape_errors", part="sshare") == 2.0  # a counter: it keeps counting


def test_without_jobs_the_job_families_are_left_out_and_quota_has_no_use():
    fams, _ = scrape(fail=("squeue",))
    for name in ("gpushare_gpu_equivalents_allocated", "gpushare_jobs_pending", "gpushare_stranded_units"):
        assert name not in fams
    assert sample(fams, "gpushare_gres_allocated", node="lab-mps01", gres="mps", gres_type="a30") == 25  # from nodes
    assert fams["gpushare_quota_limit"] and fams.get("gpushare_quota_used", {}) == {}
    assert sample(fams, "gpushare_exporter_scrape_errors", part="jobs") == 1.0


# ---- the CLI ---------------------------------------------------------------------------------------


def test_cli_once_prints_one_exposition():
    res = CliRunner().invoke(
        main,
        ["exporter", "--policy", str(examples.example()), "--once", "--slurm-backend", "cli"],
        obj={"runner": Recorded(REC24), "clock": lambda: NOW},
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    names = {f.name for f in text_string_to_metric_families(res.output)}
    assert {
        "gpushare_gpu_equivalents_allocated",
        "gpushare_gres_free",
        "gpushare_stranded_units",
        "gpushare_quota_used",
        "gpushare_exporter_scrape_errors",
    } <= names


def test_cli_once_fails_when_a_part_could_not_be_read():
    res = CliRunner().invoke(
        main,
        ["exporter", "--policy", str(examples.example()), "--once"],
        obj={"runner": Recorded(REC24, fail=("sacctmgr",)), "clock": lambda: NOW},
    )
    assert res.exit_code == 1
    assert "could not read associations" in res.output and "gpushare_gres_free{" in res.output


def test_cli_refuses_a_bad_listen_address():
    for flag in ("--web.listen-address", "--listen"):  # --listen: the former name, still accepted
        res = CliRunner().invoke(
            main,
            ["exporter", "--policy", str(examples.example()), flag, "0.0.0.0:http"],
            obj={"runner": Recorded(REC24)},
        )
        assert res.exit_code == 2 and "ADDR:PORT" in res.output and flag in res.output


def test_parse_listen():
    assert parse_listen("0.0.0.0:9877") == ("0.0.0.0", 9877)
    assert parse_listen("[::]:9100") == ("::", 9100)
    assert parse_listen(":9877") == ("0.0.0.0", 9877) and parse_listen("9877") == ("0.0.0.0", 9877)
    with pytest.raises(ValueError, match="port 1-65535"):
        parse_listen("host:0")


# ---- the pure rules on built jobs and nodes --------------------------------------------------------


def _job(
    job_id,
    state,
    gres_request,
    *,
    gres_alloc=None,
    nodes="",
    partition="batch",
    account="biology",
    user="carol",
    reason="None",
    submit_time=None,
):
    return Job(
        job_id,
        None,
        None,
        "j",
        user,
        account,
        partition,
        "normal",
        state,
        reason,
        nodes,
        gres_request,
        gres_alloc or {},
        submit_time,
    )


def _node(name, gres, alloc, state=("MIXED",), reason="", partitions=("batch", "scavenger")):
    return Node(name, state, reason, gres, alloc, (), (), 1, partitions, 8, 0, 16000, 0)


def test_a_backend_without_per_node_allocations_counts_the_request_on_every_node():
    """pyslurm 24.11 leaves gres_alloc empty: mps:25 per node on two nodes is 2 x 25/100."""
    sm = collect.SiteMetrics(_site())
    fam = collect.allocated(sm, [_job(1, "RUNNING", {"mps": 25}, nodes="lab-mps[01-02]")])
    assert fam.samples == {("biology", "carol", "batch", "mps", ""): pytest.approx(0.5)}


def test_a_free_small_slice_no_pending_job_fits_is_stranded():
    """A free 1g.5gb while every pending job asks 3g.20gb or two whole GPUs; a drained node is left out."""
    mig = _node(
        "m1", {"gpu:a100_40g_1g.5gb": 2, "gpu:a100_40g_3g.20gb": 1}, {"gpu": 2, "gpu:a100_40g_1g.5gb": 1}
    )  # the 3g.20gb has no typed entry: the untyped rest is its
    whole = _node("w1", {"gpu:l40s": 2}, {"gpu": 1, "gpu:l40s": 1})
    drained = _node("d1", {"gpu:l40s": 2}, {}, state=("IDLE", "DRAIN"), reason="bad gpu")
    jobs = [_job(9, "PENDING", {"gpu:a100_40g_3g.20gb": 1}), _job(10, "PENDING", {"gpu:l40s": 2})]
    fam = collect.stranded([mig, whole, drained], jobs)
    assert fam.samples == {
        ("m1", "gpu", "a100_40g_1g.5gb"): 1,
        ("m1", "gpu", "a100_40g_3g.20gb"): 0,
        ("w1", "gpu", "l40s"): 1,
    }
    assert collect.node_allocated(mig, "gpu:a100_40g_3g.20gb", None) == 1
    # with nothing pending, free capacity is idle, not stranded
    assert set(collect.stranded([mig, whole], []).samples.values()) == {0}
    # a pending untyped gpu:1 in batch fits the slice
    fits = collect.stranded([mig], [_job(11, "PENDING", {"gpu": 1})])
    assert set(fits.samples.values()) == {0}
    # ... but not when it asks another partition
    other = collect.stranded([mig], [_job(12, "PENDING", {"gpu": 1}, partition="gpu-big")])
    assert other.samples[("m1", "gpu", "a100_40g_1g.5gb")] == 1
    info, drained_fam = collect.node_state([drained])
    assert info.samples == {("d1", "IDLE+DRAIN", "bad gpu"): 1} and drained_fam.samples == {("d1", "bad gpu"): 1}


def test_quota_counts_sub_accounts():
    from slurm_gpushare.slurm.sacctmgr import AssocRow

    assocs = [
        AssocRow("biology", None, "root", 40, {"gres/gpu": 4, "gres/shard": 8, "cpu": 64}),
        AssocRow("biology-imaging", None, "biology", 1, {}),
    ]
    jobs = [
        _job(1, "RUNNING", {}, gres_alloc={"n1": {"gpu:l40s": GresUse(2, (0, 1))}}, account="biology-imaging"),
        _job(2, "RUNNING", {}, gres_alloc={"n2": {"shard": GresUse(3)}}),
        _job(3, "PENDING", {"gpu": 1}),
    ]
    used, limit = collect.quota(assocs, jobs)
    assert used.samples == {("biology", "gres/gpu"): 2, ("biology", "gres/shard"): 3}  # no use figure for cpu
    assert limit.samples == {("biology", "cpu"): 64, ("biology", "gres/gpu"): 4, ("biology", "gres/shard"): 8}


def test_the_http_server_answers_a_scrape():
    """The path Prometheus takes: GET /metrics from the server `gpushare exporter` starts (here on a free port)."""
    import urllib.request

    from slurm_gpushare.metrics.exporter import Exporter, SharedSnapshot, serve

    collector = SlurmCollector(CliClient(Recorded(REC24)), _site(), clock=lambda: NOW)
    server = serve(Exporter(SharedSnapshot(collector, 15.0)), "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "gpushare_gpu_equivalents_allocated" in names and "gpushare_node_info" in names
