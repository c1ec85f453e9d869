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

    prolog: str | None = Field(
        None,
        pattern=ABS_PATH,
        description=(
            "absolute path of the prolog (`gpushare-prolog`); unset: not "
            "configured. With a prolog, PrologFlags=Alloc (plus Contain with "
            "cgroups)"
        ),
    )
    epilog: str | None = Field(
        None, pattern=ABS_PATH, description="absolute path of the epilog (`gpushare-epilog`); unset: not configured"
    )
    task_prolog: str | None = Field(
        None,
        pattern=ABS_PATH,
        description="absolute path of the task prolog (`gpushare-task-prolog`); unset: not configured",
    )
    job_submit_lua: bool = Field(
        False, description="JobSubmitPlugins=lua (job_submit.lua is rendered beside slurm.conf)"
    )
    ns_caps: str | None = Field(
        None,
        pattern=ABS_PATH,
        description=(
            "absolute path of `gpushare-ns-caps`, job_container.conf's CloneNSScript where per-job MIG GPUs are "
            "isolated (sharing isolation: namespace); unset: beside the prolog"
        ),
    )


class Paths(Strict):
    slurm_conf_dir: str = Field(
        "/etc/slurm", pattern=ABS_PATH, description="where slurm.conf and the rendered files live"
    )
    gres_include: str = Field(
        "/etc/slurm/gres.d/gpushare-mig.conf",
        pattern=ABS_PATH,
        description=(
            "the per-node MIG include that gres.conf names (written on each node by `gpushare node gres-conf`)"
        ),
    )
    state_dir: str = Field(
        "/var/lib/gpushare", pattern=ABS_PATH, description="the node runtime's journals, MPS pipe directories and locks"
    )
    log_dir: str = Field("/var/log/slurm", pattern=ABS_PATH, description="Slurm's log directory")
    spool_dir: str = Field("/var/spool/slurm", pattern=ABS_PATH, description="Slurm's spool directory")


class Metrics(Strict):
    """Node-side metrics, written by the node hooks (prolog, epilog) and `gpushare node reconcile`.

    ``textfile_dir``: node_exporter's textfile-collector directory; the hooks
    (re)write ``<textfile_dir>/gpushare.prom`` there. ``dcgm_job_mapping_dir``:
    the directory dcgm-exporter reads with ``--hpc-job-mapping-dir``
    (``DCGM_HPC_JOB_MAPPING_DIR``); the prolog writes, the epilog removes each
    job's id in its GPUs' files. Both null (the default): off."""

    textfile_dir: str | None = Field(
        None,
        pattern=ABS_PATH,
        description="node_exporter's textfile-collector directory; the hooks write gpushare.prom there. null: off",
    )
    dcgm_job_mapping_dir: str | None = Field(
        None,
        pattern=ABS_PATH,
        description="dcgm-exporter's --hpc-job-mapping-dir; the hooks write job ids per GPU there. null: off",
    )

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

    program: str | None = Field(
        None,
        pattern=ABS_PATH,
        description="HealthCheckProgram: the absolute path of `gpushare-node-health`; null: no health check",
    )
    site_program: str | None = Field(
        None,
        pattern=ABS_PATH,
        description=(
            "the site's own health program (e.g. NHC), run by `gpushare-node-health` before its own checks; "
            "its exit code and the drains it makes are kept apart from ours. null: none"
        ),
    )
    interval: int = Field(300, ge=10, le=86400, description="HealthCheckInterval in seconds")
    node_state: list[Literal["ANY", "ALLOC", "IDLE", "MIXED", "NONDRAINED_IDLE", "CYCLE"]] = Field(
        ["ANY"], description="HealthCheckNodeState: ANY alone, or states, with CYCLE to spread the runs"
    )

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

    slurm_defaults: bool = Field(
        False, description="true: start from Slurm's own SchedulerParameters instead of the product's"
    )
    parameters: dict[str, bool | int | str] = Field(
        {},
        description=(
            "SchedulerParameters on top of the defaults: `option: true` for one "
            "without a value, a whole number for the others, false to leave one "
            "out; an option Slurm 24.11 does not know is refused"
        ),
    )

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
    host: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$", description="AccountingStorageHost (default: the controller)"
    )
    port: int = Field(6819, ge=1, le=65535, description="AccountingStoragePort")
    enforce: list[Literal["associations", "limits", "qos", "safe", "nojobs", "nosteps"]] = Field(
        ["associations", "limits", "qos"],
        description="AccountingStorageEnforce (quotas need limits)",
    )


