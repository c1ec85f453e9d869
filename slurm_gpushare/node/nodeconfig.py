"""Where the node hooks find the policy, the fake NVML and their own state.

slurmd builds the Prolog/Epilog environment itself (Slurm's Prolog and Epilog
Guide, https://slurm.schedmd.com/prolog_epilog.html, 24.11: the variables it
sets): nothing of slurmd's own environment reaches the hooks, so they cannot be
configured with variables. They read one root-owned file instead,
``/etc/gpushare/node.yaml``, a flat ``key: value`` mapping (valid YAML, read
without a YAML library because the task prolog runs on every task start)::

    policy: /etc/gpushare/policy.yaml        # the site policy (default)
    live_policy: /etc/slurm/gpushare-live.yaml  # the live planner's policy: wins over policy while it exists
    fake_nvml: /var/lib/gpushare/fake-nvml.json   # test clusters only
    spec_cache: /etc/gpushare/node-spec.json # default: next to this file
    mps_control: /usr/bin/nvidia-cuda-mps-control  # default: found on a fixed PATH
    state_dir: /var/lib/gpushare             # the policy's cluster.paths.state_dir

``state_dir`` is for the task prolog, which must not load the policy; when
given, the root hooks check it equals the policy's and refuse otherwise, so
the two cannot drift apart silently (docker/node-setup.sh writes it from the
policy).

No file means: real NVML, the policy at /etc/gpushare/policy.yaml.

On a node the policy does not describe, which the site's merged slurm.conf
still gives the product's Prolog, Epilog, TaskProlog and HealthCheckProgram,
``gpushare node install --outside-policy`` writes instead::

    outside_policy: yes
    site_health_program: /usr/sbin/nhc       # cluster.health.site_program, when the policy names one

and nothing else (``paths.parse_flat`` refuses the keys of a policy node
beside it): the prolog, epilog and ns-caps hook exit 0 doing nothing, the
task prolog exports nothing, the health check runs only the site's program,
``gpushare node boot`` changes nothing. No policy is read, no GPU touched.

``live_policy`` names the file `gpushare live apply` writes (the
policy's ``live.policy_file``): the admin's policy with the MIG layouts the
live planner changed. While that file exists it is the policy every hook,
the health check and `gpushare node relayout --node-config` follow, so the
node and slurm.conf (rendered from the same file) never disagree; without
it (live planner off, or not run yet) ``policy`` is read.

Loading a policy costs about a second (pydantic), too much for every job, so
the root hooks keep this node's view of it, the ``NodeSpec`` (GPU modes,
paths), in a JSON cache keyed by the policy file's sha256: a changed policy
is noticed on the next job and the cache rebuilt from it. The cache is
derived, never edited; the task prolog never reads it. The spec carries the
policy's ``cluster.metrics`` directories (textfile collector, dcgm-exporter
job mapping), so the hooks know them without loading the policy.
"""

from __future__ import annotations

import json
import os
import stat

from ..errors import GpushareError
from ..policy.share import Mode, Share
from ..records import fields, record, replace
from . import paths

TYPE_CHECKING = False  # pathlib costs every node hook ~17 M instructions (it imports re, urllib.parse, fnmatch)
if TYPE_CHECKING:
    from hashlib import sha256 as _sha256  # the same digest, typed: the C modules below publish no type information
    from pathlib import Path
else:
    # CPython's own SHA-256 (_sha2 from 3.12, _sha256 in 3.11), the digest hashlib gives: hashlib loads OpenSSL
    # first, which costs every root hook ~3 ms of its start-up (bench/node_hooks.py).
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        try:
            from _sha256 import sha256 as _sha256
        except ImportError:
            from hashlib import sha256 as _sha256

NODE_CONFIG = paths.NODE_CONFIG
DEFAULT_POLICY = paths.DEFAULT_POLICY
CONFIG_ENV = paths.CONFIG_ENV
SPEC_FORMAT = "gpushare-node-spec/4"  # 2: GPUs carry compute_mode; 3: a GPU's share (policy.share.Share) whole;
# 4: a per-job share's isolation (an older cache would read as not isolated: rebuilt instead)


