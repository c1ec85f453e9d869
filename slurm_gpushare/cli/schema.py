"""`gpushare schema`: the policy's JSON Schema (for editors) and its reference page, both from the model.

The schema is pydantic's ``model_json_schema()`` of ``policy.model.Policy``
with a description on every key (``MEANINGS`` below; the model's own class
docstrings describe the sections). The Markdown page is generated from that
same schema, so the two cannot disagree; the documentation keeps both
(``docs/reference/policy.schema.json``, ``docs/reference/policy.md``) and a
unit test checks they are what this command prints now.
"""

from __future__ import annotations

import json

import click

# What each key means, by "<model class>.<key>". A key the model has and this table lacks gets none.
MEANINGS = {
    "Policy.version": "the policy format's version; 1",
    "Policy.cluster": "the cluster's identity, daemons, paths, hooks and node-side options",
    "Policy.gpu_models": "GPU models the catalogue does not know (whole GPUs only)",
    "Policy.node_groups": "groups of identical nodes and how each of their GPUs is shared",
    "Policy.tenants": "Slurm accounts with their shares, users and quotas",
    "Policy.tiers": "partitions (and QOS of the same name) over node groups",
    "Policy.submission": "what job_submit.lua and `gpushare check` accept, change and route",
    "Policy.billing": "billing weights, from which every GRES's weight is derived",
    "Policy.live": "the live planner's limits (`gpushare live`)",
    "Cluster.name": "Slurm ClusterName (lower case)",
    "Cluster.slurm_version": 'the Slurm release, quoted: "24.11" or "24.11.5"; 23.11 and newer '
    "(tested: 24.11, 26.05). `render --slurm-version` overrides it",
    "Cluster.controller": "SlurmctldHost",
    "Cluster.hooks": "node hooks and the submission plugin",
    "Cluster.paths": "directories and files on the controller and nodes",
    "Cluster.accounting": "slurmdbd and what it enforces",
    "Cluster.priority": "the multifactor priority plugin's decay and weights",
    "Cluster.metrics": "node-side metrics written by the hooks",
    "Cluster.health": "the node health check (HealthCheckProgram)",
    "Cluster.scheduler": "SchedulerParameters",
    "Cluster.cgroups": "proctrack/cgroup + task/cgroup and ConstrainDevices=yes; false for hosts without "
    "cgroup delegation (linuxproc, task/none, global GPU indexes)",
    "Cluster.slurmd_config_overrides": "SlurmdParameters=config_overrides: nodes may have less hardware than "
    "declared (containers)",
    "Hooks.prolog": "absolute path of the prolog (`gpushare-prolog`); unset: not configured. With a prolog, "
    "PrologFlags=Alloc (plus Contain with cgroups)",
    "Hooks.epilog": "absolute path of the epilog (`gpushare-epilog`); unset: not configured",
    "Hooks.task_prolog": "absolute path of the task prolog (`gpushare-task-prolog`); unset: not configured",
    "Hooks.job_submit_lua": "JobSubmitPlugins=lua (job_submit.lua is rendered beside slurm.conf)",
    "Paths.slurm_conf_dir": "where slurm.conf and the rendered files live",
    "Paths.gres_include": "the per-node MIG include that gres.conf names (written on each node by "
    "`gpushare node gres-conf`)",
    "Paths.state_dir": "the node runtime's journals, MPS pipe directories and locks",
    "Paths.log_dir": "Slurm's log directory",
    "Paths.spool_dir": "Slurm's spool directory",
    "Metrics.textfile_dir": "node_exporter's textfile-collector directory; the hooks write gpushare.prom there. "
    "null: off",
    "Metrics.dcgm_job_mapping_dir": "dcgm-exporter's --hpc-job-mapping-dir; the hooks write job ids per GPU there. "
    "null: off",
    "Health.program": "HealthCheckProgram: the absolute path of `gpushare-node-health`; null: no health check",
    "Health.interval": "HealthCheckInterval in seconds",
    "Health.node_state": "HealthCheckNodeState: ANY alone, or states, with CYCLE to spread the runs",
    "Scheduler.slurm_defaults": "true: start from Slurm's own SchedulerParameters instead of the product's",
    "Scheduler.parameters": "SchedulerParameters on top of the defaults: `option: true` for one without a value, a "
    "whole number for the others, false to leave one out; an option Slurm 24.11 does not know is refused",
    "Accounting.host": "AccountingStorageHost (default: the controller)",
    "Accounting.port": "AccountingStoragePort",
    "Accounting.enforce": "AccountingStorageEnforce (quotas need limits)",
    "Priority.decay_half_life": "PriorityDecayHalfLife (Slurm time: days-hours:minutes:seconds)",
    "Priority.weight_fairshare": "PriorityWeightFairshare (Slurm's own default is 0)",
    "Priority.weight_age": "PriorityWeightAge",
    "Priority.weight_qos": "PriorityWeightQOS",
    "Priority.weight_partition": "PriorityWeightPartition",
    "Priority.max_age": "PriorityMaxAge",
    "Sharing.gpus": 'the GPUs this entry covers: 0, "0-3" or "4,5", within the group\'s count, each GPU at most once',
    "Sharing.mode": "exclusive, mig, shard or mps",
    "Sharing.layout": "mode mig: a list of profiles ([3g.40gb, 3g.40gb]) or a named layout (all-1g.10gb, ...) "
    "that fits the model",
    "Sharing.replicas": "mode shard: shards per GPU (2-1024)",
    "Sharing.units": "mode mps: MPS units per GPU, a divisor of 100 (2, 4, 5, 10, 20, 25, 50, 100)",
    "Sharing.type": "mode exclusive: a GRES type of their own for these GPUs (e.g. h100_reserved)",
    "Sharing.compute_mode": "mode mps: the compute mode the site sets on these GPUs; null means default. "
    "exclusive_process renders ExclusiveUser=YES on the tier's partition",
    "GpuHardware.model": "a catalogue model (`gpushare catalogue`) or one declared under gpu_models",
    "GpuHardware.count": "GPUs per node",
    "GpuModelDecl.name": "the model's name (not a catalogue name)",
    "GpuModelDecl.memory_mb": "the GPU's memory in MB",
    "GpuModelDecl.slurm_type": "its GRES type (default: the name in lower case, other characters as _)",
    "NodeGroup.name": "unique name, referenced by tiers",
    "NodeGroup.nodes": "a Slurm hostlist (gpu-[01-16]); groups must not overlap",
    "NodeGroup.gpu": "the nodes' GPU model and count",
    "NodeGroup.cpus": "CPUs",
    "NodeGroup.memory_mb": "RealMemory",
    "NodeGroup.sockets": "Sockets",
    "NodeGroup.cores_per_socket": "CoresPerSocket",
    "NodeGroup.threads_per_core": "ThreadsPerCore",
    "NodeGroup.features": "node Features besides the GPU model's own (its Slurm type, given to every node); "
    "names a --constraint can hold",
    "NodeGroup.sharing": "how each GPU or GPU range is shared; GPUs not listed are exclusive",
    "NodeGroup.weight": "slurm.conf Weight (unset: Slurm's 1); lower weights are used first",
    "Quota.gpu": "GrpTRES gres/gpu: whole GPUs and MIG slices at once",
    "Quota.shard": "GrpTRES gres/shard",
    "Quota.mps": "GrpTRES gres/mps (units)",
    "Tenant.name": "the Slurm account",
    "Tenant.shares": "FairShare: a positive integer, or parent",
    "Tenant.parent": "another tenant (default: root)",
    "Tenant.description": "the account's description",
    "Tenant.users": "the account's users",
    "Tenant.quota": "what the tenant may hold at once",
    "Tier.name": "the partition's (and QOS's) name",
    "Tier.node_groups": "the node groups in the partition",
    "Tier.default": "the default partition (at most one; otherwise the first tier)",
    "Tier.priority": "PriorityTier; a higher tier preempts lower ones on shared nodes",
    "Tier.preempt_mode": "off, requeue or cancel (suspend is refused: suspended jobs keep their GRES)",
    "Tier.grace_time": "seconds a job preempted from this tier gets to write a checkpoint (GraceTime)",
    "Tier.usage_factor": "the QOS's UsageFactor",
    "Tier.max_time": "MaxTime (UNLIMITED or Slurm time)",
    "Tier.gpu_types": "GPU types this tier serves, for routing; must exist on its nodes",
    "Tier.allow_accounts": "AllowAccounts (tenants)",
    "RouteMatch.gres": "the GRES the job asks for: none, gpu, mps or shard",
    "RouteMatch.qos": "the job's QOS names (case-insensitive)",
    "RouteMatch.min_gpus": "with gpu: at least this many GPUs per node",
    "RouteMatch.max_gpus": "with gpu: at most this many GPUs per node",
    "RouteMatch.min_cpus": "at least this many CPUs",
    "Route.match": "which jobs the route takes (only jobs that name no partition)",
    "Route.tiers": "the partitions to set, in the order Slurm tries them",
    "Route.round_to": "mig (with gres mps): mps:N becomes the smallest MIG slice of the route's tiers covering N %",
    "Submission.reject_multi_slice": "reject shard:N>1 and shared GRES asked per task or socket",
    "Submission.fail_open": "let a job through when job_submit.lua fails internally (default: reject it)",
    "Submission.route_by_gres": "a job without a partition goes to the first tier that serves all its GRES",
    "Submission.set_gpu_type": "an untyped GPU request on a tier with one GPU type gets that type",
    "Submission.aliases": 'name: "gpu:<type>" | "shard" | "mps:<1-100>", so --gres=gpu:<name>:1 works',
    "Submission.routes": "class routing, first match wins (what `gpushare plan` writes)",
    "Billing.gpu_weights": "per GPU model, the billing weight of one whole GPU",
    "Billing.default_gpu_weight": "the weight of a whole GPU of a model not in gpu_weights",
    "Billing.cpu": "per CPU",
    "Billing.mem_per_gb": "per GB of memory",
    "Live.enabled": "gpushare live apply refuses while false; the report works either way",
    "Live.min_pending": "seconds a pending job must have waited to count",
    "Live.min_dwell": "seconds between two changes of one node (a failed attempt counts)",
    "Live.min_benefit_jobs": "pending jobs a change must let start (net of what the present layout would start)",
    "Live.max_draining": "nodes under relayout at once, per tier",
    "Live.max_wait": "propose only if every GPU job on the node ends (time limit) within this many seconds",
    "Live.change_cost": "seconds of drain and re-registration counted in each change's cost",
    "Live.history_window": "seconds of finished jobs (sacct) read per run; 0: no history",
    "Live.modes": "also plan the sharing mode of GPUs not shared by MIG",
    "Live.weights": "also plan node weights that keep small jobs off the nodes large blocked jobs need",
    "Live.policy_file": "the live policy gpushare live apply writes (default: <slurm_conf_dir>/gpushare-live.yaml)",
}