class Priority(Strict):
    decay_half_life: str = Field(
        "7-0",
        pattern=r"^\d+(-\d+)?(:\d+){0,2}$",
        description="PriorityDecayHalfLife (Slurm time: days-hours:minutes:seconds)",
    )
    weight_fairshare: int = Field(10000, ge=0, description="PriorityWeightFairshare (Slurm's own default is 0)")
    weight_age: int = Field(1000, ge=0, description="PriorityWeightAge")
    weight_qos: int = Field(1000, ge=0, description="PriorityWeightQOS")
    weight_partition: int = Field(1000, ge=0, description="PriorityWeightPartition")
    max_age: str = Field("7-0", pattern=r"^\d+(-\d+)?(:\d+){0,2}$", description="PriorityMaxAge")


class Cluster(Strict):
    name: str = Field(pattern=SLURM_NAME, description="Slurm ClusterName (lower case)")
    slurm_version: str | float | int = Field(
        description=(
            'the Slurm release, quoted: "24.11" or "24.11.5"; 23.11 and newer '
            "(tested: 24.11, 26.05). `render --slurm-version` overrides it"
        )
    )
    controller: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$", description="SlurmctldHost")
    hooks: Hooks = Field(Hooks(), description="node hooks and the submission plugin")
    paths: Paths = Field(Paths(), description="directories and files on the controller and nodes")
    accounting: Accounting = Field(Accounting(), description="slurmdbd and what it enforces")
    priority: Priority = Field(Priority(), description="the multifactor priority plugin's decay and weights")
    metrics: Metrics = Field(Metrics(), description="node-side metrics written by the hooks")
    health: Health = Field(Health(), description="the node health check (HealthCheckProgram)")
    scheduler: Scheduler = Field(Scheduler(), description="SchedulerParameters")
    cgroups: bool = Field(
        True,
        description=(
            "proctrack/cgroup + task/cgroup and ConstrainDevices=yes; false for "
            "hosts without cgroup delegation (linuxproc, task/none, global GPU "
            "indexes)"
        ),
    )
    slurmd_config_overrides: bool = Field(
        False,
        description="SlurmdParameters=config_overrides: nodes may have less hardware than declared (containers)",
    )


class Sharing(Strict):
    """How one GPU or a range of GPUs on every node of the group is shared."""

    gpus: str | int = Field(
        description=('the GPUs this entry covers: 0, "0-3" or "4,5", within the group\'s count, each GPU at most once')
    )
    mode: Annotated[Mode, WithJsonSchema({"type": "string", "enum": list(MODES)})] = Field(  # any case in the file
        description="exclusive, mig, shard or mps"
    )
    layout: str | list[str] | None = Field(
        None,
        description=(
            "mode mig: a list of profiles ([3g.40gb, 3g.40gb]) or a named layout (all-1g.10gb, ...) that fits the model"
        ),
    )
    per_job: bool | None = Field(
        None,
        description=(
            "mode mig: true makes a MIG instance for each job, at a legal placement beside the running ones, "
            "instead of a fixed layout (no drain to change it); users ask as for fixed MIG"
        ),
    )
    profiles: list[str] | None = Field(
        None,
        description=(
            "mode mig with per_job: the profiles jobs may ask for ([1g.10gb, 3g.40gb, 7g.80gb]); they must have "
            "exact carrier weights (`gpushare validate` names the largest sets that do). Default: the largest such "
            "set of the model's profiles"
        ),
    )
    carrier_weights: dict[str, int] | None = Field(
        None,
        description=(
            "mode mig with per_job: the shards each allowed profile carries ({1g.5gb: 8, 1g.10gb: 10, ...}), one "
            "positive whole number per profile, no two alike, for every profile of profiles; the shard Count per "
            "GPU stays the exact one, and every set of slices the weights admit on one GPU must fit on an empty GPU. "
            "Raising small profiles' weights admits fewer of them per GPU and requeues fewer jobs for fragmentation "
            "(`gpushare plan` tunes them on a demand). Default: the exact weights (Slurm admits exactly the sets that "
            "fit)"
        ),
    )
    on_slice_failure: Literal["requeue", "fail"] | None = Field(
        None,
        description=(
            "mode mig with per_job: what becomes of a batch job whose MIG instance the prolog could not make (the "
            "job is refused, never the node; its tasks fail with the reason): requeue (the default) has the node's "
            "health check requeue it, at most 3 times by Slurm's restart count, after which it fails; fail lets it "
            "fail with the reason. Interactive jobs (salloc, srun) cannot be requeued and fail either way"
        ),
    )
    isolation: Literal["namespace", "none"] | None = Field(
        None,
        description=(
            "mode mig with per_job: how a job is kept from its neighbours' instances on the same GPU. namespace "
            "gives each job a private read-only /dev/nvidia-caps holding only its own instance's capabilities "
            "(gpushare-ns-caps run by job_container/tmpfs, namespace/tmpfs from 25.11; needs Slurm 24.11 or newer); "
            "none leaves device cgroups alone, which let a job open a neighbour's instance. Default: namespace on "
            "Slurm 24.11 and newer, none before"
        ),
    )
    replicas: int | None = Field(None, description="mode shard: shards per GPU (2-1024)")
    units: int | None = Field(
        None, description="mode mps: MPS units per GPU, a divisor of 100 (2, 4, 5, 10, 20, 25, 50, 100)"
    )
    type: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9_.]{0,39}$",
        description="mode exclusive: a GRES type of their own for these GPUs (e.g. h100_reserved)",
    )
    # mode mps: the compute mode the site sets on these GPUs (nvidia-smi -c); null means default
    compute_mode: Literal["default", "exclusive_process"] | None = Field(
        None,
        description=(
            "mode mps: the compute mode the site sets on these GPUs; null means "
            "default. exclusive_process renders ExclusiveUser=YES on the tier's "
            "partition"
        ),
    )
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
    model: str = Field(description="a catalogue model (`gpushare catalogue`) or one declared under gpu_models")
    count: int = Field(ge=1, le=64, description="GPUs per node")


