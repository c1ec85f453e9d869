"""sbatch throughput on the docker test cluster: submissions per second, and time until all jobs are done.

    python bench/cluster_throughput.py [--jobs 500] [--parallel 1] [--project NAME] [--keep]
                                       [--gres SPEC] [--hold] [--policy etc/small-lab.yaml]

Brings the test cluster up through ``TestCluster`` (docker/, the policy's
rendered config), or reuses it when the compose project ``--project`` already
answers, then submits ``--jobs`` trivial batch jobs (``--wrap true``, output
/dev/null, as alice in account physics) as fast as it can from inside the
slurmctld container: one ``docker exec`` runs a Python loop there, so the
timings are sbatch's own, not docker's. ``--parallel K`` runs K submitters at
once. It then polls squeue (inside the container too) until every job has
left the queue and counts the final states from sacct. ``--hold`` submits held
jobs and cancels them instead (submission cost only). A cluster this script
brought up is taken down at the end unless ``--keep``. Figures only.

This is the baseline that ``bench/submit.py --cluster`` (the same
measurement with and without JobSubmitPlugins=lua) builds on.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.proc import CommandError  # noqa: E402
from slurm_gpushare.testcluster.cluster import TestCluster  # noqa: E402

USER, ACCOUNT = "alice", "physics"
DEFAULT_PROJECT = "gpusharebench"
POLICY = ROOT / "etc" / "small-lab.yaml"

# Runs inside slurmctld as USER. argv[1]: JSON config. Prints one JSON object.
LOOP = r"""
import json, subprocess, sys, threading, time
cfg = json.loads(sys.argv[1])
mix = cfg.get("mix") or [[]]
argvs = [["sbatch", "--parsable", "--job-name=" + cfg["name"], *cfg["options"], *m, "--wrap", "true"] for m in mix]
lock = threading.Lock()
todo = list(range(cfg["jobs"]))[::-1]
lat, ids, errors = [], [], []

def worker():
    while True:
        with lock:
            if not todo:
                return
            argv = argvs[todo.pop() % len(argvs)]
        s = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True)
        took = time.monotonic() - s
        with lock:
            lat.append(took)
            if p.returncode == 0:
                ids.append(int(p.stdout.strip().split(";")[0]))
            else:
                errors.append(p.stderr.strip())

def queued():
    argv = ["squeue", "-h", "-u", cfg["user"], "-n", cfg["name"], "-o", "%i"]
    p = subprocess.run(argv, capture_output=True, text=True)
    return None if p.returncode else len(p.stdout.split())

t0 = time.monotonic()
threads = [threading.Thread(target=worker) for _ in range(cfg["parallel"])]
for t in threads:
    t.start()
for t in threads:
    t.join()
t1 = time.monotonic()
if cfg["hold"]:
    subprocess.run(["scancel", "-u", cfg["user"], "-n", cfg["name"]], capture_output=True)
done, left = None, None
deadline = time.monotonic() + cfg["timeout"]
while time.monotonic() < deadline:
    left = queued()
    if left == 0:
        done = time.monotonic()
        break
    time.sleep(0.2)
print(json.dumps({"lat": lat, "ids": ids, "errors": errors[:5], "failed": len(errors),
                  "submit_s": t1 - t0, "drain_s": None if done is None else done - t0, "left": left}))
