"""Time the node hooks as Slurm runs them: one process per call, on the fake NVML; the product's own time
apart from the test doubles'.

    python bench/node_hooks.py [--runs 30] [--modes exclusive,shard,mig,mps] [--metrics] [--against TREE]

The prolog, task prolog and epilog are on every job's start and end. Each is
started as Slurm starts it (the script ``gpushare node install`` writes, a
fresh process, the environment slurmd gives it) on a test node built in a
temporary directory: the small-lab policy, a fake NVML with the node's layout,
the rendered gres.conf and MIG include, a node config naming them, the three
hook scripts as ``slurm_gpushare.node.install.hook_script`` writes them for
this interpreter (``#!python -IS``, the import directories ``site`` would add,
the entry point), and for MPS the test-only nvidia-cuda-mps-control
(docker/fakes; a real daemon process). One run per job: prolog, task prolog,
epilog. Plain jobs (below) also run pip's console scripts of the three hooks,
on a job of their own, after those or (every other plain job) before them,
for comparison (``python`` with ``site`` and the wrapper's ``import re``): the
"(console script)" rows. The baseline,
measured in the same run the same way, is a bare ``python -c pass`` of the
same interpreter, measured once per job beside that job's hooks (on a shared
machine the load changes within a run). The first prolog (which builds the
node spec cache from the policy) is reported separately as the cold start.
Shard jobs are given SLURM_JOB_GPUS as exclusive ones are (the index of the
shard's GPU).

Product and test doubles. On the test node part of a hook's wall time is
spent in test doubles that a real node replaces: the fake MPS control client
(a Python program, started three times per MPS job: ``-d``, the job's
settings and ``start_server``, ``quit``; NVIDIA's is a C binary), the epilog's
wait for the fake daemon to exit, and the fake NVML (each call reads its JSON
state under a lock, where pynvml calls the driver). Jobs alternate between
two runs of the same hooks: "plain" (exactly as Slurm would start them) and
"timed", where the hook process (``python -IS -c`` with a line that imports
bench/doubles_clock/sitecustomize.py, then runs the hook's script; the file it
writes to named by GPUSHARE_BENCH_DOUBLES, set only here) times those
seams from inside the hook (``proc.run`` of the fake client from spawn to
reap, ``ProcessHandle.wait`` on the daemon, every ``FakeNvml.nvml*`` call,
and the import of the fake NVML module, where a real node imports pynvml)
and appends the sums to a file. The product's own time of a timed job is its
prolog+epilog wall time minus those sums: the hooks' interpreter start, imports
and work, the journal's fsyncs, the socket probes and /proc scans. It is
measured this way, from the hook's side, rather than by the fake timing itself,
because the fake's own clock starts only after its interpreter has started
(most of its cost). What stays in the product's figure: the timing wrappers
themselves (their cost is the timed wall minus the plain wall, printed) and
the CPU the fake daemon and server take meanwhile on a shared machine. The
product's own with the fake NVML module's import left in (as earlier results
counted it) is printed beside. pynvml's import, which a real node's hooks pay
instead, is printed once beside a bare start, not added to any figure. What a real client would
cost instead is printed as a floor: ``proc.run`` of ``/bin/true`` from this
process (a C program's spawn, exec and reap). The real daemon's and NVML's own
times are not known here and not estimated.

CPU time (user+system) is printed beside wall time, as less sensitive to the
machine's load (not immune: contention inflates it too): a hook's, as this
process's getrusage(RUSAGE_CHILDREN) around it (with the fake clients the
hook reaped, not the fake daemon or server, which it does not), less the fake
clients', the fake NVML calls' and its import's CPU as the clock records them.

Targets (issue 25): the product's own prolog+epilog p50 at most 100 ms per mode
on a quiet machine, at most 150 ms under the load of a running test cluster;
the load average is printed at the start and end of the run.

``--metrics`` turns the policy's cluster.metrics on (textfile collector file
and dcgm-exporter job mapping in the temporary directory), to see what writing
them adds. ``--against TREE`` compares with another checkout (e.g. ``git
archive COMMIT | tar -x -C TREE``): per mode, a test node for each tree, job by
job in turn (the order alternating), the hook scripts written for each tree
(TREE first among the import directories) and its fake control client; prints
both trees' prolog+epilog wall p50 (doubles included), so that a before/after
shares the machine's load. Figures only, no assertions.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from slurm_gpushare.gpu import open_backend, read_mig_minors  # noqa: E402
from slurm_gpushare.gpu.fakenvml import FakeNvml  # noqa: E402
from slurm_gpushare.node import install  # noqa: E402
from slurm_gpushare.node.gresconf import node_gres_conf  # noqa: E402
from slurm_gpushare.node.mig import apply_actions, observe, plan_mig  # noqa: E402
from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render.files import gres_conf  # noqa: E402
from slurm_gpushare.render.header import COMMENT, with_header  # noqa: E402

BIN = Path(sys.executable).parent
SCRIPTS = {"prolog": install.PROLOG, "task prolog": install.TASK_PROLOG, "epilog": install.EPILOG}
CONSOLE = {f"{name} (console script)": [str(BIN / f"gpushare-{name.replace(' ', '-')}")] for name in SCRIPTS}
CONSOLE_JOB = 100000  # the console scripts run job + CONSOLE_JOB
HOOKS = (*SCRIPTS, *CONSOLE)
# a timed hook: its script run by an interpreter started as its #! line says, after the clock's import
CLOCKED = (
    "import sys; sys.path.insert(0, sys.argv[1]); import sitecustomize; del sys.path[0]; "
    "sys.argv[:] = sys.argv[2:]; exec(compile(open(sys.argv[0]).read(), sys.argv[0], 'exec'))"
)
BASELINE = "baseline: python -c pass"
TARGET_MS, LOADED_TARGET_MS = 100.0, 150.0  # issue 25: the product's own prolog+epilog p50 per mode, quiet / loaded
MODES = {
    "exclusive": ("lab-excl01", "1", None),
    "shard": ("lab-shard01", "0", None),
    "mig": ("lab-mig01", "0", None),
    "mps": ("lab-mps01", "0", 25),
}
CLOCK = ROOT / "bench" / "doubles_clock"  # sitecustomize.py: times the doubles from inside a "timed" hook
DOUBLES = ("mps client", "daemon exit", "fake NVML", "fake NVML import")


def build_node(
    tmp: Path, node: str, metrics: bool = False, policy_file: Path = ROOT / "etc" / "small-lab.yaml"
) -> Path:
    """The test node's files (``policy_file``'s node ``node``); returns its node config."""
    raw = yaml.safe_load(policy_file.read_text())
    raw["cluster"]["paths"] = {
        "slurm_conf_dir": str(tmp / "etc"),
        "gres_include": str(tmp / "etc" / "gres.d" / "mig.conf"),
        "state_dir": str(tmp / "state"),
        "log_dir": str(tmp / "log"),
    }
    if metrics:
        raw["cluster"]["metrics"] = {"textfile_dir": str(tmp / "prom"), "dcgm_job_mapping_dir": str(tmp / "dcgm")}
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    site = load_file(policy)
    group = site.group_for_node(node)
    fake = FakeNvml.build(
        tmp / "nvml.json",
        model=group.model.name,
        count=len(group.gpus),
        mig_enabled=[s.index for s in group.gpus if s.mode == "mig"],
        seed=node,
    )
    with open_backend(fake.state_path) as backend:
        apply_actions(backend, plan_mig(group.gpus, observe(backend)))
        include = node_gres_conf(node, group.gpus, backend, read_mig_minors(backend.mig_minors_path))
    (tmp / "etc" / "gres.d").mkdir(parents=True)
    (tmp / "etc" / "gres.conf").write_text(
        with_header(site, "gres.conf", gres_conf(site), COMMENT.get("gres.conf", "#"))
    )
    (tmp / "etc" / "gres.d" / "mig.conf").write_text(include)
    config = tmp / "etc" / "node.yaml"
    config.write_text(
        f"policy: {policy}\nfake_nvml: {fake.state_path}\nstate_dir: {tmp / 'state'}\n"
        f"mps_control: {ROOT / 'docker' / 'fakes' / 'nvidia-cuda-mps-control'}\n"
    )
    return config


def write_scripts(where: Path, import_dirs: list[str]) -> dict[str, list[str]]:
    """The hook scripts as ``gpushare node install`` writes them (this interpreter), in ``where``: name -> argv."""
    where.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, module in SCRIPTS.items():
        script = where / f"gpushare-{name.replace(' ', '-')}"
        script.write_text(install.hook_script(sys.executable, import_dirs, module))
        script.chmod(0o755)
        out[name] = [str(script)]
    return out


def clocked(argv: list[str]) -> list[str]:
    """``argv`` (a hook script) run with the doubles' clock imported first: ``site``, which would import it,
    is off (-S), and -I ignores PYTHONPATH."""
    return [sys.executable, "-IS", "-c", CLOCKED, str(CLOCK), *argv]


def against_node(tmp: Path, node: str, tree: Path) -> Path:
    """A test node whose node config names ``tree``'s fake control client."""
    config = build_node(tmp, node)
    config.write_text(config.read_text().replace(str(ROOT / "docker" / "fakes"), str(tree / "docker" / "fakes")))
    return config


