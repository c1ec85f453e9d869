"""The Slurm client: no Slurm command outside slurm/, the CLI backend's parsers, backend selection."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_gpushare.proc import Result
from slurm_gpushare.slurm import client as slurm_client
from slurm_gpushare.slurm.cli_backend import CliClient, SlurmClientError, job_from_json, node_from_json
from slurm_gpushare.slurm.model import GresUse, expand_indexes, node_state, parse_gres_config, parse_gres_detail
from slurm_gpushare.slurm.pyslurm_backend import assoc_from_pyslurm, job_from_pyslurm, node_from_pyslurm

PACKAGE = Path(__file__).resolve().parents[3] / "slurm_gpushare"
SLURM_COMMANDS = {
    "scontrol",
    "squeue",
    "sinfo",
    "sacct",
    "sacctmgr",
    "sshare",
    "sbatch",
    "srun",
    "scancel",
    "sprio",
    "sdiag",
}


def _argv_heads(tree: ast.AST):
    """(line, command) of every list/tuple literal whose first item is a Slurm command, and every string
    that starts with one followed by a space (a shell line)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS:
                yield node.lineno, first.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value.split(" ", 1)[0]
            if head in SLURM_COMMANDS and any(op in node.value for op in (" | ", " && ", "; ", "$(")):
                yield node.lineno, head


def test_no_slurm_command_runs_outside_slurm_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[1] == "slurm":
            continue
        for line, cmd in _argv_heads(ast.parse(path.read_text(), str(path))):
            found.append(f"{rel}:{line}: {cmd}")
    assert found == [], (
        "Slurm commands built outside slurm_gpushare/slurm/ (use slurm.commands / the client):\n" + "\n".join(found)
    )


def test_the_scan_sees_what_it_must():
    tree = ast.parse('x = ["squeue", "-h"]\ny = ("sacctmgr", "-i")\nz = "scontrol -o show node | grep"\n')
    assert [c for _, c in _argv_heads(tree)] == ["squeue", "sacctmgr", "scontrol"]


# ---- parsers ---------------------------------------------------------------------------------


def test_gres_strings():
    assert parse_gres_config("gpu:l40s:2,shard:l40s:4(S:0)") == {"gpu:l40s": 2, "shard:l40s": 4}
    assert parse_gres_config("gres/gpu:1") == {"gpu": 1}
    assert parse_gres_config("(null)") == {} and parse_gres_config("") == {}
    assert parse_gres_detail("gpu:l40s:2(IDX:0-1)") == {"gpu:l40s": GresUse(2, (0, 1))}
    assert parse_gres_detail("gpu:3(IDX:0,2,5),mps:a30:25(25/100)") == {
        "gpu": GresUse(3, (0, 2, 5)),
        "mps:a30": GresUse(25, None),
    }
    assert parse_gres_detail("gpu:a30:0(IDX:N/A)") == {"gpu:a30": GresUse(0, None)}
    assert expand_indexes("0-2,5") == (0, 1, 2, 5) and expand_indexes("N/A") is None
    assert node_state("IDLE+DRAIN") == ("IDLE", "DRAIN") and node_state(["MIXED", "DRAIN", "COMPLETING"]) == (
        "MIXED",
        "COMPLETING",
        "DRAIN",
    )


JOB = {
    "job_id": 36,
    "name": "wrap",
    "user_name": "carol",
    "account": "biology",
    "partition": "batch",
    "qos": "batch",
    "job_state": ["RUNNING"],
    "state_reason": "None",
    "nodes": "lab-excl01",
    "tres_per_node": "gres/gpu:1",
    "gres_detail": ["gpu:l40s:1(IDX:0)"],
    "array_job_id": {"set": True, "number": 0},
    "array_task_id": {"set": False, "number": 0},
    "job_resources": {"nodes": {"allocation": [{"index": 0, "name": "lab-excl01"}]}},
    "submit_time": {"set": True, "infinite": False, "number": 1796288833},
}


def test_job_from_squeue_json():
    job = job_from_json(JOB)
    assert (job.job_id, job.state, job.user, job.nodes) == (36, "RUNNING", "carol", "lab-excl01")
    assert job.gres_request == {"gpu": 1}
    assert job.gres_alloc == {"lab-excl01": {"gpu:l40s": GresUse(1, (0,))}}
    assert job.array_job_id is None and job.array_task_id is None
    assert job.submit_time == 1796288833
    assert job_from_json({**JOB, "submit_time": {"set": False, "number": 0}}).submit_time is None
    pending = job_from_json({**JOB, "job_state": ["PENDING"], "nodes": "", "gres_detail": [], "job_resources": {}})
    assert pending.gres_alloc == {} and pending.state == "PENDING"


