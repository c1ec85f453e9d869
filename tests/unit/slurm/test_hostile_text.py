"""Text a user chooses, read back by every reader: nothing a job names itself can forge, hide or break a record.

A job's name, comment, extra, work directory and admin comment, (without enforced associations) its account and
QOS, and a node's reason are text someone other than Slurm chose. This feeds hostile values of those fields
(newline, carriage return, tab, ``|``, ``,``, ``=``, quotes, NUL, bytes that are not UTF-8, 100 kB, and whole
forged records in the format each reader used to split on), generated from fixed seeds, into a faithful fake of
the Slurm commands built from real recorded output (tests/data/slurm/recorded-*/), and runs every reader on
both backends (the CLI and pyslurm, faked): the jobs, the job summaries the exporter polls, the jobs and GPU
jobs of a node, the batch jobs health reads, sacct usage and the live planner's history, the exporter's
families, the live planner's view, ``gpushare slurm dump``'s view and sshare (fairshare). What each reader
returns must be what it returns for the same cluster with plain values in those fields: the held jobs show
no allocation, no other tenant changes, no part of the metrics goes down.

The fake prints what real Slurm prints: ``--json`` as data_parser's JSON (control characters escaped, bytes
above 0x7f as they are, so a name that is not UTF-8 makes output that is not UTF-8), ``--Format``/``-o``/
``-P``/``-p`` fields by printf (a NUL ends the text), and the output is decoded as ``proc.run`` decodes it.
"""

from __future__ import annotations

import json
import random
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from slurm_gpushare import examples
from slurm_gpushare.live.view import view_from_client
from slurm_gpushare.metrics.exporter import SlurmCollector
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import CommandError, Result, _text
from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.client import dump
from tests.unit.slurm_fakes import FakeSlurm

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
REC24 = DATA / "recorded-24.11.5"
RECORDINGS = sorted(p.parent for p in DATA.glob("recorded-*/squeue.json"))
SEEDS = range(8)
TEXT_FIELDS = ("name", "comment", "extra", "current_working_directory", "admin_comment", "system_comment")
NOW_PAD = 3600


# ---- hostile values -----------------------------------------------------------------------------


def forged_lines(victim: dict) -> list[str]:
    """Whole records claiming ``victim``'s user and account run job 999 on its node holding 4 GPUs, in every
    line format a reader split on: squeue --Format (summaries, name last), ``-o '%A %b'``, sacct -P usage."""
    node, user, acct = victim["nodes"], victim["user_name"], victim["account"]
    alloc = "cpu=1,mem=2000M,node=1,billing=400,gres/gpu=4,gres/gpu:l40s=4"
    summary = "|".join(
        [
            "999",
            "999",
            "N/A",
            "RUNNING",
            "None",
            user,
            acct,
            "batch",
            "normal",
            "gres/gpu:l40s:4",
            "1796288833",
            node,
            alloc,
            "forged",
        ]
    )
    sacct = "|".join(
        ["999", user, acct, "batch", "COMPLETED", "1796288833", "1796290000", "", "1167", alloc, alloc, "normal"]
    )
    return [summary, "999 gres/gpu:l40s:4", sacct, "999|1796288833|" + node + "|1"]


def hostile(rng: random.Random, victim: dict) -> str:
    pieces = [
        "\n",
        "\r",
        "\r\n",
        "\t",
        "|",
        "||",
        ",",
        "=",
        "a=b,c=d",
        '"',
        "'",
        "\\",
        "\x00",
        "\udcff\udcfe",
        "\u00e9",
        "%s%n",
        "${IFS}",
        " ",
        "(null)",
        "N/A",
        "|0123456789abcdef|",
        "}",
        '{"jobs": []}',
    ]
    out = [rng.choice(pieces) for _ in range(rng.randint(1, 6))]
    for line in forged_lines(victim):
        if rng.random() < 0.7:
            out.append(f"\n{line}\n")
    if rng.random() < 0.25:
        out.append("A" * 100_000)
    rng.shuffle(out)
    return "x" + "".join(out)


# ---- a faithful fake of the commands, over a recording ----------------------------------------------


