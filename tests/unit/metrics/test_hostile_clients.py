"""The exporter facing hostile clients: what one request sends never changes what the others are served.

- headers of one scrape (the scrape timeout Prometheus sends included) bound only how long that scrape waits;
- a part whose read fails keeps serving its last good value, with its age, and the failure is counted;
- password checks are bounded: no lock held during bcrypt, guesses never evict a good login, a client that
  keeps failing gets 429, a check that finds every slot busy answers 503 at once;
- clients without a login cannot use up the rate limit;
- beyond loopback the exporter serves only with TLS, or when told plain HTTP is wanted.

Slow password checks are a fake ``checkpw`` held on an Event, so "a check in progress" is a state the test
sets up; threads are joined with a 30 s guard against a hang, never timed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpushare import examples
from slurm_gpushare.cli import main
from slurm_gpushare.metrics import exporter as exp
from slurm_gpushare.metrics import webconfig
from slurm_gpushare.metrics.defaults import DEFAULT_LISTEN
from slurm_gpushare.metrics.exporter import Exporter, SlurmCollector, exposition, parse_listen, registry_for
from slurm_gpushare.policy import load_file
from slurm_gpushare.slurm.cli_backend import CliClient
from tests.unit.metrics.test_exporter import NOW, REC24, Recorded
from tests.unit.metrics.test_webserver import HASH, PASSWORD, _wait_until, basic

HOSTILE_TIMEOUTS = ("0.000001", "1e-300", "-5", "0", "nan", "inf", "-inf", "junk", "9" * 400, "0x10", " 3 ")


def families(body: str) -> dict[str, dict[tuple, float]]:
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(body)
    }


def slurm_view(body: str) -> dict[str, dict[tuple, float]]:
    """The families computed from Slurm (the exporter's own timings left out)."""
    return {name: samples for name, samples in families(body).items() if not name.startswith("gpushare_exporter_")}


# ---- headers of one scrape ---------------------------------------------------------------------------------


def test_a_tiny_scrape_timeout_does_not_make_others_see_a_partial_read(stacks):
    """A scrape that gives itself a microsecond begins the read; it gets 503, the read still reads every part,
    and the next scrape is served all of it."""
    quiet = stacks()
    want = slurm_view(quiet.get()[2])
    s = stacks(held=True)
    status, _h, _b = s.get(headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.000001"})
    assert status == 503
    s.gate.open.set()
    _wait_until("the read finished", lambda: not s.snapshot._reading)
    status, _h, body = s.get()
    assert status == 200
    fams = families(body)
    assert set(fams["gpushare_exporter_part_up"].values()) == {1.0}
    assert slurm_view(body) == want


@pytest.mark.parametrize("header", HOSTILE_TIMEOUTS)
def test_hostile_scrape_timeouts_leave_every_part_read(stacks, header):
    s = stacks(limit=10.0)
    status, _h, _body = s.get(
        headers={
            "X-Prometheus-Scrape-Timeout-Seconds": header,
            "Accept": "text/plain;;;" + "x" * 1000,
            "Accept-Encoding": "br, *;q=0",
        }
    )
    assert status in (200, 503)
    _wait_until("the read finished", lambda: not s.snapshot._reading)
    assert s.gate.timeouts == [10.0] * 4  # every command of the read with its own limit, none skipped
    status, _h, body = s.get()
    assert status == 200 and set(families(body)["gpushare_exporter_part_up"].values()) == {1.0}


def test_budget_of_a_value_that_is_no_finite_positive_number_is_the_default_wait():
    exporter = Exporter(None, wait=40.0)
    for header in ("nan", "inf", "-inf", "-1", "0"):
        assert exporter.budget(header) == 40.0, header


# ---- a failed part keeps its last good value ---------------------------------------------------------


class Failing(Recorded):
    """The recordings; a command named in ``failing`` (changed between reads) exits 1."""

    def __call__(self, argv, **kw):
        self.fail = set(self.failing)
        return super().__call__(argv, **kw)

    failing: tuple[str, ...] = ()


def test_a_failed_part_serves_its_last_good_value_with_its_age_and_counts_the_failure():
    runner, clock = Failing(REC24), [NOW]
    collector = SlurmCollector(CliClient(runner), load_file(examples.example()), clock=lambda: clock[0])
    good = families(exposition(registry_for(collector)))
    runner.failing, clock[0] = ("sshare", "squeue"), NOW + 30
    later = families(exposition(registry_for(collector)))
    for name in (
        "gpushare_fairshare_level_fs",
        "gpushare_fairshare_factor",
        "gpushare_gpu_equivalents_allocated",
        "gpushare_jobs_pending",
        "gpushare_stranded_units",
        "gpushare_quota_used",
    ):
        assert later[name] == good[name], name
    part = lambda p: (("part", p),)  # noqa: E731
    assert later["gpushare_exporter_part_up"][part("sshare")] == 0.0
    assert later["gpushare_exporter_part_up"][part("nodes")] == 1.0
    assert later["gpushare_exporter_scrape_errors"][part("sshare")] == 1.0
    assert later["gpushare_exporter_scrape_errors"][part("jobs")] == 1.0
    assert later["gpushare_exporter_part_age_seconds"][part("sshare")] == 30.0
    assert later["gpushare_exporter_part_age_seconds"][part("jobs")] == 30.0
    assert later["gpushare_exporter_part_age_seconds"][part("nodes")] == 0.0
    assert later["gpushare_exporter_last_scrape_success"] == {(): 0.0}
    runner.failing, clock[0] = (), NOW + 60
    again = families(exposition(registry_for(collector)))
    assert set(again["gpushare_exporter_part_age_seconds"].values()) == {0.0}
    assert again["gpushare_exporter_scrape_errors"][part("sshare")] == 1.0  # a counter: the failure stays counted


def test_a_part_never_read_has_no_age_and_no_families():
    collector = SlurmCollector(
        CliClient(Recorded(REC24, fail=("sshare",))), load_file(examples.example()), clock=lambda: NOW
    )
    fams = families(exposition(registry_for(collector)))
    assert "gpushare_fairshare_level_fs" not in fams
    assert (("part", "sshare"),) not in fams["gpushare_exporter_part_age_seconds"]
    assert fams["gpushare_exporter_part_age_seconds"][(("part", "jobs"),)] == 0.0


# ---- password checks ----------------------------------------------------------------------------------


class SlowCheck:
    """A fake bcrypt.checkpw: the right password is PASSWORD; while ``hold`` is clear, a check of ``slow`` waits
    (a check in progress, as long as the test wants). Counts its runs and whether the auth lock was held."""

    def __init__(self, slow: bytes | None = None):
        self.slow, self.runs, self.auth = slow, 0, None
        self.hold, self.entered = threading.Event(), threading.Event()
        self.locked_during: list[bool] = []

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.runs += 1
        self.locked_during.append(self.auth._lock.locked())
        if password == self.slow:
            self.entered.set()
            assert self.hold.wait(30), "the test never released the check"
        return password == PASSWORD.encode()


def make_auth(slow: bytes | None = None, **kw) -> tuple[webconfig.BasicAuth, SlowCheck]:
    check = SlowCheck(slow)
    auth = webconfig.BasicAuth({"prometheus": HASH}, checkpw=check, **kw)
    check.auth = auth
    return auth, check


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


GOOD = basic("prometheus", PASSWORD)["Authorization"]


def test_no_lock_is_held_during_a_password_check_and_a_cached_login_passes_meanwhile():
    auth, check = make_auth(slow=b"guess")
    assert auth.verdict(GOOD, "10.0.0.1") == webconfig.AuthVerdict.OK  # cached from now on
    slow, _ = in_thread(auth.verdict, basic("prometheus", "guess")["Authorization"], "10.0.0.2")
    assert check.entered.wait(30)
    cached, out = in_thread(auth.verdict, GOOD, "10.0.0.1")
    cached.join(30)
    assert out == [webconfig.AuthVerdict.OK]  # answered while the slow check still runs
    check.hold.set()
    slow.join(30)
    assert check.locked_during == [False, False]
    assert check.runs == 2  # the cached login cost no second check


def test_a_busy_check_answers_at_once_rather_than_queueing():
    auth, check = make_auth(slow=b"guess", workers=1)
    slow, _ = in_thread(auth.verdict, basic("prometheus", "guess")["Authorization"], "10.0.0.2")
    assert check.entered.wait(30)
    busy, out = in_thread(auth.verdict, basic("prometheus", "another")["Authorization"], "10.0.0.3")
    busy.join(30)
    assert out == [webconfig.AuthVerdict.BUSY] and check.runs == 1
    exporter = Exporter(None, auth=auth)
    status, headers, _ = exporter.respond("/metrics", {"Authorization": GOOD}, "10.0.0.4")
    assert status == 503 and headers["Retry-After"] == "1"  # not cached yet, no slot free: 503 at once
    check.hold.set()
    slow.join(30)
    assert auth.verdict(GOOD, "10.0.0.4") == webconfig.AuthVerdict.OK  # a slot free again


def test_failed_attempts_never_evict_a_good_login():
    auth, check = make_auth(size=4, failed_size=8)
    assert auth.verdict(GOOD, "10.0.0.1") == webconfig.AuthVerdict.OK
    for i in range(500):  # every guess a new password from a new address (no client limit reached)
        assert (
            auth.verdict(basic("prometheus", f"guess-{i}")["Authorization"], f"10.1.{i // 250}.{i % 250}")
            == webconfig.AuthVerdict.DENIED
        )
    runs = check.runs
    assert auth.verdict(GOOD, "10.0.0.1") == webconfig.AuthVerdict.OK
    assert check.runs == runs  # still cached: no second bcrypt for the good login


def test_a_repeated_wrong_password_costs_one_check():
    auth, check = make_auth()
    bad = basic("prometheus", "nope")["Authorization"]
    assert [auth.verdict(bad, f"10.0.0.{i}") for i in range(5)] == [webconfig.AuthVerdict.DENIED] * 5
    assert check.runs == 1


def test_a_client_that_keeps_failing_gets_429_and_its_cached_login_still_passes():
    clock = [0.0]
    auth, check = make_auth(failures=webconfig.ClientFailures(burst=3, interval=10.0, clock=lambda: clock[0]))
    exporter = Exporter(None, auth=auth)
    assert auth.verdict(GOOD, "10.0.0.9") == webconfig.AuthVerdict.OK
    statuses = [
        exporter.respond("/", {"Authorization": basic("prometheus", f"g{i}")["Authorization"]}, "10.0.0.9")[0]
        for i in range(6)
    ]
    assert statuses == [401, 401, 401, 429, 429, 429]
    assert check.runs == 4  # the good login and three guesses: no bcrypt once limited
    status, headers, _ = exporter.respond(
        "/", {"Authorization": basic("prometheus", "g9")["Authorization"]}, "10.0.0.9"
    )
    assert status == 429 and headers["Retry-After"] == "10"
    assert exporter.respond("/", {"Authorization": GOOD}, "10.0.0.9")[0] == 200  # cached: passes
    assert exporter.respond("/", {"Authorization": basic("prometheus", "g0")["Authorization"]}, "10.0.0.8")[0] == 401
    clock[0] += 10.0  # one failure more allowed
    assert exporter.respond("/", {"Authorization": basic("prometheus", "x")["Authorization"]}, "10.0.0.9")[0] == 401
    assert exporter.respond("/", {"Authorization": basic("prometheus", "y")["Authorization"]}, "10.0.0.9")[0] == 429


def test_clients_without_a_login_cannot_use_up_the_rate_limit(stacks):
    out: list = []
    web = webconfig.parse(
        {"basic_auth_users": {"prometheus": HASH}, "rate_limit": {"interval": "1h", "burst": 2}}, Path("."), out
    )
    assert out == []
    s = stacks(web)
    for hdrs in ({}, basic("prometheus", "wrong"), {"Authorization": "Basic !!!"}) * 3:
        assert s.get(headers=hdrs)[0] in (401, 429)
    assert [s.get(headers=basic("prometheus", PASSWORD))[0] for _ in range(3)] == [200, 200, 429]


# ---- where it listens -----------------------------------------------------------------------------------


def test_the_default_listen_address_is_this_host_only():
    addr, _port = parse_listen(DEFAULT_LISTEN)
    assert exp.is_loopback(addr) and exp.plain_http_problem(addr, 9877, None, False) is None
    for addr in ("127.0.0.1", "::1", "localhost", "127.1.2.3"):
        assert exp.is_loopback(addr), addr
    for addr in ("0.0.0.0", "::", "10.0.0.1", "slurmctld", "127.0.0.1.example.org"):
        assert not exp.is_loopback(addr), addr


def _tls_web(tmp_path) -> webconfig.WebConfig:
    from tests import tlsfiles

    tls = tlsfiles.make(tmp_path)
    return webconfig.WebConfig(
        webconfig.TlsConfig(tls.server_cert.read_text(), tls.server_key.read_text()), {}, {}, 0.0, 0
    )


def test_beyond_loopback_only_with_tls_or_when_plain_http_is_asked_for(tmp_path):
    auth_only = webconfig.parse({"basic_auth_users": {"prometheus": HASH}}, Path("."), [])
    for web in (None, auth_only):
        problem = exp.plain_http_problem("0.0.0.0", 9877, web, False)
        assert problem and "--web.listen-address 0.0.0.0:9877 is not a loopback address" in problem
        assert exp.INSECURE_FLAG in problem and "tls_server_config" in problem
        assert exp.plain_http_problem("0.0.0.0", 9877, web, True) is None
    assert exp.plain_http_problem("10.0.0.1", 9877, _tls_web(tmp_path), False) is None


def test_cli_refuses_a_non_loopback_address_without_tls(monkeypatch):
    def served(self):
        raise AssertionError("it served")

    monkeypatch.setattr(exp.ExporterServer, "serve_forever", served)
    monkeypatch.setattr(exp.ExporterServer, "server_bind", lambda self: None)  # nothing bound, whatever happens
    for listen in (":9877", "0.0.0.0:9877", "[::]:9877"):
        res = CliRunner().invoke(
            main,
            ["exporter", "--policy", str(examples.example()), "--web.listen-address", listen],
            obj={"runner": Recorded(REC24)},
        )
        assert res.exit_code == 2, res.output
        out = " ".join(res.output.split())
        assert "is not a loopback address" in out and "--web.insecure-plain-http" in out