def test_node_from_json():
    node = node_from_json(
        {
            "name": "n1",
            "state": ["IDLE", "DRAIN"],
            "reason": "r",
            "gres": "gpu:l40s:2",
            "tres_used": "cpu=6,mem=6720M,gres/gpu=1,gres/gpu:l40s=1",
            "features": ["a"],
            "active_features": [],
            "weight": 5,
            "partitions": ["batch"],
            "cpus": 8,
            "alloc_cpus": 6,
            "real_memory": 16000,
            "alloc_memory": 6720,
        }
    )
    assert node.state == ("IDLE", "DRAIN") and node.flags == {"DRAIN"} and node.gres == {"gpu:l40s": 2}
    assert node.gres_alloc == {"gpu": 1, "gpu:l40s": 1} and node.weight == 5


# ---- the pyslurm backend's conversion: the same model from pyslurm's shapes -------------------


def test_pyslurm_job_converts_like_the_cli():
    pj = SimpleNamespace(
        id=36,
        array_id=None,
        array_task_id=None,
        name="wrap",
        user_name="carol",
        account="biology",
        partition="batch",
        qos="batch",
        state="RUNNING",
        state_reason="None",
        allocated_nodes="lab-excl01",
        submit_time=1796288833,
        gres_per_node={"gres/gpu": 1},  # pyslurm's to_gres_dict keeps the "gres/" of tres_per_node
        get_resource_layout_per_node=lambda: {"lab-excl01": {"gres": {"gpu:l40s": {"count": 1, "indexes": "0"}}}},
    )
    assert job_from_pyslurm(pj) == job_from_json(JOB)


def test_pyslurm_node_and_assoc():
    pn = SimpleNamespace(
        name="n1",
        state="IDLE+DRAIN",
        reason="r",
        reason_user="slurm",
        configured_gres={"gpu:l40s": 2},
        allocated_tres={"cpu": "6", "gres/gpu": "1", "gres/gpu:l40s": "1"},
        available_features=["a"],
        active_features=[],
        weight=5,
        partitions=["batch"],
        total_cpus=8,
        allocated_cpus=6,
        real_memory=16000,
        allocated_memory=6720,
    )
    assert node_from_pyslurm(pn).gres_alloc == {"gpu": 1, "gpu:l40s": 1}
    assert node_from_pyslurm(pn).reason_user == "slurm"
    pa = SimpleNamespace(
        account="physics",
        user=None,
        parent_account="root",
        shares=0x7FFFFFFF,
        group_tres=SimpleNamespace(gres={"gpu": 24}),
    )
    row = assoc_from_pyslurm(pa)
    assert (row.fairshare, row.grp_tres, row.parent) == ("parent", {"gres/gpu": 24}, "root")


# ---- the CLI client over a fake runner ----------------------------------------------------------


class Replay:
    """A Runner answering known argv with recorded text; anything else raises."""

    def __init__(self, answers: dict[tuple, str]):
        self.answers, self.calls = answers, []

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv not in self.answers:
            raise AssertionError(f"unexpected command {argv}")
        return Result(argv, 0, self.answers[argv], "")


def test_cli_client_reads_and_changes():
    runner = Replay(
        {
            ("squeue", "--all", "--json"): json.dumps({"jobs": [JOB]}),
            ("squeue", "-w", "n1", "-h", "-o", "%A"): "5\n12\n",
            ("scontrol", "update", "nodename=n1", "state=drain", "reason=why"): "",
            ("scontrol", "show", "node", "n2", "--json"): json.dumps({"nodes": []}),
        }
    )
    c = CliClient(runner)
    assert [j.job_id for j in c.jobs()] == [36]
    assert c.job_ids_on_node("n1") == {5, 12}
    c.drain("n1", "why")
    with pytest.raises(SlurmClientError, match="no such node"):
        c.node("n2")


def test_backend_choice(tmp_path, monkeypatch):
    runner = Replay({})
    assert slurm_client.make_client("cli", runner).backend == "cli"
    assert slurm_client.make_client(None, runner, environ={}).backend == "cli"
    with pytest.raises(SlurmClientError, match="expected one of"):
        slurm_client.make_client("bogus", runner)
    monkeypatch.setattr(slurm_client, "_probe", lambda runner: "pyslurm does not import here (no slurm.conf)")
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert slurm_client.make_client("auto", runner, environ=env).backend == "cli"
    with pytest.raises(SlurmClientError, match="does not import"):
        slurm_client.make_client("pyslurm", runner, environ=env)


