"""Metrics on a real cluster, read back through a real Prometheus: the controller exporter, the node
textfile metrics (node_exporter's textfile collector), dcgm-exporter's job-mapping files, the dashboard.

Runs its own compose project (the small lab with ``cluster.metrics`` set, so the node hooks write the
textfile and the dcgm mapping) with a Prometheus server (``TestCluster(prometheus=True)``: Debian's
prometheus scraping ``gpushare exporter`` on slurmctld:9877 every 5 s and each node's
prometheus-node-exporter every 2 s). The exporter is scraped as on a production network: HTTPS with a
certificate of a throwaway CA made here, a client certificate it requires and verifies, and basic auth
with a bcrypt hash (its --web.config.file); every scrape series below came through that. The module starts
``gpushare exporter`` in slurmctld, then runs
a mix of whole-GPU, MIG, shard and MPS jobs of two tenants (plus one job pending on physics' quota),
and compares what Prometheus answers with what Slurm says at the same moment: the exporter's read of
Slurm (its snapshot, shared by the scrapes of one --slurm.read-interval) began after one read of squeue /
scontrol and was served before an identical second one, and the query is evaluated at that scrape.
GPU-equivalents are checked against fractions written here by hand from the small lab's hardware
(etc/small-lab.yaml), not against the code under test.

Set GPUSHARE_METRICS_KEEP=1 to leave the project up after the module (debugging).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

import bcrypt
import pytest
import yaml

from slurm_gpushare.testcluster.cluster import TestCluster
from slurm_gpushare.testcluster.compose import EXPORTER_PORT, EXPORTER_USER, PROMETHEUS_TLS_DIR
from tests import tlsfiles
from tests.cluster.conftest import MIG_INCLUDE, POLICY, own_cluster, wait_for, wait_quiet
from tests.unit.metrics.test_dashboard import PER_JOB_METRICS, metric_names

PROJECT = os.environ.get(
    "GPUSHARE_METRICS_PROJECT", os.environ.get("GPUSHARE_TEST_PROJECT", "gpusharetest") + "-metrics"
)
NODES = ("lab-excl01", "lab-shard01", "lab-mig01", "lab-mps01")
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian node_exporter's default textfile directory
DCGM_DIR = "/var/lib/dcgm-exporter/job-mapping"  # what dcgm-exporter's --hpc-job-mapping-dir would name
EXPORTER_LOG = TestCluster.EXPORTER_LOG

# GPU-equivalents by hand, from the small lab's hardware: a 1g.5gb slice is 1/7 of an A100-40GB,
# lab-shard01's L40S has 4 shards, lab-mps01's A30 100 MPS units; a whole L40S is 1.
MIG = "a100_40g_1g.5gb"
FRACTION = {("gpu", "l40s"): 1.0, ("gpu", MIG): 1 / 7, ("shard", ""): 1 / 4, ("mps", ""): 1 / 100}
KIND = {("gpu", "l40s"): "whole", ("gpu", MIG): "mig", ("shard", ""): "shard", ("mps", ""): "mps"}
# (user, account, --gres, --nodelist): two tenants, every kind; two jobs on the one shard GPU and two on the MPS GPU.
MIX = (
    ("alice", "physics", "gpu:l40s:1", "lab-excl01"),
    ("alice", "physics", f"gpu:{MIG}:1", None),
    ("alice", "physics", "shard:1", None),
    ("alice", "physics", "mps:25", None),
    ("carol", "biology", f"gpu:{MIG}:1", None),
    ("carol", "biology", "shard:1", None),
    ("carol", "biology", "mps:50", None),
)
EXPECTED_TENANTS = {"physics": 1 + 1 / 7 + 1 / 4 + 25 / 100, "biology": 1 / 7 + 1 / 4 + 50 / 100}
# physics' quota is 2 GPUs (GrpTRES gres/gpu=2): its whole L40S and MIG slice use it up, so this one pends.
PENDING = ("alice", "physics", "gpu:l40s:1")
DRAIN_NODE, DRAIN_REASON = "lab-excl01", "gpushare metrics test drain"
PASSWORD = secrets.token_urlsafe(18)  # the basic-auth password Prometheus scrapes the exporter with


def metrics_policy(path: Path) -> Path:
    """etc/small-lab.yaml with the node metrics on: the textfile directory and the dcgm job-mapping directory."""
    raw = yaml.safe_load(POLICY.read_text())
    raw["cluster"]["metrics"] = {"textfile_dir": TEXTFILE_DIR, "dcgm_job_mapping_dir": DCGM_DIR}
    path.write_text(
        "# small-lab.yaml with node metrics on (tests/cluster/test_metrics.py)\n" + yaml.safe_dump(raw, sort_keys=False)
    )
    return path


def exporter_tls(where: Path, password: str) -> Path:
    """The exporter's TLS files under ``where``: ``exporter/`` (web configuration, server certificate and key,
    the CA its clients' certificates must chain to) and ``prometheus/`` (CA, client certificate and key,
    password). A CA made here, a server certificate for slurmctld, a client certificate for prometheus."""
    tls = tlsfiles.make(where / "made", hosts=("slurmctld",), client="prometheus")
    exporter, prom = where / "exporter", where / "prometheus"
    exporter.mkdir()
    prom.mkdir()
    for src, dst in (
        (tls.server_cert, exporter / "server.crt"),
        (tls.server_key, exporter / "server.key"),
        (tls.ca, exporter / "clients-ca.crt"),
        (tls.ca, prom / "ca.crt"),
        (tls.client_cert, prom / "client.crt"),
        (tls.client_key, prom / "client.key"),
    ):
        dst.write_text(src.read_text())
    (prom / "password").write_text(password)
    web = {
        "tls_server_config": {
            "cert_file": "server.crt",
            "key_file": "server.key",  # relative to the file
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": "clients-ca.crt",
            "client_allowed_sans": ["prometheus"],
        },
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        "basic_auth_users": {EXPORTER_USER: bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()},
    }
    (exporter / "web-config.yml").write_text(yaml.safe_dump(web))
    for path in where.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # read through bind mounts by the prometheus user
    return where


@pytest.fixture(scope="module")
def metrics_cluster():
    tls = Path(tempfile.mkdtemp(prefix="gpushare-metrics-tls-"))
    try:
        yield from own_cluster(
            "metrics",
            PROJECT,
            lambda work: metrics_policy(work / "small-lab-metrics.yaml"),
            "GPUSHARE_METRICS_KEEP",
            prometheus=True,
            exporter_tls=exporter_tls(tls, PASSWORD),
        )
    finally:
        if os.environ.get("GPUSHARE_METRICS_KEEP") != "1":
            shutil.rmtree(tls, ignore_errors=True)


# ---- reading Prometheus and Slurm ---------------------------------------------------------------


def values(c: TestCluster, query: str, labels: tuple[str, ...], at: float | None = None) -> dict[tuple, float]:
    """{label values: value} of an instant query (a label Prometheus leaves out, as it does empty ones, is '')."""
    out = {}
    for s in c.promql(query, at=at):
        key = tuple(s["metric"].get(k, "") for k in labels)
        assert key not in out, f"{query}: two series for {dict(zip(labels, key, strict=False))}"
        out[key] = float(s["value"][1])
    return out


def scrape_after(c: TestCluster, t: float, timeout: float = 90) -> tuple[float, float]:
    """(scrape time, read time) of a controller-exporter scrape serving a snapshot whose read of Slurm began
    after ``t`` and read every part; both from the one scrape (the queries are evaluated at one instant)."""

    def probe():
        at = time.time()
        ok = c.promql(
            "timestamp(gpushare_exporter_last_scrape_success) and gpushare_exporter_last_scrape_success == 1", at=at
        )
        read = c.promql("gpushare_exporter_snapshot_timestamp_seconds", at=at)
        if ok and read and float(read[0]["value"][1]) > t:
            return float(ok[0]["value"][1]), float(read[0]["value"][1])
        return None

    return wait_for(
        f"a successful gpushare exporter read of Slurm after {t:.1f} (log {EXPORTER_LOG} in slurmctld)",
        probe,
        timeout=timeout,
    )


def gres_key(spec: str) -> tuple[str, str, int]:
    """'gres/gpu:l40s:1' (squeue %b) or 'shard:1' -> ('gpu', 'l40s', 1) / ('shard', '', 1)."""
    spec = re.sub(r"^gres[/:]", "", spec)
    parts = spec.split(":")
    count = int(parts[-1]) if parts[-1].isdigit() else 1
    name_type = parts[:-1] if parts[-1].isdigit() else parts
    return name_type[0], (name_type[1] if len(name_type) > 1 else ""), count


def squeue(c: TestCluster, state: str, fields: str) -> list[list[str]]:
    out = c.slurm(["squeue", "-h", "-t", state, "-o", fields]).stdout
    return sorted(line.split("|") for line in out.splitlines() if line.strip())


GRES_ENTRY = re.compile(r"([a-z]+)(?::([^:,()]+))?:(\d+)(?:\([^)]*\))?")


def gres_entries(text: str) -> dict[tuple[str, str], int]:
    """scontrol's Gres= / GresUsed= ('gpu:l40s:1(IDX:0),shard:l40s:2(2/4)') -> {(name, type): count}."""
    if text in ("", "(null)", "N/A"):
        return {}
    return {(m[1], m[2] or ""): int(m[3]) for m in GRES_ENTRY.finditer(text)}


