"""The exporter on a network: web configuration file, TLS, basic auth, one shared read of Slurm, timeouts.

The server is the real one (``ExporterServer`` on 127.0.0.1, a free port) over the recorded Slurm outputs
of test_metrics_exporter.py; the TLS files are made by openssl for each module (tests/tlsfiles.py).
A read of Slurm is held open with a gate (the runner waits on an Event), so "N scrapes during one read"
is a state the test sets up, not a race it hopes to win.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
from pathlib import Path

import bcrypt
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpushare import examples
from slurm_gpushare.cli import main
from slurm_gpushare.metrics import webconfig
from slurm_gpushare.metrics.exporter import CommandTimeouts, Exporter, ExporterServer, SharedSnapshot, SlurmCollector
from slurm_gpushare.metrics.webconfig import BasicAuth, WebConfigError
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import CommandError
from slurm_gpushare.slurm.cli_backend import CliClient
from tests import tlsfiles
from tests.unit.metrics.test_exporter import NOW, REC24, Recorded

PASSWORD = "s3cret-scrape"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests, same code path


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tlsfiles.TlsFiles:
    return tlsfiles.make(tmp_path_factory.mktemp("tls"))


class Gate:
    """A Runner over the recordings that counts the Slurm commands it runs and the timeouts it was given,
    and, while ``held``, waits at each command until the test opens it."""

    def __init__(self, held: bool = False):
        self.inner = Recorded(REC24)
        self.commands: list[tuple[str, ...]] = []
        self.timeouts: list[float] = []
        self.open = threading.Event()
        self.entered = threading.Event()
        if not held:
            self.open.set()

    def __call__(self, argv, **kw):
        self.commands.append(tuple(argv))
        self.timeouts.append(kw.get("timeout"))
        self.entered.set()
        assert self.open.wait(30), "the test never opened the gate"
        return self.inner(argv, **kw)

    def reads(self) -> int:
        """Reads of Slurm begun: each read runs squeue once."""
        return sum(1 for argv in self.commands if argv[0] == "squeue")


class Stack:
    """A served exporter: the gate, the shared snapshot, the server; ``get`` makes one request."""

    def __init__(
        self, web=None, *, interval=15.0, held=False, limit=10.0, clock=None, context=None, auth=None, read_budget=None
    ):
        self.gate = Gate(held)
        monotonic = {"monotonic": clock} if clock else {}  # one clock for the snapshot and the commands' deadline
        self.timeouts = CommandTimeouts(self.gate, limit, **monotonic)
        collector = SlurmCollector(CliClient(self.timeouts), load_file(examples.example()), clock=lambda: NOW)
        budget = {"read_budget": read_budget} if read_budget is not None else {}
        self.snapshot = SharedSnapshot(collector, interval, timeouts=self.timeouts, **budget, **monotonic)
        self.exporter = Exporter(self.snapshot, web, **({"auth": auth} if auth is not None else {}))
        tls = web.tls if web else None
        self.server = ExporterServer("127.0.0.1", 0, self.exporter, webconfig.ssl_context(tls) if tls else None, tls)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.context = context

    def connection(self, context=None) -> http.client.HTTPConnection:
        context = context or self.context
        if context is not None:
            return http.client.HTTPSConnection("localhost", self.port, timeout=30, context=context)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def get(self, path="/metrics", headers=None, context=None) -> tuple[int, dict, str]:
        conn = self.connection(context)
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read().decode()
        finally:
            conn.close()

    def close(self) -> None:
        self.gate.open.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stacks():
    made: list[Stack] = []

    def make(*args, **kw) -> Stack:
        made.append(Stack(*args, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def client_context(tls: tlsfiles.TlsFiles, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    if cert:
        ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    return ctx


def web_file(tmp_path: Path, doc: dict | str) -> Path:
    path = tmp_path / "web-config.yml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def problems(tmp_path: Path, doc: dict | str) -> str:
    with pytest.raises(WebConfigError) as err:
        webconfig.load(web_file(tmp_path, doc))
    return err.value.report()


# ---- the web configuration file ----------------------------------------------------------------------


def test_unknown_keys_are_refused_naming_the_key_and_what_is_accepted(tmp_path, tls):
    report = problems(
        tmp_path,
        {
            "tls_server_config": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key), "certfile": "x"},
            "basic_auth": {"u": HASH},
        },
    )
    assert (
        "basic_auth: unknown key in the file; accepted: tls_server_config, http_server_config, basic_auth_users, "
        "rate_limit" in report
    )
    assert "tls_server_config.certfile: unknown key in tls_server_config; accepted: cert_file, key_file" in report
    assert report.startswith(f"--web.config.file {tmp_path / 'web-config.yml'}: 2 problem(s)")


def test_every_problem_at_once_each_with_its_key(tmp_path, tls):
    report = problems(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": "missing.crt",
                "client_auth_type": "RequestClientCert",
                "min_version": "TLS14",
                "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
            },
            "http_server_config": {"headers": {"X-Frame-Options": "allow", "Server": "x"}},
            "basic_auth_users": {"prometheus": "plain-text-password"},
            "rate_limit": {"interval": "soon", "burst": 0},
        },
    )
    for line in (
        f"tls_server_config.cert_file: cannot read {tmp_path / 'missing.crt'}",
        "tls_server_config.key_file: missing: TLS needs key_file (or key inline)",
        "tls_server_config.client_auth_type: 'RequestClientCert' (asks for a certificate without verifying it: not "
        "supported); accepted: NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert",
        "tls_server_config.min_version: 'TLS14'; accepted: TLS10, TLS11, TLS12, TLS13",
        "tls_server_config.cipher_suites: Go cipher suite names are not supported here",
        "http_server_config.headers.X-Frame-Options: 'allow'; accepted: deny, sameorigin",
        "http_server_config.headers.Server: unknown key in http_server_config.headers; accepted: Strict-Transport",
        "basic_auth_users.prometheus: expected a bcrypt hash",
        "rate_limit.interval: 'soon'; expected a duration",
    ):
        assert line in report, (line, report)


def test_client_ca_and_client_auth_type_go_together(tmp_path, tls):
    base = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
    assert "client_auth_type: a client CA is configured" in problems(
        tmp_path, {"tls_server_config": {**base, "client_ca_file": str(tls.ca)}}
    )
    assert "client_ca_file: client_auth_type RequireAndVerifyClientCert needs the CA" in problems(
        tmp_path, {"tls_server_config": {**base, "client_auth_type": "RequireAndVerifyClientCert"}}
    )
    assert "client_allowed_sans: needs client_auth_type RequireAndVerifyClientCert" in problems(
        tmp_path,
        {
            "tls_server_config": {
                **base,
                "client_auth_type": "VerifyClientCertIfGiven",
                "client_ca_file": str(tls.ca),
                "client_allowed_sans": ["x"],
            }
        },
    )


def test_relative_files_are_read_from_the_config_directory_and_an_empty_file_is_plain_http(tmp_path, tls):
    for src in (tls.server_cert, tls.server_key):
        (tmp_path / src.name).write_text(src.read_text())
    web = webconfig.load(
        web_file(
            tmp_path,
            {
                "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
                "basic_auth_users": {"prometheus": HASH},
            },
        )
    )
    assert web.tls.cert == tls.server_cert.read_text() and web.users == {"prometheus": HASH}
    assert "PRIVATE KEY" not in repr(web) and HASH not in repr(web)  # no secret in a log line
    empty = webconfig.load(web_file(tmp_path, ""))
    assert empty.tls is None and empty.users == {}


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path, tls):
    report = problems(
        tmp_path, {"tls_server_config": {"cert_file": str(tls.server_cert), "key_file": str(tls.client_key)}}
    )
    assert "tls_server_config: the certificate and key do not load" in report


def test_cli_refuses_a_bad_web_config_before_serving(tmp_path):
    path = web_file(tmp_path, {"basic_auth_users": {"prometheus": HASH}, "tls_config": {}})
    res = CliRunner().invoke(
        main,
        ["exporter", "--policy", str(examples.example()), "--web.config.file", str(path)],
        obj={"runner": Recorded(REC24)},
    )
    assert res.exit_code == 1
    assert "tls_config: unknown key in the file; accepted: tls_server_config" in res.output


def test_help_names_the_flags_and_the_default_port():
    res = CliRunner().invoke(main, ["exporter", "--help"])
    out = " ".join(res.output.split())
    for flag in ("--web.listen-address", "--web.config.file", "--slurm.read-interval", "--slurm.timeout"):
        assert flag in out
    assert "default: 127.0.0.1:9877" in out and "this host only, on port 9877" in out
    assert "--web.insecure-plain-http" in out


# ---- TLS ---------------------------------------------------------------------------------------------


def _tls_web(tmp_path, tls, **extra) -> webconfig.WebConfig:
    return webconfig.load(
        web_file(
            tmp_path,
            {"tls_server_config": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key), **extra}},
        )
    )


def test_tls_scrape_verified_against_the_ca_and_plain_http_gets_nothing(tmp_path, tls, stacks):
    s = stacks(_tls_web(tmp_path, tls))
    status, headers, body = s.get(context=client_context(tls))
    assert status == 200 and "gpushare_gres_free{" in body
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        s.get(context=None)  # plain HTTP to the TLS port: no HTTP answer
    with pytest.raises(ssl.SSLCertVerificationError):
        s.get(context=ssl.create_default_context())  # a client that does not trust the test CA


def test_client_certificates_required_and_verified(tmp_path, tls, stacks):
    web = _tls_web(
        tmp_path,
        tls,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(tls.ca),
        client_allowed_sans=["prometheus"],
    )
    s = stacks(web)
    assert s.get(context=client_context(tls, cert=True))[0] == 200
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        s.get(context=client_context(tls, cert=False))


def test_client_allowed_sans_turns_away_another_client(tmp_path, tls, stacks):
    web = _tls_web(
        tmp_path,
        tls,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(tls.ca),
        client_allowed_sans=["grafana"],
    )
    s = stacks(web)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        s.get(context=client_context(tls, cert=True))


def test_a_client_that_never_handshakes_blocks_no_one(tmp_path, tls, stacks):
    s = stacks(_tls_web(tmp_path, tls))
    idle = socket.create_connection(("127.0.0.1", s.port))  # connects, sends nothing
    try:
        assert s.get(context=client_context(tls))[0] == 200
    finally:
        idle.close()


# ---- basic auth ----------------------------------------------------------------------------------------


def _auth_web(**extra) -> webconfig.WebConfig:
    raw = {"basic_auth_users": {"prometheus": HASH}, **extra}
    out: list = []
    web = webconfig.parse(raw, Path("."), out)
    assert out == []
    return web


def test_basic_auth_accepts_the_user_and_answers_401_otherwise(stacks):
    s = stacks(_auth_web(http_server_config={"headers": {"X-Content-Type-Options": "nosniff"}}))
    status, headers, body = s.get(headers=basic("prometheus", PASSWORD))
    assert status == 200 and "gpushare_gres_free{" in body and headers["X-Content-Type-Options"] == "nosniff"
    for hdrs in (
        {},
        basic("prometheus", "wrong"),
        basic("grafana", PASSWORD),
        {"Authorization": "Bearer x"},
        {"Authorization": "Basic !!!"},
    ):
        status, headers, body = s.get(headers=hdrs)
        assert status == 401, hdrs
        assert headers["WWW-Authenticate"].startswith("Basic") and "gpushare" not in body.replace("gpushare exp", "")
    assert s.get("/", headers={})[0] == 401  # every path, not only /metrics


def test_bcrypt_runs_once_per_password_not_per_scrape():
    auth = BasicAuth({"prometheus": HASH})
    good = basic("prometheus", PASSWORD)["Authorization"]
    bad = basic("prometheus", "nope")["Authorization"]
    assert all(auth.check(good) for _ in range(20))
    assert not any(auth.check(bad) for _ in range(5))
    assert auth.bcrypt_runs == 2
    assert not auth.check(basic("prometheus", "x" * 100)["Authorization"])  # over bcrypt's 72 bytes: no match


def test_an_unknown_user_costs_a_bcrypt_as_a_known_one_does():
    auth = BasicAuth({"prometheus": HASH})
    assert not auth.check(basic("mallory", PASSWORD)["Authorization"])
    assert auth.bcrypt_runs == 1  # checked against a dummy hash, not answered at once


def test_htpasswd_style_2y_hashes_are_accepted():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)
    out: list = []
    web = webconfig.parse({"basic_auth_users": {"u": hashed}}, Path("."), out)
    assert out == [] and BasicAuth(web.users).check(basic("u", "pw")["Authorization"])


def test_rate_limit_answers_429_past_the_burst():
    clock = [0.0]
    limit = webconfig.RateLimit(1.0, 2, clock=lambda: clock[0])
    assert [limit.allow() for _ in range(3)] == [True, True, False]
    clock[0] += 1.0
    assert limit.allow() and not limit.allow()


# ---- one read of Slurm for every scrape ------------------------------------------------------------------


def _concurrent(stack: Stack, n: int, headers=None) -> list:
    results: list = [None] * n

    def one(i):
        results[i] = stack.get(headers=headers)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _wait_until(what, probe):
    """Poll a condition the code under test will reach (not a timing assertion: 30 s is only a hang guard)."""
    deadline = time.monotonic() + 30
    while not probe():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_concurrent_scrapes_share_one_read_of_slurm(stacks):
    s = stacks(held=True)
    threads, results = _concurrent(s, 20)
    _wait_until("20 scrapes waiting for the one read", lambda: s.snapshot.waiting == 20)
    assert s.gate.reads() == 1
    s.gate.open.set()
    for t in threads:
        t.join(30)
    assert {r[0] for r in results} == {200}
    assert len({r[2] for r in results}) == 1  # the same snapshot, the same text
    assert s.gate.reads() == 1 and len(s.gate.commands) == 4  # squeue, scontrol, sshare, sacctmgr: once


def test_one_read_per_interval_whatever_the_number_of_scrapes(stacks):
    clock = [1000.0]
    s = stacks(interval=15.0, clock=lambda: clock[0])
    for _ in range(10):
        assert s.get()[0] == 200
    assert s.gate.reads() == 1
    clock[0] += 14.9
    assert s.get()[0] == 200 and s.gate.reads() == 1
    clock[0] += 0.1
    status, _h, body = s.get()
    assert status == 200 and s.gate.reads() == 2
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert fams["gpushare_exporter_slurm_reads"].samples[0].value == 2
    assert fams["gpushare_exporter_snapshot_timestamp_seconds"].samples[0].value == NOW


def test_scrapers_that_disconnect_leave_no_slurm_command_behind(stacks):
    s = stacks(held=True)
    s.get  # noqa: B018 - the server is up
    conns = []
    for _ in range(10):
        conn = socket.create_connection(("127.0.0.1", s.port))
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        conns.append(conn)
    _wait_until("10 scrapes waiting", lambda: s.snapshot.waiting == 10)
    for conn in conns:
        conn.close()  # every scraper gives up at once
    s.gate.open.set()
    _wait_until("the read finished", lambda: s.snapshot.waiting == 0 and not s.snapshot._reading)
    assert s.gate.reads() == 1 and len(s.gate.commands) == 4


# ---- timeouts -------------------------------------------------------------------------------------------


def test_each_command_gets_the_smaller_of_its_limit_and_the_time_left():
    seen = []
    clock = [100.0]
    timeouts = CommandTimeouts(lambda argv, **kw: seen.append(kw["timeout"]), 10.0, monotonic=lambda: clock[0])
    timeouts(["squeue"], timeout=120)
    timeouts.deadline = 103.0
    timeouts(["scontrol"], timeout=120)
    clock[0] = 103.0
    with pytest.raises(CommandError, match="not started: the scrape's time was used up"):
        timeouts(["sshare"])
    assert seen == [10.0, 3.0]


def test_the_scrape_timeout_prometheus_sends_does_not_bound_the_shared_read(stacks):
    """The header bounds how long that scrape waits; the commands of the read it began keep their own limit."""
    s = stacks(limit=10.0)
    assert s.get(headers={"X-Prometheus-Scrape-Timeout-Seconds": "4"})[0] == 200
    assert s.gate.timeouts == [10.0] * 4


def test_the_read_has_a_budget_of_its_own(stacks):
    clock = [100.0]
    s = stacks(limit=10.0, read_budget=6.0, clock=lambda: clock[0])
    assert s.get(headers={"X-Prometheus-Scrape-Timeout-Seconds": "30"})[0] == 200
    assert s.gate.timeouts == [6.0] * 4  # the read's 6 s (the clock stands still), whatever the header says


def test_without_the_header_the_command_limit_applies(stacks):
    s = stacks(limit=7.0)
    assert s.get()[0] == 200
    assert s.gate.timeouts == [7.0] * 4


def test_a_scrape_that_runs_out_of_time_gets_503_and_starts_no_second_read(stacks):
    s = stacks(held=True)
    status, _h, body = s.get(headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.2"})
    assert status == 503 and "No read of Slurm has finished yet" in body
    assert s.gate.reads() == 1
    s.gate.open.set()
    _wait_until("the read finished", lambda: not s.snapshot._reading)
    status, _h, body = s.get()
    assert status == 200 and s.gate.reads() == 1  # the read begun for the first scrape serves this one
    # and it read every part: the first scrape's short timeout bounded that scrape's wait, not the read
    assert len(s.gate.commands) == 4
    for part in ("jobs", "nodes", "sshare", "associations"):
        assert f'gpushare_exporter_part_up{{part="{part}"}} 1.0' in body


def test_budget_leaves_a_margin_to_answer_in():
    exporter = Exporter(None, wait=40.0)
    assert exporter.budget(None) == 40.0 and exporter.budget("junk") == 40.0
    assert exporter.budget("10") == 9.5 and exporter.budget("1") == 0.75 and exporter.budget("100") == 40.0


def test_a_snapshot_is_rendered_once_per_format_whatever_the_number_of_scrapes(stacks):
    s = stacks()
    metrics, generation = s.snapshot.get(None)
    calls, release = [], threading.Event()

    def encoder(registry):
        calls.append(1)
        release.wait(30)
        return b"text"

    threads = [
        threading.Thread(target=s.snapshot.render, args=(metrics, generation, encoder, "text/plain", False))
        for _ in range(10)
    ]
    for t in threads:
        t.start()
    _wait_until("the first rendering under way", lambda: calls)
    release.set()
    for t in threads:
        t.join(30)
    assert len(calls) == 1
    assert s.snapshot.render(metrics, generation, encoder, "text/plain", True) != b"text"  # gzip: its own entry
    assert len(calls) == 2