def c_text(value) -> str:
    """A field as printf prints it: a C string ends at its first NUL."""
    return str(value).split("\x00", 1)[0]


def num(v):
    return v.get("number") if isinstance(v, dict) and v.get("set", True) else (None if isinstance(v, dict) else v)


class Cluster:
    """A Runner printing squeue, scontrol and sacct from ``jobs``/``nodes`` (JSON dicts, as squeue --json and
    scontrol show node --json have them); sshare and sacctmgr from FakeSlurm over the 24.11.5 recordings."""

    def __init__(self, where: Path, inject: dict[int, dict[str, str]], node_reason: str | None = None):
        self.squeue = json.loads((where / "squeue.json").read_text())
        self.scontrol = json.loads((where / "scontrol-show-node.json").read_text())
        self.partitions = (where / "scontrol-show-partition.json").read_text()
        for job in self.squeue["jobs"]:
            job.update(inject.get(job["job_id"], {}))
        if node_reason is not None:
            self.scontrol["nodes"][0]["reason"] = node_reason
        self.slurm = FakeSlurm(cluster="lab")
        self.slurm.assocs = [
            ln.split("|") for ln in (REC24 / "sacctmgr-assoc-policy.parsable2").read_text().splitlines()
        ]
        self.slurm.sshare_text = (REC24 / "sshare.parsable2").read_text()

    @property
    def jobs(self) -> list[dict]:
        return self.squeue["jobs"]

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        argv = tuple(argv)
        if argv[0] in ("squeue", "scontrol", "sacct") and not (argv[0] == "scontrol" and "partition" in argv):
            out = getattr(self, "_" + argv[0])(list(argv[1:]), env)
            return Result(argv, 0, _text(out, "utf-8"), "")
        if argv == ("scontrol", "show", "partition", "--json"):
            return Result(argv, 0, self.partitions, "")
        return self.slurm(argv, input=input, timeout=timeout, check=check, env=env)

    # -- JSON: data_parser escapes control characters; bytes that are not UTF-8 pass as they are
    @staticmethod
    def _json(doc: dict) -> bytes:
        return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogateescape")

    @staticmethod
    def _printed(text: str) -> bytes:
        return text.encode("utf-8", "surrogateescape")

    def _scontrol(self, args, env):
        if args == ["show", "node", "--json"]:
            return self._json(self.scontrol)
        if args[:2] == ["show", "node"] and args[3:] == ["--json"]:
            return self._json({**self.scontrol, "nodes": [n for n in self.scontrol["nodes"] if n["name"] == args[2]]})
        raise AssertionError(f"fake scontrol does not know {args}")

    def _squeue(self, args, env):
        jobs, rest = list(self.jobs), list(args)
        for flag in ("--all", "-h", "--noheader"):
            while flag in rest:
                rest.remove(flag)
        while rest[:1] in (["-w"], ["-t"], ["--jobs"]):
            opt, value, rest = rest[0], rest[1], rest[2:]
            if opt == "-w":
                jobs = [j for j in jobs if j.get("nodes") == value]
            elif opt == "-t":
                jobs = [j for j in jobs if value in j["job_state"]]
            else:
                jobs = [j for j in jobs if str(j["job_id"]) in value.split(",")]
        if rest == ["--json"]:
            return self._json({**self.squeue, "jobs": jobs})
        if rest[:1] == ["--Format"] and len(rest) == 2:
            return self._printed("".join(self._format_line(j, rest[1], env) for j in jobs))
        if rest == ["-o", "%A %b"]:
            return self._printed("".join(f"{j['job_id']} {c_text(j.get('tres_per_node') or 'N/A')}\n" for j in jobs))
        if rest == ["-o", "%A"]:
            return self._printed("".join(f"{j['job_id']}\n" for j in jobs))
        raise AssertionError(f"fake squeue does not know {args}")

    def _format_line(self, j: dict, spec: str, env) -> str:
        assert env and env.get("SLURM_TIME_FORMAT") == "%s"
        state = j["job_state"][0]
        array_job, task = num(j.get("array_job_id")) or 0, num(j.get("array_task_id"))
        values = {
            "jobid": j["job_id"],
            "arrayjobid": array_job or j["job_id"],
            "arraytaskid": str(task)
            if task is not None
            else (j.get("array_task_string") or "N/A")
            if array_job
            else "N/A",
            "state": state,
            "reason": j.get("state_description") or j.get("state_reason") or "None",
            "username": j.get("user_name", ""),
            "account": j.get("account", ""),
            "partition": j.get("partition", ""),
            "qos": j.get("qos", ""),
            "tres-per-node": j.get("tres_per_node") or "N/A",
            "submittime": num(j.get("submit_time")),
            "starttime": num(j.get("start_time")),
            "nodelist": j.get("nodes") or "",
            "batchhost": j.get("batch_host") or "",
            "batchflag": int(bool(j.get("batch_flag", True))),
            "tres-alloc": (j.get("tres_req_str") if state == "PENDING" else j.get("tres_alloc_str")) or "",
            "name": j.get("name", ""),
            "comment": j.get("comment", ""),
            "workdir": j.get("current_working_directory", ""),
        }
        out = []
        for item in spec.split(","):
            field, _, suffix = item.partition(":")
            if field.lower() not in values:
                raise AssertionError(f"fake squeue --Format does not know {field}")
            out.append(c_text(values[field.lower()]) + suffix)
        return "".join(out) + "\n"

    def _sacct(self, args, env):
        delim = "|"
        if any(a.startswith("--delimiter=") for a in args):
            delim = next(a for a in args if a.startswith("--delimiter="))[len("--delimiter=") :]
        ending = "-p" in args
        fields = args[args.index("-o") + 1].split(",")
        assert ("-P" in args) != ending and "-X" in args
        assert "Start" not in fields or (env or {}).get("SLURM_TIME_FORMAT") == "%s", "times read as epoch seconds"
        return self._printed("".join(self._sacct_line(j, fields, delim, ending) for j in self._accounted()))

    def _accounted(self) -> list[dict]:
        """sacct's view of the same jobs: the queue's, and each running one again as finished (history)."""
        done = [
            {
                **j,
                "job_id": j["job_id"] + 1000,
                "job_state": ["COMPLETED"],
                "end_time": {"set": True, "number": num(j["start_time"]) + 60},
            }
            for j in self.jobs
            if j["job_state"][0] == "RUNNING"
        ]
        return list(self.jobs) + done

    @staticmethod
    def _sacct_line(j: dict, fields, delim: str, ending: bool) -> str:
        state = j["job_state"][0]
        start = num(j.get("start_time")) if state != "PENDING" else None
        end = num(j.get("end_time")) if state == "COMPLETED" else None
        alloc = j.get("tres_alloc_str") if state != "PENDING" else ""
        values = {
            "JobID": j["job_id"],
            "User": j.get("user_name"),
            "Account": j.get("account"),
            "Partition": j.get("partition"),
            "State": state,
            "Start": start or "Unknown",
            "End": end or "Unknown",
            "Elapsed": "",
            "ElapsedRaw": (end or start or 0) - (start or 0),
            "AllocTRES": alloc or "",
            "ReqTRES": j.get("tres_req_str") or "",
            "QOS": j.get("qos"),
            "NodeList": j.get("nodes") or "None assigned",
            "JobName": j.get("name"),
        }
        return delim.join(c_text(values[f]) for f in fields) + (delim if ending else "") + "\n"