class GpuModelDecl(Strict):
    """A GPU model the catalogue does not know, declared by the site: whole GPUs only (no MIG)."""

    name: str = Field(pattern=NAME, description="the model's name (not a catalogue name)")
    memory_mb: int = Field(ge=1, description="the GPU's memory in MB")
    slurm_type: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9_.]{0,39}$",
        description="its GRES type (default: the name in lower case, other characters as _)",
    )


class NodeGroup(Strict):
    name: str = Field(pattern=NAME, description="unique name, referenced by tiers")
    nodes: str = Field(min_length=1, description="a Slurm hostlist (gpu-[01-16]); groups must not overlap")
    gpu: GpuHardware = Field(description="the nodes' GPU model and count")
    cpus: int = Field(ge=1, description="CPUs")
    memory_mb: int = Field(ge=1, description="RealMemory")
    sockets: int | None = Field(None, ge=1, description="Sockets")
    cores_per_socket: int | None = Field(None, ge=1, description="CoresPerSocket")
    threads_per_core: int | None = Field(None, ge=1, description="ThreadsPerCore")
    features: list[str] = Field(
        [],
        description=(
            "node Features besides the GPU model's own (its Slurm type, given to "
            "every node); names a --constraint can hold"
        ),
    )
    sharing: list[Sharing] = Field([], description="how each GPU or GPU range is shared; GPUs not listed are exclusive")
    weight: int | None = Field(
        None, ge=1, le=65533, description="slurm.conf Weight (unset: Slurm's 1); lower weights are used first"
    )


class Quota(Strict):
    """Limits on what one tenant may hold at once (Slurm GrpTRES)."""

    gpu: int | None = Field(None, ge=0, description="GrpTRES gres/gpu: whole GPUs and MIG slices at once")
    shard: int | None = Field(None, ge=0, description="GrpTRES gres/shard")
    mps: int | None = Field(None, ge=0, description="GrpTRES gres/mps (units)")


class Tenant(Strict):
    name: str = Field(pattern=SLURM_NAME, description="the Slurm account")
    shares: int | str = Field(description="FairShare: a positive integer, or parent")
    parent: str | None = Field(None, description="another tenant (default: root)")
    description: str = Field("", description="the account's description")
    users: list[str] = Field([], description="the account's users")
    quota: Quota = Field(Quota(), description="what the tenant may hold at once")


