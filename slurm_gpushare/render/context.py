"""Template contexts: everything a template prints, computed here in tested Python."""

from __future__ import annotations

from collections import Counter

from ..policy import Group, Site, TierView
from ..policy.groups import format_indexes
from ..policy.perjob import NAMESPACE_TMPFS
from ..policy.share import PER_JOB_PROLOG_TIMEOUT_S, SHARED_GRES, Mode

NS_CAPS = "gpushare-ns-caps"  # the console script job_container.conf's CloneNSScript names (hooks/nscaps.py)
# CloneNSScript_Wait (s): the hook reads the job's journal and runs a few mount/mknod commands (well under a
# second); Slurm's default of 10 s leaves a loaded node little room, and a timeout fails the job.
NS_CAPS_WAIT_S = 30


def gres_types(site: Site) -> str:
    """Only the GRES the policy uses, mps before shard.

    Seen on 24.11.5 and 26.05.5: with both mps and shard in GresTypes one of
    the two loses its GPU variables (gpu,mps,shard: mps jobs get no
    CUDA_VISIBLE_DEVICES; gpu,shard,mps: shard jobs get none and mps jobs a
    0 % thread limit). Listing only what is used keeps single-kind clusters
    correct; with both, the node task prolog sets CUDA_VISIBLE_DEVICES for
    mps jobs. Changing GresTypes needs slurmctld and slurmd restarts.
    """
    return ",".join(["gpu"] + [n for n in SHARED_GRES if n in site.uses])


def gres_string(group: Group) -> str:
    """slurm.conf ``Gres=`` for one node group: gpu:<type>:N,...,shard:N,mps:N."""
    parts = [f"{name}:{gtype}:{n}" if gtype else f"{name}:{n}" for (name, gtype), n in group.gres.items()]
    return ",".join(parts)


def accounting_tres(site: Site) -> list[str]:
    """Every GPU TRES worth tracking, typed ones included, and every TRES a billing weight names."""
    tres = {"gres/gpu"} | {f"gres/gpu:{t}" for t in site.gpu_types}
    tres |= {f"gres/{n}" for n in site.uses if n != "gpu"}
    for tier in site.tiers:
        tres |= {k.lower() for k, _ in tier.billing if k.startswith("GRES/")}
    return sorted(tres)


def preemption(site: Site) -> dict[str, str] | None:
    modes = {t.spec.preempt_mode.lower() for t in site.tiers} - {"off"}
    if not modes:
        return None
    return {"type": "preempt/partition_prio", "mode": "REQUEUE" if "requeue" in modes else "CANCEL"}


def node_lines(site: Site) -> list[dict]:
    out = []
    for g in site.groups:
        spec = g.spec
        hw = {
            "CPUs": spec.cpus,
            "Sockets": spec.sockets,
            "CoresPerSocket": spec.cores_per_socket,
            "ThreadsPerCore": spec.threads_per_core,
            "RealMemory": spec.memory_mb,
        }
        attrs: list[tuple[str, object]] = [(k, v) for k, v in hw.items() if v is not None]
        attrs.append(("Gres", gres_string(g)))
        # the GPU model's feature (its Slurm type) and the policy's own: --constraint=a30|l40s picks GPU models
        attrs.append(("Features", ",".join(g.features)))
        if spec.weight is not None:
            attrs.append(("Weight", spec.weight))  # cons_tres fills lower weights first (planned by `gpushare plan`)
        attrs.append(("State", "UNKNOWN"))
        out.append({"group": g, "nodes": g.hostlist, "attrs": attrs})
    return out


def partition_lines(site: Site) -> list[dict]:
    preempting = preemption(site) is not None
    out = []
    for tier in site.tiers:
        spec = tier.spec
        attrs = [
            ("Nodes", tier.hostlist),
            ("Default", "YES" if tier.is_default else "NO"),
            ("MaxTime", spec.max_time),
            ("PriorityTier", spec.priority),
            ("DefMemPerCPU", def_mem_per_cpu(tier)),
        ]
        if preempting:
            attrs.append(("PreemptMode", spec.preempt_mode.upper()))
            if spec.grace_time:
                # partition_prio reads the preempted job's partition GraceTime: SIGCONT+SIGTERM to its steps
                # now, requeue (or cancel) when it runs out (Slurm 24.11 interfaces/preempt.c)
                attrs.append(("GraceTime", spec.grace_time))
        if tier.exclusive_user:
            # MPS GPUs in EXCLUSIVE_PROCESS hold one MPS server, so one user's jobs, at a time (slurm.conf(5)
            # ExclusiveUser)
            attrs.append(("ExclusiveUser", "YES"))
        if spec.allow_accounts:
            attrs.append(("AllowAccounts", ",".join(spec.allow_accounts)))
        if tier.billing:
            from .env import kv

            attrs.append(("TRESBillingWeights", f'"{kv(tier.billing)}"'))
        attrs.append(("State", "UP"))
        out.append({"tier": tier, "attrs": attrs})
    return out