def policy_schema() -> dict:
    """The policy's JSON Schema with a description on every key the table knows."""
    from ..policy.model import Policy

    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "slurm-gpushare policy"
    _describe("Policy", schema)
    for name, section in schema.get("$defs", {}).items():
        _describe(name, section)
    return schema


def _describe(model: str, section: dict) -> None:
    for key, prop in section.get("properties", {}).items():
        meaning = MEANINGS.get(f"{model}.{key}")
        if meaning and "description" not in prop:
            prop["description"] = meaning


def schema_json() -> str:
    return json.dumps(policy_schema(), indent=2, sort_keys=True) + "\n"


def _ref(prop: dict) -> str | None:
    for p in [prop, prop.get("items", {}), *prop.get("anyOf", [])]:
        if "$ref" in p:
            return p["$ref"].rsplit("/", 1)[1]
        if "$ref" in p.get("items", {}):
            return p["items"]["$ref"].rsplit("/", 1)[1]
    return None


def _type(prop: dict) -> str:
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return "section"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop:
        return f"map of {_type(prop['additionalProperties'])}"
    if "const" in prop:
        return f"{kind} {json.dumps(prop['const'])}"
    return kind


def _allowed(prop: dict) -> str:
    parts = []
    for p in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
        if "enum" in p:
            parts.append(", ".join(f"`{v}`" for v in p["enum"]))
        if "pattern" in p:
            parts.append(f"`{p['pattern']}`")
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("minItems", "items >=")):
            if key in p:
                parts.append(f"{sign} {p[key]}")
    return _escape_pipes("; ".join(parts))