class Tier(Strict):
    name: str = Field(pattern=SLURM_NAME, description="the partition's (and QOS's) name")
    node_groups: list[str] = Field(min_length=1, description="the node groups in the partition")
    default: bool = Field(False, description="the default partition (at most one; otherwise the first tier)")
    priority: int = Field(
        1, ge=0, le=65533, description="PriorityTier; a higher tier preempts lower ones on shared nodes"
    )
    preempt_mode: str = Field(
        "off", description="off, requeue or cancel (suspend is refused: suspended jobs keep their GRES)"
    )
    # seconds a job preempted from this tier gets between SIGTERM (to its steps) and its requeue or cancel
    # (partition GraceTime): time to write a checkpoint. None: Slurm's default, 0.
    grace_time: int | None = Field(
        None,
        ge=0,
        le=86400,
        description="seconds a job preempted from this tier gets to write a checkpoint (GraceTime)",
    )
    usage_factor: float = Field(1.0, ge=0, description="the QOS's UsageFactor")
    max_time: str = Field(
        "UNLIMITED",
        pattern=r"^(UNLIMITED|INFINITE|\d+(-\d+)?(:\d+){0,2})$",
        description="MaxTime (UNLIMITED or Slurm time)",
    )
    gpu_types: list[str] = Field([], description="GPU types this tier serves, for routing; must exist on its nodes")
    allow_accounts: list[str] = Field([], description="AllowAccounts (tenants)")
    # Whether job_submit.lua gives a job that names no QOS this tier's QOS (its UsageFactor and priority).
    # "if-allowed": only when the job's association may use it (job_desc.assoc_qos, Slurm 24.11 and newer),
    # so an association without it (root, a site account) keeps its default QOS and is never refused
    # "Invalid qos specification"; true: always (every association must have the QOS); false: never.
    # None (unset): "if-allowed" from Slurm 24.11, false before (older job_submit.lua cannot see the list).
    set_qos: bool | Literal["if-allowed"] | None = Field(
        None,
        description="whether job_submit gives a job that names no QOS this tier's QOS: if-allowed (only when the "
        "job's association may use it; the default from Slurm 24.11), true (always), false (never; the default "
        "before 24.11)",
    )
    # What an untyped GPU request (--gres=gpu:N, --gpus=N, --gpus-per-node=N) means here: "whole" (a whole
    # GPU, never a MIG slice nor an MPS or shard GPU: rewritten to the one whole-GPU type, else routed or
    # refused), "refuse" (name a type), or a GPU type of the tier (rewritten to it). See submit/decide.py.
    untyped_gpu: str = Field(
        "whole",
        pattern=r"^[a-z0-9][a-z0-9_.]{0,63}$",
        description="what an untyped GPU request (--gres=gpu:N, --gpus=N, --gpus-per-node=N) means: whole (the "
        "default: a whole GPU, never a MIG slice nor an MPS or shard GPU; rewritten to the one whole type, routed, "
        "or refused UNTYPED), refuse, or a GPU type of the tier",
    )


class RouteMatch(Strict):
    """Which jobs a route takes: by the GRES they ask for, their QOS, their GPU count."""

    gres: Literal["none", "gpu", "mps", "shard"] = Field(
        description="the GRES the job asks for: none, gpu, mps or shard"
    )
    qos: list[str] = Field([], description="the job's QOS names (case-insensitive)")
    min_gpus: int | None = Field(None, ge=1, description="with gpu: at least this many GPUs per node")
    max_gpus: int | None = Field(None, ge=1, description="with gpu: at most this many GPUs per node")
    # the job's CPUs (job_submit's min_cpus)
    min_cpus: int | None = Field(None, ge=1, description="at least this many CPUs")


class Route(Strict):
    """Class routing: jobs that ``match`` (and name no partition) go to ``tiers``; mps requests may be rounded to MIG."""  # noqa: E501 the policy schema's description (docs/reference/policy.schema.json), kept on one line

    match: RouteMatch = Field(description="which jobs the route takes (only jobs that name no partition)")
    tiers: list[str] = Field([], description="the partitions to set, in the order Slurm tries them")
    round_to: Literal["mig"] | None = Field(
        None,
        description="mig (with gres mps): mps:N becomes the smallest MIG slice of the route's tiers covering N %",
    )


class SiteLua(Strict):
    """A site's own job_submit.lua, kept as a module that the generated job_submit.lua runs."""

    path: str = Field(
        pattern=ABS_PATH,
        description="where the site's job_submit.lua is kept (`gpushare install` moves it there), e.g. "
        "/etc/slurm/job_submit_site.lua",
    )
    order: Literal["before", "after"] = Field(
        "before", description="run the site's rules before or after ours; the first to refuse a job decides"
    )


