"""The GPU-trace placement benchmark: Slurm's placement against FGD, BestFit and Random on the paper's arrivals.

    python bench/placement.py [--seeds 42-51] [--scenarios S1,S2,S3] [--workload NAME|FILE] [--json out.json]
    python bench/placement.py --family [--seeds 42-51] [--workloads a,b] [--jobs 2]  # S1 on the paper's 17 workloads
    python bench/placement.py --family --generated SEED [--count 10]  # S1 on workloads generated from the trace
    python bench/placement.py --planner-only 3 [--scenarios S1,S2,S3]   # the planner's own time and memory

--workload runs the scenarios on one pod list of the paper's published family
(default, cpu050 ... multigpu50; sim/paper/workloads.py WORKLOADS) or on any openb
pod list file (.csv or .csv.gz); published figures are shown when the paper
published some for it. --family runs S1 on every workload of the family (or
those --workloads names) and prints, per workload, the published FGD and
BestFit means, the harness's FGD and BestFit, Slurm under the product's
uniform policy and Slurm + planner, their differences, and the per-seed
spread (min..max over seeds of harness FGD minus published FGD, and of Slurm +
planner minus the uniform policy; seeds where the planner is below the
uniform policy, below the harness's BestFit on the same arrivals, and below
published BestFit where the paper published it). ``--jobs N`` runs N
workloads at once, each in its own process (rows are printed in the order
given; a row's wall seconds are its own process's, beside the others).
``--generated SEED`` runs the family table on ``--count`` workloads that
bench/workloads.py draws from the production trace by the published
variants' rules (their mixes from SEED, printed first) instead of the 17
published ones; the pods are passed in memory, and the published columns
print n/a (the paper has no figures for them).

For each seed every policy of a scenario replays the same arrivals (the
paper's rules: seeded shuffle, resampling to 130 %, each pod tried once, no
departures) and the paper's metric; the table prints each policy's mean
allocation ratio at 100 % and 130 % arrived beside the published FGD,
BestFit and Random figures for the same seeds and pod list (tests/data/
gpu-trace/analysis_allo_discrete.csv.gz), the seconds per seed and the peak traced memory
of one replay (tracemalloc, a separate traced pass of the first seed, since
tracing slows numpy) and the process's max RSS. Before its replays each
scenario times the planner itself on the 1,213-node trace cluster (wall and
CPU seconds, candidates scored as `gpushare plan` does, and the peak traced
memory of a separate pass).

Scenarios (issue 13): S1 the trace as it is, fractional requests as mps
units of 100; S2 every GPU an A100-SXM4-40GB, fractional requests rounded up
to a MIG profile, static layouts; S3 the same A100s, LS fractional requests
on MIG slices and the rest on MPS. The planner's own policies ("Slurm +
planner") come from bench/scenarios.py (``uniform`` and ``planned``); S2/S3
also run the plain stand-in layouts of sim/paper/whatif.py. S2 adds
the planner held to compact slice types and to the uniform policy's slice
types, and FGD with MIG rules on each planned policy's own rounded requests
(the MIG profile every pod's request is rounded to), unless those are the
requests of an FGD row it already runs (covering or the uniform policy's
rounding): then it says which row stands for it.

Slice occupancy (S2, S3), at 100 % / 130 % arrived, two figures per row:
- "all N GPUs": compute slices occupied over 7 x every GPU of the cluster,
  the same rule for every policy (slurmmodel.occupied_slices): a MIG GPU
  counts the compute slices of its occupied instances; a GPU allocated whole
  (exclusive, or the whole-GPU record of an mps GPU) counts 7 of 7, as a
  whole-GPU job holds a 7g.40gb under MIG; an mps GPU counts the share its
  jobs hold, rounded up to slices once per GPU, ceil(7 x units used / units);
  an idle GPU 0. FGD under MIG rules makes every GPU a MIG GPU and a
  whole-GPU job takes a 7g.40gb, so its figure is the same count over the
  same GPUs (baselines.PaperState.metrics).
- "MIG GPUs only (M)": compute slices of occupied instances over 7 x the M
  GPUs in MIG mode (for FGD M is every GPU, so it equals the first figure).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import scenarios
from bench import workloads as generator
from slurm_gpushare.planner.evaluate import forked_map
from slurm_gpushare.sim.arrivals import arrival_sequence
from slurm_gpushare.sim.engine import replay
from slurm_gpushare.sim.paper import whatif
from slurm_gpushare.sim.paper.baselines import BestFit, RandomPolicy
from slurm_gpushare.sim.paper.fgd import FGD
from slurm_gpushare.sim.paper.gpustate import covering_profile, mig_kind
from slurm_gpushare.sim.paper.workloads import TRACE_DIR, WORKLOADS, workload_name, workload_path
from slurm_gpushare.sim.slurmmodel import SlurmPolicy, uniform_router, with_uniform_mps
from slurm_gpushare.sim.trace import load_cluster, load_pods

PUBLISHED = {"FGD": "06-FGD", "BestFit": "05-BestFit", "Random": "01-Random"}
PLANNER_UNIFORM_TYPES = "Slurm + planner, uniform's slice types"
PLANNER_COMPACT_TYPES = "Slurm + planner, compact slice types"


def published(workload: str = "default") -> dict[tuple[str, int], tuple[float, float]]:
    """The paper's per-seed figures at 100 % and 130 % arrived for one workload of the family ({} for others)."""
    with gzip.open(TRACE_DIR / "analysis_allo_discrete.csv.gz", "rt", newline="") as f:
        return {
            (r["sc_policy"], int(r["seed"])): (float(r["100"]), float(r["130"]))
            for r in csv.DictReader(f)
            if r["workload"] == f"openb_pod_list_{workload}"
        }


