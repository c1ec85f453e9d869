"""The controller exporter: a prometheus_client Collector over one read of Slurm, and its HTTP server.

A read has four parts, read through the Slurm client (jobs, nodes, sshare,
associations); a part whose read fails is logged, counted in
``gpushare_exporter_scrape_errors_total{part}`` and served from its last good
read, with its age in ``gpushare_exporter_part_age_seconds{part}`` (left out
only while it was never read): a failed or partial read never replaces a good
one.

The server (``ExporterServer``) never reads Slurm on a scrape's thread: one
``SharedSnapshot`` serves every scrape, with at most one read of Slurm begun
per ``interval`` seconds however many scrapes arrive; scrapes that come while
a read is in progress wait for that read. A scraper that gives up or
disconnects therefore leaves nothing behind, and ``CommandTimeouts`` bounds
each Slurm command by ``--slurm.timeout`` and the whole read by the server's
own budget. What one request sends bounds only that request: the time
Prometheus gives the scrape (``X-Prometheus-Scrape-Timeout-Seconds``) is how
long it waits for the read, never how long the shared read may take. TLS,
client certificates and basic auth come from the web configuration file
(``webconfig``), in Prometheus' exporter-toolkit format; authentication comes
before the rate limit, so clients without a login cannot use it up.
"""

from __future__ import annotations

import gzip
import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from ..policy import Site
from ..proc import CommandError, Result
from ..slurm.interface import SlurmClient
from . import collect
from .defaults import DEFAULT_LISTEN, DEFAULT_PORT, DEFAULT_TIMEOUT
from .webconfig import AuthVerdict, BasicAuth, RateLimit, TlsConfig, WebConfig, peer_allowed

PARTS = ("jobs", "nodes", "sshare", "associations")
log = logging.getLogger("gpushare.exporter")


class SlurmCollector:
    """Collector over a Slurm client (``slurm.client.make_client``) and the loaded site policy."""

    def __init__(
        self,
        client: SlurmClient,
        site: Site,
        *,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ):
        self.client, self.site, self.clock, self.timer = client, site, clock, timer
        self.metrics = collect.SiteMetrics(site)
        self.errors = {part: 0 for part in PARTS}
        self.reads = 0
        self.last_read: dict[str, float] = {}
        self.good: dict[str, tuple[object, float]] = {}  # part -> (its last good read, clock() when it ended)
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read Slurm (the families are only known after a read)."""
        return []

    def read(self) -> tuple[collect.SlurmRead, dict[str, bool]]:
        """One read of each part; the second value says which parts were read now. A part whose read fails
        is its last good value (``good``), None when it was never read."""
        readers = {
            # the summaries where the backend has them (CLI: squeue --Format, 30 times faster than --json for
            # 10,000 jobs); the exporter needs no device indexes
            "jobs": getattr(self.client, "job_summaries", self.client.jobs),
            "nodes": self.client.nodes,
            "sshare": self.client.sshare,
            "associations": lambda: self.client.associations(self.site.cluster.name),
        }
        got: dict[str, Any] = {}  # each part's own type (collect.SlurmRead's fields)
        ok: dict[str, bool] = {}
        for part in PARTS:
            start = self.timer()
            try:
                value = readers[part]()
                self.good[part] = (value, self.clock())
                ok[part] = True
            except Exception as exc:  # any failure of one part: count it, serve its last good value
                log.warning(
                    "gpushare exporter: reading %s from Slurm failed (%s); serving its last good read", part, exc
                )
                self.errors[part] += 1
                ok[part] = False
            got[part] = self.good.get(part, (None, 0.0))[0]
            self.last_read[part] = self.timer() - start
        snap = collect.SlurmRead(
            jobs=got["jobs"],
            nodes=got["nodes"],
            shares=got["sshare"],
            associations=got["associations"],
            now=self.clock(),
        )
        return snap, ok

    def collect(self) -> Iterator[Metric]:
        yield from self.scrape()

    def scrape(self) -> list[Metric]:
        """One read of Slurm and every family computed from it, with the exporter's own metrics."""
        with self._lock:
            began, start = self.clock(), self.timer()
            snap, ok = self.read()
            self.reads += 1
            out = [to_prometheus(f) for f in collect.families(self.metrics, snap)]
            return out + self._own(ok, self.timer() - start, began) + [self._ages(snap.now)]

    def _ages(self, now: float) -> Metric:
        ages = GaugeMetricFamily(
            "gpushare_exporter_part_age_seconds",
            "Seconds since the served value of each part was read from Slurm (0 when this "
            "read got it; a part whose read failed serves its last good value); no sample "
            "for a part never read",
            labels=["part"],
        )
        for part in PARTS:
            if part in self.good:
                ages.add_metric([part], max(0.0, now - self.good[part][1]))
        return ages

    def _own(self, ok: dict[str, bool], seconds: float, began: float) -> list[Metric]:
        duration = GaugeMetricFamily(
            "gpushare_exporter_scrape_duration_seconds",
            "Seconds the last read of Slurm took, with computing the families",
            value=seconds,
        )
        taken = GaugeMetricFamily(
            "gpushare_exporter_snapshot_timestamp_seconds",
            "Unix time the served snapshot's read of Slurm began (scrapes share one snapshot "
            "for --slurm.read-interval seconds)",
            value=began,
        )
        reads = CounterMetricFamily(
            "gpushare_exporter_slurm_reads", "Reads of Slurm since the exporter started", value=self.reads
        )
        read = GaugeMetricFamily(
            "gpushare_exporter_read_duration_seconds",
            "Seconds the last scrape spent reading each part from Slurm",
            labels=["part"],
        )
        errors = CounterMetricFamily(
            "gpushare_exporter_scrape_errors",
            "Failed reads of one part from Slurm since the exporter started",
            labels=["part"],
        )
        up = GaugeMetricFamily(
            "gpushare_exporter_part_up", "1 if the last scrape read this part from Slurm, else 0", labels=["part"]
        )
        for part in PARTS:
            read.add_metric([part], self.last_read.get(part, 0.0))
            errors.add_metric([part], self.errors[part])
            up.add_metric([part], 1.0 if ok[part] else 0.0)
        success = GaugeMetricFamily(
            "gpushare_exporter_last_scrape_success",
            "1 if the last scrape read every part from Slurm, else 0",
            value=1.0 if all(ok.values()) else 0.0,
        )
        skipped = CounterMetricFamily(
            "gpushare_exporter_skipped_records",
            "Records in Slurm's output that did not parse and were left out (the rest of "
            "the read was used), by command, since the exporter started",
            labels=["command"],
        )
        for command, count in sorted(getattr(self.client, "skipped", {}).items()):
            skipped.add_metric([command], count)
        return [duration, taken, reads, read, errors, up, success, skipped]


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
    """'ADDR:PORT', ':PORT', 'PORT' or '[v6]:PORT' -> (addr, port); ValueError names what is accepted.

    An empty address is every interface (IPv4), as node_exporter's ':9100' is (``plain_http_problem`` says
    whether it may be served)."""
    addr, sep, port = text.rpartition(":")
    if not sep:
        addr, port = "", text
    addr = addr.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--web.listen-address {text!r}: expected ADDR:PORT with a port 1-65535 (e.g. "
            f"{DEFAULT_LISTEN}: this host only, :{DEFAULT_PORT}: every interface, [::]:{DEFAULT_PORT})"
        )
    return addr, int(port)