class Submission(Strict):
    reject_multi_slice: bool = Field(True, description="reject shard:N>1 and shared GRES asked per task or socket")
    fail_open: bool = Field(
        False, description="let a job through when job_submit.lua fails internally (default: reject it)"
    )
    route_by_gres: bool = Field(
        True, description="a job without a partition goes to the first tier that serves all its GRES"
    )
    set_gpu_type: bool = Field(True, description="an untyped GPU request on a tier with one GPU type gets that type")
    aliases: dict[str, str] = Field(
        {}, description=('name: "gpu:<type>" | "shard" | "mps:<1-100>", so --gres=gpu:<name>:1 works')
    )
    routes: list[Route] = Field([], description="class routing, first match wins (what `gpushare plan` writes)")
    site_lua: SiteLua | None = Field(
        None, description="a site's own job_submit.lua, chained before or after ours; null: none"
    )


class Billing(Strict):
    gpu_weights: dict[str, float] = Field({}, description="per GPU model, the billing weight of one whole GPU")
    default_gpu_weight: float = Field(
        100.0, gt=0, description="the weight of a whole GPU of a model not in gpu_weights"
    )
    cpu: float = Field(0.0, ge=0, description="per CPU")
    mem_per_gb: float = Field(0.0, ge=0, description="per GB of memory")


class Live(Strict):
    """The live planner (`gpushare live`): which MIG layouts and GPU modes follow the pending queue, and
    the limits that keep it from thrashing. Times are seconds. A node under relayout holds a gpushare-relayout-<node>
    reservation or is drained with a reason starting "gpushare relayout"."""

    enabled: bool = Field(False, description="gpushare live apply refuses while false; the report works either way")
    min_pending: int = Field(300, ge=0, le=30 * 86400, description="seconds a pending job must have waited to count")
    min_dwell: int = Field(
        3600, ge=0, le=365 * 86400, description="seconds between two changes of one node (a failed attempt counts)"
    )
    min_benefit_jobs: int = Field(
        1,
        ge=1,
        le=100000,
        description="pending jobs a change must let start (net of what the present layout would start)",
    )
    max_draining: int = Field(1, ge=1, le=10000, description="nodes under relayout at once, per tier")
    max_wait: int = Field(
        3600,
        ge=0,
        le=30 * 86400,
        description="propose only if every GPU job on the node ends (time limit) within this many seconds",
    )
    change_cost: int = Field(
        120, ge=0, le=86400, description="seconds of drain and re-registration counted in each change's cost"
    )
    # s of finished jobs (sacct) read per run: what a node ran lately counts toward keeping its layout or mode
    # (the jobs of a type it would lose, at their recent rate, over min_dwell); 0: no history read
    history_window: int = Field(
        21600, ge=0, le=7 * 86400, description="seconds of finished jobs (sacct) read per run; 0: no history"
    )
    # also propose a non-MIG GPU's sharing mode (exclusive, mps, shard) for the queue
    modes: bool = Field(True, description="also plan the sharing mode of GPUs not shared by MIG")
    weights: bool = Field(
        True, description="also plan node weights that keep small jobs off the nodes large blocked jobs need"
    )
    policy_file: str | None = Field(
        None,
        pattern=ABS_PATH,
        description="the live policy gpushare live apply writes (default: <slurm_conf_dir>/gpushare-live.yaml)",
    )

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
    version: Literal[1] = Field(description="the policy format's version; 1")
    cluster: Cluster = Field(description="the cluster's identity, daemons, paths, hooks and node-side options")
    gpu_models: list[GpuModelDecl] = Field([], description="GPU models the catalogue does not know (whole GPUs only)")
    node_groups: list[NodeGroup] = Field(
        min_length=1, description="groups of identical nodes and how each of their GPUs is shared"
    )
    tenants: list[Tenant] = Field([], description="Slurm accounts with their shares, users and quotas")
    tiers: list[Tier] = Field(min_length=1, description="partitions (and QOS of the same name) over node groups")
    submission: Submission = Field(
        Submission(), description="what job_submit.lua and `gpushare check` accept, change and route"
    )
    billing: Billing = Field(Billing(), description="billing weights, from which every GRES's weight is derived")
    live: Live = Field(Live(), description="the live planner's limits (`gpushare live`)")