class NodeConfigError(GpushareError):
    """The node config file, or this node's entry in the policy, cannot be used."""

    exit_code = 1


class _AsPath:
    """A path attribute kept as a str (``<name>_str``, what the hooks use) and read as a ``pathlib.Path`` (or
    None): pathlib is imported only by the callers that read it so, not by every hook."""

    def __set_name__(self, owner, name: str) -> None:
        self.key = name + "_str"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.key]
        if value is None:
            return None
        from pathlib import Path

        return Path(value)


class NodeConfig:
    """The parsed node config file (see the module docstring)."""

    path, admin_policy, live_policy, policy = _AsPath(), _AsPath(), _AsPath(), _AsPath()
    state_dir, mps_control, fake_nvml, spec_cache = _AsPath(), _AsPath(), _AsPath(), _AsPath()

    def __init__(
        self,
        path: str | Path,
        policy: str | Path = DEFAULT_POLICY,
        fake_nvml: str | Path | None = None,
        spec_cache: str | Path | None = None,
        mps_control: str | Path | None = None,
        state_dir: str | Path | None = None,
        live_policy: str | Path | None = None,
        outside_policy: str | None = None,
        site_health_program: str | Path | None = None,
    ):
        self.path_str = paths.plain(path)
        # a node the policy does not describe: the hooks do nothing of ours (paths.parse_flat keeps the rest out)
        self.outside_policy = outside_policy == "yes"
        self.site_health_program_str = _norm(site_health_program)
        self.live_policy_str = _norm(live_policy)
        self.admin_policy_str = paths.plain(policy)
        self.state_dir_str = _norm(state_dir)
        self.mps_control_str = _norm(mps_control)
        # the policy the hooks follow: the live planner's while its file exists (checked at each read)
        live = self.live_policy_str
        self.policy_str = live if live is not None and os.path.isfile(live) else self.admin_policy_str
        self.fake_nvml_str = _norm(fake_nvml)
        self.spec_cache_str = (
            paths.plain(spec_cache)
            if spec_cache
            else os.path.join(os.path.dirname(self.path_str), paths.SPEC_CACHE_NAME)
        )


def _norm(path) -> str | None:
    return None if path is None else paths.plain(path)


def config_path(environ: dict | None = None) -> str:
    """The fixed path, or GPUSHARE_NODE_CONFIG when it names a file only root can change.

    The override exists for benchmarks and tests; a root hook never reads a
    config that another user could have written."""
    env = os.environ if environ is None else environ
    value = env.get(CONFIG_ENV)
    if not value:
        return NODE_CONFIG
    if not paths._absolute(value):
        raise NodeConfigError(f"{CONFIG_ENV}={value!r} is not an absolute path")
    return value