# ---- a faked pyslurm over the same cluster --------------------------------------------------------


def fake_pyslurm(cluster: Cluster) -> types.ModuleType:
    """pyslurm's objects (pyslurm 24.11 attribute names) over the cluster's JSON; it decodes C strings
    replacing what is not UTF-8."""

    def text(v):
        return c_text(v).encode("utf-8", "surrogateescape").decode("utf-8", "replace") if v is not None else None

    def job(j):
        state = j["job_state"][0]
        return types.SimpleNamespace(
            id=j["job_id"],
            array_id=num(j.get("array_job_id")) or None,
            array_task_id=num(j.get("array_task_id")),
            name=text(j.get("name")),
            user_name=text(j.get("user_name")),
            account=text(j.get("account")),
            partition=j.get("partition"),
            qos=text(j.get("qos")),
            state=state,
            state_reason=j.get("state_reason"),
            allocated_nodes=j.get("nodes") or None,
            gres_per_node=_gres(j.get("tres_per_node")),
            submit_time=num(j.get("submit_time")),
            end_time=num(j.get("end_time")),
            priority=num(j.get("priority")),
            get_resource_layout_per_node=lambda: {},
        )

    def node(n):
        return types.SimpleNamespace(
            name=n["name"],
            state="+".join(n.get("state") or []),
            reason=text(n.get("reason")),
            reason_user=n.get("reason_set_by_user"),
            configured_gres=_gres(n.get("gres")),
            allocated_tres=dict(i.split("=", 1) for i in (n.get("tres_used") or "").split(",") if "=" in i),
            available_features=[f for f in (n.get("features") or []) if f],
            active_features=[f for f in (n.get("active_features") or []) if f],
            weight=num(n.get("weight")),
            partitions=n.get("partitions") or [],
            total_cpus=num(n.get("cpus")),
            allocated_cpus=num(n.get("alloc_cpus")),
            real_memory=num(n.get("real_memory")),
            allocated_memory=num(n.get("alloc_memory")),
        )

    def loader(items):
        return types.SimpleNamespace(load=lambda *a: {i: x for i, x in enumerate(items())})

    assoc = [
        types.SimpleNamespace(
            account=a[0],
            user=a[1] or None,
            parent_account=a[2] or None,
            cluster="lab",
            shares=int(a[3]) if a[3].isdigit() else 0x7FFFFFFF if a[3] == "parent" else None,
            group_tres=None,
        )
        for a in cluster.slurm.assocs
    ]
    mod = types.ModuleType("pyslurm")
    mod.Jobs = loader(lambda: [job(j) for j in cluster.jobs])
    mod.Nodes = loader(lambda: [node(n) for n in cluster.scontrol["nodes"]])
    mod.Partitions = loader(lambda: [])

    def db_job(j):  # pyslurm.db.Job (24.11: no TRES; the client joins them in from sacct)
        state = j["job_state"][0]
        start = num(j.get("start_time")) if state != "PENDING" else None
        end = num(j.get("end_time")) if state == "COMPLETED" else None
        return types.SimpleNamespace(
            id=j["job_id"],
            array_id=None,
            array_task_id=None,
            user_name=text(j["user_name"]),
            account=text(j.get("account")),
            partition=j.get("partition"),
            state=state,
            start_time=start,
            end_time=end,
            elapsed_time=(end or start or 0) - (start or 0),
            qos=text(j.get("qos")),
        )

    mod.db = types.SimpleNamespace(
        Associations=loader(lambda: assoc),
        Jobs=loader(lambda: map(db_job, cluster._accounted())),
        JobFilter=lambda **kw: kw,
    )
    return mod