def test_probe_is_cached_and_never_imports_in_process(tmp_path):
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        if "-c" in argv:
            assert "import pyslurm" in argv[-1]
            return Result(tuple(argv), 0, "24.11.0 24.11\n", "")
        return Result(tuple(argv), 0, "slurm 24.11.5\n", "")

    assert slurm_client.pyslurm_problem(environ={}, runner=runner, cache_dir=tmp_path) is None
    assert slurm_client.pyslurm_problem(environ={}, runner=runner, cache_dir=tmp_path) is None
    assert len(calls) == 2  # the child import and scontrol --version, once


def test_probe_refuses_another_slurm(tmp_path):
    def runner(argv, **kw):
        out = "24.11.0 24.11\n" if "-c" in argv else "slurm 26.05.5\n"
        return Result(tuple(argv), 0, out, "")

    assert "runs Slurm 26.05.5" in slurm_client.pyslurm_problem(environ={}, runner=runner, cache_dir=tmp_path)


# ---- recorded outputs of real Slurm (tests/data/slurm/recorded-<version>/, by tests/cluster/test_slurm_client.py) ----

RECORDED = sorted(p.parent for p in (PACKAGE.parent / "tests" / "data" / "slurm").glob("recorded-*/squeue.json"))


@pytest.mark.parametrize("where", RECORDED, ids=[p.name for p in RECORDED])
def test_cli_parser_on_recorded_output(where):
    """The CLI backend on squeue/scontrol --json as Slurm printed them gives the view recorded beside them
    (client-dump.json: written by the same run, so a parser change that alters the view shows here)."""
    from slurm_gpushare.slurm import commands

    answers = {
        tuple(commands.SQUEUE_JSON): (where / "squeue.json").read_text(),
        tuple(commands.NODES_JSON): (where / "scontrol-show-node.json").read_text(),
        tuple(commands.PARTITIONS_JSON): (where / "scontrol-show-partition.json").read_text(),
    }
    view = slurm_client.dump(CliClient(Replay(answers)), parts=("jobs", "nodes", "partitions"))
    view = json.loads(json.dumps(view))
    want = json.loads((where / "client-dump.json").read_text())
    for part in ("jobs", "nodes", "partitions"):
        assert view[part] == want[part], part
    kinds = {k.split(":")[0] for j in view["jobs"] for use in j["gres_alloc"].values() for k in use}
    assert kinds >= {"gpu"}, kinds
    assert all(isinstance(j["submit_time"], int) and j["submit_time"] > 1.7e9 for j in view["jobs"])
    assert any(j["state"] == "PENDING" for j in view["jobs"]) and any(j["state"] == "RUNNING" for j in view["jobs"])


# ---- reservations, batch jobs and their ends: the same answers from each backend ---------------------------

RESERVATION = {
    "name": "gpushare-relayout-lab-mig01",
    "node_list": "lab-mig01",
    "flags": ["MAINT", "IGNORE_JOBS", "SPEC_NODES"],
    "users": "root",
    "start_time": {"set": True, "infinite": False, "number": 1796288833},
    "end_time": {"set": True, "infinite": False, "number": 1796292433},
}


class Answers:
    """A Runner answering argv by its first words (exit code, stdout, stderr); records argv, input and env."""

    def __init__(self, answers: dict[tuple, tuple[int, str, str]]):
        self.answers, self.calls = answers, []

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        from slurm_gpushare.proc import CommandError

        argv = tuple(argv)
        self.calls.append((argv, input, (env or {}).get("SLURM_TIME_FORMAT")))
        match = [k for k in self.answers if argv[: len(k)] == k]
        if not match:
            raise AssertionError(f"unexpected command {argv}")
        res = Result(argv, *self.answers[max(match, key=len)])
        if check and res.returncode:
            raise CommandError(res)
        return res


def test_cli_reservations_are_read_from_json():
    from slurm_gpushare.slurm import commands
    from slurm_gpushare.slurm.model import Reservation

    runner = Answers({tuple(commands.RESERVATIONS_JSON): (0, json.dumps({"reservations": [RESERVATION, {}]}), "")})
    client = CliClient(runner)
    got = client.reservations()
    flags = ("IGNORE_JOBS", "MAINT", "SPEC_NODES")
    assert got[0] == Reservation("gpushare-relayout-lab-mig01", "lab-mig01", 1796288833, 1796292433, flags, "root")
    assert got[1].name == "" and got[1].start is None  # an empty record reads as empty, nothing invented


def test_pyslurm_reservations_are_the_clis():
    """pyslurm 24.11's reservation().get(): name -> fields (epoch times, flags as Slurm's text, users a list)."""
    from slurm_gpushare.slurm.cli_backend import reservation_from_json
    from slurm_gpushare.slurm.pyslurm_backend import PyslurmClient

    got = {
        "gpushare-relayout-lab-mig01": {
            "node_list": "lab-mig01",
            "flags": "MAINT,IGNORE_JOBS,SPEC_NODES",
            "users": ["root"],
            "start_time": 1796288833,
            "end_time": 1796292433,
            "accounts": None,
        }
    }
    client = object.__new__(PyslurmClient)  # without `import pyslurm` (it reads slurm.conf at import)
    CliClient.__init__(client, Replay({}))
    client.pyslurm = SimpleNamespace(reservation=lambda: SimpleNamespace(get=lambda: got))
    assert client.reservations() == [reservation_from_json(RESERVATION)]