def seeds_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def planned(scenario: str, cluster, pods) -> list:
    """Slurm under the product's own policies for a scenario (uniform and planned).

    bench/scenarios.py builds, for the trace cluster, ``uniform(cluster, scenario)`` and ``planned(cluster, pods,
    scenario)``: each a (SimCluster as rendered, SubmitRouter through the submission decision, Site).
    """
    builders = [
        ("Slurm uniform policy (product)", scenarios.uniform, (cluster, scenario)),
        ("Slurm + planner", scenarios.planned, (cluster, pods, scenario)),
    ]
    if scenario == "S2":
        # the planner held to compact slice types (one per compute size, the least memory), and to the uniform
        # policy's slice types (its requests are then rounded as the uniform policy's are)
        builders.append((PLANNER_COMPACT_TYPES, scenarios.planned, (cluster, pods, scenario, "auto", ("compact",))))
        types = scenarios.uniform_mig_types(cluster, scenario)
        builders.append((PLANNER_UNIFORM_TYPES, scenarios.planned, (cluster, pods, scenario, "auto", types)))
    out = []
    for label, fn, call in builders:
        began = time.perf_counter()
        sim, router, _site = fn(*call)
        print(f"  {label}: policy built in {time.perf_counter() - began:.1f} s", flush=True)
        shares = whatif.mig_shares()
        out.append(SlurmPolicy(label, router, lambda c, sim=sim: sim, whatif.mig_slices(), mig_shares=shares))
    return out