def _gres(text) -> dict:
    from slurm_gpushare.slurm.model import parse_gres_config

    return {f"gres/{k}": v for k, v in parse_gres_config(text).items()}


def client_for(cluster: Cluster, backend: str, monkeypatch):
    if backend == "cli":
        return CliClient(cluster)
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm(cluster))
    from slurm_gpushare.slurm.pyslurm_backend import PyslurmClient

    return PyslurmClient(cluster)


# ---- what every reader returns ------------------------------------------------------------------


def _jobs(jobs, blank=("name",)) -> list:
    return sorted(((j.to_dict() | {k: "" for k in blank}) for j in jobs), key=lambda d: (d["job_id"], repr(d)))


def observe(client, cluster: Cluster, site, blank=("name",)) -> dict:
    """Every reader's answer, the fields under test blanked; a reader that raised answers its error's type."""
    now = max(num(j["submit_time"]) for j in cluster.jobs) + NOW_PAD
    nodes = sorted({j["nodes"] for j in cluster.jobs if j.get("nodes")})
    readers = {
        "jobs": lambda: _jobs(client.jobs(), blank),
        "job_summaries": lambda: _jobs(client.job_summaries(), blank),
        "jobs_on_node": lambda: {n: _jobs(client.jobs_on_node(n), blank) for n in nodes},
        "nodes": lambda: [n.to_dict() | {"reason": ""} for n in client.nodes()],
        "gpu_job_lines": lambda: {n: sorted(client.gpu_job_lines(n)) for n in nodes},
        "batch_jobs_started": lambda: {n: client.batch_jobs_started(n) for n in nodes},
        "usage": lambda: sorted(
            (r.job_id, r.user, r.partition, r.state, r.start, r.end, r.alloc_tres)
            for r in client.usage_source().records(now - 2 * 86400, now)
        ),
        "history": lambda: sorted(map(repr, client.recent_jobs(now - 86400, now))),
        "dump": lambda: _dump(client, now, blank),
        "live_view": lambda: _view(client, site, now),
        "sshare": lambda: client.sshare(),
        "exporter": lambda: _exported(client, site, now),
    }
    out = {}
    for name, read in readers.items():
        try:
            out[name] = read()
        except Exception as exc:  # the comparison names the reader that broke
            out[name] = f"raised {type(exc).__name__}: {str(exc)[:200]}"
    return out


