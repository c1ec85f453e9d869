"""Bring the test cluster up from a policy, talk to it, take it down.

Every docker / docker-compose command goes through the one runner
(``proc.run``). Slurm is reached through the Slurm client (``slurm.client``)
whose runner is ``docker exec`` into the slurmctld container, so the
host needs nothing but docker, and every Slurm command line is built in
``slurm/``.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import atomic_write
from ..errors import GpushareError
from ..policy import Site, load_file
from ..proc import CommandError, Result, Runner, run
from ..render import render_all
from ..slurm import commands
from ..slurm.client import CliClient
from ..slurm.parsable import parse_scontrol_oneliners  # tests import it from here
from .compose import (
    CGROUP_V1_CONTROLLERS,
    EXPORTER_PORT,
    EXPORTER_TLS_DIR,
    PROMETHEUS_PORT,
    nodes,
    nodes_compose,
    project_cgroup,
    prometheus_config,
)

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"


class ClusterError(GpushareError):
    exit_code = 1


CGROUP_ROOT = Path("/sys/fs/cgroup")
# Serialises docker/bootstrap.sh across processes: it rewrites docker/.build (the wheel) and retags the
# images, and two test runs side by side (CI runs the Slurm 26.05 subset beside the 24.11 tier) build at once.
BUILD_LOCK = Path("/tmp/gpushare-image-build.lock")
_BUILT: set[tuple[str, str, bool]] = set()


def cgroup_v1_host(root: Path = CGROUP_ROOT) -> bool:
    """Whether the host mounts cgroup v1 hierarchies (one directory per controller Slurm uses) at ``root``."""
    return all((root / c).is_dir() for c in CGROUP_V1_CONTROLLERS)


def remove_cgroup_trees(tops, root: Path = CGROUP_ROOT) -> list[Path]:
    """Remove the cgroup v1 directories ``<controller>/<top>`` (and below) for each of ``tops``; return those left.

    The containers make their cgroups in the host's cgroup v1 hierarchies: slurmd's task/cgroup plugin
    makes ``slurm_<node>/uid_<uid>/job_<id>/...`` under the project's cgroup (``compose.project_cgroup``),
    or under the root when the nodes mount the whole hierarchy. They outlive the containers, and a later
    cluster of the same project whose job ids meet them cannot set their cpuset ("batch job complete
    failure" drains). Only empty directories go (``rmdir``, deepest first); one still in use by a running
    process stays and is returned, never forced.
    """
    left: list[Path] = []
    if not root.is_dir():
        return left
    for controller in sorted(root.iterdir()):
        for name in tops:
            top = controller / name
            if not top.is_dir() or top.is_symlink():
                continue
            dirs = [Path(d) for d, _, _ in os.walk(top)]
            for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                try:
                    d.rmdir()
                except OSError:
                    left.append(d)
    return left


@dataclass
class TestCluster:
    """One compose project of the test cluster, configured from ``policy``."""

    __test__ = False  # not a pytest class

    policy: Path
    project: str = "gpushare"
    suite: str = os.environ.get("SLURM_SUITE", "trixie")
    workdir: Path = field(default_factory=lambda: Path("/tmp/gpushare-testcluster"))
    docker_dir: Path = DOCKER_DIR
    runner: Runner = run
    # A Prometheus server in the project (service ``prometheus``), scraping the
    # controller exporter and every node's node_exporter.
    prometheus: bool = False
    # A host directory with the exporter's throwaway TLS files (compose.nodes_compose's exporter_tls_dir):
    # Prometheus then scrapes the exporter over HTTPS with a client certificate and basic auth.
    exporter_tls: Path | None = None
    # The image without the package (gpushare-slurm:<suite>-plain, docker/bootstrap.sh --no-wheel): a site's own
    # Slurm before it installs slurm-gpushare. Nothing of the product runs in it until a test installs it.
    plain: bool = False
    # The files of the slurm.conf directory (name -> text) to start with, instead of the policy's rendering:
    # a site's own configuration.
    conf_files: dict[str, str] | None = None
    # Nodes of that configuration the policy does not describe: a container each (no node setup).
    extra_nodes: tuple[str, ...] = ()
    site: Site = field(init=False)
    _containers: dict[str, str] = field(init=False, default_factory=dict)  # service -> container id

    def __post_init__(self) -> None:
        self.policy = Path(self.policy).resolve()
        self.workdir = Path(self.workdir) / self.project
        self.site = load_file(self.policy)

    # ---- files -------------------------------------------------------
    @property
    def conf_dir(self) -> Path:
        return self.workdir / "conf"

    @property
    def compose_files(self) -> list[Path]:
        return [self.docker_dir / "docker-compose.yml", self.workdir / "nodes.yml"]

    def write_config(self, site: Site | None = None) -> None:
        """Render the policy into the conf dir and the node services next to it."""
        site = site or self.site
        files = self.conf_files if self.conf_files is not None and site is self.site else render_all(site)
        for name, text in files.items():
            atomic_write(self.conf_dir / name, text)
        prom = None
        if self.prometheus:
            prom = self.workdir / "prometheus.yml"
            atomic_write(prom, prometheus_config(site, site.cluster.controller, exporter_tls=bool(self.exporter_tls)))
        tls = str(self.exporter_tls) if self.exporter_tls else None
        atomic_write(
            self.workdir / "nodes.yml",
            nodes_compose(site, str(prom) if prom else None, tls, self.cgroup_parent, self.extra_nodes),
        )

    @property
    def cgroup_parent(self) -> str | None:
        """The host cgroup the nodes' cgroups go under (cgroup v1 hosts), so that clusters side by side,
        with the same node names, never share one; None: the nodes mount the whole hierarchy."""
        return project_cgroup(self.project) if self.site.cluster.cgroups and cgroup_v1_host() else None

    def cgroup_tops(self) -> list[str]:
        """What ``remove_cgroup_trees`` removes for this project."""
        parent = self.cgroup_parent
        return [parent] if parent else [f"slurm_{n}" for n in [*self.nodes(), *self.extra_nodes]]

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "GPUSHARE_CONF_DIR": str(self.conf_dir),
            "GPUSHARE_POLICY_FILE": str(self.policy),
            "SLURM_SUITE": self.suite,
            "COMPOSE_PROJECT_NAME": self.project,
        }

    def compose_argv(self, *args: str) -> list[str]:
        argv = ["docker-compose", "-p", self.project]
        for f in self.compose_files:
            argv += ["-f", str(f)]
        return argv + list(args)

    @property
    def image(self) -> str:
        return f"gpushare-slurm:{self.suite}-plain" if self.plain else f"gpushare-slurm:{self.suite}"

    def compose(self, *args: str, timeout: float = 300, check: bool = True, input: str | None = None) -> Result:
        # the compose files name the Slurm image gpushare-slurm:${SLURM_SUITE}: the plain image's tag goes there
        env = {**self.env, "SLURM_SUITE": self.image.split(":", 1)[1]}
        return self.runner(self.compose_argv(*args), timeout=timeout, check=check, env=env, input=input)

    # ---- lifecycle ---------------------------------------------------
    def build(self, timeout: float = 1800) -> None:
        """Build the images (idempotent; installs the working tree's wheel, or with ``plain`` none).

        Once per process for each checkout, suite and kind (the working tree does not change under a
        test run), and one build at a time on the machine (BUILD_LOCK)."""
        key = (str(self.docker_dir), self.suite, self.plain)
        if key in _BUILT:
            return
        argv = ["bash", str(self.docker_dir / "bootstrap.sh")] + (["--no-wheel"] if self.plain else [])
        with open(BUILD_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.runner(argv, timeout=timeout, env=self.env)
        _BUILT.add(key)

    def up(self, timeout: float = 300) -> None:
        self.write_config()
        self.compose("up", "-d", timeout=timeout)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=180)
        remove_cgroup_trees(self.cgroup_tops())

    def nodes(self) -> list[str]:
        return nodes(self.site)

    def reconfigure(self, site: Site) -> None:
        """Render ``site`` into the running cluster: copy it into /etc/slurm, `scontrol reconfigure`."""
        self.write_config(site)
        self.compose("run", "--rm", "--no-deps", "config", timeout=120)
        self.client().reconfigure()

    def oneoff_slurmd(
        self, node: str, env: dict[str, str], args: tuple[str, ...] = ("-G",), timeout: float = 120
    ) -> Result:
        """Start a throw-away copy of ``node`` (no registration: `slurmd -G` parses gres.conf and exits)."""
        flags = [f"-e{k}={v}" for k, v in env.items()]
        return self.compose("run", "--rm", "--no-deps", *flags, node, "slurmd", *args, timeout=timeout, check=False)

    def wait_idle(self, timeout: float = 180) -> dict[str, dict]:
        """Wait until every policy node is idle; fail with the nodes' Reason= if any drains."""
        deadline = time.monotonic() + timeout
        last: dict[str, dict] = {}
        while time.monotonic() < deadline:
            try:
                last = self.node_states()
            except CommandError:
                time.sleep(2)
                continue
            bad = {n: s for n, s in last.items() if any(f.startswith(("DRAIN", "INVAL", "FAIL")) for f in s["flags"])}
            if bad:
                raise ClusterError(
                    "nodes drained or invalid: "
                    + "; ".join(f"{n}: {s['state']} Reason={s['reason']}" for n, s in bad.items())
                )
            if set(last) >= set(self.nodes()) and all(s["base"] == "IDLE" for s in last.values()):
                return last
            time.sleep(1)
        raise ClusterError(
            f"nodes not idle after {timeout:.0f} s: "
            + "; ".join(f"{n}: {s['state']} Reason={s['reason']}" for n, s in last.items())
        )

    def node_states(self) -> dict[str, dict]:
        return {n.name: _node_state(n) for n in self.client(timeout=30).nodes()}

    def slurm_runner(self, service: str = "slurmctld", user: str | None = None):
        """A Runner that runs argv inside ``service`` (docker exec): the Slurm client's way in."""

        def exec_runner(argv, *, input=None, timeout=60.0, check=True, env=None):
            return self.exec(service, list(argv), user=user, input=input, timeout=timeout, check=check)

        return exec_runner

    def client(self, service: str = "slurmctld", user: str | None = None, timeout: float = 60) -> CliClient:
        """The CLI Slurm client, run inside the cluster."""
        return CliClient(self.slurm_runner(service, user), timeout=timeout)

    # ---- commands in the cluster ----------------------------------------
    def exec(
        self,
        service: str,
        argv: list[str],
        *,
        user: str | None = None,
        input: str | None = None,
        timeout: float = 60,
        check: bool = True,
    ) -> Result:
        """Run ``argv`` in ``service``'s container with `docker exec` (docker-compose's own exec is a Python
        program that takes a CPU-second to start: polling through it loaded the test machine's CPUs)."""
        who = ["-u", user] if user else []
        for attempt in (1, 2):
            cid = self.container(service, fresh=attempt == 2)
            res = self.runner(["docker", "exec", "-i", *who, cid, *argv], timeout=timeout, check=False, input=input)
            gone = res.returncode != 0 and ("No such container" in res.stderr or "is not running" in res.stderr)
            if not gone or attempt == 2:
                break
        if check and res.returncode != 0:
            raise CommandError(res)
        return res

    def container(self, service: str, fresh: bool = False) -> str:
        """The id of ``service``'s container in this project (looked up by compose's labels once, again when
        ``fresh``: a container compose made anew has a new id)."""
        if fresh or service not in self._containers:
            labels = [f"label=com.docker.compose.project={self.project}", f"label=com.docker.compose.service={service}"]
            found = self.runner(["docker", "ps", "-a", "-q", "--filter", labels[0], "--filter", labels[1]], timeout=60)
            ids = found.stdout.split()
            if len(ids) != 1:
                raise ClusterError(f"{self.project}: {len(ids)} containers of service {service} (want one): {ids}")
            self._containers[service] = ids[0]
        return self._containers[service]

    def slurm(self, argv: list[str], *, user: str | None = None, timeout: float = 60, check: bool = True) -> Result:
        return self.exec("slurmctld", argv, user=user, timeout=timeout, check=check)

    def sbatch(self, script: str, *, user: str | None = None, **opts) -> int:
        """Submit ``script`` (text, a '#!' line is added if missing); return the job id."""
        if not script.startswith("#!"):
            script = "#!/bin/bash\n" + script
        argv = commands.sbatch(_options(opts))
        res = self.exec("slurmctld", argv, user=user, input=script, timeout=60)
        return int(res.stdout.strip().split(";")[0])

    def srun(self, argv: list[str], *, user: str | None = None, timeout: float = 120, **opts) -> Result:
        return self.slurm(commands.srun(_options(opts), list(argv)), user=user, timeout=timeout)

    def scontrol(self, *args: str) -> Result:
        return self.slurm(commands.scontrol(*args))

    def job(self, job_id: int) -> dict:
        out = self.slurm(commands.scontrol("-o", "show", "job", str(job_id)), check=False).stdout
        recs = parse_scontrol_oneliners(out)
        return recs[0] if recs else {}

    def wait(self, job_id: int, timeout: float = 120) -> dict:
        """Wait until the job has finished; return its sacct record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = self.sacct(job_id)
            if recs and recs[0]["State"].split()[0] not in (
                "PENDING",
                "RUNNING",
                "REQUEUED",
                "COMPLETING",
                "CONFIGURING",
            ):
                return recs[0]
            time.sleep(1)
        raise ClusterError(f"job {job_id} not finished after {timeout:.0f} s: {self.job(job_id)}")

    SACCT_FIELDS = (
        "JobID",
        "User",
        "Account",
        "Partition",
        "State",
        "ExitCode",
        "NodeList",
        "Start",
        "End",
        "ElapsedRaw",
        "AllocTRES",
        "ReqTRES",
    )

    def sacct(self, job_id: int | None = None, extra: list[str] | None = None) -> list[dict]:
        out = self.slurm(commands.sacct_jobs(self.SACCT_FIELDS, job_id, extra)).stdout
        return [
            dict(zip(self.SACCT_FIELDS, line.split("|"), strict=False)) for line in out.splitlines() if line.strip()
        ]

    EXPORTER_LOG = "/var/log/gpushare-exporter.log"

    def start_exporter(self, policy: str = "/etc/gpushare/policy.yaml", *extra: str) -> None:
        """Start `gpushare exporter` in slurmctld, in the background (log EXPORTER_LOG there), on the port
        the project's Prometheus scrapes; with ``exporter_tls``, with its web configuration file."""
        args = [f"--web.listen-address=:{EXPORTER_PORT}", *extra]
        if self.exporter_tls:
            args.append(f"--web.config.file={EXPORTER_TLS_DIR}/web-config.yml")
        else:  # Prometheus scrapes it from its own container over the cluster network
            args.append("--web.insecure-plain-http")
        self.compose(
            "exec",
            "-d",
            "-T",
            "slurmctld",
            "bash",
            "-c",
            f"exec gpushare exporter --policy {shlex.quote(policy)} {' '.join(map(shlex.quote, args))} "
            f">>{self.EXPORTER_LOG} 2>&1",
            timeout=60,
        )

    def prometheus_api(self, path: str, params: dict[str, str] | None = None, timeout: float = 30) -> dict:
        """GET Prometheus's HTTP API (``/api/v1/<path>``) inside its container; the decoded JSON.

        Raises ClusterError naming the request when Prometheus answers an error."""
        import json
        from urllib.parse import urlencode

        url = f"http://localhost:{PROMETHEUS_PORT}/api/v1/{path}" + (f"?{urlencode(params)}" if params else "")
        # wget prints the body of an HTTP error too (--content-on-error): Prometheus's error JSON.
        res = self.exec(
            "prometheus", ["wget", "-q", "--content-on-error", "-O", "-", url], timeout=timeout, check=False
        )
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            raise ClusterError(
                f"Prometheus {path} {params}: no JSON answer (wget exit {res.returncode}): "
                f"{res.stdout[:300]!r} {res.stderr[:300]!r}"
            ) from None
        if doc.get("status") != "success":
            raise ClusterError(f"Prometheus {path} {params}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def promql(self, query: str, at: float | None = None) -> list[dict]:
        """An instant query (at the Unix time ``at``, default now): the result vector
        (each ``{"metric": {...}, "value": [ts, "v"]}``; a scalar comes back as one unlabelled sample)."""
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.prometheus_api("query", params)
        result = data["result"]
        return result if data["resultType"] == "vector" else [{"metric": {}, "value": result}]

    def read_shared(self, path: str) -> str:
        return self.exec("slurmctld", ["cat", f"/shared/{path}"]).stdout

    def node_json(self) -> list[dict]:
        import json

        return json.loads(self.slurm(list(commands.NODES_JSON)).stdout)["nodes"]


def _options(opts: dict) -> list[str]:
    out = []
    for key, value in opts.items():
        flag = "--" + key.rstrip("_").replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out.append(f"{flag}={value}")
    return out


def _node_state(node) -> dict:
    """A ``slurm.model.Node`` as the tests read it: State=/Reason=/Gres= as scontrol prints them."""
    base = node.base_state
    return {
        "state": "+".join(node.state),
        "base": base,
        "flags": set(node.flags) | ({base} if base == "DOWN" else set()),
        "reason": node.reason,
        "gres": ",".join(f"{k}:{v}" for k, v in node.gres.items()),
    }


def quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