def scontrol_gres(c: TestCluster) -> dict[tuple[str, str, str], tuple[int, int]]:
    """{(node, gres, type): (configured, allocated)} from `scontrol -d show node -o` (Gres=, GresUsed=)."""
    out = {}
    for line in c.slurm(["scontrol", "-d", "show", "node", "-o"]).stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" not in fields:
            continue
        used = gres_entries(fields.get("GresUsed", ""))
        for (name, gtype), total in gres_entries(fields.get("Gres", "")).items():
            out[fields["NodeName"], name, gtype] = (total, used.get((name, gtype), 0))
    return out


def slurm_view(c: TestCluster) -> dict:
    return {
        "running": squeue(c, "RUNNING", "%i|%a|%u|%b|%N"),
        "pending": squeue(c, "PENDING", "%i|%b|%r|%V"),
        "gres": scontrol_gres(c),
    }


def consistent_moment(c: TestCluster, attempts: int = 5) -> tuple[dict, float, float]:
    """Slurm's view, the time of an exporter scrape whose read of Slurm was taken while that view held (read
    before and after), and the time that read began."""
    for _ in range(attempts):
        before = slurm_view(c)
        t = time.time()
        ts, read = scrape_after(c, t)
        after = slurm_view(c)
        if after == before:
            return before, ts, read
    raise AssertionError(f"Slurm's view kept changing across {attempts} exporter scrapes: {before} vs {after}")