INSECURE_FLAG = "--web.insecure-plain-http"


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (an IP address or 'localhost') is this host only."""
    import ipaddress

    if addr.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def plain_http_problem(addr: str, port: int, web: WebConfig | None, insecure: bool) -> str | None:
    """Why the exporter must not serve ``addr:port`` (None: it may). Beyond loopback it serves only with TLS
    (the web config's tls_server_config), unless ``insecure`` (--web.insecure-plain-http) says plain HTTP
    is wanted there: basic auth over plain HTTP sends the password in the clear."""
    if insecure or is_loopback(addr) or (web is not None and web.tls is not None):
        return None
    what = "a web config without tls_server_config" if web is not None else "no --web.config.file"
    return (
        f"--web.listen-address {addr}:{port} is not a loopback address and {what} makes it plain HTTP: "
        f"give a --web.config.file with tls_server_config (and basic_auth_users), listen on 127.0.0.1, or "
        f"pass {INSECURE_FLAG} to serve plain HTTP there"
    )


# ---- one read of Slurm for every scrape -------------------------------------------------------------


class CommandTimeouts:
    """A Runner for the Slurm client: each command gets at most ``limit`` seconds, and none runs past the
    ``deadline`` (a ``monotonic`` time) of the read in progress; a command with no time left is not started
    (a CommandError, so the part counts as failed)."""

    def __init__(self, runner, limit: float, monotonic: Callable[[], float] = time.monotonic):
        self.runner, self.limit, self.monotonic = runner, limit, monotonic
        self.deadline: float | None = None

    def __call__(self, argv, *, timeout: float = 60.0, **kw):
        budget = min(timeout, self.limit)
        if self.deadline is not None:
            left = self.deadline - self.monotonic()
            if left <= 0:
                raise CommandError(
                    Result(tuple(str(a) for a in argv), 124, "", ""),
                    "not started: the scrape's time was used up by the commands before it",
                )
            budget = min(budget, left)
        return self.runner(argv, timeout=budget, **kw)


class SharedSnapshot:
    """The metrics of at most one read of Slurm begun per ``interval`` seconds, shared by every scrape.

    ``get`` returns the last snapshot while its read began less than ``interval`` seconds ago; otherwise
    it starts a read on a thread of its own (unless one is in progress) and waits for it up to the
    scrape's budget. Scrapes never read Slurm themselves: any number of them, and any that disconnect,
    cost one read. The read's own limit is ``read_budget`` seconds (None: only each command's), the same
    whichever scrape began it: a scrape's budget bounds how long that scrape waits, never what the others
    are served."""

    def __init__(
        self,
        collector: SlurmCollector,
        interval: float,
        *,
        timeouts: CommandTimeouts | None = None,
        read_budget: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.collector, self.interval, self.timeouts, self.monotonic = collector, interval, timeouts, monotonic
        self.read_budget = read_budget
        self.reads = 0  # reads begun
        self.waiting = 0  # scrapes waiting for the read in progress (tests and the benchmark watch it)
        self._cond = threading.Condition()
        self._metrics: list[Metric] | None = None
        self._started: float | None = None
        self._reading = False
        self._generation = 0
        self._rendered: dict[tuple[int, str, bool], bytes] = {}
        self._render_lock = threading.Lock()

    def get(self, budget: float | None) -> tuple[list[Metric] | None, int]:
        """(metrics, generation) of the snapshot to serve, waiting at most ``budget`` seconds (None: until the
        read in progress ends) for a read; metrics None when no read has finished in time."""
        with self._cond:
            if not self._reading and not self._fresh():
                self._start(None if self.read_budget is None else self.monotonic() + self.read_budget)
            if self._reading:
                generation = self._generation
                self.waiting += 1
                try:
                    self._cond.wait_for(lambda: self._generation != generation, timeout=budget)
                finally:
                    self.waiting -= 1
            return self._metrics, self._generation

    def render(self, metrics: list[Metric], generation: int, encoder, content_type: str, gzipped: bool) -> bytes:
        """The exposition of a snapshot in one format (gzipped or not), computed once per snapshot and format:
        concurrent scrapes of a new snapshot wait for the first one's rendering instead of each rendering it."""
        key = (generation, content_type, gzipped)
        with self._render_lock:
            cached = self._rendered.get(key)
            if cached is None:
                cached = encoder(_Static(metrics))
                if gzipped:
                    cached = gzip.compress(cached, compresslevel=1)
                with self._cond:
                    if generation == self._generation:
                        self._rendered[key] = cached
            return cached

    def _fresh(self) -> bool:
        return self._started is not None and self.monotonic() - self._started < self.interval

    def _start(self, deadline: float | None) -> None:
        self._reading, self._started = True, self.monotonic()
        self.reads += 1
        threading.Thread(target=self._read, args=(deadline,), name="gpushare-slurm-read", daemon=True).start()

    def _read(self, deadline: float | None) -> None:
        metrics = None
        try:
            if self.timeouts is not None:
                self.timeouts.deadline = deadline
            metrics = self.collector.scrape()
        except Exception:  # the server keeps serving the last snapshot; the log says why
            log.exception("gpushare exporter: reading Slurm failed")
        finally:
            if self.timeouts is not None:
                self.timeouts.deadline = None
            with self._cond:
                if metrics is not None:
                    self._metrics, self._rendered = metrics, {}
                self._reading = False
                self._generation += 1
                self._cond.notify_all()