def compare(mode: str, runs: int, tree: Path) -> tuple[list[float], list[float]]:
    """prolog+epilog per job on this tree and on ``tree`` (interleaved job by job)."""
    node, gpus, mps_pct = MODES[mode]
    sums: dict[str, list[float]] = {"this": [], "other": []}
    dirs = install.probe_import_dirs(sys.executable)
    with tempfile.TemporaryDirectory(prefix=f"gpushare-bench-{mode}-") as tmp:
        (Path(tmp) / "this").mkdir()
        (Path(tmp) / "other").mkdir()
        configs = {"this": build_node(Path(tmp) / "this", node), "other": against_node(Path(tmp) / "other", node, tree)}
        hooks = {
            "this": write_scripts(Path(tmp) / "this" / "bin", dirs),
            "other": write_scripts(Path(tmp) / "other" / "bin", [str(tree), *dirs]),
        }
        for job in range(1, runs + 2):
            for which in ("this", "other") if job % 2 else ("other", "this"):
                took = {}
                for name, argv in hooks[which].items():
                    took[name] = timed(argv, hook_env(configs[which], node, job, gpus, mps_pct, name == "task prolog"))
                if job > 1:
                    sums[which].append(took["prolog"] + took["epilog"])
    return sums["this"], sums["other"]