def node_shell(c: TestCluster, node: str, script: str) -> str:
    return c.exec(node, ["bash", "-c", script]).stdout


def mapping_files(c: TestCluster, node: str) -> dict[str, set[str]]:
    """dcgm-exporter's job-mapping directory on the node: {file name: job ids in it}."""
    out = node_shell(
        c,
        node,
        f'cd {DCGM_DIR} 2>/dev/null || exit 0; for f in *; do [ -f "$f" ] || continue; '
        'echo "== $f"; cat "$f"; echo; done',
    )
    files: dict[str, set[str]] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("== "):
            name = line[3:]
            files[name] = set()
        elif line.strip() and name is not None:
            files[name] |= set(line.split())
    return files


def job_gpu_indices(c: TestCluster, job: int) -> list[int]:
    """The GPU indices Slurm allocated to a job (`scontrol -d show job`: GRES=gpu:l40s:1(IDX:0))."""
    out = c.slurm(["scontrol", "-d", "show", "job", str(job)]).stdout
    idx: list[int] = []
    for spec in re.findall(r"IDX:([0-9,-]+)\)", out):
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            idx += range(int(lo), int(hi or lo) + 1)
    return idx


def node_metric(c: TestCluster, name: str, extra: tuple[str, ...] = ()) -> dict[tuple, float]:
    return values(c, name, ("node", *extra))