class _Static:
    """A registry-like holder of already computed families (what prometheus_client's encoders take)."""

    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


# ---- HTTP ------------------------------------------------------------------------------------------

SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
LANDING = (
    b"<html><head><title>gpushare exporter</title></head><body><h1>gpushare exporter</h1>"
    b'<p><a href="/metrics">Metrics</a></p></body></html>\n'
)


class Exporter:
    """What a request gets: basic auth, then the rate limit, then /metrics from the shared snapshot.

    Authentication comes first, so the rate limit (the web config's ``rate_limit``) counts only requests
    that passed it: clients without a login cannot use it up. Their own bounds are ``BasicAuth``'s (429 for
    a client address that keeps failing, 503 at once while every password check is in use)."""

    def __init__(
        self,
        snapshot: SharedSnapshot,
        web: WebConfig | None = None,
        *,
        wait: float = 4 * DEFAULT_TIMEOUT,
        auth: BasicAuth | None = None,
    ):
        self.snapshot, self.wait = snapshot, wait
        self.web = web
        self.auth = auth or (BasicAuth(web.users) if web and web.users else None)
        self.limit = RateLimit(web.rate_interval, web.rate_burst) if web and web.rate_interval else None
        self.headers = dict(web.headers) if web else {}

    def budget(self, header: str | None) -> float:
        """Seconds this scrape may wait for the shared read: Prometheus' scrape timeout less a margin to answer
        in, else ``wait`` (also for a value that is no finite positive number)."""
        try:
            timeout = float(header) if header else 0.0
        except ValueError:
            timeout = 0.0
        if not math.isfinite(timeout) or timeout <= 0:
            return self.wait
        return min(self.wait, max(timeout - min(0.5, timeout / 4), timeout / 2))

    def respond(self, path: str, headers, client: str = "") -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for a GET of ``path`` with the request's ``headers`` from address ``client``."""
        extra = dict(self.headers)
        if self.auth:
            verdict = self.auth.verdict(headers.get("Authorization"), client)
            if verdict == AuthVerdict.LIMITED:
                wait = max(1, math.ceil(self.auth.failures.interval))
                return 429, {**extra, "Retry-After": str(wait)}, b"Too Many Failed Logins\n"
            if verdict == AuthVerdict.BUSY:
                return 503, {**extra, "Retry-After": "1"}, b"Busy Checking Passwords\n"
            if verdict != AuthVerdict.OK:
                return 401, {**extra, "WWW-Authenticate": 'Basic realm="gpushare exporter"'}, b"Unauthorized\n"
        if self.limit and not self.limit.allow():
            return 429, extra, b"Too Many Requests\n"
        route = path.split("?", 1)[0]
        if route == "/":
            return 200, {**extra, "Content-Type": "text/html; charset=utf-8"}, LANDING
        if route != "/metrics":
            return 404, extra, b"Not Found\n"
        return self._metrics(headers, extra)

    def _metrics(self, headers, extra: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        from prometheus_client.exposition import choose_encoder

        metrics, generation = self.snapshot.get(self.budget(headers.get(SCRAPE_TIMEOUT_HEADER)))
        if metrics is None:
            return 503, extra, b"No read of Slurm has finished yet; the exporter's log says why.\n"
        encoder, content_type = choose_encoder(headers.get("Accept") or "")
        gzipped = "gzip" in (headers.get("Accept-Encoding") or "")
        body = self.snapshot.render(metrics, generation, encoder, content_type, gzipped)
        out = {**extra, "Content-Type": content_type}
        if gzipped:
            out["Content-Encoding"] = "gzip"
        return 200, out, body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a connection may idle or dawdle over a request: a stalled client is dropped
    server_version = "gpushare-exporter"
    server: ExporterServer  # the server that made this handler: its exporter answers

    def do_GET(self) -> None:  # http.server's name
        status, headers, body = self.server.exporter.respond(self.path, self.headers, self.client_address[0])
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the scraper went away: nothing of ours is left running for it
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # http.server's signature
        log.debug("%s %s", self.address_string(), format % args)


class ExporterServer(ThreadingHTTPServer):
    """The HTTP(S) server of ``Exporter``. With TLS the handshake runs on the connection's own thread (with a
    timeout), so a client that never completes one blocks nobody."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog (socketserver's 5 resets connections when many scrapers come at once)
    HANDSHAKE_TIMEOUT = 10.0

    def __init__(
        self,
        addr: str,
        port: int,
        exporter: Exporter,
        context: ssl.SSLContext | None = None,
        tls: TlsConfig | None = None,
    ):
        self.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.exporter, self.context, self.tls = exporter, context, tls
        super().__init__((addr, port), _Handler)
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def finish_request(self, request, client_address) -> None:
        if self.context is not None and not self._handshake(request, client_address):
            return
        super().finish_request(request, client_address)

    def _handshake(self, request, client_address) -> bool:
        request.settimeout(self.HANDSHAKE_TIMEOUT)
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            log.info("gpushare exporter: TLS handshake with %s failed: %s", client_address[0], exc)
            return False
        if self.tls is not None and not peer_allowed(self.tls, request.getpeercert()):
            log.info("gpushare exporter: %s: client certificate has none of client_allowed_sans", client_address[0])
            return False
        return True


def serve(exporter: Exporter, addr: str, port: int, web: WebConfig | None = None) -> ExporterServer:
    """Bind the server (OSError when the address is taken or not ours) and serve it on a daemon thread."""
    from .webconfig import ssl_context

    tls = web.tls if web else None
    server = ExporterServer(addr, port, exporter, ssl_context(tls) if tls else None, tls)
    threading.Thread(target=server.serve_forever, name="gpushare-exporter-http", daemon=True).start()
    return server