def read_config(path: str | Path, root_hook: bool = True) -> NodeConfig:
    """Parse ``path``; a missing file gives the defaults. Strict: unknown keys and
    relative paths are errors naming the line and what is accepted."""
    name = paths.plain(path)
    try:
        with open(name, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return NodeConfig(name)
    except OSError as exc:
        raise NodeConfigError(f"cannot read node config {name}: {exc.strerror}") from None
    if root_hook:
        _check_owner(name)
    return NodeConfig(name, **parse_config(text, name))


def parse_config(text: str, source: str) -> dict[str, str]:
    try:
        return dict(paths.parse_flat(text, source))
    except ValueError as exc:
        raise NodeConfigError(str(exc)) from None


def _check_owner(path: str) -> None:
    info = os.stat(path)
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NodeConfigError(f"node config {path} must be owned by uid {os.geteuid()} and writable by no one else")


# ---- this node's view of the policy -------------------------------------------------


@record
class GpuSpec:
    """One GPU of the node, its model and its share (a MIG layout in the catalogue's profile names)."""

    index: int
    model: str
    share: Share

    @property
    def mode(self) -> Mode:
        return self.share.mode

    @property
    def layout(self) -> tuple[str, ...]:
        return self.share.layout

    def to_json(self) -> dict:
        return {"index": self.index, "model": self.model, "share": self.share.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> GpuSpec:
        return cls(int(data["index"]), str(data["model"]), Share.from_json(data["share"]))


@record
class NodeSpec:
    """What the root hooks need of the policy for one node; cached as JSON (``to_json``/``from_json``)."""

    policy: str
    policy_sha256: str
    node: str
    group: str
    state_dir: str
    log_dir: str
    slurm_conf_dir: str
    gres_include: str
    gpus: tuple[GpuSpec, ...]
    textfile_dir: str | None = None  # cluster.metrics: off when None
    dcgm_job_mapping_dir: str | None = None
    site_health_program: str | None = None  # cluster.health.site_program: run by the health check first
    format: str = SPEC_FORMAT

    def to_json(self) -> dict:
        return {**vars(self), "gpus": [g.to_json() for g in self.gpus]}

    @classmethod
    def from_json(cls, data) -> NodeSpec | None:
        """The spec a cache file holds, or None when it is not one of this format (then it is rebuilt)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or data.get("format") != SPEC_FORMAT or set(data) != names:
            return None
        try:
            gpus = tuple(GpuSpec.from_json(g) for g in data["gpus"])
        except (TypeError, KeyError, ValueError):
            return None
        return cls(**{**data, "gpus": gpus})

    def matches(self, policy: str, digest: str, node: str) -> bool:
        return (self.policy, self.policy_sha256, self.node) == (str(policy), digest, node)


def file_sha256(path: str | Path) -> str:
    try:
        with open(path, "rb") as fh:
            return _sha256(fh.read()).hexdigest()
    except OSError as exc:
        raise NodeConfigError(f"cannot read policy {path}: {exc.strerror}") from None


def node_spec(config: NodeConfig, node: str) -> NodeSpec:
    """This node's spec: from the cache when it matches the policy file, else rebuilt."""
    digest = file_sha256(config.policy_str)
    spec = _read_cache(config.spec_cache_str)
    if spec is None or not spec.matches(config.policy_str, digest, node):
        spec = build_spec(config.policy_str, node, digest)
        _write_cache(config.spec_cache_str, spec)
    if config.state_dir_str is not None and config.state_dir_str != spec.state_dir:
        raise NodeConfigError(
            f"{config.path_str}: state_dir {config.state_dir_str} differs from the policy's "
            f"cluster.paths.state_dir {spec.state_dir} ({config.policy_str}); the task prolog would "
            "look for journals in the wrong place"
        )
    return spec


def build_spec(policy: str | Path, node: str, digest: str) -> NodeSpec:
    """Load the policy (slow path) and keep what the hooks need for ``node``."""
    from ..policy import load_file

    site = load_file(policy)
    try:
        group = site.group_for_node(node)
    except KeyError as exc:
        raise NodeConfigError(f"{exc.args[0]} ({policy})") from None
    paths = site.cluster.paths
    gpus = tuple(
        GpuSpec(s.index, s.model.name, replace(s.share, layout=tuple(s.model.profile(n).name for n in s.layout)))
        for s in group.gpus
    )
    metrics = site.cluster.metrics
    return NodeSpec(
        policy=str(policy),
        policy_sha256=digest,
        node=node,
        group=group.name,
        state_dir=paths.state_dir,
        log_dir=paths.log_dir,
        slurm_conf_dir=paths.slurm_conf_dir,
        gres_include=paths.gres_include,
        gpus=gpus,
        textfile_dir=metrics.textfile_dir,
        dcgm_job_mapping_dir=metrics.dcgm_job_mapping_dir,
        site_health_program=site.cluster.health.site_program,
    )


def _read_cache(path: str) -> NodeSpec | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return NodeSpec.from_json(data)


def _write_cache(path: str, spec: NodeSpec) -> None:
    from .journal import write_json

    write_json(path, spec.to_json(), mode=0o644)