# ---- the running mix -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mix(metrics_cluster):
    c = metrics_cluster
    c.start_exporter()
    wait_for(
        "Prometheus to scrape the exporter and every node_exporter (up == 1)",
        lambda: sorted(values(c, "up", ("job", "instance")).values()) == [1.0] * (1 + len(NODES)),
        timeout=120,
        every=2,
    )
    wait_quiet(c)
    baseline = values(c, "sum by (node, hook) (gpushare_node_hook_runs_total)", ("node", "hook"))
    jobs = []
    for user, account, gres, nodelist in MIX:
        jobs.append(
            c.sbatch("sleep 900\n", user=user, account=account, gres=gres, nodelist=nodelist, output="/dev/null")
        )
    wait_for(
        "every job of the mix running, its prolog done (not CONFIGURING)",
        lambda: {int(r[0]) for r in squeue(c, "RUNNING", "%i")} >= set(jobs) and not squeue(c, "CONFIGURING", "%i"),
        timeout=180,
        every=2,
    )
    user, account, gres = PENDING
    pending = c.sbatch("sleep 900\n", user=user, account=account, gres=gres, output="/dev/null")
    wait_for(
        f"job {pending} pending on physics' quota",
        lambda: any(r[0] == str(pending) and r[1].startswith("AssocGrp") for r in squeue(c, "PENDING", "%i|%r")),
        timeout=60,
    )
    nodes_of = {int(r[0]): r[1] for r in squeue(c, "RUNNING", "%i|%N")}
    yield {"jobs": jobs, "pending": pending, "baseline": baseline, "nodes_of": nodes_of}
    c.slurm(["scancel", *map(str, jobs), str(pending)], check=False)
    resume(c)


def resume(c: TestCluster) -> None:
    """Undrain the node the dashboard test drains (scontrol refuses when it is not drained: not an error here)."""
    c.slurm(["scontrol", "update", f"nodename={DRAIN_NODE}", "state=resume"], check=False)


def test_prometheus_scrapes_the_exporter_and_every_node(metrics_cluster, mix):
    up = values(metrics_cluster, "up", ("job", "instance"))
    assert up == {("gpushare", "slurmctld:9877"): 1.0, **{("node", f"{n}:9100"): 1.0 for n in NODES}}


def fetch_from_prometheus(c: TestCluster, url: str, *options: str):
    """GET ``url`` with wget inside the Prometheus container (on the cluster network, as Prometheus scrapes)."""
    return c.exec(
        "prometheus", ["wget", "-S", "-O", "-", "--tries=1", "--timeout=20", *options, url], check=False, timeout=60
    )


def test_the_exporter_is_scraped_over_tls_and_refuses_anyone_else(metrics_cluster, mix):
    c = metrics_cluster
    targets = [t for t in c.prometheus_api("targets")["activeTargets"] if t["labels"]["job"] == "gpushare"]
    assert [(t["scrapeUrl"], t["health"]) for t in targets] == [(f"https://slurmctld:{EXPORTER_PORT}/metrics", "up")]
    url = f"https://slurmctld:{EXPORTER_PORT}/metrics"
    ca = f"--ca-certificate={PROMETHEUS_TLS_DIR}/ca.crt"
    cert = (f"--certificate={PROMETHEUS_TLS_DIR}/client.crt", f"--private-key={PROMETHEUS_TLS_DIR}/client.key")
    good = fetch_from_prometheus(c, url, ca, *cert, f"--user={EXPORTER_USER}", f"--password={PASSWORD}")
    assert good.returncode == 0 and "gpushare_gres_free{" in good.stdout, good.stderr[-2000:]
    assert "X-Content-Type-Options: nosniff" in good.stderr  # http_server_config.headers
    plain = fetch_from_prometheus(c, f"http://slurmctld:{EXPORTER_PORT}/metrics")
    assert plain.returncode != 0 and "gpushare_" not in plain.stdout
    no_cert = fetch_from_prometheus(c, url, ca, f"--user={EXPORTER_USER}", f"--password={PASSWORD}")
    assert no_cert.returncode != 0 and "gpushare_" not in no_cert.stdout  # client certificate required
    for creds in ((), (f"--user={EXPORTER_USER}", "--password=wrong"), ("--user=grafana", f"--password={PASSWORD}")):
        refused = fetch_from_prometheus(c, url, ca, *cert, *creds)
        assert refused.returncode in (6, 8) and "401 Unauthorized" in refused.stderr, (creds, refused.stderr[-2000:])
        assert "WWW-Authenticate: Basic" in refused.stderr and "gpushare_" not in refused.stdout
    log = c.exec("slurmctld", ["cat", EXPORTER_LOG]).stdout
    assert "serving https://" in log and "basic auth for 1 user(s)" in log, log[-2000:]