def planner_figures(scenario: str, cluster, pods, repeats: int = 1) -> dict:
    """The planner alone on the trace cluster, as `gpushare plan` runs it (candidates scored): wall and CPU
    seconds of each of ``repeats`` runs, and the peak traced memory of one more (tracemalloc slows numpy)."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        scenarios.plan_for(cluster, pods, scenario, "auto")
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    tracemalloc.start()
    tracemalloc.reset_peak()
    scenarios.plan_for(cluster, pods, scenario, "auto")
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(
        f"  planner on {len(cluster.nodes)} nodes ({scenario}): wall {', '.join(f'{w:.1f}' for w in wall)} s, "
        f"CPU {', '.join(f'{c:.1f}' for c in cpu)} s, peak traced memory {peak:.1f} MiB",
        flush=True,
    )
    return {"wall_s": wall, "cpu_s": cpu, "peak_mib": peak}


def policies(scenario: str, cluster, pods) -> tuple[list, object]:
    """(policies, the cluster they start from)."""
    extra = planned(scenario, cluster, pods)
    if scenario == "S1":
        base = [
            SlurmPolicy("Slurm uniform (mps:N of 100)", uniform_router, with_uniform_mps),
            FGD(),
            BestFit(),
            RandomPolicy(),
        ]
        return base + extra, cluster
    a100 = whatif.a100_cluster(cluster)
    slices = whatif.mig_slices()
    if scenario == "S2":
        stand_in = whatif.proportional_layouts(cluster, pods)
        base = [
            SlurmPolicy(
                "Slurm static layouts (stand-in)",
                whatif.mig_router(),
                lambda c: stand_in,
                slices,
                mig_shares=whatif.mig_shares(),
            ),
            _named(FGD(kind=mig_kind()), "FGD, MIG rules, covering rounding"),
        ]
        product_router = scenarios.uniform(cluster, "S2")[1]
        # FGD on exactly the requests the product's submission makes
        kind = mig_kind(profile_of=whatif.profile_from_router(product_router))
        base.append(_named(FGD(kind=kind), "FGD, MIG rules, product rounding"))
        # and on exactly the requests each planned policy's submission makes (its own slice types), unless they are
        # the product rounding's already (checked pod by pod)
        ran = {"covering rounding": _profiles(None, pods), "product rounding": _profiles(product_router, pods)}
        for p in extra:
            if p.name.startswith("Slurm + planner"):
                label = "FGD, MIG rules, planner rounding" + p.name[len("Slurm + planner") :]
                same = [name for name, profiles in ran.items() if _profiles(p.router, pods) == profiles]
                if same:
                    print(f"  {label}: the same rounded requests as FGD's {same[0]} (every pod): its row stands for it")
                    continue
                kind = mig_kind(profile_of=whatif.profile_from_router(p.router))
                base.append(_named(FGD(kind=kind), label))
        return base + extra, a100
    if scenario == "S3":
        stand_in = whatif.split_by_qos(cluster, pods)
        base = [
            SlurmPolicy(
                "Slurm MIG(LS)+MPS split (stand-in)",
                whatif.qos_router(),
                lambda c: stand_in,
                slices,
                mig_shares=whatif.mig_shares(),
            )
        ]
        return base + extra, a100
    raise SystemExit(f"unknown scenario {scenario!r}; accepted: S1, S2, S3")


def _profiles(router, pods) -> list[str]:
    """The MIG profile each pod's request is rounded to by this router (None: covering rounding), as FGD with MIG
    rules is given it."""
    if router is None:
        model = mig_kind().model
        return [covering_profile(model, p.gpu_milli).name if p.num_gpu else "" for p in pods]
    profile_of = whatif.profile_from_router(router)
    return [profile_of(p) if p.num_gpu else "" for p in pods]


def _named(policy, name):
    policy.name = name
    return policy


def peak_memory(policy, cluster, pods, arrivals) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    replay(policy, cluster, pods, arrivals)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def run(scenario: str, seeds: list[int], cluster, pods, pub) -> dict:
    planner = planner_figures(scenario, cluster, pods)
    pols, start_cluster = policies(scenario, cluster, pods)
    rows: dict[str, dict] = {p.name: {"per_seed": {}, "seconds": [], "probes": {}} for p in pols}
    first = arrival_sequence(pods, cluster.gpu_count, seeds[0])
    for p in pols:
        rows[p.name]["peak_mib"] = peak_memory(p, start_cluster, pods, first)
    for seed in seeds:
        arrivals = arrival_sequence(pods, cluster.gpu_count, seed)
        for p in pols:
            r = replay(p, start_cluster, pods, arrivals)
            row = rows[p.name]
            row["per_seed"][seed] = (r.at(100), r.at(130))
            row["seconds"].append(r.seconds)
            row["probes"][seed] = r.probes
        print(
            f"  seed {seed}: " + ", ".join(f"{p.name} {rows[p.name]['per_seed'][seed][0]:.2f}" for p in pols),
            flush=True,
        )
    report(scenario, seeds, rows, pub)
    return {"scenario": scenario, "rows": rows, "planner": planner}


def mean(values):
    return statistics.fmean(values) if values else float("nan")


def refused_codes(probes: list[dict]) -> dict[str, float]:
    """Jobs refused at submission per violation code, mean per seed (the Slurm rows' 'refused <code>' probes)."""
    codes = sorted({k for p in probes for k in p if k.startswith("refused ")})
    return {k[len("refused ") :]: mean([p.get(k, 0.0) for p in probes]) for k in codes}


def refused_line(probes: list[dict]) -> str:
    """'refused at submission 365/seed: UNKNOWN_FEATURE g2 300, ...' ('' when nothing was refused)."""
    total = mean([p.get("rejected", 0.0) for p in probes])
    if not total:
        return ""
    codes = sorted(refused_codes(probes).items(), key=lambda kv: (-kv[1], kv[0]))
    return f"refused at submission {total:.0f}/seed: " + ", ".join(f"{c} {n:.0f}" for c, n in codes)


def report(scenario: str, seeds: list[int], rows: dict, pub) -> None:
    print(
        f"\n{scenario}: mean allocation ratio (%) over seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), "
        "100 % / 130 % arrived"
    )
    for name, row in rows.items():
        a100 = mean([v[0] for v in row["per_seed"].values()])
        a130 = mean([v[1] for v in row["per_seed"].values()])
        secs = row["seconds"]
        extra = ""
        occ_all = [row["probes"][s][100].get("slices_occupied_all") for s in seeds]
        if all(o is not None for o in occ_all):
            occ130 = [row["probes"][s][130]["slices_occupied_all"] for s in seeds]
            gpus = row["probes"][seeds[0]][100]["gpus"]
            extra = f"  slices occupied, all {gpus:.0f} GPUs {mean(occ_all):.2f} / {mean(occ130):.2f} %"
        occ = [row["probes"][s][100].get("slices_occupied") for s in seeds]
        if all(o is not None for o in occ):
            occ130 = [row["probes"][s][130]["slices_occupied"] for s in seeds]
            mig = row["probes"][seeds[0]][100].get("mig_gpus", float("nan"))
            extra += f"; MIG GPUs only ({mig:.0f}) {mean(occ):.2f} / {mean(occ130):.2f} %"
        under = [row["probes"][s][130].get("undersized") for s in seeds]
        if any(under):
            extra += f"  undersized jobs (MIG slice < request) {mean(under):.0f}/seed"
        ls = [row["probes"][s][130].get("ls_share_not_on_mig") for s in seeds]
        if scenario == "S3" and all(v is not None for v in ls):
            extra += f"  LS fractional jobs placed without a MIG slice {mean(ls):.0f}/seed"
        print(
            f"  {name:40s} {a100:6.2f} / {a130:6.2f}   {mean(secs):5.1f} s/seed (max {max(secs):5.1f})"
            f"  peak {row['peak_mib']:6.1f} MiB{extra}"
        )
        refused = refused_line([row["probes"][s][130] for s in seeds])
        if refused:
            print(f"  {'':40s} {refused}")
    if scenario == "S1" and not all((v, s) in pub for v in PUBLISHED.values() for s in seeds):
        print(
            "  published: none for this pod list and these seeds (the paper published seeds 42-51 of its 17 workloads)"
        )
    elif scenario == "S1":
        for ours, theirs in PUBLISHED.items():
            vals = [pub[(theirs, s)] for s in seeds]
            print(f"  published {ours:30s} {mean([v[0] for v in vals]):6.2f} / {mean([v[1] for v in vals]):6.2f}")
        print("\n  per seed at 100 % arrived (ours | published):")
        names = list(rows)
        print("  seed " + " ".join(f"{n[:14]:>14s}" for n in names) + " | " + " ".join(f"{k:>8s}" for k in PUBLISHED))
        for s in seeds:
            ours = " ".join(f"{rows[n]['per_seed'][s][0]:14.2f}" for n in names)
            theirs = " ".join(f"{pub[(v, s)][0]:8.2f}" for v in PUBLISHED.values())
            print(f"  {s:4d} {ours} | {theirs}")


# ---- the paper's workload family (S1) ----

FAMILY_COLUMNS = ("FGD", "BestFit", "uniform", "planner")


def family_policies(cluster, pods) -> tuple[list, dict]:
    """FGD, BestFit, Slurm under the product's uniform policy and Slurm + planner for one pod list, and the
    planner's own figures (seconds, whether it kept the policy as given, its scores)."""
    uniform_sim, uniform_router_, _site = scenarios.uniform(cluster, "S1")
    began = time.perf_counter()
    result = scenarios.plan_for(cluster, pods, "S1", "auto")
    seconds = time.perf_counter() - began
    planned_sim, planned_router, _site = scenarios.built(result.policy, cluster, "planned-S1")
    # as planned() builds the product's rows for the scenario table
    pols = [
        FGD(),
        BestFit(),
        SlurmPolicy(
            "uniform", uniform_router_, lambda c: uniform_sim, whatif.mig_slices(), mig_shares=whatif.mig_shares()
        ),
        SlurmPolicy(
            "planner", planned_router, lambda c: planned_sim, whatif.mig_slices(), mig_shares=whatif.mig_shares()
        ),
    ]
    info = {
        "plan_s": seconds,
        "kept_given": result.kept_given,
        "given_score": result.given_score,
        "score": result.score,
        "knobs": result.knobs.changed(),
        # the search's and the race's report lines: candidates and scores computed, how sure the choice is
        "search": [
            line for line in result.report if "candidate policies scored" in line or line.startswith("race over")
        ],
    }
    return pols, info


def family_one(workload: str, seeds: list[int], cluster, pods=None, mix: str = "") -> dict:
    """One workload of the family: every FAMILY_COLUMNS policy on every seed, at 100 % arrived. ``pods``: the
    workload's pods when it is not a pod list on disk (a generated one, ``mix`` its parameters); by name else."""
    began = time.perf_counter()
    if pods is None:
        pods = load_pods(workload_path(workload))
    pols, info = family_policies(cluster, pods)
    per_seed: dict[str, dict[int, float]] = {p.name: {} for p in pols}
    probes: dict[str, list[dict]] = {p.name: [] for p in pols}
    for seed in seeds:
        arrivals = arrival_sequence(pods, cluster.gpu_count, seed)
        for p in pols:
            r = replay(p, cluster, pods, arrivals)
            per_seed[p.name][seed] = r.at(100)
            probes[p.name].append(r.probes[130])
    pub = published(workload)
    refused = {name: refused_line(probes[name]) for name in ("uniform", "planner")}
    out = {
        "workload": workload,
        "mix": mix,
        "seeds": seeds,
        "per_seed": per_seed,
        "planner": info,
        "refused": {k: v for k, v in refused.items() if v},
        "published": {k: {s: pub[(v, s)][0] for s in seeds if (v, s) in pub} for k, v in PUBLISHED.items()},
        "wall_s": time.perf_counter() - began,
    }
    return out


def _echo(row: dict) -> None:
    print(family_line(row), flush=True)
    print(f"  planner: {row['planner'].get('knobs', '')}", flush=True)
    for line in row["planner"].get("search", []):
        print(f"  planner: {line}", flush=True)
    for name, text in row["refused"].items():
        print(f"  {name}: {text}", flush=True)


def _spread(values: list[float]) -> str:
    return f"{min(values):+.2f}..{max(values):+.2f}" if values else "n/a"


def _fig(value: float, signed: bool = False) -> str:
    """A figure of the family table, 6 wide; n/a where there is none (no published figures)."""
    if value != value:  # nan
        return f"{'n/a':>6s}"
    return f"{value:+6.2f}" if signed else f"{value:6.2f}"


def family_line(r: dict) -> str:
    """One workload's row: published FGD/BestFit, harness FGD/BestFit, uniform, planner, differences, spread."""
    seeds, ps, pub = r["seeds"], r["per_seed"], r["published"]
    m = {k: mean([ps[k][s] for s in seeds]) for k in FAMILY_COLUMNS}
    pf = mean(list(pub["FGD"].values())) if len(pub["FGD"]) == len(seeds) else float("nan")
    pb = mean(list(pub["BestFit"].values())) if len(pub["BestFit"]) == len(seeds) else float("nan")
    d_fgd = [ps["FGD"][s] - pub["FGD"][s] for s in seeds if s in pub["FGD"]]
    d_plan = [ps["planner"][s] - ps["uniform"][s] for s in seeds]
    below_u = sum(ps["planner"][s] < ps["uniform"][s] for s in seeds)
    below_bf = sum(ps["planner"][s] < ps["BestFit"][s] for s in seeds)  # the harness's BestFit, same arrivals
    pub_seeds = [s for s in seeds if s in pub["BestFit"]]
    below_pbf = str(sum(ps["planner"][s] < pub["BestFit"][s] for s in pub_seeds)) if pub_seeds else "-"
    kept = "given" if r["planner"]["kept_given"] else "plan"
    return (
        f"{r['workload']:12s} {_fig(pf)} {_fig(pb)} | {m['FGD']:6.2f} {_fig(m['FGD'] - pf, True)} "
        f"{m['BestFit']:6.2f} {_fig(m['BestFit'] - pb, True)} | {m['uniform']:6.2f} {m['planner']:6.2f} "
        f"{_fig(m['planner'] - pf, True)} {m['planner'] - m['uniform']:+6.2f} | {_spread(d_fgd):>13s} "
        f"{_spread(d_plan):>13s} {below_u:>2d} {below_bf:>3d} {below_pbf:>4s} | {kept:5s} "
        f"{r['planner']['plan_s']:4.1f} {r['wall_s']:5.0f}"
    )


FAMILY_HEADER = (
    "workload     pubFGD  pubBF |  FGD    -pub     BF    -pub  | unifrm  plannr -pubFGD -unifrm | "
    "FGD-pub/seed  plan-unif/seed <u <BF <pBF | kept  plan_s wall_s"
)


def family_rows(
    seeds: list[int], workloads: list[str], cluster, jobs: int, generated: dict | None = None
) -> list[dict]:
    """family_one for each workload, ``jobs`` at a time (forked processes); rows in ``workloads`` order, each
    printed when it and those before it are done. ``generated``: name -> (Mix, pods) for workloads not on disk
    (the forks inherit the pods; only the names are passed)."""
    generated = generated or {}

    def one(w: str) -> dict:
        if w in generated:
            mix, pods = generated[w]
            return family_one(w, seeds, cluster, pods=pods, mix=mix.text())
        return family_one(w, seeds, cluster)

    rows = []
    for r in forked_map(one, workloads, jobs):
        _echo(r)
        rows.append(r)
    return rows


def family(
    seeds: list[int], workloads: list[str], cluster, out_json: str | None, jobs: int = 1, generated: dict | None = None
) -> None:
    """The family table; ``generated``: name -> (Mix, pods) for workloads drawn by bench/workloads.py."""
    what = "workloads generated from the trace" if generated else "the paper's workload family"
    print(f"S1 on {what}: mean allocation ratio (%) at 100 % arrived over seeds {seeds}")
    for name, (mix, pods) in (generated or {}).items():
        print(f"  {name:12s} {mix.text():50s} {generator.stats_text(generator.stats(pods))}")
    print(
        "columns: published FGD, BestFit (n/a: none published); harness FGD, BestFit (and minus published); Slurm "
        "under the product's uniform policy, Slurm + planner (minus published FGD, minus uniform); per seed "
        "min..max of harness FGD minus published and of planner minus uniform; seeds with the planner below "
        "uniform (<u), below the harness's BestFit on the same arrivals (<BF) and below published BestFit "
        "(<pBF; -: none published); which policy the planner kept (given: the uniform policy as given), its "
        "seconds, the workload's wall seconds",
        flush=True,
    )
    print(FAMILY_HEADER, flush=True)
    began = time.perf_counter()
    rows = family_rows(seeds, workloads, cluster, jobs, generated)
    print(f"\n{FAMILY_HEADER}")
    for r in rows:
        print(family_line(r))
    refused = [f"  {r['workload']:12s} {name:8s} {text}" for r in rows for name, text in r["refused"].items()]
    print(
        "\njobs the product refuses at submission (all arrivals, mean per seed, by reason): "
        + ("none" if not refused else "")
    )
    for line in refused:
        print(line)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - began:.0f} s; max RSS of this process {rss:.0f} MiB")
    if out_json:
        Path(out_json).write_text(json.dumps(rows, indent=1, default=float))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,45 (default 42-51)")
    ap.add_argument("--scenarios", default="S1,S2,S3")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--planner-only",
        type=int,
        metavar="N",
        default=0,
        help="only time the planner, N runs per scenario (no replays)",
    )
    ap.add_argument(
        "--workload",
        default="default",
        metavar="NAME|FILE",
        help=f"the pod list: one of {', '.join(WORKLOADS)}, or an openb pod list file (default: default)",
    )
    ap.add_argument("--family", action="store_true", help="S1 on every workload of the family (see above)")
    ap.add_argument("--workloads", help="with --family: only these workloads, comma-separated")
    ap.add_argument(
        "--generated",
        type=int,
        metavar="SEED",
        help="with --family: instead of the published workloads, --count workloads that "
        "bench/workloads.py generates from the trace with this seed",
    )
    ap.add_argument(
        "--count", type=int, default=10, metavar="N", help="with --generated: how many workloads (default 10)"
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with --family: run N workloads at once, each in its own process (default 1)",
    )
    args = ap.parse_args()
    seeds = seeds_of(args.seeds)
    cluster = load_cluster(TRACE_DIR / "openb_node_list_gpu_node.csv")
    if args.generated is not None and not args.family:
        ap.error("--generated goes with --family")
    if args.family and args.generated is not None:
        if args.workloads:
            ap.error("--generated and --workloads: one or the other")
        if args.count < 1:
            ap.error(f"--count {args.count}: accepted: an integer >= 1")
        drawn = {name: (mix, pods) for name, mix, pods in generator.generated(args.generated, args.count)}
        family(seeds, list(drawn), cluster, args.json, args.jobs, drawn)
        return
    if args.family:
        names = [w.strip() for w in args.workloads.split(",")] if args.workloads else list(WORKLOADS)
        family(seeds, names, cluster, args.json, args.jobs)
        return
    path = workload_path(args.workload)
    pods = load_pods(path)
    if args.planner_only:
        for scenario in args.scenarios.split(","):
            planner_figures(scenario.strip(), cluster, pods, args.planner_only)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"max RSS of this process {rss:.0f} MiB")
        return
    pub = published(workload_name(path))
    print(f"trace: {len(cluster.nodes)} nodes, {cluster.gpu_count} GPUs, {len(pods)} pods ({path.name}); seeds {seeds}")
    out = []
    began = time.perf_counter()
    for scenario in args.scenarios.split(","):
        print(f"\n== {scenario}", flush=True)
        out.append(run(scenario.strip(), seeds, cluster, pods, pub))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - began:.0f} s; max RSS of this process {rss:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
