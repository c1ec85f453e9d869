"""Time the generated job_submit.lua per call under lupa, on Lua 5.1 and 5.4.

    python bench/submit.py [--calls 20000] [--policy etc/small-lab.yaml] [--also OTHER.lua]
    python bench/submit.py --cluster [--jobs 500] [--rounds 2] [--parallel 1] [--project NAME] [--keep]

slurmctld calls slurm_job_submit under its locks for every submission, so its
cost is on the controller's critical path. Each call is timed from Python
(perf_counter_ns around one Lua call with a prepared job_desc table); the
baseline, measured the same way in the same run, is an empty Lua function
with the same arguments, so the ratio and the difference say what gpushare's
rules add on top of the Python-to-Lua crossing. Figures only, no assertions.

Each job_desc is built just before its call and dropped after it, so the Lua
heap holds one job_desc at a time, as slurmctld's does. (Building all of them
first kept 20,000 references in lupa's registry table; Lua 5.1's collector
marks a table in one step, so every collection cycle paid a ~100 us step, and
that, not the script, was the p99.) The tail that remains is the collector's
work, which grows with what a call allocates: "alloc" is the bytes one call
allocates, measured with the collector stopped. ``--also`` times another
job_submit.lua in the same run, e.g. the one rendered before a change.

--cluster: sbatch throughput on the docker test cluster (bench/cluster_throughput.py
does the cluster and the measurement), in one run with JobSubmitPlugins=lua and
without: the policy is re-rendered with cluster.hooks.job_submit_lua false into
the conf dir, the `config` one-shot copies it into /etc/slurm, `scontrol
reconfigure`, and the policy's own config is restored at the end. Each
measurement is --jobs held submissions (then cancelled) of a plain job and of a
GPU job, so scheduling and job runs do not blur the submission cost; rounds
alternate lua, none, none, lua, ... and the ratio is of the totals.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render.jobsubmit import job_submit_lua  # noqa: E402

VERSIONS = ("lua51", "lua54")
FAKE_SLURM = """
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_INVALID_GRES = 2072,
  log_user = function(fmt, ...) end, log_info = function(fmt, ...) end, log_error = function(fmt, ...) end }
function gpushare_empty(job_desc, part_list, uid) return 0 end
"""
JOBS = {
    "gpu request": {"tres_per_node": "gres/gpu:l40s:1", "partition": "batch"},
    "gpu alias (rewrite)": {"tres_per_node": "gres/gpu:small:1"},
    "rejected (2 shards)": {"tres_per_node": "gres/shard:2"},
    "no gpu": {"partition": "batch"},
}


def time_calls(lua, fn, job: dict, calls: int) -> list[int]:
    """ns per call; a fresh job_desc table per call (the script may change it), built outside the timing."""
    table_from, parts = lua.table_from, lua.table()
    out = []
    gc.disable()
    try:
        for _ in range(calls):
            desc = table_from(job)
            t0 = time.perf_counter_ns()
            fn(desc, parts, 1000)
            out.append(time.perf_counter_ns() - t0)
            del desc
    finally:
        gc.enable()
    return out


def alloc_per_call(lua, fn, job: dict, calls: int = 1000) -> float:
    """Bytes one call allocates: Lua's heap growth over ``calls`` calls with its collector stopped."""
    descs, parts = [lua.table_from(job) for _ in range(calls)], lua.table()
    lua.execute('collectgarbage("collect"); collectgarbage("stop")')
    before = lua.eval('collectgarbage("count")')
    for desc in descs:
        fn(desc, parts, 1000)
    grown = lua.eval('collectgarbage("count")') - before
    lua.execute('collectgarbage("restart")')
    return grown * 1024 / calls


def pct(values: list[int], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] / 1000


def bench(version: str, source: str, calls: int, label: str = "") -> None:
    lua = importlib.import_module(f"lupa.{version}").LuaRuntime()
    lua.execute(FAKE_SLURM)
    lua.execute(source)
    g = lua.globals()
    time_calls(lua, g.slurm_job_submit, JOBS["gpu request"], min(calls, 2000))  # warm up
    base = time_calls(lua, g.gpushare_empty, JOBS["gpu request"], calls)
    b50 = statistics.median(base) / 1000
    print(f"{lua.eval('_VERSION')} ({version}){label}, {calls} calls each, microseconds per call:")
    print(f"  {'baseline: empty Lua function':30s} p50 {b50:7.2f}  p99 {pct(base, 0.99):7.2f}")
    for name, job in JOBS.items():
        t = time_calls(lua, g.slurm_job_submit, job, calls)
        p50 = statistics.median(t) / 1000
        alloc = alloc_per_call(lua, g.slurm_job_submit, job)
        print(
            f"  {name:30s} p50 {p50:7.2f}  p99 {pct(t, 0.99):7.2f}  p99.9 {pct(t, 0.999):7.2f}  "
            f"alloc {alloc:5.0f} B  ({p50 / b50:5.1f}x baseline, +{p50 - b50:.2f} us)"
        )


CLUSTER_KINDS = {"plain job": [], "gpu job (--gres=gpu:l40s:1)": ["--gres=gpu:l40s:1"]}
TARGET = 0.10  # the plugin may cost at most this share of sbatch throughput


def _without_plugin(policy: Path):
    """The policy with cluster.hooks.job_submit_lua off (only JobSubmitPlugins= changes in slurm.conf)."""
    import yaml

    from slurm_gpushare.policy import build_site

    raw = yaml.safe_load(policy.read_text(encoding="utf-8"))
    raw.setdefault("cluster", {}).setdefault("hooks", {})["job_submit_lua"] = False
    return build_site(raw, policy.name)


