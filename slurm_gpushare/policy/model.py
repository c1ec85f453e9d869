"""The site policy's shape: strict (unknown keys rejected), versioned, frozen.

Only structure and per-field ranges live here; rules that relate several
fields (layouts against the hardware, hostlist overlaps, tiers against node
groups) are in ``rules.py`` so that every such problem is reported at once.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from .share import MODES, Mode, parse_mode

NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$"
SLURM_NAME = r"^[a-z][a-z0-9_-]{0,39}$"
ABS_PATH = r"^/[A-Za-z0-9_./+-]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class Hooks(Strict):
    """Node hooks and the submission plugin. A hook left empty is not configured."""

    prolog: str | None = Field(None, pattern=ABS_PATH)
    epilog: str | None = Field(None, pattern=ABS_PATH)
    task_prolog: str | None = Field(None, pattern=ABS_PATH)
    job_submit_lua: bool = False


class Paths(Strict):
    slurm_conf_dir: str = Field("/etc/slurm", pattern=ABS_PATH)
    gres_include: str = Field("/etc/slurm/gres.d/gpushare-mig.conf", pattern=ABS_PATH)
    state_dir: str = Field("/var/lib/gpushare", pattern=ABS_PATH)
    log_dir: str = Field("/var/log/slurm", pattern=ABS_PATH)
    spool_dir: str = Field("/var/spool/slurm", pattern=ABS_PATH)


class Metrics(Strict):
    """Node-side metrics, written by the node hooks (prolog, epilog) and `gpushare node reconcile`.

    ``textfile_dir``: node_exporter's textfile-collector directory; the hooks
    (re)write ``<textfile_dir>/gpushare.prom`` there. ``dcgm_job_mapping_dir``:
    the directory dcgm-exporter reads with ``--hpc-job-mapping-dir``
    (``DCGM_HPC_JOB_MAPPING_DIR``); the prolog writes, the epilog removes each
    job's id in its GPUs' files. Both null (the default): off."""

    textfile_dir: str | None = Field(None, pattern=ABS_PATH)
    dcgm_job_mapping_dir: str | None = Field(None, pattern=ABS_PATH)

    @model_validator(mode="after")
    def _own_directories(self):
        for name in ("textfile_dir", "dcgm_job_mapping_dir"):
            value = getattr(self, name)
            if value is not None and "/../" in value + "/":
                raise ValueError(f"{name}: {value!r} climbs with '..'; give the directory's own absolute path")
            if value is not None and value.rstrip("/") in ("", "/."):
                raise ValueError(
                    f"{name}: {value!r} is the root directory; name a directory of its own "
                    "(e.g. /var/lib/prometheus/node-exporter, /run/gpushare/dcgm-job-mapping)"
                )
        if self.textfile_dir is not None and self.textfile_dir.rstrip("/") == (self.dcgm_job_mapping_dir or "").rstrip(
            "/"
        ):
            raise ValueError(
                "textfile_dir and dcgm_job_mapping_dir are the same directory; dcgm-exporter reads "
                "every file named like a GPU index there, node_exporter every *.prom: give each its own"
            )
        return self


class Health(Strict):
    """The node health check (`gpushare node health`), rendered as slurm.conf HealthCheckProgram,
    HealthCheckInterval and HealthCheckNodeState. Off (nothing rendered) while ``program`` is null.

    ``node_state``: Slurm's HealthCheckNodeState values (slurm.conf(5), 24.11): ANY, ALLOC, IDLE,
    MIXED, NONDRAINED_IDLE, and CYCLE (spread the runs over the interval; combines with the others)."""

    program: str | None = Field(None, pattern=ABS_PATH)
    interval: int = Field(300, ge=10, le=86400)
    node_state: list[Literal["ANY", "ALLOC", "IDLE", "MIXED", "NONDRAINED_IDLE", "CYCLE"]] = ["ANY"]

    @model_validator(mode="after")
    def _states(self):
        states = [s for s in self.node_state if s != "CYCLE"]
        if not states:
            raise ValueError(
                "node_state: name at least one of ANY, ALLOC, IDLE, MIXED, NONDRAINED_IDLE "
                "(CYCLE only combines with them)"
            )
        if len(set(self.node_state)) != len(self.node_state):
            raise ValueError(f"node_state: {self.node_state} names a state twice")
        if "ANY" in states and len(states) > 1:
            raise ValueError(
                f"node_state: ANY already covers {', '.join(s for s in states if s != 'ANY')}; "
                "give ANY alone (with CYCLE if wanted) or the states without ANY"
            )
        return self


# slurm.conf(5) SchedulerParameters of Slurm 24.11: options that stand alone, and options that take a value.
SCHEDULER_FLAGS = frozenset(
    """