def test_gpu_equivalents_per_tenant_equal_the_hand_computation_from_squeue(metrics_cluster, mix):
    c = metrics_cluster
    view, ts, _read = consistent_moment(c)
    by_tenant: dict[str, float] = defaultdict(float)
    by_kind: dict[tuple[str, str, str], float] = defaultdict(float)
    for _job, account, user, spec, _nodes in view["running"]:
        name, gtype, count = gres_key(spec)
        key = (name, gtype if name == "gpu" else "")
        by_tenant[account] += FRACTION[key] * count
        by_kind[account, user, KIND[key]] += FRACTION[key] * count
    assert by_tenant == pytest.approx(EXPECTED_TENANTS)  # squeue shows the mix as submitted
    got = values(c, "sum by (tenant) (gpushare_gpu_equivalents_allocated)", ("tenant",), at=ts)
    assert {k[0]: v for k, v in got.items()} == pytest.approx(dict(by_tenant), abs=1e-6), (got, view["running"])
    got = values(
        c, "sum by (tenant, user, kind) (gpushare_gpu_equivalents_allocated)", ("tenant", "user", "kind"), at=ts
    )
    assert got == pytest.approx(dict(by_kind), abs=1e-6), (got, view["running"])


def test_free_and_allocated_units_per_type_equal_scontrol(metrics_cluster, mix):
    c = metrics_cluster
    view, ts, _read = consistent_moment(c)
    labels = ("node", "gres", "gres_type")
    want = view["gres"]
    assert want[("lab-shard01", "shard", "l40s")][1] == 2 and want[("lab-mps01", "mps", "a30")][1] == 75, want
    assert values(c, "gpushare_gres_configured", labels, at=ts) == {k: float(t) for k, (t, _) in want.items()}
    assert values(c, "gpushare_gres_allocated", labels, at=ts) == {k: float(u) for k, (_, u) in want.items()}
    assert values(c, "gpushare_gres_free", labels, at=ts) == {k: float(t - u) for k, (t, u) in want.items()}
    per_type: Counter[tuple[str, str]] = Counter()
    for (_node, name, gtype), (total, used) in want.items():
        per_type[name, gtype] += total - used
    got = values(c, "sum by (gres, gres_type) (gpushare_gres_free)", ("gres", "gres_type"), at=ts)
    assert got == {k: float(v) for k, v in per_type.items()}


def test_pending_demand_equals_squeue(metrics_cluster, mix):
    c = metrics_cluster
    view, ts, began = consistent_moment(c)
    want: Counter[tuple[str, str, str]] = Counter()
    submitted: dict[tuple[str, str], float] = {}
    for _job, spec, reason, submit in view["pending"]:
        name, gtype, count = gres_key(spec)
        want[name, gtype, reason] += 1
        epoch = float(c.slurm(["date", "-d", submit, "+%s"]).stdout)
        submitted[name, gtype] = min(submitted.get((name, gtype), epoch), epoch)
    assert len(want) == 1, want
    ((name, gtype, reason),) = want
    assert (name, gtype) == ("gpu", "l40s") and reason.startswith("AssocGrp"), want  # the job over physics' quota
    assert values(c, "gpushare_jobs_pending", ("gres", "gres_type", "reason"), at=ts) == {
        k: float(v) for k, v in want.items()
    }
    eq = values(c, "gpushare_pending_gpu_equivalents", ("gres", "gres_type", "reason"), at=ts)
    assert eq == pytest.approx({k: FRACTION["gpu", "l40s"] * v for k, v in want.items()})
    age = values(c, "gpushare_pending_oldest_age_seconds", ("gres", "gres_type"), at=ts)
    assert set(age) == set(submitted)
    read = values(c, "gpushare_exporter_scrape_duration_seconds", (), at=ts)[()]
    for key, t in submitted.items():
        # squeue's SubmitTime is whole seconds (the job came in up to 1 s after it); the exporter's clock
        # is read after Slurm, between its read's start (began) and its end (began + its duration)
        assert began - t - 1.5 <= age[key] <= began + read - t + 0.5, (key, age[key], began - t, read)
    quota = values(c, "gpushare_quota_used", ("account", "tres"), at=ts)
    assert quota[("physics", "gres/gpu")] == 2.0  # the whole L40S and the MIG slice


