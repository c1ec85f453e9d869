"""A stateful fake of the Slurm commands the accounting code runs (tests of it: test_slurm_fakes.py).

FakeSlurm is a Runner: called with an argv, it answers like sacct, sshare or
sacctmgr would (same output formats, same refusals) from state it keeps, and
raises on any command or option it does not know, so code cannot drift from
the real command lines without a test noticing. sacctmgr changes persist,
so a plan can be applied and read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_gpushare.proc import CommandError, Result

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


class UnknownCommand(AssertionError):
    """The code ran something the fake (and so the real tool, as far as we know) does not accept."""


@dataclass
class FakeJob:
    job_id: str
    user: str
    account: str
    partition: str
    start: int | None
    end: int | None
    alloc_tres: str
    state: str = "COMPLETED"
    qos: str = "normal"


@dataclass
class FakeSlurm:
    assocs: list[list[str]] = field(default_factory=list)  # [account, user, parent, fairshare, grptres]
    qos: dict[str, list[str]] = field(default_factory=dict)  # name -> [priority, mode, factor, preempt]
    # (account, user or "") -> the QOS set on that association; absent: inherited (root: normal), as slurmdbd does
    assoc_qos: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    jobs: list[FakeJob] = field(default_factory=list)
    sshare_text: str = ""
    sshare_json: str = ""
    squeue_json: str = ""  # the jobs of squeue --json, printed by the job summaries (squeue --Format) too
    calls: list[tuple[str, ...]] = field(default_factory=list)
    envs: list[dict | None] = field(default_factory=list)
    cluster: str = "lab"

    @classmethod
    def recorded(cls) -> FakeSlurm:
        """The half-configured small-lab state of tests/data/slurm."""
        fake = cls()
        for line in (DATA / "sacctmgr-assoc-small-lab.parsable2").read_text().splitlines():
            fake.assocs.append(line.split("|"))
        for line in (DATA / "sacctmgr-qos-small-lab.parsable2").read_text().splitlines():
            name, *rest = line.split("|")
            fake.qos[name] = rest
        fake.sshare_text = (DATA / "sshare-small-lab.parsable2").read_text()
        fake.sshare_json = (DATA / "sshare-small-lab.v0.0.42.json").read_text()
        return fake

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None) -> Result:
        argv = tuple(argv)
        self.calls.append(argv)
        self.envs.append(env)
        tool = {"sacct": self._sacct, "sshare": self._sshare, "sacctmgr": self._sacctmgr, "squeue": self._squeue}.get(
            argv[0]
        )
        if tool is None:
            raise UnknownCommand(f"not a Slurm command the accounting code may run: {argv!r}")
        code, out, err = tool(list(argv[1:]))
        res = Result(argv, code, out, err)
        if check and code:
            raise CommandError(res)
        return res

    # ---- sacct -----------------------------------------------------------------------------

    def _sacct(self, args):
        # -P: '|' between fields; -p: after each, --delimiter=D instead of '|' (sacct ignores it without -p/-P)
        delim = args.pop(4)[len("--delimiter=") :] if len(args) > 4 and args[4].startswith("--delimiter=") else "|"
        expect = ["-a", "-X", None, "--noheader", "-S", None, "-E", None, "-o", None]
        if (
            len(args) != len(expect)
            or args[2] not in ("-P", "-p")
            or any(e is not None and a != e for a, e in zip(args, expect, strict=False))
        ):
            raise UnknownCommand(f"sacct {args!r}")
        lo, hi = (datetime.fromisoformat(args[5]).timestamp(), datetime.fromisoformat(args[7]).timestamp())
        fields = args[9].split(",")
        out = [self._job_line(j, fields, delim, args[2] == "-p") for j in self.jobs if self._overlaps(j, lo, hi)]
        return 0, "".join(out), ""

    def _squeue(self, args):
        delim = summaries_delimiter(["squeue", *args])
        if delim is None or not self.squeue_json:
            raise UnknownCommand(f"squeue {args!r}")
        return 0, squeue_summaries(self.squeue_json, delim), ""

    @staticmethod
    def _overlaps(job: FakeJob, lo: float, hi: float) -> bool:
        if job.start is None:
            return False
        return job.start < hi and (job.end is None or job.end >= lo)

    @staticmethod
    def _job_line(job: FakeJob, fields, delim: str = "|", ending: bool = False) -> str:
        # SLURM_TIME_FORMAT=%s: epoch seconds; unknown times print "Unknown"
        def t(v):
            return "Unknown" if v is None else str(v)

        values = {
            "JobID": job.job_id,
            "User": job.user,
            "Account": job.account,
            "Partition": job.partition,
            "State": job.state,
            "Start": t(job.start),
            "End": t(job.end),
            "Elapsed": "",
            "ElapsedRaw": str((job.end or job.start or 0) - (job.start or 0)),
            "AllocTRES": job.alloc_tres,
            "ReqTRES": job.alloc_tres,
            "QOS": job.qos,
        }
        unknown = [f for f in fields if f not in values]
        if unknown:
            raise UnknownCommand(f"sacct field(s) {unknown}")
        return delim.join(values[f] for f in fields) + (delim if ending else "") + "\n"

    # ---- sshare ----------------------------------------------------------------------------

    def _sshare(self, args):
        if args == ["-a", "-l", "--parsable2"]:
            return 0, self.sshare_text, ""
        if args == ["-a", "--json"] and self.sshare_json:
            return 0, self.sshare_json, ""
        raise UnknownCommand(f"sshare {args!r}")

    # ---- sacctmgr --------------------------------------------------------------------------

    def _sacctmgr(self, args):
        if args[:3] == ["--noheader", "--parsable2", "show"]:
            return self._show(args[3:])
        if args[:1] != ["-i"]:
            raise UnknownCommand(f"sacctmgr without -i would prompt: {args!r}")
        verb, entity, *rest = args[1:]
        handler = getattr(self, f"_{verb}_{entity}", None)
        if handler is None:
            raise UnknownCommand(f"sacctmgr {verb} {entity}")
        return handler(rest)

    def _show(self, args):
        if args[0] == "assoc" and args[1:3] == ["where", f"cluster={self.cluster}"]:
            if args[3:] == ["format=account,user,qos"]:
                return (
                    0,
                    "".join(f"{a[0]}|{a[1]}|{','.join(sorted(self.effective_qos(a[0], a[1])))}\n" for a in self.assocs),
                    "",
                )
            if args[3:] != ["format=account,user,parentname,fairshare,grptres"]:
                raise UnknownCommand(f"show assoc {args!r}")
            return 0, "".join("|".join(a) + "\n" for a in self.assocs), ""
        if args == ["qos", "format=name,priority,preemptmode,usagefactor,preempt"]:
            return 0, "".join("|".join([n, *v]) + "\n" for n, v in self.qos.items()), ""
        raise UnknownCommand(f"sacctmgr show {args!r}")

    def _opts(self, items, allowed):
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or key.lower() not in allowed:
                raise UnknownCommand(f"sacctmgr option {item!r}")
            out[key.lower()] = value
        return out

    def effective_qos(self, account: str, user: str = "") -> frozenset[str]:
        """What ``show assoc`` prints in the qos column: the association's own list, else its parent's."""
        if (account, user) in self.assoc_qos:
            return self.assoc_qos[(account, user)]
        if user:
            return self.effective_qos(account)
        acct = self._account(account)
        if account == "root" or acct is None:
            return frozenset({"normal"}) if account == "root" else frozenset()
        return self.effective_qos(acct[2] or "root")

    def _set_qos(self, key: tuple[str, str], value: str):
        """``qos=a,b`` replaces the list, ``qos+=a`` adds to and ``qos-=a`` takes from what it has now."""
        op = value[0] if value[:1] in "+-" and value[:1] else ""
        names = frozenset(n for n in value[len(op) :].split(",") if n)
        if not names or any(n not in self.qos for n in names):
            return 1, "", " Unknown QOS\n"
        have = self.effective_qos(*key)
        self.assoc_qos[key] = have | names if op == "+" else have - names if op == "-" else names
        return None

    def _account(self, name):
        return next((a for a in self.assocs if a[0] == name and a[1] == ""), None)

    def _add_account(self, rest):
        name, opts = rest[0], self._opts(rest[1:], {"cluster", "parent", "fairshare", "description"})
        if self._account(name):
            return 1, "", " Nothing new added.\n"
        if opts.get("cluster") != self.cluster or not self._account(opts.get("parent", "root")):
            return 1, "", " Need a valid cluster and parent\n"
        self.assocs.append([name, "", opts.get("parent", "root"), opts.get("fairshare", "1"), ""])
        return 0, " Adding Account(s)\n", ""

    def _add_user(self, rest):
        name, opts = rest[0], self._opts(rest[1:], {"account", "cluster"})
        if not self._account(opts.get("account", "")) or opts.get("cluster") != self.cluster:
            return 1, "", " No such account\n"
        if any(a[0] == opts["account"] and a[1] == name for a in self.assocs):
            return 1, "", " Nothing new added.\n"
        self.assocs.append([opts["account"], name, "", "1", ""])
        return 0, " Adding User(s)\n", ""

    def _modify_account(self, rest):
        if rest[0] != "where" or "set" not in rest:
            raise UnknownCommand(f"modify account {rest!r}")
        cut = rest.index("set")
        where = self._opts(rest[1:cut], {"name", "cluster"})
        changes = self._opts(rest[cut + 1 :], {"parent", "fairshare", "grptres", "qos+", "qos-", "qos"})
        acct = self._account(where.get("name"))
        if acct is None or where.get("cluster") != self.cluster:
            return 1, "", " Nothing modified\n"
        for key in ("qos", "qos+", "qos-"):
            if key in changes:
                failed = self._set_qos((acct[0], ""), key[3:] + changes[key])
                if failed:
                    return failed
        if "parent" in changes:
            if not self._account(changes["parent"]):
                return 1, "", " No such parent\n"
            acct[2] = changes["parent"]
        if "fairshare" in changes:
            acct[3] = changes["fairshare"]
        if "grptres" in changes:
            acct[4] = _merge_tres(acct[4], changes["grptres"])
        return 0, " Modified account associations...\n", ""

    def _modify_user(self, rest):
        if rest[0] != "where" or "set" not in rest:
            raise UnknownCommand(f"modify user {rest!r}")
        cut = rest.index("set")
        where = self._opts(rest[1:cut], {"name", "account", "cluster"})
        changes = self._opts(rest[cut + 1 :], {"qos+", "qos-", "qos"})
        if where.get("cluster") != self.cluster or not any(
            a[0] == where.get("account") and a[1] == where.get("name") for a in self.assocs
        ):
            return 1, "", " Nothing modified\n"
        for key in ("qos", "qos+", "qos-"):
            if key in changes:
                failed = self._set_qos((where["account"], where["name"]), key[3:] + changes[key])
                if failed:
                    return failed
        return 0, " Modified user associations...\n", ""

    def _add_qos(self, rest):
        if len(rest) != 1 or rest[0] in self.qos:
            return 1, "", " Nothing new added.\n"
        self.qos[rest[0]] = ["0", "cluster", "1.000000", ""]
        return 0, " Adding QOS(s)\n", ""

    def _modify_qos(self, rest):
        if rest[0] != "where" or "set" not in rest:
            raise UnknownCommand(f"modify qos {rest!r}")
        cut = rest.index("set")
        name = self._opts(rest[1:cut], {"name"}).get("name")
        changes = self._opts(rest[cut + 1 :], {"priority", "preemptmode", "usagefactor", "preempt"})
        if name not in self.qos:
            return 1, "", " Nothing modified\n"
        q = self.qos[name]
        if "priority" in changes:
            q[0] = str(int(changes["priority"]))
        if "preemptmode" in changes:
            mode = changes["preemptmode"].lower()
            if mode not in ("off", "cluster", "cancel", "requeue", "suspend", "gang"):
                return 1, "", f" Unknown preempt mode {mode}\n"
            q[1] = "cluster" if mode in ("off", "cluster") else mode
        if "usagefactor" in changes:
            q[2] = f"{float(changes['usagefactor']):f}"
        if "preempt" in changes:
            names = [n for n in changes["preempt"].split(",") if n]
            if any(n not in self.qos for n in names):
                return 1, "", " You gave a bad qos\n"
            q[3] = ",".join(names)
        return 0, " Modified qos...\n", ""


def _merge_tres(current: str, change: str) -> str:
    tres = dict(item.split("=") for item in current.split(",") if item)
    for item in change.split(","):
        key, value = item.split("=")
        if value == "-1":
            tres.pop(key, None)
        else:
            tres[key] = value
    return ",".join(f"{k}={v}" for k, v in sorted(tres.items()))


def summaries_delimiter(argv) -> str | None:
    """The delimiter of a job summaries command (commands.job_summaries), None for any other argv."""
    from slurm_gpushare.slurm import commands

    argv = list(argv)
    head = commands.job_summaries("")[:4]
    if argv[:4] != head or len(argv) != 5:
        return None
    specs = argv[4].split(",")
    names = tuple(spec.split(":", 1)[0] for spec in specs)
    delims = {spec.split(":", 1)[1] for spec in specs if ":" in spec}
    if names != commands.JOB_SUMMARY_FIELDS or len(delims) != 1:
        raise UnknownCommand(f"squeue --Format {argv[4]!r}")
    return delims.pop()


def squeue_summaries(squeue_json: str, delim: str = "|") -> str:
    """What ``squeue --Format`` (commands.job_summaries(delim), SLURM_TIME_FORMAT=%s) prints for the jobs of a
    ``squeue --json`` document of the same moment, as real 24.11.5 printed it (checked against a recording
    of both at one moment: tests/data/slurm/recorded-24.11.5/summaries/, test_summaries.py): ``delim`` after
    every field."""
    import json

    def num(v):
        return v.get("number") if isinstance(v, dict) and v.get("set", True) else (None if isinstance(v, dict) else v)

    lines = []
    for j in json.loads(squeue_json)["jobs"]:
        state = j["job_state"][0] if isinstance(j["job_state"], list) else j["job_state"]
        array_job, task = num(j.get("array_job_id")) or 0, num(j.get("array_task_id"))
        task_text = str(task) if task is not None else (j.get("array_task_string") or "N/A") if array_job else "N/A"
        alloc = j.get("tres_req_str") if state == "PENDING" else j.get("tres_alloc_str")
        fields = [
            j["job_id"],
            array_job or j["job_id"],
            task_text,
            state,
            j.get("state_reason") or "None",
            j.get("user_name", ""),
            j.get("account", ""),
            j.get("partition", ""),
            j.get("qos", ""),
            j.get("tres_per_node") or "N/A",
            num(j.get("submit_time")),
            j.get("nodes") or "",
            alloc or "",
        ]
        lines.append("".join(f"{f}{delim}" for f in fields))
    return "".join(line + "\n" for line in lines)