def _escape_pipes(cell: str) -> str:
    """A table cell's '|' escaped outside code spans only: inside one the site would print the backslash."""
    spans = cell.split("`")
    return "`".join(s if i % 2 else s.replace("|", "\\|") for i, s in enumerate(spans))


def _default(name: str, prop: dict, required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, dict) and value:
        return "see below" if _ref(prop) else f"`{json.dumps(value)}`"
    return f"`{json.dumps(value)}`"


def _table(model: str, section: dict, path: str, defs: dict, out: list[str], seen: set[str]) -> None:
    out += [f"## `{path}`", ""]
    if section.get("description"):
        out += [" ".join(section["description"].split()), ""]
    out += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    required = set(section.get("required", []))
    nested = []
    for name, prop in section.get("properties", {}).items():
        meaning = _escape_pipes(prop.get("description", ""))
        out.append(f"| `{name}` | {_type(prop)} | {_default(name, prop, required)} | {_allowed(prop)} | {meaning} |")
        ref = _ref(prop)
        if ref and ref not in seen:
            seen.add(ref)
            suffix = "[]" if prop.get("type") == "array" or "items" in prop else ""
            nested.append((ref, f"{path}.{name}{suffix}" if path != "policy" else f"{name}{suffix}"))
    out.append("")
    for ref, sub in nested:
        _table(ref, defs[ref], sub, defs, out, seen)