def set_plugin(c, site, want: str) -> float:
    """Render ``site`` into the running cluster (conf dir, `config` one-shot, `scontrol reconfigure`);
    wait until slurmctld answers with JobSubmitPlugins=``want``. Returns the seconds it took."""
    from bench import cluster_throughput as ct
    from slurm_gpushare.proc import CommandError

    t0 = time.monotonic()
    c.write_config(site)
    c.compose("run", "--rm", "--no-deps", "config", timeout=120)
    c.scontrol("reconfigure")
    deadline = time.monotonic() + 120
    while True:
        try:
            if ct.answers(c) and ct.live_setting(c, "JobSubmitPlugins") == want:
                break
        except CommandError:  # slurmctld re-executes itself on reconfigure
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"slurmctld does not answer with JobSubmitPlugins={want!r} 120 s after reconfigure")
        time.sleep(1)
    c.wait_idle(timeout=120)
    return time.monotonic() - t0


def cluster_throughput(args) -> None:
    """sbatch submissions per second with and without JobSubmitPlugins=lua on the docker test cluster."""
    from bench import cluster_throughput as ct
    from slurm_gpushare.render import render_all

    c, started = ct.open_cluster(args.project or ct.DEFAULT_PROJECT, args.policy, build=not args.no_build)
    with_lua, without = c.site, _without_plugin(c.policy)  # with: the policy's own config, exactly
    current = ct.live_setting(c, "JobSubmitPlugins")
    results: dict[tuple[str, str], list] = {}
    try:
        if current != "lua":
            print(f"reconfigured to JobSubmitPlugins=lua in {set_plugin(c, with_lua, 'lua'):.0f} s", flush=True)
            current = "lua"
        order = []
        for r in range(args.rounds):
            order += ["lua", ""] if r % 2 == 0 else ["", "lua"]
        for mode in order:
            if mode != current:
                took = set_plugin(c, with_lua if mode else without, mode)
                print(f"reconfigured to JobSubmitPlugins={mode or '(none)'} in {took:.0f} s", flush=True)
                current = mode
            for kind, options in CLUSTER_KINDS.items():
                f = ct.measure(
                    c,
                    args.jobs,
                    options,
                    args.parallel,
                    hold=True,
                    label=f"JobSubmitPlugins={mode or '(none)'}, {kind}",
                )
                print("\n".join(f.lines()), flush=True)
                results.setdefault((mode, kind), []).append(f)
    finally:
        if current != "lua":
            took = set_plugin(c, with_lua, "lua")
            print(f"restored the policy's config (JobSubmitPlugins=lua) in {took:.0f} s", flush=True)
        for name, text in render_all(with_lua).items():
            if c.exec("slurmctld", ["cat", f"/etc/slurm/{name}"], check=False).stdout != text:
                print(f"WARNING: /etc/slurm/{name} is not the policy's rendered file after the restore", flush=True)
        if started and not args.keep:
            c.down()
    print(
        f"\nsbatch throughput, {args.jobs} held submissions per measurement, {args.rounds} round(s), "
        f"{args.parallel} submitter(s):"
    )
    for kind in CLUSTER_KINDS:
        on, off = results[("lua", kind)], results[("", kind)]
        rate_on = sum(f.submitted for f in on) / sum(f.submit_s for f in on)
        rate_off = sum(f.submitted for f in off) / sum(f.submit_s for f in off)
        cost = 1 - rate_on / rate_off
        verdict = "within" if cost < TARGET else "OVER"
        spread = ", ".join(
            f"{mode or 'none'} {min(f.rate for f in fs):.1f}-{max(f.rate for f in fs):.1f}/s"
            for mode, fs in (("lua", on), ("", off))
        )
        print(f"  {kind}:")
        print(
            f"    with lua {rate_on:.1f}/s, without {rate_off:.1f}/s: ratio {rate_on / rate_off:.3f}, the plugin costs "
            f"{cost * 100:+.1f} % of throughput ({verdict} the {TARGET * 100:.0f} % target); per round: {spread}"
        )
        p50_on = statistics.median(x for f in on for x in f.latencies) * 1000
        p50_off = statistics.median(x for f in off for x in f.latencies) * 1000
        print(f"    sbatch p50 latency {p50_on:.1f} ms with lua, {p50_off:.1f} ms without ({p50_on - p50_off:+.1f} ms)")
        u_on = [u for f in on for u in f.ctld_usec]
        u_off = [u for f in off for u in f.ctld_usec]
        if u_on and u_off:
            m_on, m_off = statistics.median(u_on), statistics.median(u_off)
            print(
                f"    slurmctld submit RPC p50 {m_on:.0f} us with lua, {m_off:.0f} us without ({m_on - m_off:+.0f} us, "
                f"{(m_on - m_off) / (p50_off * 1000) * 100:+.1f} % of an sbatch call)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--policy", type=Path, default=ROOT / "etc" / "small-lab.yaml")
    ap.add_argument("--also", type=Path, help="another job_submit.lua to time in the same run (e.g. before a change)")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="sbatch throughput with and without the plugin on the docker test cluster",
    )
    group = ap.add_argument_group("--cluster")
    from bench import cluster_throughput as ct

    ct.add_arguments(group, policy=False)
    group.add_argument("--rounds", type=int, default=2, help="lua/none measurement pairs, alternating (default 2)")
    args = ap.parse_args()
    if args.cluster:
        cluster_throughput(args)
        return
    source = job_submit_lua(load_file(args.policy))
    print(f"policy {args.policy.name}; job_submit.lua {len(source) / 1e3:.1f} kB")
    for version in VERSIONS:
        bench(version, source, args.calls)
        if args.also:
            bench(version, args.also.read_text(encoding="utf-8"), args.calls, f" [{args.also.name}]")


if __name__ == "__main__":
    main()