def hook_env(
    config: Path, node: str, job: int, gpus: str, pct: int | None, task: bool, clock: Path | None = None
) -> dict[str, str]:
    """What slurmd gives the hook (no PATH for root hooks), plus the config override; with ``clock`` (a file),
    the file the doubles' timing (bench/doubles_clock, see ``clocked``) appends its sums to."""
    env = {
        "SLURM_JOB_ID": str(job),
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURMD_NODENAME": node,
        "GPUSHARE_NODE_CONFIG": str(config),
    }
    if pct is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    if not task or pct is None:  # mps tasks get no CUDA_VISIBLE_DEVICES from Slurm
        env["SLURM_JOB_GPUS"] = gpus
        env["CUDA_VISIBLE_DEVICES"] = "0" if task else gpus
    if clock is not None:
        env["GPUSHARE_BENCH_DOUBLES"] = str(clock)
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    return timed_cpu(argv, env)[0]


def timed_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one process: its user+system time with that of the children it reaped
    (getrusage(RUSAGE_CHILDREN) of this process around the run)."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{argv[0]} failed ({res.returncode}): {res.stderr.strip()}")
    return elapsed * 1000, (_children_cpu() - c0) * 1000


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def read_doubles(path: Path, hook: str) -> dict:
    """What one timed hook process appended (bench/doubles_clock/sitecustomize.py); the file is then removed."""
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    if len(lines) != 1:
        raise SystemExit(f"the timed {hook} wrote {len(lines)} lines to {path}, not 1: is {CLOCK} imported?")
    words = dict(word.split("=", 1) for word in lines[0].split())
    return {
        "mps client": float(words["mps_ms"]),
        "daemon exit": float(words["wait_ms"]),
        "fake NVML": float(words["nvml_ms"]),
        "fake NVML import": float(words["import_ms"]),
        "import cpu": float(words["import_cpu"]),
        "n_mps": int(words["mps_n"]),
        "n_nvml": int(words["nvml_n"]),
        "other": float(words["other_ms"]),
        "cpu": float(words["mps_cpu"]) + float(words["nvml_cpu"]) + float(words["import_cpu"]),
        "other names": words["other"],
    }