def def_mem_per_cpu(tier: TierView) -> int:
    """Without a default, a job without --mem gets the whole node's memory and nothing can share it."""
    return min(g.spec.memory_mb // g.spec.cpus for g in tier.groups)


def hooks(site: Site) -> list[tuple[str, str]]:
    h = site.cluster.hooks
    pairs = [("Prolog", h.prolog), ("Epilog", h.epilog), ("TaskProlog", h.task_prolog)]
    out = [(k, v) for k, v in pairs if v]
    if h.prolog:
        # Alloc: set MIG / MPS up when the job is allocated, before its batch script starts.
        out.insert(0, ("PrologFlags", "Alloc,Contain" if site.cluster.cgroups else "Alloc"))
        if per_job_mig(site):
            # a per-job prolog makes MIG instances (tens of seconds at NVIDIA's latencies): bounded, and a batch
            # job is not counted missing while it runs (policy.share.PER_JOB_PROLOG_TIMEOUT_S says why this much)
            out.insert(1, ("PrologEpilogTimeout", str(PER_JOB_PROLOG_TIMEOUT_S)))
            out.insert(2, ("BatchStartTimeout", str(PER_JOB_PROLOG_TIMEOUT_S)))
        container = job_container(site)
        if container is not None:
            # isolation: namespace: each job's own mount namespace, where gpushare-ns-caps gives it a private
            # /dev/nvidia-caps (job_container.conf)
            out.append((container["key"], container["plugin"]))
    if h.job_submit_lua:
        out.append(("JobSubmitPlugins", "lua"))
    health = site.cluster.health
    if health.program:
        # `gpushare node health` (gpushare-node-health): repairs, or drains with a "gpushare-health:" reason
        out += [
            ("HealthCheckProgram", health.program),
            ("HealthCheckInterval", str(health.interval)),
            ("HealthCheckNodeState", ",".join(health.node_state)),
        ]
    return out


def isolated(site: Site) -> bool:
    """Whether any per-job MIG GPU isolates its jobs in their mount namespaces (sharing ``isolation: namespace``)."""
    return any(s.share.isolated for g in site.groups for s in g.gpus)


def ns_caps_path(site: Site) -> str:
    """Where gpushare-ns-caps is: cluster.hooks.ns_caps, else beside the prolog."""
    hooks = site.cluster.hooks
    if hooks.ns_caps:
        return hooks.ns_caps
    return (hooks.prolog or "/usr/local/bin/x").rsplit("/", 1)[0] + "/" + NS_CAPS


def job_container(site: Site) -> dict | None:
    """The job container plugin per-job MIG isolation needs (its slurm.conf key, plugin, and job_container.conf's
    values), or None where no GPU isolates or no prolog makes instances: job_container/tmpfs on 24.11 and 25.05,
    the same plugin renamed namespace/tmpfs from 25.11 (still reading job_container.conf)."""
    if not (isolated(site) and site.cluster.hooks.prolog and site.cluster.cgroups):
        return None
    renamed = site.version >= NAMESPACE_TMPFS
    return {
        "key": "NamespaceType" if renamed else "JobContainerType",
        "plugin": "namespace/tmpfs" if renamed else "job_container/tmpfs",
        "base_path": site.cluster.paths.spool_dir.rstrip("/") + "/gpushare-ns",
        "script": ns_caps_path(site),
        "wait": NS_CAPS_WAIT_S,
    }


def mig_nodes(site: Site) -> list[dict]:
    """Groups with fixed MIG layouts (their instances go in the per-node include); per-job GPUs are not among them."""
    fixed = [(g, [s for s in g.gpus if s.share.is_mig]) for g in site.groups]
    return [{"nodes": g.hostlist, "gpus": [(s.index, list(s.layout)) for s in slots]} for g, slots in fixed if slots]


def per_job_mig(site: Site) -> bool:
    """Whether any GPU makes a MIG instance per job (carried by shards)."""
    return any(s.share.is_per_job_mig for g in site.groups for s in g.gpus)


def select_type_parameters(site: Site) -> str:
    """SelectTypeParameters: with per-job MIG, LL_SHARED_GRES, so Slurm gives a slice's shards to the least loaded
    GPU, where it is most likely to have a legal placement (bench/RESULTS.md, per-job MIG churn: 0.68-0.92 x the
    requeues of first fit). Never MULTIPLE_SHARING_GRES_PJ: one slice's shards must come from one GPU."""
    return "CR_Core_Memory,LL_SHARED_GRES" if per_job_mig(site) else "CR_Core_Memory"


def gres_conf_lines(site: Site) -> list[dict]:
    """Non-MIG gres.conf lines per group, contiguous GPUs of one type merged into one File= range.

    A node with more than one MPS GPU gets ``Flags=all_sharing`` on its mps lines: Slurm's default for mps is
    one_sharing (src/interfaces/gres.c: "The default for MPS is to have only one gpu sharing"; gres_use_busy_dev),
    under which, once any mps is allocated on a node, every further mps job must use that same GPU, so the node's
    other MPS GPUs take no mps job until it empties (seen on 24.11.5: an mps:23 job pended for a GPU on a node whose
    second MPS GPU was idle). Shards are all_sharing by default."""
    out = []
    for g in site.groups:
        lines = []
        for gtype, indexes in _runs(g):
            lines.append(f"NodeName={g.hostlist} Name=gpu Type={gtype} File={_devices(indexes)}")
        several_mps = sum(s.share.shared_gres == "mps" for s in g.gpus) > 1
        for slot in g.gpus:
            if slot.share.shared_gres:
                flags = " Flags=all_sharing" if several_mps and slot.share.shared_gres == "mps" else ""
                lines.append(
                    f"NodeName={g.hostlist} Name={slot.share.shared_gres} Count={slot.share.shared_count} "
                    f"File={slot.device}{flags}"
                )
        out.append({"group": g, "lines": lines})
    return out


def _runs(group: Group) -> list[tuple[str, list[int]]]:
    runs: list[tuple[str, list[int]]] = []
    for slot in group.gpus:
        if slot.share.is_mig:
            continue
        if runs and runs[-1][0] == slot.slurm_type and runs[-1][1][-1] == slot.index - 1:
            runs[-1][1].append(slot.index)
        else:
            runs.append((slot.slurm_type, [slot.index]))
    return runs


def _devices(indexes: list[int]) -> str:
    if len(indexes) == 1:
        return f"/dev/nvidia{indexes[0]}"
    return f"/dev/nvidia[{indexes[0]}-{indexes[-1]}]"


def describe(group: Group) -> str:
    """'8 x H100-SXM5-80GB (0-3 exclusive; 4-5 mig 2x3g.40gb; 6 shard x4)' for comments."""
    runs: list[tuple[str, list[int]]] = []
    for slot in group.gpus:
        what = _slot_text(slot)
        if runs and runs[-1][0] == what and runs[-1][1][-1] == slot.index - 1:
            runs[-1][1].append(slot.index)
        else:
            runs.append((what, [slot.index]))
    parts = [f"{format_indexes(ix)} {what}" for what, ix in runs]
    return f"{len(group.gpus)} x {group.model.name} ({'; '.join(parts)})"


def _slot_text(slot) -> str:
    if slot.share.is_per_job_mig:
        return f"mig per job ({'/'.join(slot.share.profiles)}: gpu + shard x{slot.share.capacity})"
    if slot.share.is_mig:
        counts = Counter(slot.layout)
        return "mig " + "+".join(f"{n}x{p}" if n > 1 else p for p, n in counts.items())
    extra = {Mode.EXCLUSIVE: "", Mode.SHARD: f" x{slot.replicas}", Mode.MPS: f" {slot.units} units"}[slot.mode]
    typed = "" if slot.slurm_type == slot.model.slurm_type else f" (type {slot.slurm_type})"
    return f"{slot.mode}{extra}{typed}"