"""


@dataclass
class Figures:
    label: str
    jobs: int
    parallel: int
    options: list[str]
    hold: bool
    submitted: int
    failed: int
    submit_s: float
    latencies: list[float] = field(repr=False)
    drain_s: float | None  # first submission -> queue empty (jobs done, or cancelled with --hold)
    states: dict[str, int]
    errors: list[str]
    ctld_usec: list[int] = field(default_factory=list, repr=False)  # slurmctld's own time per submit RPC

    @property
    def rate(self) -> float:
        return self.submitted / self.submit_s if self.submit_s > 0 else 0.0

    def pct(self, q: float) -> float:
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")

    def lines(self) -> list[str]:
        what = " ".join(self.options) or "(no GRES)"
        out = [
            f"{self.label}: {self.jobs} x sbatch --wrap true {what}{' --hold' if self.hold else ''}, {self.parallel} "
            "submitter(s)",
            f"  submitted {self.submitted}, failed {self.failed}, in {self.submit_s:.2f} s: {self.rate:.1f} "
            "submissions/s",
            f"  sbatch latency ms: p50 {self.pct(0.5):.1f}  p90 {self.pct(0.9):.1f}  p99 {self.pct(0.99):.1f}  "
            f"mean {statistics.fmean(self.latencies) * 1000 if self.latencies else float('nan'):.1f}",
        ]
        if self.ctld_usec:
            u = sorted(self.ctld_usec)
            out.append(
                f"  slurmctld submit RPC us (its log, {len(u)} jobs): p50 {statistics.median(u):.0f}  "
                f"p90 {u[int(0.9 * (len(u) - 1))]}  mean {statistics.fmean(u):.0f}"
            )
        if self.drain_s is None:
            out.append("  queue did not drain before the timeout")
        elif self.hold:
            out.append(f"  held jobs cancelled; queue empty {self.drain_s:.1f} s after the first submission")
        else:
            states = ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())) or "no sacct records"
            out.append(f"  all jobs done {self.drain_s:.1f} s after the first submission; sacct: {states}")
        out += [f"  error: {e}" for e in self.errors]
        return out


# ---- the cluster -------------------------------------------------------------------
def answers(c: TestCluster) -> bool:
    try:
        res = c.slurm(["scontrol", "ping"], timeout=30, check=False)
    except CommandError:
        return False
    return res.returncode == 0 and "UP" in res.stdout


def live_setting(c: TestCluster, key: str) -> str:
    """A value of `scontrol show config` ('' when unset or '(null)')."""
    for line in c.slurm(["scontrol", "show", "config"]).stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            value = value.strip()
            return "" if value == "(null)" else value
    return ""


def wait_answers(c: TestCluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(c):
            return
        time.sleep(1)
    raise SystemExit(f"slurmctld of project {c.project} does not answer after {timeout:.0f} s")


def open_cluster(
    project: str, policy: Path = POLICY, build: bool = True, workdir: Path | None = None
) -> tuple[TestCluster, bool]:
    """(cluster, whether this call started it). A running project is reused as it is."""
    kwargs = {"workdir": workdir} if workdir else {}
    c = TestCluster(policy, project=project, **kwargs)
    c.write_config()  # the compose files exec needs; the running cluster is not touched
    if answers(c):
        print(f"reusing the running cluster {project}", flush=True)
        return c, False
    t0 = time.monotonic()
    if build:
        c.build()
    c.down()  # leftovers of a killed run
    c.up()
    c.wait_idle(timeout=240)
    c.slurm(["gpushare", "accounts", "apply", "/etc/gpushare/policy.yaml"], timeout=120)
    print(f"cluster {project} up in {time.monotonic() - t0:.0f} s", flush=True)
    return c, True


def wait_queue_empty(c: TestCluster, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not c.slurm(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
            return
        time.sleep(1)
    raise SystemExit(f"the queue of {c.project} is not empty after {timeout:.0f} s")


_RPC = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) .*usec=(\d+)")


def ctld_usec(c: TestCluster, ids: list[int]) -> list[int]:
    """slurmctld's 'usec=' for each job's submit RPC (SlurmctldDebug info and up logs it): the controller's
    time for the request, job_submit plugin included, without sbatch's process start and munge."""
    log = live_setting(c, "SlurmctldLogFile")
    if not log:
        return []
    out = c.exec(
        "slurmctld", ["grep", "-F", "_slurm_rpc_submit_batch_job: JobId=", log], check=False, timeout=120
    ).stdout
    want = set(ids)
    return [int(m[2]) for m in _RPC.finditer(out) if int(m[1]) in want]