allow_zero_lic assoc_limit_stop bf_allow_magnetic_slot bf_busy_nodes bf_continue bf_hetjob_immediate bf_licenses
bf_one_resv_per_job bf_running_job_reserve bf_topopt_enable defer defer_batch disable_job_shrink disable_hetjob_steps
enable_hetjob_steps enable_job_state_cache enable_user_top extra_constraints ignore_constraint_validation Ignore_NUMA
ignore_prefer_validation no_backup_scheduling no_env_cache nohold_on_prolog_fail pack_serial_at_end
reduce_completing_frag requeue_setup_env_fail salloc_wait_nodes sbatch_wait_nodes spec_cores_first
time_min_as_soft_limit whole_hetjob""".split()
)
SCHEDULER_VALUES = frozenset(
    """
batch_sched_delay bb_array_stage_cnt bf_hetjob_prio bf_interval bf_job_part_count_reserve bf_max_job_array_resv
bf_max_job_assoc bf_max_job_part bf_max_job_start bf_max_job_test bf_max_job_user bf_max_job_user_part bf_max_time
bf_min_age_reserve bf_min_prio_reserve bf_node_space_size bf_resolution bf_topopt_iterations bf_window
bf_window_linear bf_yield_interval bf_yield_sleep build_queue_timeout correspond_after_task_cnt default_queue_depth
delay_boot max_array_tasks max_rpc_cnt max_sched_time max_script_size max_submit_line_size max_switch_wait
partition_job_depth sched_interval sched_max_job_start sched_min_interval step_retry_count step_retry_time""".split()
)

# The product's SchedulerParameters for many short GPU jobs of mixed kinds in one partition
# (bench/cluster_throughput.py --sched measures them against Slurm's defaults; the README says why each).
SCHEDULER_DEFAULTS: dict[str, bool | int] = {
    "bf_continue": True,
    "bf_interval": 10,
    "bf_min_age_reserve": 300,
    "nohold_on_prolog_fail": True,
}


class Scheduler(Strict):
    """slurm.conf SchedulerParameters: the product's defaults (``SCHEDULER_DEFAULTS``) with the
    site's ``parameters`` on top. A parameter set to ``false`` is left out; an option that stands
    alone takes ``true``; the others a whole number (``bf_hetjob_prio``: min, avg or max).
    ``slurm_defaults: true`` starts from Slurm's own defaults instead of the product's."""

    slurm_defaults: bool = False
    parameters: dict[str, bool | int | str] = {}

    @model_validator(mode="after")
    def _known(self):
        problems = []
        for key, value in self.parameters.items():
            if key in SCHEDULER_FLAGS:
                if not isinstance(value, bool):
                    problems.append(f"{key}: an option without a value: give true (on) or false (off), not {value!r}")
            elif key in SCHEDULER_VALUES:
                if key == "bf_hetjob_prio":
                    if value is not False and value not in ("min", "avg", "max"):
                        problems.append(f"bf_hetjob_prio: min, avg or max (or false), not {value!r}")
                elif value is True or isinstance(value, str) or (isinstance(value, int) and value < 0):
                    problems.append(f"{key}: a whole number >= 0 (or false to leave it out), not {value!r}")
            else:
                problems.append(f"{key!r} is not a SchedulerParameters option of Slurm 24.11 (slurm.conf(5))")
        if problems:
            raise ValueError("parameters: " + "; ".join(problems))
        return self

    def effective(self) -> list[tuple[str, bool | int | str]]:
        """(option, value) in a stable order: defaults first, then the site's additions."""
        merged: dict[str, bool | int | str] = {} if self.slurm_defaults else dict(SCHEDULER_DEFAULTS)
        merged.update(self.parameters)
        return [(k, v) for k, v in merged.items() if v is not False]

    def rendered(self) -> str:
        return ",".join(k if v is True else f"{k}={v}" for k, v in self.effective())