def mig_devices_by_index(c: TestCluster, node: str = "lab-mig01") -> list[tuple[str, str]]:
    """(MIG UUID, GPU instance id) of each gpu record of the node's MIG include, in line order (= Slurm's IDX)."""
    out, last = [], None
    for line in c.exec(node, ["cat", MIG_INCLUDE]).stdout.splitlines():
        m = re.match(r"# (MIG-[0-9a-f-]+): GPU instance (\d+)", line)
        if m:
            last = (m[1], m[2])
        elif line.startswith("NodeName="):
            out.append(last)
    return out


def test_job_to_gpu_mapping_for_dcgm_while_the_jobs_run(metrics_cluster, mix):
    """dcgm-exporter's mapping files list exactly the jobs on each GPU (``<gpu>`` for whole GPUs, shards and MPS,
    ``<gpu>.<GPU instance id>`` for a MIG slice); the info metric maps each job to its device, MIG UUID included."""
    c = metrics_cluster
    jobs, nodes_of = mix["jobs"], mix["nodes_of"]
    mig = mig_devices_by_index(c)
    assert len(mig) == 7 and all(mig), mig
    want_files: dict[str, dict[str, set[str]]] = {n: defaultdict(set) for n in NODES}
    want_info: set[tuple[str, str, str, str, str]] = set()  # node, job_id, gpu, mig_uuid, gpu_instance_id
    for job in jobs:
        node = nodes_of[job]
        if node == "lab-mig01":  # Slurm's IDX is the slice's record in the MIG include; the one GPU is 0
            for i in job_gpu_indices(c, job):
                uuid, gi = mig[i]
                want_files[node][f"0.{gi}"].add(str(job))
                want_info.add((node, str(job), "0", uuid, gi))
        elif node == "lab-excl01":  # whole GPUs: Slurm's IDX
            for i in job_gpu_indices(c, job):
                want_files[node][str(i)].add(str(job))
                want_info.add((node, str(job), str(i), "", ""))
        else:  # shards and MPS units of the node's one GPU
            want_files[node]["0"].add(str(job))
            want_info.add((node, str(job), "0", "", ""))
    assert len(want_files["lab-shard01"]["0"]) == 2 and len(want_files["lab-mps01"]["0"]) == 2  # shared GPUs
    assert len(want_files["lab-mig01"]) == 2  # two MIG jobs, two slices
    want_files = {n: dict(f) for n, f in want_files.items()}
    seen: dict[str, dict] = {}

    def files_match() -> bool:
        seen.update({n: mapping_files(c, n) for n in NODES})
        return seen == want_files

    try:
        wait_for("the dcgm mapping files", files_match, timeout=30)
    except AssertionError:
        raise AssertionError(f"dcgm mapping files {seen}, Slurm says {want_files}") from None

    labels = ("node", "job_id", "gpu", "mig_uuid", "gpu_instance_id")
    info = wait_for(
        "gpushare_node_job_gpu_info for every job of the mix",
        lambda: (lambda v: v if set(v) == want_info else None)(values(c, "gpushare_node_job_gpu_info", labels)),
        timeout=30,
    )
    assert set(info.values()) == {1.0}