def sacct_states(c: TestCluster, name: str, ids: list[int], timeout: float = 60, user: str = USER) -> dict[str, int]:
    """Final states of the jobs from sacct (slurmdbd may lag behind slurmctld a little)."""
    want = set(ids)
    deadline = time.monotonic() + timeout
    states: dict[str, int] = {}
    while True:
        out = c.slurm(
            ["sacct", "-X", "-n", "-P", "-u", user, f"--name={name}", "-S", "now-1days", "-o", "JobID,State"],
            check=False,
        ).stdout
        recs = {
            int(j): s.split()[0]
            for j, s in (line.split("|")[:2] for line in out.splitlines() if "|" in line)
            if j.isdigit() and int(j) in want
        }
        states = {}
        for s in recs.values():
            states[s] = states.get(s, 0) + 1
        ended = sum(v for k, v in states.items() if k not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"))
        if ended >= len(want) or time.monotonic() > deadline:
            missing = len(want) - len(recs)
            if missing:
                states["(not in sacct yet)"] = missing
            return states
        time.sleep(2)


# ---- the measurement -------------------------------------------------------------------
def measure(
    c: TestCluster,
    jobs: int,
    options: list[str] | None = None,
    parallel: int = 1,
    hold: bool = False,
    label: str = "sbatch",
    timeout: float = 900,
    mix: list[list[str]] | None = None,
    user: str = USER,
    account: str = ACCOUNT,
) -> Figures:
    """Submit ``jobs`` trivial jobs from inside slurmctld and time them (see the module doc).
    With ``mix``, job i also gets the options ``mix[i % len(mix)]``."""
    wait_queue_empty(c)
    name = f"gpushare-bench-{uuid.uuid4().hex[:8]}"
    opts = [f"--account={account}", "--output=/dev/null", *(["--hold"] if hold else []), *(options or [])]
    cfg = {
        "name": name,
        "jobs": jobs,
        "options": opts,
        "parallel": parallel,
        "hold": hold,
        "user": user,
        "timeout": timeout,
        "mix": mix or [],
    }
    res = c.exec("slurmctld", ["python3", "-c", LOOP, json.dumps(cfg)], user=user, timeout=timeout + jobs + 120)
    data = json.loads(res.stdout.strip().splitlines()[-1])
    states = {} if hold else sacct_states(c, name, data["ids"], user=user)
    shown = list(options or []) + (["mixed: " + " | ".join(" ".join(m) or "(no GRES)" for m in mix)] if mix else [])
    return Figures(
        label,
        jobs,
        parallel,
        shown,
        hold,
        len(data["ids"]),
        data["failed"],
        data["submit_s"],
        data["lat"],
        data["drain_s"],
        states,
        data["errors"],
        ctld_usec(c, data["ids"]),
    )


def add_arguments(ap: argparse.ArgumentParser, policy: bool = True) -> None:
    """The cluster options, shared with bench/submit.py --cluster (which has its own --policy)."""
    ap.add_argument("--jobs", type=int, default=500, help="submissions per measurement (default 500)")
    ap.add_argument("--parallel", type=int, default=1, help="concurrent sbatch submitters (default 1)")
    ap.add_argument("--project", default=None, help=f"compose project: reused when it runs (default {DEFAULT_PROJECT})")
    if policy:
        ap.add_argument("--policy", type=Path, default=POLICY)
    ap.add_argument("--keep", action="store_true", help="leave a cluster this script started running")
    ap.add_argument("--no-build", action="store_true", help="skip docker/bootstrap.sh when starting a cluster")


# ---- turnover: mixed short jobs, node hooks and scheduler parameters on and off -------------------------
MIXED_USER, MIXED_ACCOUNT = "carol", "biology"  # no GrpTRES quota on this account in the small lab
MIXED = [  # one of each kind the small lab serves; job i gets MIXED[i % 6]
    ["--gres=gpu:l40s:1"],
    ["--gres=shard:1"],
    ["--gres=gpu:a100_40g_1g.5gb:1"],
    ["--gres=mps:25"],
    ["--gres=mps:50"],
    [],
]


def variant_policy(policy: Path, hooks: bool, sched: str, out: Path) -> Path:
    """``policy`` with the node hooks off (no Prolog, Epilog, TaskProlog) and/or Slurm's own SchedulerParameters."""
    raw = yaml.safe_load(policy.read_text())
    cluster = raw["cluster"]
    if not hooks:
        cluster["hooks"] = {**cluster.get("hooks", {}), "prolog": None, "epilog": None, "task_prolog": None}
    if sched == "slurm":
        cluster["scheduler"] = {"slurm_defaults": True}
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def apply_variant(c: TestCluster, policy: Path, hooks: bool, sched: str) -> str:
    """Render the variant into the running cluster (scontrol reconfigure) and wait until every node is idle."""
    path = variant_policy(policy, hooks, sched, c.workdir / f"variant-{'hooks' if hooks else 'nohooks'}-{sched}.yaml")
    c.reconfigure(load_file(path))
    deadline = time.monotonic() + 120
    while True:
        try:
            c.wait_idle(timeout=120)
            prolog, params = (
                live_setting(c, "Prolog[0]") or live_setting(c, "Prolog"),
                live_setting(c, "SchedulerParameters"),
            )
            break
        except Exception:  # slurmctld restarting after the reconfigure
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    want_prolog = bool(c.site.cluster.hooks.prolog) and hooks
    if bool(prolog) != want_prolog:
        raise SystemExit(f"reconfigure did not take: Prolog={prolog!r}, wanted {'a prolog' if want_prolog else 'none'}")
    return f"hooks {'on' if hooks else 'off'}, SchedulerParameters={params or '(Slurm defaults)'}"


def turnover(
    c: TestCluster, policy: Path, jobs: int, rounds: int, hooks: list[bool], scheds: list[str], parallel: int
) -> None:
    """Drain ``jobs`` mixed short jobs under each variant, interleaved round by round; print jobs/s and ratios."""
    variants = [(h, sc) for sc in scheds for h in hooks]
    rates: dict[tuple[bool, str], list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for h, sc in variants:
            label = apply_variant(c, policy, h, sc)
            f = measure(
                c,
                jobs,
                parallel=parallel,
                mix=MIXED,
                user=MIXED_USER,
                account=MIXED_ACCOUNT,
                label=f"round {r + 1}: {label}",
            )
            print("\n".join(f.lines()), flush=True)
            if f.drain_s and set(f.states) == {"COMPLETED"}:
                rates[(h, sc)].append(f.submitted / f.drain_s)
            else:
                print(f"  (not counted: jobs not all COMPLETED or queue not drained: {f.states})", flush=True)
    print(
        f"\nturnover: {jobs} mixed short jobs ({len(MIXED)} kinds) per measurement, {rounds} round(s), jobs/s to drain"
    )
    med = {v: statistics.median(x) if x else float("nan") for v, x in rates.items()}
    for (h, sc), x in rates.items():
        shown = ", ".join(f"{v:.2f}" for v in x)
        print(f"  hooks {'on ' if h else 'off'}  scheduler {sc:8s} median {med[(h, sc)]:.2f} jobs/s  ({shown})")
    for sc in scheds:
        if True in hooks and False in hooks:
            print(f"  ratio hooks on/off, scheduler {sc}: {med[(True, sc)] / med[(False, sc)]:.2f}")
    for h in hooks:
        if "product" in scheds and "slurm" in scheds:
            print(
                f"  ratio scheduler product/slurm, hooks {'on' if h else 'off'}: "
                f"{med[(h, 'product')] / med[(h, 'slurm')]:.2f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--gres", default=None, help="a --gres for every job, e.g. shard:1 (default: none)")
    ap.add_argument("--hold", action="store_true", help="submit held and cancel: submission cost only")
    ap.add_argument(
        "--hooks",
        default=None,
        metavar="on,off",
        help="turnover mode: drain --jobs mixed short jobs (whole GPU, shard, MIG 1g, mps 25 and 50, CPU "
        "only) with the node hooks on and/or off, interleaved, and print jobs/s and the ratio",
    )
    ap.add_argument(
        "--sched",
        default="product",
        metavar="product,slurm",
        help="turnover mode: the policy's SchedulerParameters (product) and/or Slurm's defaults (slurm)",
    )
    ap.add_argument(
        "--rounds", type=int, default=2, help="turnover mode: rounds of the interleaved variants (default 2)"
    )
    args = ap.parse_args()
    c, started = open_cluster(args.project or DEFAULT_PROJECT, args.policy, build=not args.no_build)
    try:
        if args.hooks:
            hooks = [{"on": True, "off": False}[h] for h in args.hooks.split(",")]
            scheds = args.sched.split(",")
            if not set(scheds) <= {"product", "slurm"}:
                raise SystemExit(f"--sched: product and/or slurm, not {args.sched!r}")
            try:
                turnover(c, args.policy, args.jobs, args.rounds, hooks, scheds, args.parallel)
            finally:
                apply_variant(c, args.policy, True, "product")  # leave the cluster as its policy says
            return
        plugins = live_setting(c, "JobSubmitPlugins")
        options = [f"--gres={args.gres}"] if args.gres else []
        f = measure(c, args.jobs, options, args.parallel, args.hold, label=f"JobSubmitPlugins={plugins or '(none)'}")
        print("\n".join(f.lines()))
    finally:
        if started and not args.keep:
            c.down()


if __name__ == "__main__":
    main()