class Measured:
    """One mode's figures: plain wall (and CPU) per hook, and per timed job its prolog+epilog wall and CPU and
    the doubles' sums."""

    def __init__(self):
        self.plain: dict[str, list[float]] = {name: [] for name in (BASELINE, *HOOKS)}
        self.plain_cpu: dict[str, list[float]] = {name: [] for name in (BASELINE, "prolog+epilog")}
        self.timed_wall: list[float] = []
        self.timed_cpu: list[float] = []
        self.doubles: dict[str, list[float]] = {
            key: [] for key in (*DOUBLES, "n_mps", "n_nvml", "other", "cpu", "import cpu")
        }
        self.other_names: set[str] = set()
        self.cold = 0.0

    def add_timed(self, wall: float, cpu: float, seen: list[dict]) -> None:
        self.timed_wall.append(wall)
        self.timed_cpu.append(cpu)
        for key in self.doubles:
            self.doubles[key].append(sum(part[key] for part in seen))
        self.other_names.update(n for part in seen for n in part["other names"].split(",") if n != "-")

    @property
    def double_sums(self) -> list[float]:
        return [sum(self.doubles[k][i] for k in DOUBLES) for i in range(len(self.timed_wall))]

    @property
    def product(self) -> list[float]:
        return [w - d for w, d in zip(self.timed_wall, self.double_sums, strict=False)]

    @property
    def product_with_import(self) -> list[float]:
        """As earlier entries counted it: the fake NVML module's import left in the product's figure."""
        return [p + i for p, i in zip(self.product, self.doubles["fake NVML import"], strict=False)]

    @property
    def product_cpu(self) -> list[float]:
        return [c - d for c, d in zip(self.timed_cpu, self.doubles["cpu"], strict=False)]


def bench_mode(mode: str, runs: int, metrics: bool = False) -> Measured:
    """Job 1 is the cold start; then ``runs`` plain and ``runs`` timed jobs, alternating. A plain job also runs
    the console scripts (``console_job``), every other one before the scripts, else after them."""
    node, gpus, mps_pct = MODES[mode]
    got = Measured()
    with tempfile.TemporaryDirectory(prefix=f"gpushare-bench-{mode}-") as tmp:
        config = build_node(Path(tmp), node, metrics)
        scripts = write_scripts(Path(tmp) / "bin", install.probe_import_dirs(sys.executable))
        clock = Path(tmp) / "doubles.txt"
        for job in range(1, 2 * runs + 2):
            timing = job > 1 and job % 2 == 1
            if job > 1:
                wall, cpu = timed_cpu([sys.executable, "-c", "pass"], {})
                got.plain[BASELINE].append(wall)
                got.plain_cpu[BASELINE].append(cpu)
            console_first = not timing and job % 4 == 0
            took, cpus, seen = console_job(config, node, job, gpus, mps_pct) if console_first else {}, {}, []
            for name, argv in scripts.items():
                task = name == "task prolog"  # never timed
                env = hook_env(config, node, job, gpus, mps_pct, task, None if task or not timing else clock)
                took[name], cpus[name] = timed_cpu(clocked(argv) if timing and not task else argv, env)
                if timing and not task:
                    seen.append(read_doubles(clock, name))
            if job == 1:
                got.cold = took["prolog"]
            elif timing:
                got.add_timed(took["prolog"] + took["epilog"], cpus["prolog"] + cpus["epilog"], seen)
                got.plain["task prolog"].append(took["task prolog"])
            else:
                got.plain_cpu["prolog+epilog"].append(cpus["prolog"] + cpus["epilog"])
                if not console_first:
                    took.update(console_job(config, node, job, gpus, mps_pct))
                for name in HOOKS:
                    got.plain[name].append(took[name])
    return got