def _dump(client, now, blank):
    view = dump(
        client, cluster="lab", usage_window=(now - 86400, now), parts=("jobs", "nodes", "associations", "usage")
    )
    view["jobs"] = sorted([j | {k: "" for k in blank} for j in view["jobs"]], key=repr)
    view["nodes"] = [n | {"reason": ""} for n in view["nodes"]]
    return view


def _view(client, site, now):
    v = view_from_client(client, site, now)
    return (
        v.pending,
        v.running,
        {k: n.__class__(n.name, n.state, "", n.gres, n.weight) for k, n in v.nodes.items()},
        v.history,
    )


def _exported(client, site, now):
    metrics = SlurmCollector(client, site, clock=lambda: now, timer=lambda: 0.0).scrape()
    node_label = {"gpushare_node_info": "reason"}  # a node's reason is exported as it is: blank the one under test

    def labels(m, s):
        return tuple(
            sorted(
                (k, "" if node_label.get(m.name) == k and s.labels.get("node") == "lab-excl01" else v)
                for k, v in s.labels.items()
            )
        )

    return {m.name: sorted((labels(m, s), s.value) for s in m.samples) for m in metrics}


def plain(fields=TEXT_FIELDS) -> dict[str, str]:
    return {f: f"plain-{f}" for f in fields}


def held(cluster: Cluster) -> list[dict]:
    return [j for j in cluster.jobs if j["job_state"][0] == "PENDING"]