def reference_markdown() -> str:
    """The policy reference page: one table per section, every key with its type, default and allowed values."""
    from ..examples import example

    schema = policy_schema()
    out = [
        "# Policy reference",
        "",
        "Generated by `gpushare schema --format markdown` from the policy model; do not edit. What the keys "
        "do, with examples: [the policy](../admins/policy.md). For editors: the JSON Schema "
        "[policy.schema.json](policy.schema.json) (`gpushare schema`), e.g. with the YAML language server's "
        "`# yaml-language-server: $schema=...` first line.",
        "",
        "The policy is strict: an unknown key is an error that lists the keys allowed there, and so is a key "
        "given twice. Rules that relate several keys (a layout against the GPU model, overlapping "
        "hostlists, tiers against node groups) are checked by `gpushare validate`, which reports every "
        "problem at once with its field path.",
        "",
    ]
    _table("Policy", schema, "policy", schema["$defs"], out, set())
    text = example().read_text()
    out += ["## Example", "", "The bundled small lab (`etc/small-lab.yaml`):", "", "```yaml", text.rstrip(), "```", ""]
    return "\n".join(out)


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "markdown"]),
    default="json",
    show_default=True,
    help="json: the policy's JSON Schema (for editors); markdown: the policy reference page.",
)
def schema(fmt: str) -> None:
    """Print the policy's JSON Schema, or its reference page, generated from the policy model."""
    click.echo(schema_json() if fmt == "json" else reference_markdown(), nl=False)


COMMANDS = (schema,)