class Accounting(Strict):
    host: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
    port: int = Field(6819, ge=1, le=65535)
    enforce: list[Literal["associations", "limits", "qos", "safe", "nojobs", "nosteps"]] = [
        "associations",
        "limits",
        "qos",
    ]


class Priority(Strict):
    decay_half_life: str = Field("7-0", pattern=r"^\d+(-\d+)?(:\d+){0,2}$")
    weight_fairshare: int = Field(10000, ge=0)
    weight_age: int = Field(1000, ge=0)
    weight_qos: int = Field(1000, ge=0)
    weight_partition: int = Field(1000, ge=0)
    max_age: str = Field("7-0", pattern=r"^\d+(-\d+)?(:\d+){0,2}$")


class Cluster(Strict):
    name: str = Field(pattern=SLURM_NAME)
    slurm_version: str | float | int
    controller: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
    hooks: Hooks = Hooks()
    paths: Paths = Paths()
    accounting: Accounting = Accounting()
    priority: Priority = Priority()
    metrics: Metrics = Metrics()
    health: Health = Health()
    scheduler: Scheduler = Scheduler()
    cgroups: bool = True
    slurmd_config_overrides: bool = False


class Sharing(Strict):
    """How one GPU or a range of GPUs on every node of the group is shared."""

    gpus: str | int
    mode: Annotated[Mode, WithJsonSchema({"type": "string", "enum": list(MODES)})]  # any case in the file
    layout: str | list[str] | None = None
    replicas: int | None = None
    units: int | None = None
    type: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_.]{0,39}$")
    # mode mps: the compute mode the site sets on these GPUs (nvidia-smi -c); null means default
    compute_mode: Literal["default", "exclusive_process"] | None = None
    client_mem_limit_mib: int | None = Field(
        None,
        ge=1,
        description="mode mps: the most device memory (MiB) one MPS client may pin on each of these GPUs. The "
        "prolog sets the smaller of this and the job's share of the GPU's memory as the daemon's default pinned "
        "device memory limit (nvidia-cuda-mps-control set_default_device_pinned_mem_limit) and as the job's "
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; null: the job's share (its units' percentage of the GPU's memory).",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value):
        """Any case, as before the enum; the error names the modes allowed (policy.share.parse_mode)."""
        return parse_mode(value)


class GpuHardware(Strict):
    model: str
    count: int = Field(ge=1, le=64)


class GpuModelDecl(Strict):
    """A GPU model the catalogue does not know, declared by the site: whole GPUs only (no MIG)."""

    name: str = Field(pattern=NAME)
    memory_mb: int = Field(ge=1)
    slurm_type: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_.]{0,39}$")


class NodeGroup(Strict):
    name: str = Field(pattern=NAME)
    nodes: str = Field(min_length=1)
    gpu: GpuHardware
    cpus: int = Field(ge=1)
    memory_mb: int = Field(ge=1)
    sockets: int | None = Field(None, ge=1)
    cores_per_socket: int | None = Field(None, ge=1)
    threads_per_core: int | None = Field(None, ge=1)
    features: list[str] = []
    sharing: list[Sharing] = []
    weight: int | None = Field(None, ge=1, le=65533)  # slurm.conf Weight: lower is used first


class Quota(Strict):
    """Limits on what one tenant may hold at once (Slurm GrpTRES)."""

    gpu: int | None = Field(None, ge=0)
    shard: int | None = Field(None, ge=0)
    mps: int | None = Field(None, ge=0)


class Tenant(Strict):
    name: str = Field(pattern=SLURM_NAME)
    shares: int | str
    parent: str | None = None
    description: str = ""
    users: list[str] = []
    quota: Quota = Quota()