def console_job(config: Path, node: str, job: int, gpus: str, pct: int | None) -> dict[str, float]:
    """pip's console scripts of the three hooks on job ``job + CONSOLE_JOB``: wall ms per hook."""
    return {
        name: timed(argv, hook_env(config, node, job + CONSOLE_JOB, gpus, pct, name.startswith("task prolog")))
        for name, argv in CONSOLE.items()
    }


def native_floor(runs: int) -> list[float]:
    """ms for ``proc.run(["/bin/true"])`` in this process: what starting a C client costs a hook at least."""
    from slurm_gpushare.proc import run

    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run(["/bin/true"], env={})
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pynvml_import(runs: int) -> None:
    """What a real node's hook pays to import pynvml (the fake NVML module stands in for it here), beside a bare
    start measured in turn with it: printed, never counted in the product's figures."""
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        print("  (pynvml not installed: its import, which a real node's prolog and epilog each pay, not measured)")
        return
    base, with_it = [], []
    for _ in range(runs):
        base.append(timed([sys.executable, "-I", "-c", "pass"], {}))
        with_it.append(timed([sys.executable, "-I", "-c", "import pynvml"], {}))
    extra = statistics.median(with_it) - statistics.median(base)
    label = "python -I -c 'import pynvml'"
    print(
        f"  {label:34s} {p(with_it)}  (+{extra:.1f} ms over a bare start: a real node's "
        "prolog and epilog each pay it, not in the figures below)"
    )


def p(values: list[float]) -> str:
    return f"p50 {statistics.median(values):7.1f}  p95 {pct(values, 0.95):7.1f}"


