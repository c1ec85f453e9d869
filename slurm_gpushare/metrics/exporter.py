"""The controller exporter: a prometheus_client Collector that reads Slurm once per scrape, and its HTTP server.

Each scrape reads four parts through the Slurm client (jobs, nodes, sshare,
associations); a part whose read fails is logged, counted in
``gpushare_exporter_scrape_errors_total{part}`` and left out, and the
families of the other parts are still exported. Scrapes are serialised (one
read of Slurm at a time, whatever the number of concurrent scrapers).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from ..policy import Site
from . import collect

PARTS = ("jobs", "nodes", "sshare", "associations")
DEFAULT_PORT = 9877
log = logging.getLogger("gpushare.exporter")


class SlurmCollector:
    """Collector over a Slurm client (``slurm.client.make_client``) and the loaded site policy."""

    def __init__(self, client, site: Site, *, clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter):
        self.client, self.site, self.clock, self.timer = client, site, clock, timer
        self.metrics = collect.SiteMetrics(site)
        self.errors = {part: 0 for part in PARTS}
        self.last_read: dict[str, float] = {}
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read Slurm (the families are only known after a read)."""
        return []

    def read(self) -> tuple[collect.Snapshot, dict[str, bool]]:
        """One read of each part; a failed part is None in the snapshot and False in the second value."""
        readers = {
            # the summaries where the backend has them (CLI: squeue --Format, 30 times faster than --json for
            # 10,000 jobs); the exporter needs no device indexes
            "jobs": getattr(self.client, "job_summaries", self.client.jobs),
            "nodes": self.client.nodes,
            "sshare": self.client.sshare,
            "associations": lambda: self.client.associations(self.site.cluster.name),
        }
        got: dict[str, object] = {}
        ok: dict[str, bool] = {}
        for part in PARTS:
            start = self.timer()
            try:
                got[part] = readers[part]()
                ok[part] = True
            except Exception as exc:  # noqa: BLE001 - any failure of one part: count it, export the others
                log.warning("gpushare exporter: reading %s from Slurm failed: %s", part, exc)
                self.errors[part] += 1
                got[part], ok[part] = None, False
            self.last_read[part] = self.timer() - start
        snap = collect.Snapshot(jobs=got["jobs"], nodes=got["nodes"], shares=got["sshare"],
                                associations=got["associations"], now=self.clock())
        return snap, ok

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            start = self.timer()
            snap, ok = self.read()
            out = [to_prometheus(f) for f in collect.families(self.metrics, snap)]
            out += self._own(ok, self.timer() - start)
        yield from out

    def _own(self, ok: dict[str, bool], seconds: float) -> list[Metric]:
        duration = GaugeMetricFamily("gpushare_exporter_scrape_duration_seconds",
                                     "Seconds the last scrape took: reading Slurm and computing the families",
                                     value=seconds)
        read = GaugeMetricFamily("gpushare_exporter_read_duration_seconds",
                                 "Seconds the last scrape spent reading each part from Slurm", labels=["part"])
        errors = CounterMetricFamily("gpushare_exporter_scrape_errors",
                                     "Failed reads of one part from Slurm since the exporter started", labels=["part"])
        up = GaugeMetricFamily("gpushare_exporter_part_up", "1 if the last scrape read this part from Slurm, else 0",
                               labels=["part"])
        for part in PARTS:
            read.add_metric([part], self.last_read.get(part, 0.0))
            errors.add_metric([part], self.errors[part])
            up.add_metric([part], 1.0 if ok[part] else 0.0)
        success = GaugeMetricFamily("gpushare_exporter_last_scrape_success",
                                    "1 if the last scrape read every part from Slurm, else 0",
                                    value=1.0 if all(ok.values()) else 0.0)
        return [duration, read, errors, up, success]


def to_prometheus(fam: collect.Family) -> Metric:
    cls = CounterMetricFamily if fam.type == "counter" else GaugeMetricFamily
    metric = cls(fam.name, fam.help, labels=list(fam.labels))
    for key in sorted(fam.samples):
        metric.add_metric(list(key), fam.samples[key])
    return metric


def registry_for(collector: SlurmCollector) -> CollectorRegistry:
    """A registry holding only our collector (no process/platform collectors of the default registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """One scrape in the Prometheus text format (what --once prints)."""
    from prometheus_client import generate_latest

    return generate_latest(registry).decode("utf-8")


def parse_listen(text: str) -> tuple[str, int]:
    """'ADDR:PORT', ':PORT', 'PORT' or '[v6]:PORT' -> (addr, port); ValueError names what is accepted."""
    addr, sep, port = text.rpartition(":")
    if not sep:
        addr, port = "", text
    addr = addr.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text!r}: expected ADDR:PORT with a port 1-65535 (e.g. 0.0.0.0:{DEFAULT_PORT}, "
                         f"[::]:{DEFAULT_PORT}, :{DEFAULT_PORT})")
    return addr, int(port)


def serve(registry: CollectorRegistry, addr: str, port: int):
    """Start the HTTP server (a daemon thread answering /metrics); returns prometheus_client's (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=registry)
