"""gpushare exporter: one scrape (read Slurm + compute the families + exposition text) of a large cluster.

The jobs and nodes are bench/slurm_client.py's replay: `squeue --json` / `scontrol show node --json`
documents of --jobs jobs and --nodes nodes made by repeating the real 24.11.5 records
(tests/data/slurm/recorded-24.11.5/: 4 running GPU jobs of every kind and 3 pending ones; 4 nodes),
answered by a fake runner; sshare and the associations are the recorded ones (tests/unit/slurm_fakes.py's
FakeSlurm). Policy: etc/small-lab.yaml.

Prints, best of 3 (figures, never assertions):
  - the full scrape through the CLI backend, split into the client's read (json.loads and model building),
    our collection (metrics/collect.py) and the exposition text (prometheus_client);
  - the same scrape over an in-memory client whose model objects are already built (what a pyslurm-like
    backend hands over without JSON), i.e. the exporter's own cost;
  - peak Python memory of one full scrape (tracemalloc).

    .venv/bin/python bench/exporter.py [--jobs 10000] [--nodes 1000]

--large PROJECT (from the host, on a running test cluster): grows it as bench/slurm_client.py --large does
(--nodes CLOUD nodes, --jobs held jobs) and then scrapes real Slurm from inside slurmctld, once per backend
(cli, pyslurm where the image has it), with the policy the cluster runs; --live is that inner part.

--concurrent N: the HTTP server under N concurrent scrapes, --rounds times, one round per
--interval seconds (127.0.0.1 only; bounded). Each Slurm command of the fake runner takes --latency
seconds more (slurmctld's round trip). Prints, for the server as shipped (one shared snapshot per
interval) and for a no-cache baseline in the same run (prometheus_client's server over the collector:
every scrape reads Slurm, one read at a time): reads of Slurm per round (= per interval), scrape latency
p50/p95, and their ratios.

    nice -n 19 .venv/bin/python bench/exporter.py --concurrent 50 --jobs 1000 --nodes 100

--hostile: the HTTP server as shipped, with basic auth (bcrypt, --cost), on 127.0.0.1. An authenticated
scraper makes --scrapes scrapes, --pause seconds apart, three times: quiet; while --attackers clients send
random passwords (at most --per-client requests each, all stopping when the scraper is done); while
clients with the good login send hostile headers (X-Prometheus-Scrape-Timeout-Seconds of 1e-300, nan,
junk, ...; odd Accept and Accept-Encoding). Prints the scraper's p50/p99 and its ratio to the quiet run,
how many of its scrapes were served values other than the quiet run's or with a part down, and what the
attackers were answered (401, 429, 503).

    nice -n 19 .venv/bin/python bench/exporter.py --hostile --jobs 1000 --nodes 100
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def live() -> None:
    """Inside slurmctld: one scrape of the real cluster per backend, best of 3, and its parts."""
    import gc

    from slurm_gpushare.metrics.exporter import SlurmCollector, exposition, registry_for
    from slurm_gpushare.policy import load_file
    from slurm_gpushare.slurm.client import make_client, pyslurm_problem

    site = load_file(Path("/etc/gpushare/policy.yaml"))
    times = {}
    for backend in ("cli", "pyslurm"):
        if backend == "pyslurm" and pyslurm_problem():
            print(f"pyslurm: {pyslurm_problem()}")
            continue
        collector = SlurmCollector(make_client(backend), site)
        registry = registry_for(collector)
        best = float("inf")
        for _ in range(3):
            gc.collect()
            t = time.perf_counter()
            text = exposition(registry)
            best = min(best, time.perf_counter() - t)
        jobs, nodes = len(collector.client.jobs()), len(collector.client.nodes())
        read, coll, expo, n = best_phases(collector)
        times[backend] = best
        print(
            f"live {backend}: one scrape of {jobs} jobs + {nodes} nodes in {best:.3f} s (best of 3), "
            f"{n} samples, {len(text) / 2**10:.0f} KiB; read {read:.3f} s, collection {coll:.3f} s, "
            f"exposition {expo:.3f} s"
        )
    if len(times) == 2:
        print(f"ratio pyslurm/cli: {times['pyslurm'] / times['cli']:.2f}")


def fake_runner(squeue: str, scontrol: str):
    from slurm_gpushare.proc import Result
    from slurm_gpushare.slurm import commands
    from tests.unit.slurm_fakes import FakeSlurm

    rec = ROOT / "tests" / "data" / "slurm" / "recorded-24.11.5"
    slurm = FakeSlurm(cluster="lab")
    slurm.assocs = [ln.split("|") for ln in (rec / "sacctmgr-assoc-policy.parsable2").read_text().splitlines()]
    slurm.sshare_text = (rec / "sshare.parsable2").read_text()
    answers = {tuple(commands.SQUEUE_JSON): squeue, tuple(commands.NODES_JSON): scontrol}
    slurm.squeue_json = squeue  # FakeSlurm prints the summaries the exporter reads (--Format) from it

    def run(argv, **kw):
        argv = tuple(argv)
        if argv in answers:
            return Result(argv, 0, answers[argv], "")
        return slurm(argv, **kw)

    return run


class InMemory:
    """A client whose reads return model objects built beforehand (no JSON on the scrape's path)."""

    backend = "memory"

    def __init__(self, client, cluster: str):
        self._jobs, self._nodes = client.jobs(), client.nodes()
        self._shares, self._assocs = client.sshare(), client.associations(cluster)

    def jobs(self):
        return list(self._jobs)

    def nodes(self):
        return list(self._nodes)

    def sshare(self):
        return list(self._shares)

    def associations(self, cluster=None):
        return list(self._assocs)


def phases(collector):
    """One scrape in three timed steps: (read s, collect s, exposition s, number of samples)."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from slurm_gpushare.metrics import collect
    from slurm_gpushare.metrics.exporter import to_prometheus

    t0 = time.perf_counter()
    snap, _ok = collector.read()
    t1 = time.perf_counter()
    fams = collect.families(collector.metrics, snap)
    t2 = time.perf_counter()
    metrics = [to_prometheus(f) for f in fams]

    class Static:
        def collect(self):
            return metrics

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Static())
    generate_latest(reg)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, sum(len(f.samples) for f in fams)


def best_phases(collector, repeat=3):
    runs = [phases(collector) for _ in range(repeat)]
    return tuple(min(r[i] for r in runs) for i in range(3)) + (runs[-1][3],)


class Counting:
    """A Runner over ``inner`` that counts reads of Slurm (squeue runs once per read) and adds ``latency``
    seconds to every command."""

    def __init__(self, inner, latency: float):
        self.inner, self.latency, self.reads, self.commands = inner, latency, 0, 0
        self.starts: list[float] = []  # monotonic time each read began
        self._lock = __import__("threading").Lock()

    def __call__(self, argv, **kw):
        with self._lock:
            self.commands += 1
            if argv[0] == "squeue":
                self.reads += 1
                self.starts.append(time.monotonic())
        time.sleep(self.latency)
        return self.inner(argv, **kw)


def scrape_round(port: int, n: int) -> tuple[list[float], int]:
    """n concurrent GET /metrics (one connection each): latencies in seconds of the answered ones, failures."""
    import http.client
    import threading

    lat: list[float | None] = [None] * n
    go = threading.Barrier(n)

    def one(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        go.wait()
        t = time.perf_counter()
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read()
        except OSError:  # the server reset or refused the connection: a failed scrape
            return
        finally:
            conn.close()
        if resp.status == 200 and b"gpushare_gres_free" in body:
            lat[i] = time.perf_counter() - t

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    answered = [x for x in lat if x is not None]
    return answered, n - len(answered)


def run_rounds(port: int, runner: Counting, n: int, rounds: int, interval: float) -> tuple[list[int], list[float], int]:
    """``rounds`` rounds of n scrapes, each starting on its own interval boundary: reads per round, latencies,
    failed scrapes."""
    reads, lat, failed = [], [], 0
    start = time.monotonic()
    for r in range(rounds):
        time.sleep(max(0.0, start + (r + 0.05) * interval - time.monotonic()))  # just past the boundary
        before = runner.reads
        got, bad = scrape_round(port, n)
        lat, failed = lat + got, failed + bad
        reads.append(runner.reads - before)
    return reads, lat, failed


def most_in_one_interval(starts: list[float], interval: float) -> int:
    """The most reads begun within any window of ``interval`` seconds."""
    return max((sum(1 for u in starts if s <= u < s + interval) for s in starts), default=0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def concurrent(args, site, squeue: str, scontrol: str) -> None:
    from prometheus_client import start_http_server

    from slurm_gpushare.metrics.exporter import (
        CommandTimeouts,
        Exporter,
        ExporterServer,
        SharedSnapshot,
        SlurmCollector,
        registry_for,
    )
    from slurm_gpushare.slurm.cli_backend import CliClient

    n, rounds, interval = args.concurrent, args.rounds, args.interval
    print(
        f"{n} concurrent scrapes x {rounds} rounds, one round per {interval:g} s interval; "
        f"{args.latency * 1000:.0f} ms added to each Slurm command"
    )
    figures = {}
    for name in ("shared snapshot", "no-cache baseline"):
        runner = Counting(fake_runner(squeue, scontrol), args.latency)
        timeouts = CommandTimeouts(runner, 60.0)
        collector = SlurmCollector(CliClient(timeouts), site)
        if name == "shared snapshot":
            server = ExporterServer("127.0.0.1", 0, Exporter(SharedSnapshot(collector, interval, timeouts=timeouts)))
            import threading

            threading.Thread(target=server.serve_forever, daemon=True).start()
            port = server.server_address[1]
        else:  # what `gpushare exporter` served before: a read of Slurm per scrape
            server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry_for(collector))
            port = server.server_port
        reads, lat, failed = run_rounds(port, runner, n, rounds, interval)
        server.shutdown()
        server.server_close()
        most = most_in_one_interval(runner.starts, interval)
        figures[name] = (reads, pct(lat, 0.5), pct(lat, 0.95), most)
        print(
            f"{name:18}: reads of Slurm per round {reads}, at most {most} begun within any {interval:g} s; "
            f"{runner.commands} Slurm commands; latency p50 {pct(lat, 0.5) * 1000:.0f} ms, "
            f"p95 {pct(lat, 0.95) * 1000:.0f} ms; {failed} of {n * rounds} scrapes failed (connection reset)"
        )
    new, old = figures["shared snapshot"], figures["no-cache baseline"]
    print(
        f"ratio baseline/shared: reads {sum(old[0]) / sum(new[0]):.0f}x, p50 {old[1] / new[1]:.1f}x, "
        f"p95 {old[2] / new[2]:.1f}x"
    )
    print(f"target (at most one read of Slurm per interval): {'met' if new[3] <= 1 else 'NOT met'}")


# ---- hostile clients ------------------------------------------------------------------------------------


def hostile_server(site, squeue: str, scontrol: str, latency: float, interval: float, password: str, cost: int):
    """The server as shipped, with basic auth (bcrypt at ``cost``), over the fake runner; (server, port)."""
    import threading

    import bcrypt

    from slurm_gpushare.metrics import webconfig
    from slurm_gpushare.metrics.exporter import (
        CommandTimeouts,
        Exporter,
        ExporterServer,
        SharedSnapshot,
        SlurmCollector,
    )
    from slurm_gpushare.slurm.cli_backend import CliClient

    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    web = webconfig.parse({"basic_auth_users": {"prometheus": hashed}}, Path("."), [])
    timeouts = CommandTimeouts(Counting(fake_runner(squeue, scontrol), latency), 10.0)
    snapshot = SharedSnapshot(SlurmCollector(CliClient(timeouts), site), interval, timeouts=timeouts, read_budget=40.0)
    server = ExporterServer("127.0.0.1", 0, Exporter(snapshot, web, wait=40.0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def get(port: int, headers: dict[str, str]) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def slurm_values(body: bytes) -> tuple[dict, dict]:
    """(the families computed from Slurm, part_up by part) of one exposition; ages (which grow with the
    clock) left out."""
    from prometheus_client.parser import text_string_to_metric_families

    fams, up = {}, {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if fam.name == "gpushare_exporter_part_up":
                up[s.labels["part"]] = s.value
            elif not fam.name.startswith("gpushare_exporter_") and not fam.name.endswith("_age_seconds"):
                fams[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return fams, up


def scraper(port: int, auth: str, scrapes: int, pause: float) -> tuple[list[float], list[bytes], list[int]]:
    lat, bodies, statuses = [], [], []
    for _ in range(scrapes):
        t = time.perf_counter()
        status, body = get(port, {"Authorization": auth, "X-Prometheus-Scrape-Timeout-Seconds": "10"})
        lat.append(time.perf_counter() - t)
        statuses.append(status)
        if status == 200:
            bodies.append(body)
        time.sleep(pause)
    return lat, bodies, statuses


def attackers(port: int, n: int, per_client: int, stop, kind: str):
    """n threads, each at most ``per_client`` requests or until ``stop``: random passwords ("passwords") or the
    good login with hostile headers ("headers"). Returns (threads, status counts)."""
    import base64
    import random
    import threading
    from collections import Counter

    counts: Counter = Counter()
    lock = threading.Lock()
    hostile = ["0.000001", "1e-300", "-1", "nan", "inf", "0", "junk", "9" * 300]

    def one(i: int, auth: str) -> None:
        rng = random.Random(i)
        for _ in range(per_client):
            if stop.is_set():
                return
            if kind == "passwords":
                pw = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(16))
                hdrs = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{pw}".encode()).decode()}
            else:
                hdrs = {
                    "Authorization": auth,
                    "X-Prometheus-Scrape-Timeout-Seconds": rng.choice(hostile),
                    "Accept": rng.choice(["text/plain;;;q=x", "application/openmetrics-text; version=9", "*/*"]),
                    "Accept-Encoding": rng.choice(["gzip", "br", "", "gzip;q=0"]),
                }
            status, _ = get(port, hdrs)
            with lock:
                counts[status] += 1

    return one, counts


def hostile(args, site, squeue: str, scontrol: str) -> None:
    """An authenticated scraper's latency and the values it is served: quiet, under 100 clients guessing
    passwords, and under clients sending hostile headers."""
    import base64
    import threading

    password = "bench-scrape-password"
    auth = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
    print(
        f"hostile clients: bcrypt cost {args.cost}, {args.attackers} attacking clients (127.0.0.1, each at most "
        f"{args.per_client} requests), a scraper of {args.scrapes} scrapes {args.pause:g} s apart; read interval "
        f"{args.interval:g} s, {args.latency * 1000:.0f} ms per Slurm command"
    )
    runs = {}
    for name in ("quiet", "random passwords", "hostile headers"):
        server, port = hostile_server(site, squeue, scontrol, args.latency, args.interval, password, args.cost)
        get(port, {"Authorization": auth})  # the first read, and the login cached, as a running exporter has it
        stop, threads, counts = threading.Event(), [], {}
        if name != "quiet":
            one, counts = attackers(
                port, args.attackers, args.per_client, stop, "passwords" if name == "random passwords" else "headers"
            )
            threads = [threading.Thread(target=one, args=(i, auth), daemon=True) for i in range(args.attackers)]
            for t in threads:
                t.start()
        lat, bodies, statuses = scraper(port, auth, args.scrapes, args.pause)
        stop.set()
        for t in threads:
            t.join(120)
        server.shutdown()
        server.server_close()
        views = [slurm_values(b) for b in bodies]
        runs[name] = (lat, views, statuses, dict(counts))
    report_hostile(runs)


def report_hostile(runs: dict) -> None:
    quiet_view = runs["quiet"][1][0][0] if runs["quiet"][1] else {}
    q99 = pct(runs["quiet"][0], 0.99)
    for name, (lat, views, statuses, counts) in runs.items():
        differ = sum(1 for fams, _up in views if fams != quiet_view)
        parts_down = sum(1 for _fams, up in views if set(up.values()) != {1.0})
        ok = statuses.count(200)
        print(
            f"{name:17}: scraper p50 {pct(lat, 0.5) * 1000:.1f} ms, p99 {pct(lat, 0.99) * 1000:.1f} ms "
            f"(p99 ratio to quiet {pct(lat, 0.99) / q99:.2f}); {ok}/{len(statuses)} scrapes answered 200; "
            f"{differ} served values other than the quiet run's, {parts_down} with a part down"
            + (f"; attackers' answers {dict(sorted(counts.items()))}" if counts else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--live", action="store_true", help="inside slurmctld: scrape the real cluster")
    ap.add_argument("--large", metavar="PROJECT", help="grow this running test cluster, then --live in it")
    ap.add_argument("--concurrent", type=int, metavar="N", help="N concurrent scrapes of the HTTP server per round")
    ap.add_argument("--rounds", type=int, default=3, help="--concurrent: rounds, one per interval")
    ap.add_argument("--interval", type=float, default=5.0, help="--concurrent: --slurm.read-interval, seconds")
    ap.add_argument("--latency", type=float, default=0.05, help="--concurrent: seconds added to each Slurm command")
    ap.add_argument(
        "--hostile",
        action="store_true",
        help="an authenticated scraper beside 100 clients guessing passwords or sending hostile headers",
    )
    ap.add_argument("--attackers", type=int, default=100, help="--hostile: attacking clients")
    ap.add_argument("--per-client", type=int, default=50, help="--hostile: most requests of one attacking client")
    ap.add_argument("--scrapes", type=int, default=60, help="--hostile: the scraper's scrapes")
    ap.add_argument("--pause", type=float, default=0.05, help="--hostile: seconds between two of its scrapes")
    ap.add_argument("--cost", type=int, default=10, help="--hostile: bcrypt cost of the password hash")
    args = ap.parse_args()
    if args.live:
        return live()
    from slurm_client import grow, large_outputs, measure, run_inside  # bench/slurm_client.py

    if args.large:
        grow(args.large, args.nodes, args.jobs)
        return run_inside(args.large, Path(__file__), ["--live"])

    from slurm_gpushare import examples
    from slurm_gpushare.metrics.exporter import SlurmCollector, exposition, registry_for
    from slurm_gpushare.policy import load_file
    from slurm_gpushare.slurm.cli_backend import CliClient

    site = load_file(examples.example())
    squeue, scontrol = large_outputs(args.jobs, args.nodes)
    if args.concurrent:
        print(f"{args.jobs} jobs, {args.nodes} nodes, policy {examples.example().name}")
        return concurrent(args, site, squeue, scontrol)
    if args.hostile:
        print(f"{args.jobs} jobs, {args.nodes} nodes, policy {examples.example().name}")
        return hostile(args, site, squeue, scontrol)
    print(
        f"{args.jobs} jobs ({len(squeue) / 2**20:.0f} MiB squeue JSON), {args.nodes} nodes "
        f"({len(scontrol) / 2**20:.1f} MiB scontrol JSON), policy {examples.example().name}"
    )

    cli = SlurmCollector(CliClient(fake_runner(squeue, scontrol)), site)
    registry = registry_for(cli)
    secs, peak, text = measure(lambda: exposition(registry))
    read, coll, expo, n = best_phases(cli)
    total = read + coll + expo
    print(
        f"cli backend, full scrape: {secs:.3f} s (best of 3), peak {peak / 2**20:.0f} MiB, "
        f"{len(text) / 2**10:.0f} KiB of exposition text, {n} samples"
    )
    print(
        f"  client read {read:.3f} s ({100 * read / total:.0f}%), collection {coll:.3f} s "
        f"({100 * coll / total:.0f}%), exposition {expo:.3f} s ({100 * expo / total:.0f}%)"
    )

    mem = SlurmCollector(InMemory(CliClient(fake_runner(squeue, scontrol)), site.cluster.name), site)
    registry = registry_for(mem)
    secs, peak, _ = measure(lambda: exposition(registry))
    read, coll, expo, _ = best_phases(mem)
    print(
        f"in-memory client (model objects prebuilt), full scrape: {secs:.3f} s (best of 3), peak {peak / 2**20:.1f} MiB"
    )
    print(f"  read {read:.3f} s, collection {coll:.3f} s, exposition {expo:.3f} s")


if __name__ == "__main__":
    tracemalloc.stop()
    main()