class Tier(Strict):
    name: str = Field(pattern=SLURM_NAME)
    node_groups: list[str] = Field(min_length=1)
    default: bool = False
    priority: int = Field(1, ge=0, le=65533)
    preempt_mode: str = "off"
    # seconds a job preempted from this tier gets between SIGTERM (to its steps) and its requeue or cancel
    # (partition GraceTime): time to write a checkpoint. None: Slurm's default, 0.
    grace_time: int | None = Field(None, ge=0, le=86400)
    usage_factor: float = Field(1.0, ge=0)
    max_time: str = Field("UNLIMITED", pattern=r"^(UNLIMITED|INFINITE|\d+(-\d+)?(:\d+){0,2})$")
    gpu_types: list[str] = []
    allow_accounts: list[str] = []


class RouteMatch(Strict):
    """Which jobs a route takes: by the GRES they ask for, their QOS, their GPU count."""

    gres: Literal["none", "gpu", "mps", "shard"]
    qos: list[str] = []
    min_gpus: int | None = Field(None, ge=1)
    max_gpus: int | None = Field(None, ge=1)
    min_cpus: int | None = Field(None, ge=1)  # the job's CPUs (job_submit's min_cpus)


class Route(Strict):
    """Class routing: jobs that ``match`` (and name no partition) go to ``tiers``; mps requests may be rounded to MIG."""  # noqa: E501 the policy schema's description (docs/reference/policy.schema.json), kept on one line

    match: RouteMatch
    tiers: list[str] = []
    round_to: Literal["mig"] | None = None


class Submission(Strict):
    reject_multi_slice: bool = True
    fail_open: bool = False
    route_by_gres: bool = True
    set_gpu_type: bool = True
    aliases: dict[str, str] = {}
    routes: list[Route] = []


class Billing(Strict):
    gpu_weights: dict[str, float] = {}
    default_gpu_weight: float = Field(100.0, gt=0)
    cpu: float = Field(0.0, ge=0)
    mem_per_gb: float = Field(0.0, ge=0)


class Live(Strict):
    """The live planner (`gpushare live`): which MIG layouts and GPU modes follow the pending queue, and
    the limits that keep it from thrashing. Times are seconds. A node under relayout holds a gpushare-relayout-<node>
    reservation or is drained with a reason starting "gpushare relayout"."""

    enabled: bool = False
    min_pending: int = Field(300, ge=0, le=30 * 86400)  # a pending job counts once it has waited this long
    min_dwell: int = Field(3600, ge=0, le=365 * 86400)  # between two changes (or attempts) of one node's layout
    min_benefit_jobs: int = Field(1, ge=1, le=100000)  # pending jobs a change must let start
    max_draining: int = Field(1, ge=1, le=10000)  # nodes under relayout at once, per tier
    max_wait: int = Field(3600, ge=0, le=30 * 86400)  # every GPU job on the node must end within this
    change_cost: int = Field(120, ge=0, le=86400)  # drain + re-registration counted in every change's cost
    # s of finished jobs (sacct) read per run: what a node ran lately counts toward keeping its layout or mode
    # (the jobs of a type it would lose, at their recent rate, over min_dwell); 0: no history read
    history_window: int = Field(21600, ge=0, le=7 * 86400)
    modes: bool = True  # also propose a non-MIG GPU's sharing mode (exclusive, mps, shard) for the queue
    weights: bool = True  # also propose node weights that keep small jobs off nodes large blocked jobs need
    policy_file: str | None = Field(None, pattern=ABS_PATH)  # default: <slurm_conf_dir>/gpushare-live.yaml

    @model_validator(mode="after")
    def _file(self):
        if self.policy_file is not None:
            if "/../" in self.policy_file + "/" or self.policy_file.endswith("/"):
                raise ValueError(
                    f"policy_file: {self.policy_file!r} must name a file by its own absolute path "
                    "(no '..', not a directory), e.g. /etc/slurm/gpushare-live.yaml"
                )
        return self


class Policy(Strict):
    version: Literal[1]
    cluster: Cluster
    gpu_models: list[GpuModelDecl] = []
    node_groups: list[NodeGroup] = Field(min_length=1)
    tenants: list[Tenant] = []
    tiers: list[Tier] = Field(min_length=1)
    submission: Submission = Submission()
    billing: Billing = Billing()
    live: Live = Live()