def report_mode(mode: str, got: Measured) -> tuple[float, ...]:
    """Print one mode's table; return (baseline, plain wall, doubles, product) prolog+epilog p50s."""
    m50 = statistics.median(got.plain[BASELINE])
    plain_pe = [a + b for a, b in zip(got.plain["prolog"], got.plain["epilog"], strict=False)]
    console_pe = [
        a + b for a, b in zip(got.plain["prolog (console script)"], got.plain["epilog (console script)"], strict=False)
    ]
    print(
        f"  {mode}: first prolog (builds the spec cache from the policy) {got.cold:.0f} ms; "
        f"{len(plain_pe)} plain jobs, {len(got.timed_wall)} timed"
    )
    for name, values in got.plain.items():
        ratio = "" if name == BASELINE else f"  ({statistics.median(values) / m50:4.1f}x baseline)"
        print(f"    {name:34s} {p(values)}{ratio}")
    wall, plain = statistics.median(got.timed_wall), statistics.median(plain_pe)
    print(f"    {'prolog+epilog, plain wall':34s} {p(plain_pe)}")
    saved = statistics.median(console_pe) - statistics.median(plain_pe)
    print(f"    {'  the same, console scripts':34s} {p(console_pe)}  (the scripts save {saved:.1f} ms)")
    print(f"    {'prolog+epilog, timed wall':34s} {p(got.timed_wall)}  (timing wrappers {wall - plain:+.1f} ms)")
    kinds = ", ".join(f"{k} {statistics.median(got.doubles[k]):.1f}" for k in DOUBLES)
    counts = (
        f"{statistics.median(got.doubles['n_mps']):g} client starts, "
        f"{statistics.median(got.doubles['n_nvml']):g} NVML calls"
    )
    print(f"      {'test doubles':32s} {p(got.double_sums)}  (p50s: {kinds}; {counts} per job)")
    product = got.product
    print(f"      {'product own':32s} {p(product)}  ({statistics.median(product) / m50:4.1f}x baseline)")
    print(
        f"      {'product own + fake NVML import':32s} {p(got.product_with_import)}  (as counted before the import "
        "was timed apart)"
    )
    c50 = statistics.median(got.plain_cpu[BASELINE])
    print(f"    CPU ms (user+system, with the reaped fake clients): baseline {p(got.plain_cpu[BASELINE])}")
    print(f"      {'prolog+epilog, plain':32s} {p(got.plain_cpu['prolog+epilog'])}")
    print(f"      {'test doubles (client, NVML, import)':32s} {p(got.doubles['cpu'])}")
    print(
        f"      {'product own':32s} {p(got.product_cpu)}  ({statistics.median(got.product_cpu) / c50:4.1f}x baseline)"
    )
    if got.other_names:
        print(
            f"      (counted as the product's: other commands run, {', '.join(sorted(got.other_names))}: "
            f"p50 {statistics.median(got.doubles['other']):.1f} ms per job)"
        )
    own = statistics.median(product)
    print(
        f"    product's own prolog+epilog p50 {own:.1f} ms: <= {TARGET_MS:g} "
        f"{'met' if own <= TARGET_MS else 'not met'}, "
        f"<= {LOADED_TARGET_MS:g} {'met' if own <= LOADED_TARGET_MS else 'not met'}"
    )
    return (
        m50,
        plain,
        statistics.median(got.double_sums),
        own,
        pct(product, 0.95),
        statistics.median(got.product_with_import),
        c50,
        statistics.median(got.product_cpu),
    )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs",
        type=int,
        default=30,
        help="plain jobs per mode, and as many timed (prolog, task prologs, epilog each)",
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--metrics", action="store_true", help="policy with cluster.metrics on (textfile + dcgm mapping)")
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="TREE",
        help="another checkout: its prolog+epilog beside this tree's, job by job",
    )
    args = ap.parse_args(argv)
    missing = [argv[0] for argv in CONSOLE.values() if not Path(argv[0]).exists()]
    if missing:
        raise SystemExit(f"console scripts missing: {', '.join(missing)} (pip install -e .)")
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    print(f"start: {load()}, nice {os.nice(0)}")
    base = [timed([sys.executable, "-c", "pass"], {}) for _ in range(args.runs)]
    print(
        f"node hooks, {args.runs} jobs per mode (and as many timed), wall ms per process "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs), node metrics {'on' if args.metrics else 'off'}:"
    )
    print(f"  {'baseline: python -c pass':34s} {p(base)}")
    print(f"  {'a C client from a hook: /bin/true':34s} {p(native_floor(args.runs))}  (proc.run: spawn, exec, reap)")
    pynvml_import(args.runs)
    for mode in args.modes.split(",") if args.against else ():
        this, other = compare(mode, args.runs, args.against.resolve())
        a, b = statistics.median(this), statistics.median(other)
        print(
            f"  {mode:10s} prolog+epilog p50 per job: {args.against} {b:6.1f}, this tree {a:6.1f} "
            f"({(a - b) / b * 100:+.0f} %)"
        )
    rows = [
        (mode, report_mode(mode, bench_mode(mode, args.runs, args.metrics)))
        for mode in args.modes.split(",")
        if not args.against
    ]
    if rows:
        print(
            "\n| mode | baseline | prolog+epilog wall (plain) | test doubles | product's own p50 | p95 "
            "| with the fake NVML's import | <= 100 | <= 150 | CPU: baseline | CPU: product's own |"
        )
        print("|---|--:|--:|--:|--:|--:|--:|:-:|:-:|--:|--:|")
        for mode, (m50, plain, doubles, own, own95, with_import, c50, own_cpu) in rows:
            print(
                f"| {mode} | {m50:.1f} | {plain:.1f} | {doubles:.1f} | **{own:.1f}** | {own95:.1f} | "
                f"{with_import:.1f} | {'met' if own <= TARGET_MS else 'not met'} "
                f"| {'met' if own <= LOADED_TARGET_MS else 'not met'} "
                f"| {c50:.1f} | {own_cpu:.1f} |"
            )
    print(f"end: {load()}")


if __name__ == "__main__":
    main()
