"""Slurm client: one full read of the jobs (pending and running) and the nodes, time and peak memory per backend.

Two modes:

  replay (default, anywhere): the CLI backend's parsing on a simulated large cluster: a fake
      runner replays `squeue --json` / `scontrol show node --json` documents of N jobs and M nodes
      made by repeating real 24.11.5 records (tests/data/slurm/recorded-24.11.5/) with new ids and
      names. Measures our side only (Slurm's own time to print the JSON is not in it).

  live (inside a test-cluster container, where slurm.conf is): both backends against real Slurm,
      end to end (the command's run time included), with --submit N held jobs first:
        docker exec -i <project>_slurmctld_1 /opt/gpushare/bin/python3 - --live --submit 2000 \\
          < bench/slurm_client.py

  large (from the host, on a running test cluster: `gpushare testcluster up --project P`): makes the
      cluster large first, then runs the live mode in it. slurmctld gets --nodes more nodes (State=CLOUD,
      8 GPUs each, in a partition `bench`: real node records that no slurmd answers for) and is restarted;
      then --jobs held jobs are submitted (half GPU jobs in `bench`, half in the default partition):
        python3 bench/slurm_client.py --large P --nodes 1000 --jobs 9990
      It changes that cluster's slurm.conf: take the cluster down afterwards.

Prints one line per backend and the pyslurm/CLI ratio. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import time
import tracemalloc
from pathlib import Path

REC = Path(__file__).resolve().parents[1] / "tests" / "data" / "slurm" / "recorded-24.11.5"


def measure(fn, repeat: int = 3):
    best, peak, out = float("inf"), 0, None
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak, out


def large_outputs(n_jobs: int, n_nodes: int) -> tuple[str, str]:
    jobs = json.loads((REC / "squeue.json").read_text())
    nodes = json.loads((REC / "scontrol-show-node.json").read_text())
    sample_jobs, sample_nodes = jobs["jobs"], nodes["nodes"]
    out_jobs = []
    for i in range(n_jobs):
        j = copy.deepcopy(sample_jobs[i % len(sample_jobs)])
        j["job_id"] = 100000 + i
        out_jobs.append(j)
    out_nodes = []
    for i in range(n_nodes):
        n = copy.deepcopy(sample_nodes[i % len(sample_nodes)])
        n["name"] = f"{n['name']}-{i:04d}"
        out_nodes.append(n)
    return json.dumps({**jobs, "jobs": out_jobs}), json.dumps({**nodes, "nodes": out_nodes})


def replay(n_jobs: int, n_nodes: int) -> None:
    from slurm_gpushare.proc import Result
    from slurm_gpushare.slurm import commands
    from slurm_gpushare.slurm.cli_backend import CliClient

    squeue, scontrol = large_outputs(n_jobs, n_nodes)
    answers = {tuple(commands.SQUEUE_JSON): squeue, tuple(commands.NODES_JSON): scontrol}
    client = CliClient(lambda argv, **kw: Result(tuple(argv), 0, answers[tuple(argv)], ""))
    secs, peak, (jobs, nodes) = measure(lambda: (client.jobs(), client.nodes()))
    print(
        f"replay cli: {len(jobs)} jobs + {len(nodes)} nodes parsed in {secs:.3f} s, peak {peak / 2**20:.0f} MiB "
        f"(squeue {len(squeue) / 2**20:.0f} MiB + scontrol {len(scontrol) / 2**20:.1f} MiB of JSON)"
    )


def live(submit: int) -> None:
    import subprocess

    from slurm_gpushare.slurm.client import make_client, pyslurm_problem

    if submit:
        # held jobs in one sbatch per 500 (as a loop in one shell: a docker exec per job costs seconds)
        script = f"for i in $(seq {submit}); do sbatch -H -A physics --wrap true -o /dev/null -J bench >/dev/null; done"
        t = time.perf_counter()
        subprocess.run(["su", "alice", "-c", script], check=True)
        print(f"submitted {submit} held jobs in {time.perf_counter() - t:.0f} s")
    results = {}
    for backend in ("cli", "pyslurm"):
        if backend == "pyslurm" and pyslurm_problem():
            print(f"pyslurm: {pyslurm_problem()}")
            continue
        client = make_client(backend)
        secs, peak, (jobs, nodes) = measure(lambda client=client: (client.jobs(), client.nodes()))
        results[backend] = secs
        print(
            f"live {backend}: {len(jobs)} jobs + {len(nodes)} nodes in {secs:.3f} s, peak {peak / 2**20:.1f} MiB "
            f"(Python heap; pyslurm's C allocations are not traced)"
        )
    cli = make_client("cli")
    secs, peak, (jobs, nodes) = measure(lambda: (cli.job_summaries(), cli.nodes()))
    results["summaries"] = secs
    print(
        f"live cli, job summaries (squeue --Format, no device indexes): {len(jobs)} jobs + {len(nodes)} nodes "
        f"in {secs:.3f} s, peak {peak / 2**20:.1f} MiB"
    )
    if "pyslurm" in results:
        print(
            f"ratio pyslurm/cli: {results['pyslurm'] / results['cli']:.2f}, "
            f"pyslurm/cli summaries: {results['pyslurm'] / results['summaries']:.2f}"
        )
    if submit:
        subprocess.run(["scancel", "-n", "bench"], check=False)


def large(project: str, n_nodes: int, n_jobs: int) -> None:
    """Grow a running test cluster to n_nodes more nodes and n_jobs held jobs, then run --live inside it."""
    grow(project, n_nodes, n_jobs)
    run_inside(project, Path(__file__), ["--live"])


def run_inside(project: str, script: Path, args: list[str]) -> None:
    """Run a bench script with the package's Python in the project's slurmctld (where slurm.conf is)."""
    import subprocess

    res = subprocess.run(
        ["docker", "exec", "-i", f"{project}_slurmctld_1", "/opt/gpushare/bin/python3", "-", *args],
        input=script.read_text(),
        capture_output=True,
        text=True,
    )
    print(res.stdout + res.stderr, end="")


def grow(project: str, n_nodes: int, n_jobs: int) -> None:
    """n_nodes more nodes (State=CLOUD, partition bench) in a running test cluster, and n_jobs held jobs."""
    import subprocess

    ctl = f"{project}_slurmctld_1"

    def sh(script: str, user: str = "root") -> str:
        argv = ["docker", "exec", ctl, "su", user, "-c", script]
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    lines = [
        f"NodeName=bench[0001-{n_nodes:04d}] CPUs=64 RealMemory=512000 Gres=gpu:l40s:8 State=CLOUD",
        f"PartitionName=bench Nodes=bench[0001-{n_nodes:04d}] Default=NO State=UP",
    ]
    conf = sh("cat /etc/slurm/slurm.conf")
    if "PartitionName=bench " not in conf:
        # slurmctld reads gres.conf (its Include of the node-local MIG file too) when nodes change
        sh(
            "touch /etc/slurm/gres.d/gpushare-mig.conf && printf '%s\\n' "
            + " ".join(f"'{line}'" for line in lines)
            + " >> /etc/slurm/slurm.conf"
        )
        subprocess.run(["docker", "restart", ctl], check=True, capture_output=True)
    t = time.perf_counter()
    while time.perf_counter() - t < 60:
        res = subprocess.run(
            ["docker", "exec", ctl, "sinfo", "-h", "-p", "bench", "-o", "%D"], capture_output=True, text=True
        )
        if res.returncode == 0 and res.stdout.strip() == str(n_nodes):
            break
        time.sleep(1)
    else:
        raise SystemExit(f"slurmctld did not come back with {n_nodes} bench nodes")
    have = int(sh("squeue -h -n bench | wc -l"))
    half = max(0, n_jobs - have) // 2
    rest = max(0, n_jobs - have) - half
    t = time.perf_counter()
    sh(
        f"for i in $(seq {half}); do sbatch -H -A physics -p bench --gres=gpu:l40s:1 --wrap true -o /dev/null "
        f"-J bench >/dev/null; done; for i in $(seq {rest}); do sbatch -H -A physics --gres=gpu:l40s:1 --wrap true "
        f"-o /dev/null -J bench >/dev/null; done",
        user="alice",
    )
    print(f"{project}: {n_nodes} bench nodes; {half + rest} held jobs submitted in {time.perf_counter() - t:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--submit", type=int, default=0)
    ap.add_argument("--large", metavar="PROJECT", help="grow this running test cluster, then run --live in it")
    args = ap.parse_args()
    if args.large:
        large(args.large, args.nodes, args.jobs)
    elif args.live:
        live(args.submit)
    else:
        replay(args.jobs, args.nodes)


if __name__ == "__main__":
    main()
