"""Fixed names the node hooks share, importable without any cost.

The task prolog runs as the user on every task start and reads only this
module, the node config and the job's task file (its budget is the
interpreter's start-up: even ``json`` would add a third, through ``re``),
so nothing here imports anything, not even the package's error classes.

The task file ``<state_dir>/jobs/<job id>.task`` is derived from the journal
and written with it (only while the journal is ``ready``)::

    gpushare-task/1 17
    env CUDA_DEVICE_ORDER PCI_BUS_ID
    dev 2 GPU-<uuid> MIG-<uuid>      # Slurm's index, the GPU, what CUDA_VISIBLE_DEVICES says ('-': Slurm's)
"""

NODE_CONFIG = "/etc/gpushare/node.yaml"
CONFIG_ENV = "GPUSHARE_NODE_CONFIG"
DEFAULT_POLICY = "/etc/gpushare/policy.yaml"
DEFAULT_STATE_DIR = "/var/lib/gpushare"
SPEC_CACHE_NAME = "node-spec.json"
JOURNAL_FORMAT = "gpushare-journal/1"
TASK_FORMAT = "gpushare-task/1"
CONFIG_KEYS = (
    "policy",
    "fake_nvml",
    "spec_cache",
    "mps_control",
    "state_dir",
    "live_policy",
    "outside_policy",
    "site_health_program",
)
# A node the policy does not describe (``gpushare node install --outside-policy``): ``outside_policy: yes``, and
# the site's health program when the policy names one; the hooks then do nothing of gpushare's there.
OUTSIDE = "outside_policy"
OUTSIDE_KEYS = frozenset((OUTSIDE, "site_health_program"))
# The module whose ``main`` each hook script runs (``gpushare node install`` writes the scripts; the health
# check knows Slurm's Prolog / Epilog as ours by the line that imports it).
SCRIPT_MODULES = {
    "prolog": "slurm_gpushare.hooks.prolog",
    "epilog": "slurm_gpushare.hooks.epilog",
    "task_prolog": "slurm_gpushare.node.taskprolog",
    "health": "slurm_gpushare.hooks.health",
    "ns_caps": "slurm_gpushare.hooks.nscaps",
}


def parse_flat(text: str, source: str) -> dict[str, str]:
    """The node config's flat ``key: /absolute/path`` lines (``outside_policy: yes`` the one that is no path);
    ValueError names the line, or the keys that do not go together."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        if not sep or key not in CONFIG_KEYS:
            raise ValueError(
                f"{source}:{number}: expected 'KEY: /absolute/path' with KEY one of "
                f"{', '.join(CONFIG_KEYS)}, got {raw!r}"
            )
        if key in values:
            raise ValueError(f"{source}:{number}: {key} given twice")
        if key == OUTSIDE and value != "yes":
            raise ValueError(
                f"{source}:{number}: {OUTSIDE}: {value!r}: the one value is 'yes' (a node outside the policy); "
                "leave the key out on a node of the policy"
            )
        if key != OUTSIDE and not _absolute(value):
            raise ValueError(f"{source}:{number}: {key}: {value!r} is not an absolute path")
        values[key] = value
    _check_outside(values, source)
    return values


def _check_outside(values: dict[str, str], source: str) -> None:
    """A node outside the policy has no policy, state dir or GPUs of ours; a node of the policy runs the
    policy's site health program (cluster.health.site_program), not one of node.yaml's."""
    if OUTSIDE in values:
        other = sorted(k for k in values if k not in OUTSIDE_KEYS)
        if other:
            raise ValueError(
                f"{source}: {OUTSIDE}: yes (a node outside the policy) takes only site_health_program besides; "
                f"{', '.join(other)} belong to a node of the policy (`gpushare node install` without "
                "--outside-policy writes them)"
            )
    elif "site_health_program" in values:
        raise ValueError(
            f"{source}: site_health_program is for a node outside the policy ({OUTSIDE}: yes); a node of the "
            "policy runs the policy's cluster.health.site_program"
        )


def _absolute(value: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+-")
    return value.startswith("/") and set(value) <= allowed and "/../" not in value + "/"


def plain(path) -> str:
    """``path`` (str or os.PathLike) as ``str(pathlib.Path(path))`` spells it: no empty or "." parts, no
    trailing slash. The hooks keep paths as str: pathlib costs each of them ~17 M instructions at start-up."""
    path = path.__fspath__() if hasattr(path, "__fspath__") else path
    parts = [p for p in path.split("/") if p not in ("", ".")]
    lead = "//" if path.startswith("//") and not path.startswith("///") else "/" if path.startswith("/") else ""
    return lead + "/".join(parts) or "."


def journal_dir(state_dir: str) -> str:
    return state_dir.rstrip("/") + "/jobs"


def task_path(state_dir: str, job_id: int) -> str:
    return f"{journal_dir(state_dir)}/{job_id}.task"