SITE = load_file(examples.example())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", ["cli", "pyslurm"])
@pytest.mark.parametrize("where", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_hostile_job_text_changes_no_reader(where, backend, seed, monkeypatch):
    """Hostile name, comment, extra, work directory, admin and system comment on the held jobs, and a hostile
    reason on a node: every reader answers as it does with plain text there, nothing skipped."""
    base = Cluster(where, {})
    victim = next(j for j in base.jobs if j["job_state"][0] == "RUNNING")
    rng = random.Random(seed)
    inject = {j["job_id"]: {f: hostile(rng, victim) for f in TEXT_FIELDS} for j in held(base)}
    calm = {j["job_id"]: plain() for j in held(base)}
    bad, good = Cluster(where, inject, hostile(rng, victim)), Cluster(where, calm, "plain reason")
    bad_client, good_client = client_for(bad, backend, monkeypatch), client_for(good, backend, monkeypatch)
    got, want = observe(bad_client, bad, SITE), observe(good_client, good, SITE)
    for reader in want:
        assert got[reader] == want[reader], f"{reader} differs with hostile job text (seed {seed})"
    assert not bad_client.skipped, "JSON and the summaries read every record"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", ["cli", "pyslurm"])
@pytest.mark.parametrize("where", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_hostile_account_and_qos_forge_nothing(where, backend, seed, monkeypatch):
    """A held job whose account and QOS are hostile text (a cluster without enforced associations): no reader
    shows a job that is not there, every other job reads as before, and the held job holds nothing; its own
    record is read with its account, or skipped and counted."""
    base = Cluster(where, {})
    victim = next(j for j in base.jobs if j["job_state"][0] == "RUNNING")
    rng = random.Random(1000 + seed)
    target = held(base)[0]["job_id"]
    bad = Cluster(where, {target: {"account": hostile(rng, victim), "qos": hostile(rng, victim)}})
    client, good_client = client_for(bad, backend, monkeypatch), client_for(base, backend, monkeypatch)
    got, want = observe(client, bad, SITE), observe(good_client, base, SITE)
    for reader in ("jobs", "job_summaries", "usage"):
        assert isinstance(got[reader], list), f"{reader}: {got[reader]}"
        rest = [r for r in got[reader] if _job_id(r) != target]
        assert rest == [r for r in want[reader] if _job_id(r) != target], f"{reader}: another job changed"
        mine = [r for r in got[reader] if _job_id(r) == target]
        before = [r for r in want[reader] if _job_id(r) == target]  # usage: none (a held job never started)
        assert len(mine) == len(before) or (not mine and client.skipped), f"{reader}: the held job read wrong"
    for reader in ("jobs_on_node", "gpu_job_lines", "batch_jobs_started", "history", "live_view", "sshare"):
        assert got[reader] == want[reader], reader
    alice = {k: [s for s in v if ("user", victim["user_name"]) in s[0]] for k, v in got["exporter"].items()}
    assert alice == {k: [s for s in v if ("user", victim["user_name"]) in s[0]] for k, v in want["exporter"].items()}
    up = dict(got["exporter"]["gpushare_exporter_part_up"])
    assert all(value == 1.0 for value in up.values()), up


def _job_id(row) -> int:
    if isinstance(row, dict):
        return row["job_id"]
    return int(str(row[0]).split("_")[0])


def test_the_fake_prints_the_recording_as_recorded():
    """Without injection the fake's JSON is the recording's, and the summaries it prints are the real ones."""
    from tests.unit.slurm_fakes import squeue_summaries

    cluster = Cluster(REC24, {})
    assert json.loads(cluster(["squeue", "--all", "--json"]).stdout) == json.loads((REC24 / "squeue.json").read_text())
    spec = ",".join(
        f"{f}:|"
        for f in (
            "JobID",
            "ArrayJobID",
            "ArrayTaskID",
            "State",
            "Reason",
            "UserName",
            "Account",
            "Partition",
            "QOS",
            "tres-per-node",
            "SubmitTime",
            "NodeList",
            "tres-alloc",
        )
    )
    out = cluster(["squeue", "--all", "--noheader", "--Format", spec], env={"SLURM_TIME_FORMAT": "%s"}).stdout
    assert out == squeue_summaries((REC24 / "squeue.json").read_text())


def test_a_record_that_does_not_parse_is_skipped_and_counted():
    cluster = Cluster(REC24, {})
    real = cluster.__call__

    def garbled(argv, **kw):
        res = real(argv, **kw)
        if "--Format" in argv and "JobID:" in argv[-1] and "tres-alloc" in argv[-1]:
            delim = argv[-1].split(",")[0][len("JobID:") :]
            return Result(res.argv, 0, res.stdout + f"not-a-job{delim}\n" + "half a record\n", "")
        return res

    client = CliClient(garbled)
    assert sorted(j.job_id for j in client.job_summaries()) == sorted(j["job_id"] for j in cluster.jobs)
    assert client.skipped == Counter({"squeue --Format": 2})  # the record of one field, the unended tail
    # the exporter reports the count (a scrape reads the summaries once more: two more skipped)
    exported = _exported(client, SITE, 1796290000.0)
    assert exported["gpushare_exporter_skipped_records"] == [((("command", "squeue --Format"),), 4.0)]
    assert dict(exported["gpushare_exporter_part_up"])[(("part", "jobs"),)] == 1.0
    with pytest.raises(CommandError):
        CliClient(lambda argv, **kw: (_ for _ in ()).throw(CommandError(Result(tuple(argv), 1, "", "down")))).jobs()