def test_drained_node_and_every_dashboard_query_return_series(metrics_cluster, mix):
    c = metrics_cluster
    c.scontrol("update", f"nodename={DRAIN_NODE}", "state=drain", f"reason={DRAIN_REASON}")
    try:
        wait_for(
            f"gpushare_node_drained for {DRAIN_NODE}",
            lambda: values(c, "gpushare_node_drained", ("node", "reason")) == {(DRAIN_NODE, DRAIN_REASON): 1.0},
            timeout=60,
        )
        dash = json.loads(resources.files("slurm_gpushare.metrics").joinpath("dashboard.json").read_text())
        for var in dash["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["query"]["query"])
            assert m, var["query"]
            got = c.prometheus_api(f"label/{m[2]}/values", {"match[]": m[1]})
            assert got, f"dashboard variable {var['name']}: no values for {var['query']['query']}"
        # Grafana's range over the last minutes, its step, and the variables at All (.*).
        end = time.time()
        problems = []
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                if metric_names(target["expr"]) <= PER_JOB_METRICS:
                    continue  # per-job MIG's: the small lab has no per-job MIG GPUs
                expr = (
                    target["expr"]
                    .replace("$__rate_interval", "1m")
                    .replace("$__interval", "10s")
                    .replace("$tenant", ".*")
                    .replace("$node", ".*")
                )
                if target.get("instant"):
                    result = c.promql(expr)
                else:
                    data = c.prometheus_api(
                        "query_range", {"query": expr, "start": f"{end - 300:.0f}", "end": f"{end:.0f}", "step": "10"}
                    )
                    result = data["result"]
                if not result:
                    problems.append(f"{panel['title']!r} {target['refId']}: {expr}")
        assert not problems, "dashboard queries returning no series:\n" + "\n".join(problems)
    finally:
        resume(c)


def test_after_the_jobs_end_hook_counters_moved_and_nothing_is_left(metrics_cluster, mix):
    c = metrics_cluster
    jobs, nodes_of, baseline = mix["jobs"], mix["nodes_of"], mix["baseline"]
    c.slurm(["scancel", *map(str, jobs), str(mix["pending"])])
    # the epilogs are done when their runs are counted (below); slurmdbd's records do not matter here
    wait_for(
        "the mix gone from squeue (none pending, running or completing)",
        lambda: not squeue(c, "PENDING,RUNNING,CONFIGURING,COMPLETING", "%i"),
        timeout=120,
        every=2,
    )
    per_node = Counter(nodes_of[j] for j in jobs)
    want = {(n, hook): baseline.get((n, hook), 0.0) + per_node[n] for n in NODES for hook in ("prolog", "epilog")}

    def runs():
        got = values(c, "sum by (node, hook) (gpushare_node_hook_runs_total)", ("node", "hook"))
        return {k: got.get(k, 0.0) for k in want}

    wait_for(
        f"prolog and epilog runs up by the jobs of each node ({dict(per_node)})", lambda: runs() == want, timeout=60
    )
    failures = values(c, "sum by (node, hook) (gpushare_node_hook_failures_total)", ("node", "hook"))
    assert not any(failures.values()), failures
    wait_for(
        "gpushare_node_journals_present 0 on every node",
        lambda: node_metric(c, "gpushare_node_journals_present") == {(n,): 0.0 for n in NODES},
        timeout=30,
    )
    for node in NODES:
        on_disk = node_shell(c, node, "ls /var/lib/gpushare/jobs 2>/dev/null | grep -c . || true").strip()
        assert on_disk == "0", f"{node}: journals left: {on_disk}"
    wait_for(
        "gpushare_node_mps_daemons_running 0 on lab-mps01",
        lambda: node_metric(c, "gpushare_node_mps_daemons_running").get(("lab-mps01",)) == 0.0,
        timeout=30,
    )
    layout = values(c, "gpushare_node_mig_layout_matches_policy", ("node", "gpu"))
    assert layout == {("lab-mig01", "0"): 1.0}, layout
    for node in NODES:
        wait_for(f"no dcgm mapping file left on {node}", lambda node=node: not mapping_files(c, node), timeout=30)
    wait_for("no gpushare_node_job_gpu_info left", lambda: not c.promql("gpushare_node_job_gpu_info"), timeout=30)
    assert math.isclose(values(c, "gpushare_exporter_last_scrape_success", ())[()], 1.0)
