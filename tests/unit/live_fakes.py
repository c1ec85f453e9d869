"""A stateful fake of the Slurm commands the live planner's apply path runs (through the client, slurm/relayoutjob.py).

``FakeCtld`` is a Runner: scontrol create/show/delete/update reservation,
scontrol update of a node (drain), sbatch --parsable (a script on stdin) and
sacct of one job answer as Slurm 24.11 does, with the same error texts
(src/common/slurm_errno.c; scontrol prefixes "Error creating the
reservation: " or "delete_reservation <arg>: "). Anything else raises
UnknownCommand, so the code cannot drift from the real command lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from slurm_gpushare.proc import CommandError, Result
from tests.unit.slurm_fakes import UnknownCommand


@dataclass
class FakeJob:
    job_id: int
    name: str
    node: str
    reservation: str
    script: str
    options: dict
    state: str = "PENDING"
    exit_code: str = "0:0"
    end: int | None = None
    in_sacct: bool = True
    user: str = "root"
    submit: int = 0
    in_squeue: bool = True  # False: slurmctld forgot it (MinJobAge after its end); sacct still has it


@dataclass
class FakeCtld:
    now: float = 1_000_000.0
    reservations: dict[str, dict] = field(default_factory=dict)
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    drains: dict[str, str] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)  # node -> weight set by scontrol update
    calls: list[tuple[str, ...]] = field(default_factory=list)
    next_id: int = 100
    fail_sbatch: str = ""  # when set: sbatch fails with this message
    finished: list[tuple] = field(default_factory=list)  # (job id, start, end, node, AllocTRES) for the history

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None) -> Result:
        argv = tuple(argv)
        self.calls.append(argv)
        tool = {"scontrol": self._scontrol, "sbatch": self._sbatch, "sacct": self._sacct, "squeue": self._squeue}.get(
            argv[0]
        )
        if tool is None:
            raise UnknownCommand(f"not a command the live apply path runs: {argv!r}")
        code, out, err = tool(list(argv[1:]), input, env)
        res = Result(argv, code, out, err)
        if check and code:
            raise CommandError(res)
        return res

    # ---- scontrol ---------------------------------------------------------------------------
    def _scontrol(self, args, input, env):
        if args[:2] == ["create", "reservation"]:
            return self._create(args[2:])
        if args == ["show", "reservation", "--json"]:
            return (
                0,
                json.dumps(
                    {
                        "reservations": [self._res_json(n, r) for n, r in self.reservations.items()],
                        "errors": [],
                        "warnings": [],
                    }
                ),
                "",
            )
        if args[:1] == ["delete"] and len(args) == 2 and args[1].startswith("ReservationName="):
            name = args[1].split("=", 1)[1]
            if name not in self.reservations:
                return 1, "", f"delete_reservation {args[1]}: Requested reservation is invalid\n"
            if any(j.reservation == name and j.state in ("PENDING", "RUNNING") for j in self.jobs.values()):
                return 1, "", f"delete_reservation {args[1]}: Requested reservation is in use\n"
            del self.reservations[name]
            return 0, "", ""
        if args[:1] == ["update"] and args[1:2] and args[1].startswith("ReservationName="):
            name = args[1].split("=", 1)[1]
            if len(args) != 3 or not args[2].startswith("EndTime=now+") or not args[2].endswith("minutes"):
                raise UnknownCommand(f"scontrol update reservation {args!r}")
            if name not in self.reservations:
                return 1, "", "Error updating the reservation: Requested reservation is invalid\n"
            self.reservations[name]["end"] = self.now + 60 * int(args[2][len("EndTime=now+") : -len("minutes")])
            return 0, "Reservation updated.\n", ""
        if args[:1] == ["update"] and args[1:2] and args[1].startswith("nodename="):
            opts = dict(a.split("=", 1) for a in args[1:])
            if set(opts) == {"nodename", "weight"}:  # scontrol takes 0..2^32-2 ("Invalid weight" otherwise)
                if not opts["weight"].isdigit():
                    return 1, "", f"Invalid weight {opts['weight']}\n"
                self.weights[opts["nodename"]] = int(opts["weight"])
                return 0, "", ""
            if opts.get("state") != "drain" or "reason" not in opts:
                raise UnknownCommand(f"scontrol update node {args!r}")
            self.drains[opts["nodename"]] = opts["reason"]
            return 0, "", ""
        raise UnknownCommand(f"scontrol {args!r}")

    def _create(self, args):
        opts = {}
        for a in args:
            key, sep, value = a.partition("=")
            if not sep or key in opts:
                raise UnknownCommand(f"scontrol create reservation {args!r}")
            opts[key] = value
        if set(opts) != {"ReservationName", "Nodes", "StartTime", "Duration", "Users", "Flags"}:
            raise UnknownCommand(f"scontrol create reservation with {sorted(opts)}")
        if opts["StartTime"] != "now" or opts["Users"] != "root" or opts["Flags"] != "MAINT,IGNORE_JOBS":
            raise UnknownCommand(f"scontrol create reservation {opts}")
        name = opts["ReservationName"]
        if name in self.reservations:
            return 1, "", "Error creating the reservation: Duplicate reservation name\n"
        self.reservations[name] = {
            "node": opts["Nodes"],
            "start": self.now,
            "end": self.now + 60 * int(opts["Duration"]),
        }
        return 0, f"Reservation created: {name}\n", ""

    @staticmethod
    def _res_json(name, r):
        return {
            "name": name,
            "node_list": r["node"],
            "flags": ["MAINT", "IGNORE_JOBS", "SPEC_NODES"],
            "users": "root",
            "start_time": {"set": True, "infinite": False, "number": int(r["start"])},
            "end_time": {"set": True, "infinite": False, "number": int(r["end"])},
        }

    # ---- sbatch / sacct ----------------------------------------------------------------------
    def _sbatch(self, args, input, env):
        if args[:1] != ["--parsable"] or not input or not input.startswith("#!"):
            raise UnknownCommand(f"sbatch {args!r} (want --parsable and a script on stdin)")
        opts = {}
        for a in args[1:]:
            key, sep, value = a.partition("=")
            if not key.startswith("--") or not sep:
                raise UnknownCommand(f"sbatch option {a!r}")
            opts[key[2:]] = value
        if self.fail_sbatch:
            return 1, "", f"sbatch: error: {self.fail_sbatch}\n"
        if opts.get("reservation") not in self.reservations:
            return 1, "", "sbatch: error: Batch job submission failed: Requested reservation is invalid\n"
        self.next_id += 1
        self.jobs[self.next_id] = FakeJob(
            self.next_id,
            opts.get("job-name", ""),
            opts.get("nodelist", ""),
            opts["reservation"],
            input,
            opts,
            submit=int(self.now),
        )
        return 0, f"{self.next_id}\n", ""

    def user_job(self, name: str, user: str) -> int:
        """A user's job named as the planner names its own (any user may choose a job's name)."""
        self.next_id += 1
        self.jobs[self.next_id] = FakeJob(
            self.next_id, name, "", "", "#!/bin/sh\n", {}, user=user, submit=int(self.now)
        )
        return self.next_id

    def _squeue(self, args, input, env):
        """``squeue --all -h -t all -u USER --name=NAME -o %i|%T|%V`` (the jobs named so, of that user)."""
        if (
            len(args) != 9
            or args[:5] != ["--all", "-h", "-t", "all", "-u"]
            or not args[6].startswith("--name=")
            or args[7:] != ["-o", "%i|%T|%V"]
        ):
            raise UnknownCommand(f"squeue {args!r}")
        if (env or {}).get("SLURM_TIME_FORMAT") != "%s":
            raise UnknownCommand("squeue without SLURM_TIME_FORMAT=%s: %V would not be epoch seconds")
        name = args[6].split("=", 1)[1]
        return (
            0,
            "".join(
                f"{j.job_id}|{j.state}|{j.submit}\n"
                for j in self.jobs.values()
                if j.name == name and j.user == args[5] and j.in_squeue
            ),
            "",
        )

    def _sacct(self, args, input, env):
        if args[:4] == ["-a", "-X", "-P", "--noheader"]:
            return self._history(args, env)
        if args[:5] == ["-X", "-P", "-n", "-u", "root"]:
            return self._named(args, env)
        if args[:6] != ["-a", "-X", "-P", "-n", "-o", "JobID,State,ExitCode,End,NodeList"] or args[6] != "-j":
            raise UnknownCommand(f"sacct {args!r}")
        if (env or {}).get("SLURM_TIME_FORMAT") != "%s":
            raise UnknownCommand("sacct without SLURM_TIME_FORMAT=%s: End would not be epoch seconds")
        job = self.jobs.get(int(args[7]))
        if job is None or not job.in_sacct:
            return 0, "", ""
        end = str(job.end) if job.end else "Unknown"
        return 0, f"{job.job_id}|{job.state}|{job.exit_code}|{end}|{job.node}\n", ""

    def _named(self, args, env):
        """``sacct -X -P -n -u root --name=NAME -S START -o JobID,State,Submit``: the jobs of that name accounting has
        (submitted before START too: sacct selects by the time a job was eligible or ran, not by its submission)."""
        import time

        if (
            len(args) != 10
            or not args[5].startswith("--name=")
            or args[6] != "-S"
            or args[8:] != ["-o", "JobID,State,Submit"]
        ):
            raise UnknownCommand(f"sacct {args!r}")
        if (env or {}).get("SLURM_TIME_FORMAT") != "%s":
            raise UnknownCommand("sacct without SLURM_TIME_FORMAT=%s: Submit would not be epoch seconds")
        time.strptime(args[7], "%Y-%m-%dT%H:%M:%S")  # the form sacct takes; anything else raises
        name = args[5].split("=", 1)[1]
        return (
            0,
            "".join(
                f"{j.job_id}|{j.state}|{j.submit}\n"
                for j in self.jobs.values()
                if j.name == name and j.user == "root" and j.in_sacct
            ),
            "",
        )

    def _history(self, args, env):
        """The live planner's history (slurm/history.py): the jobs that ended in the window, its finished fake
        jobs (the relayout jobs: no GRES) and ``finished`` (jobs the test says ran), as sacct -P prints them."""
        if (
            len(args) != 10
            or args[4] != "-S"
            or args[6] != "-E"
            or args[8] != "-o"
            or args[9] != "JobID,State,Start,End,NodeList,AllocTRES"
        ):
            raise UnknownCommand(f"sacct {args!r}")
        if (env or {}).get("SLURM_TIME_FORMAT") != "%s":
            raise UnknownCommand("sacct without SLURM_TIME_FORMAT=%s: its times would not be epoch seconds")
        lines = [
            f"{j.job_id}|{j.state}|{j.end - 3}|{j.end}|{j.node}|billing=1,cpu=1,node=1"
            for j in self.jobs.values()
            if j.end
        ]
        lines += [
            f"{job_id}|COMPLETED|{int(start)}|{int(end)}|{node}|{tres}"
            for job_id, start, end, node, tres in self.finished
        ]
        return 0, "".join(line + "\n" for line in lines), ""

    def finish(self, job_id: int, state: str = "COMPLETED", exit_code: str = "0:0") -> None:
        job = self.jobs[job_id]
        job.state, job.exit_code, job.end = state, exit_code, int(self.now)


def carol_job(i: int, state: str, gres: str, now: float, node: str = "", count: int = 1, reason: str = ""):
    """One of carol's batch jobs as the Slurm client reads it: running on ``node`` (count of ``gres`` on GPU 0) or,
    without a node, pending for ``reason`` (default Resources)."""
    from slurm_gpushare.slurm.model import GresUse, Job

    alloc = {node: {gres: GresUse(count, (0,))}} if node else {}
    return Job(
        i,
        None,
        None,
        f"j{i}",
        "carol",
        "biology",
        "batch",
        "normal",
        state,
        reason or ("None" if node else "Resources"),
        node,
        {gres: count},
        alloc,
        now - 60,
        now + 100 if node else None,
        100,
    )