def test_cli_reservation_changes_say_what_slurmctld_answered():
    from slurm_gpushare.slurm.cli_backend import ReservationError, ReservationExists

    create = ("scontrol", "create", "reservation")
    client = CliClient(Answers({create: (0, "Reservation created: r\n", "")}))
    client.create_reservation("r", "n1", 5)
    assert client.runner.calls[-1][0] == (
        *create,
        "ReservationName=r",
        "Nodes=n1",
        "StartTime=now",
        "Duration=5",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    )
    dup = CliClient(Answers({create: (1, "", "Error creating the reservation: Duplicate reservation name\n")}))
    with pytest.raises(ReservationExists, match="reservation r exists"):
        dup.create_reservation("r", "n1", 5)
    bad = CliClient(Answers({create: (1, "", "Error creating the reservation: Invalid node name specified\n")}))
    with pytest.raises(ReservationError, match="cannot create reservation r: .*Invalid node name") as exc:
        bad.create_reservation("r", "nope", 5)
    assert not isinstance(exc.value, ReservationExists)
    gone = ("scontrol", "delete")
    assert CliClient(Answers({gone: (0, "", "")})).delete_reservation("r") is True
    invalid = "delete_reservation ReservationName=r: Requested reservation is invalid\n"
    assert CliClient(Answers({gone: (1, "", invalid)})).delete_reservation("r") is False
    with pytest.raises(ReservationError, match="Requested reservation is in use"):
        CliClient(Answers({gone: (1, "", "Requested reservation is in use\n")})).delete_reservation("r")
    client = CliClient(Answers({("scontrol", "update"): (0, "Reservation updated.\n", "")}))
    client.extend_reservation("r", 7)
    assert client.runner.calls[-1][0] == ("scontrol", "update", "ReservationName=r", "EndTime=now+7minutes")


def test_cli_submit_batch_gives_the_script_on_stdin_and_reads_the_job_id():
    client = CliClient(Answers({("sbatch",): (0, "4242;lab\n", "")}))
    assert client.submit_batch(["--job-name=x"], "#!/bin/sh\ntrue\n") == 4242
    assert client.runner.calls[-1][:2] == (("sbatch", "--parsable", "--job-name=x"), "#!/bin/sh\ntrue\n")
    with pytest.raises(SlurmClientError, match="not a job id"):
        CliClient(Answers({("sbatch",): (0, "Submitted batch job 5\n", "")})).submit_batch([], "#!/bin/sh\n")


def test_cli_root_jobs_named_merges_squeue_and_sacct_since_a_time():
    runner = Answers(
        {
            ("squeue",): (0, "7|PENDING|1000\n5|RUNNING|900\n", ""),
            ("sacct",): (0, "6|COMPLETED|1001\n7|PENDING|1000\n", ""),
        }
    )
    assert CliClient(runner).root_jobs_named("gpushare-relayout-n1", 1000) == [6, 7]
    assert [fmt for _, _, fmt in runner.calls] == ["%s", "%s"]  # epoch seconds on both
    assert runner.calls[0][0][-3:] == ("--name=gpushare-relayout-n1", "-o", "%i|%T|%V")
    bad = Answers({("squeue",): (0, "x|PENDING|1000\n", ""), ("sacct",): (0, "", "")})
    with pytest.raises(SlurmClientError, match="'x' is not a job id"):
        CliClient(bad).root_jobs_named("gpushare-relayout-n1", 0)


def test_cli_job_end_reads_sacct_in_epoch_seconds():
    from slurm_gpushare.slurm.model import JobEnd

    runner = Answers({("sacct",): (0, "12|CANCELLED by 0|0:15|1796292433|lab-mig01\n", "")})
    end = CliClient(runner).job_end(12)
    assert end == JobEnd(12, "CANCELLED", "0:15", 1796292433, "lab-mig01") and end.ended and not end.ok
    assert runner.calls[-1][0][-2:] == ("-j", "12") and runner.calls[-1][2] == "%s"
    running = CliClient(Answers({("sacct",): (0, "12|RUNNING|0:0|Unknown|lab-mig01\n", "")})).job_end(12)
    assert running == JobEnd(12, "RUNNING", "0:0", None, "lab-mig01") and not running.ended
    assert CliClient(Answers({("sacct",): (0, "", "")})).job_end(12) is None
