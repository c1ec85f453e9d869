"""Where Slurm 24.11 (select/cons_tres) puts a single-node job on a SimCluster. Pure, numpy-vectorised.

Read from SchedMD/slurm at tag slurm-24-11-7-1 (the rules below are what the
model implements; file and function named for each):

Node choice (src/plugins/topology/common/eval_nodes.c ``_eval_nodes_consec``,
the default when no topology plugin, LLN, pack_serial_at_end or SPREAD_JOB
applies): the nodes that can run the job are grouped into sets of
*consecutive* nodes (in slurmctld's node table order: by name, naturally sorted, not slurm.conf's order) of equal
Weight; the set with the
lowest Weight wins; among equal Weights the first set with enough CPUs, then
any set with fewer CPUs in total (tightest fit); inside the chosen set a
one-node job takes the node with the fewest available CPUs, the first among
equals ("try best fit single node"). Available CPUs are modelled as the
node's idle CPUs.

GRES inside the node:
- gpu (whole GPUs, typed GPU and typed MIG records alike): the lowest-indexed
  free records of the requested type (any type when untyped), in gres.conf
  order (src/plugins/select/cons_tres/gres_select_filter.c ``_pick_gres_topo``
  without NVLink counts);
- mps and shard: one device per job unless SelectTypeParameters has
  MULTIPLE_SHARING_GRES_PJ (``_set_shared_node_bits``, ``use_single_dev``):
  the first device in index order with enough count left
  (``_pick_shared_gres_topo``); with LL_SHARED_GRES the devices are tried
  least-loaded first, by ``(avail - alloc) x node_total / avail`` in integer
  arithmetic (``_get_sorted_topo_by_least_loaded``; ties keep index order
  here, qsort's order in Slurm); with MULTIPLE_SHARING_GRES_PJ a request no
  single device holds is split over several, in the same order;
- a GPU allocated as gpu takes no mps/shard job and a GPU with mps/shard
  jobs takes no gpu job (gres_sock_list.c ``_build_sock_gres_by_topo``,
  "Filter out resources already allocated to the other GRES type").
- a per-job MIG GPU is one gpu record and its carrier shards; a slice job
  (``SlurmRequest.mig_profile``) takes its shards as above, then the prolog
  places the slice on that GPU (``sim.perjob``); a slice with no legal
  placement there is refused: its CPUs, memory and shards are released and
  the job counts as not placed (``slices_refused``; Slurm would requeue it).
  GRES_CONF_ONE_SHARING (``gres_use_busy_dev`` in src/interfaces/gres.c:
  once a node has any mps allocated, mps jobs must use that same GPU) is
  Slurm's default for mps and is not modelled: the product's gres.conf sets
  Flags=all_sharing on the mps lines of a node with several MPS GPUs
  (render.context.gres_conf_lines), and a node with one has no choice.

Node features (--constraint): a node is a candidate only when its features
satisfy the job's constraint (src/slurmctld/node_scheduler.c filters the
nodes by the job's feature list before node choice); the constraint is read
as Slurm and job_submit read it (slurm/constraint.py: '|' any of the names, '&'
all of them; an expression mixing both is not modelled and refused here).

Several partitions: tried by PriorityTier, highest first (equal tiers in the order the request lists them), the first
that can start the job wins. What the model leaves out is listed in the
README (sockets and core binding, topology, backfill, priorities and
preemption, reservations, the job's memory and CPU binding granularity).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..hardware import get_model
from ..policy.share import Mode
from ..slurm.constraint import parse as parse_constraint
from .cluster import GPU_MILLI, Pod, Router, SimCluster, SimGpu, SimNode, SlurmRequest
from .perjob import Carrier, Slices

LL_SHARED_GRES = "LL_SHARED_GRES"
MULTIPLE_SHARING_GRES_PJ = "MULTIPLE_SHARING_GRES_PJ"
SHARED_KINDS: dict[str, int] = {Mode.MPS: 1, Mode.SHARD: 2}  # looked up by a GPU's mode and a request's GRES


def uniform_router(pod: Pod) -> SlurmRequest:
    """Stand-in submission for S1: whole GPUs as ``gpu:N``, a share as ``mps:ceil(milli/10)`` of 100.

    The planner's router (the product's submission decision) replaces this;
    a router may also return None for a job the submission filter rejects.
    """
    cpus = -(-pod.cpu_milli // 1000)
    if pod.num_gpu == 0:
        return SlurmRequest(partitions=(), cpus=cpus, memory_mib=pod.memory_mib)
    if pod.gpu_milli >= GPU_MILLI:
        return SlurmRequest((), cpus, pod.memory_mib, gres="gpu", count=pod.num_gpu)
    return SlurmRequest((), cpus, pod.memory_mib, gres="mps", count=-(-pod.gpu_milli // 10))


def with_uniform_mps(cluster: SimCluster, units: int = 100) -> SimCluster:
    """Every GPU in mps mode with ``units`` mps Count (S1's uniform policy): gpu and mps GRES on each."""
    nodes = tuple(
        replace(n, gpus=tuple(SimGpu(mode=Mode.MPS, model=g.model, gres_type=g.gres_type, units=units) for g in n.gpus))
        for n in cluster.nodes
    )
    return replace(cluster, nodes=nodes)


class SlurmState:
    """Idle CPUs and memory per node, gpu GRES records, mps/shard counts per GPU. Jobs arrive and never leave
    (the paper's experiment): every free count only falls."""

    def __init__(self, cluster: SimCluster):
        nodes = tuple(sorted(cluster.nodes, key=lambda x: natural_key(x.name)))  # slurmctld's node table order
        self.names = tuple(x.name for x in nodes)  # node index -> name: choose_node answers in this order
        self.tiers = dict(cluster.partition_tiers)
        n = len(nodes)
        self.flags = cluster.select_flags
        self.weight = np.array([x.weight for x in nodes], dtype=np.int64)
        self.cpu = np.array([x.cpus for x in nodes], dtype=np.int64)
        self.mem = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        parts = sorted({p for x in nodes for p in x.partitions})
        self.partition = {p: np.array([p in x.partitions for x in nodes]) for p in parts}
        width = max((len(x.gpus) for x in nodes), default=0) or 1
        rwidth = self._gpu_records(nodes)
        self._shared_counts(nodes, width)
        self._kept_counts(n, width, rwidth)
        self._part_masks: dict[tuple[str, ...], list[np.ndarray]] = {}  # a job's partitions, in the order tried
        self.features = tuple(frozenset(x.features) for x in nodes)
        self._feature_masks: dict[str, np.ndarray] = {}  # a constraint -> the nodes whose features satisfy it
        self.room = {k: np.where(self.sh_kind == k, self.sh_cap, 0) for k in SHARED_KINDS.values()}
        self.room_max = {k: r.max(axis=1) for k, r in self.room.items()}
        self.room_sum = {k: r.sum(axis=1) for k, r in self.room.items()}
        self._pristine = copy.copy(self)  # the counts as built, for ``fresh``
        _copy_counts(self._pristine, self)
        self._nowhere: set[SlurmRequest] = set()

    def _gpu_records(self, nodes: tuple[SimNode, ...]) -> int:
        """The gpu GRES records per node (a whole non-MIG GPU, or a MIG instance), their types (codes in
        ``types``), GPUs and free flags; the records' width (the most records of a node, at least 1)."""
        n = len(nodes)
        recs = [
            [
                (g.mig[k] if g.mig else g.gres_type, i)
                for i, g in enumerate(x.gpus)
                for k in range(max(len(g.mig), 1))
                if g.mig or g.mode != Mode.MIG or g.per_job
            ]
            for x in nodes
        ]
        rwidth = max((len(r) for r in recs), default=0) or 1
        self.types = {"": 0}
        self.rec_type = np.full((n, rwidth), -1, dtype=np.int64)
        self.rec_gpu = np.zeros((n, rwidth), dtype=np.int64)
        self.rec_free = np.zeros((n, rwidth), dtype=bool)
        for i, rows in enumerate(recs):
            for r, (t, g) in enumerate(rows):
                self.rec_type[i, r] = self.types.setdefault(t, len(self.types))
                self.rec_gpu[i, r] = g
                self.rec_free[i, r] = True
        self.rec_mig = np.zeros((n, rwidth), dtype=bool)
        for i, x in enumerate(nodes):
            self.rec_mig[i, : len(recs[i])] = [bool(x.gpus[g].mig) for _, g in recs[i]]
        return rwidth

    def _shared_counts(self, nodes: tuple[SimNode, ...], width: int) -> None:
        """Per GPU, its mps/shard kind, count and the count used."""
        n = len(nodes)
        self.sh_kind = np.zeros((n, width), dtype=np.int64)
        self.sh_cap = np.zeros((n, width), dtype=np.int64)
        self.per_job = np.zeros((n, width), dtype=bool)  # a per-job MIG GPU (its carrier is shard)
        for i, x in enumerate(nodes):
            for g, gpu in enumerate(x.gpus):
                kind = SHARED_KINDS[Mode.SHARD] if gpu.per_job else SHARED_KINDS.get(gpu.mode, 0)
                if kind and gpu.units > 0:
                    self.sh_kind[i, g] = kind
                    self.sh_cap[i, g] = gpu.units
                    self.per_job[i, g] = gpu.per_job
        self.sh_used = np.zeros((n, width), dtype=np.int64)

    def _kept_counts(self, n: int, width: int, rwidth: int) -> None:
        """What is kept up to date as jobs arrive (nothing departs), so that a job's feasibility is a few comparisons
        over the nodes."""
        # gpu records of a non-MIG GPU that has mps/shard jobs, and one mask per GRES type: the per-job record
        # filter without re-deriving them from every GPU's count
        self.rec_shared_busy = np.zeros((n, rwidth), dtype=bool)
        self.gpu_taken = np.zeros((n, width), dtype=bool)  # a whole-GPU gpu record of it is allocated
        # usable gpu records per node, of any type and per GRES type code (rows); mps/shard room per GPU and its
        # largest and total value per node, per sharing kind (``room``, set up by __init__)
        usable = self.rec_free & ~self.rec_shared_busy
        self.usable_any = usable.sum(axis=1)
        self.usable_by_type = np.zeros((len(self.types), n), dtype=np.int64)
        for code in range(len(self.types)):
            self.usable_by_type[code] = (usable & (self.rec_type == code)).sum(axis=1)
        self.rec_whole = ~self.rec_mig & (self.rec_type >= 0)  # a real gpu record of a whole (non-MIG) GPU
        self.shared_gpu = self.sh_cap > 0  # a GPU with mps/shard count
        self.any_mig = bool(self.rec_mig.any())  # without MIG records a gpu job's records are all whole GPUs

    # requests that found no node (``_nowhere``): nothing departs here (the paper's rule) and every count above only
    # falls as jobs arrive, so such a request fits nowhere for the rest of the replay (late arrivals on a full
    # cluster are mostly these)

    def fresh(self) -> SlurmState:
        """A copy of this state as it was built, before any job: for replaying another arrival order on the same
        cluster without building it again. The counts jobs change are copied; what only describes the cluster
        (weights, partitions, records' types, the masks derived from them) is shared."""
        out = copy.copy(self)
        _copy_counts(out, self._pristine)
        out._nowhere = set()
        return out

    # -- feasibility -------------------------------------------------------------------------------
    def _usable_records(self, req: SlurmRequest) -> np.ndarray:
        """Free gpu records of the requested type (any type when untyped) that no mps/shard job made unusable."""
        match = self.rec_free & ~self.rec_shared_busy
        if req.gres_type:
            return match & (self.rec_type == self.types.get(req.gres_type, -2))
        return match

    def _usable_count(self, req: SlurmRequest) -> np.ndarray:
        """Per node, how many gpu records ``_usable_records`` would give (kept up to date as jobs arrive)."""
        if not req.gres_type:
            return self.usable_any
        code = self.types.get(req.gres_type)
        return self.usable_by_type[code] if code is not None else np.zeros(len(self.names), dtype=np.int64)

    def _shared_room(self, req: SlurmRequest) -> np.ndarray:
        """mps/shard count left per GPU for this kind (0 on a GPU allocated whole or of another kind)."""
        return self.room[SHARED_KINDS[req.gres]]

    def _feature_mask(self, text: str) -> np.ndarray:
        mask = self._feature_masks.get(text)
        if mask is None:
            con = parse_constraint(text)
            if not con.op:
                raise ValueError(f"constraint {text!r} is not modelled: names joined by '|' or by '&' only")
            mask = self._feature_masks[text] = np.array([con.allows(f) for f in self.features], dtype=bool)
        return mask

    def fits(self, req: SlurmRequest) -> np.ndarray:
        ok = (self.cpu >= req.cpus) & (self.mem >= req.memory_mib)
        if req.constraint:
            ok &= self._feature_mask(req.constraint)
        if req.gres == "gpu":
            ok &= self._usable_count(req) >= req.count
        elif req.gres in SHARED_KINDS:
            kind = SHARED_KINDS[req.gres]
            if MULTIPLE_SHARING_GRES_PJ in self.flags:
                ok &= self.room_sum[kind] >= req.count
            else:
                ok &= self.room_max[kind] >= req.count
        elif req.gres:
            raise ValueError(f"unknown GRES {req.gres!r} in a SlurmRequest; accepted: gpu, mps, shard or ''")
        return ok

    # -- node choice -------------------------------------------------------------------------------
    def choose_node(self, req: SlurmRequest) -> int:
        if req in self._nowhere:
            return -1
        node = self._choose(req)
        if node < 0:
            self._nowhere.add(req)
        return node

    def _choose(self, req: SlurmRequest) -> int:
        ok = self.fits(req)
        if not req.partitions:
            return consec_pick(ok, self.weight, self.cpu)
        masks = self._part_masks.get(req.partitions)
        if masks is None:
            # by PriorityTier (stable: equal tiers keep request order); a partition this cluster lacks is skipped
            order = sorted(req.partitions, key=lambda p: -self.tiers.get(p, 1))
            masks = self._part_masks[req.partitions] = [self.partition[p] for p in order if p in self.partition]
        for inside in masks:
            node = consec_pick(ok & inside, self.weight, self.cpu)
            if node >= 0:
                return node
        return -1

    # -- allocation --------------------------------------------------------------------------------
    def allocate(self, req: SlurmRequest, node: int) -> tuple[int, ...]:
        """Take the job's CPUs, memory and GRES on ``node``; returns the gpu record or GPU indexes used."""
        self.cpu[node] -= req.cpus
        self.mem[node] -= req.memory_mib
        if req.gres == "gpu":
            match = self.rec_free[node] & ~self.rec_shared_busy[node]
            if req.gres_type:
                match &= self.rec_type[node] == self.types.get(req.gres_type, -2)
            recs = match.nonzero()[0][: req.count]
            self.rec_free[node, recs] = False
            self._unusable(node, recs)
            whole = recs[~self.rec_mig[node, recs]] if self.any_mig else recs
            if len(whole):
                gpus = self.rec_gpu[node, whole]
                self.gpu_taken[node, gpus] = True
                if _ANY(self.shared_gpu[node, gpus]):  # a whole job on a GPU that had mps/shard count
                    for kind, room in self.room.items():
                        if room[node, gpus].any():
                            room[node, gpus] = 0
                            self._room_changed(node, kind)
            return tuple(recs.tolist())
        if req.gres in SHARED_KINDS:
            return self._allocate_shared(req, node)
        return ()

    def _allocate_shared(self, req: SlurmRequest, node: int) -> tuple[int, ...]:
        kind = SHARED_KINDS[req.gres]
        room = self.room[kind][node]
        if LL_SHARED_GRES in self.flags:
            cap = np.where(self.sh_kind[node] == kind, self.sh_cap[node], 0)
            total = int(cap.sum())
            with np.errstate(divide="ignore", invalid="ignore"):
                free = np.where(cap > 0, (cap - self.sh_used[node]) * total // np.maximum(cap, 1), 0)
            order = np.argsort(-free, kind="stable")
        else:
            order = np.arange(len(room))
        need, used = req.count, []
        single = order[room[order] >= need]
        if len(single):
            g = int(single[0])
            self.sh_used[node, g] += need
            room[g] -= need
            used = [g]
        else:
            for g in order.tolist():  # MULTIPLE_SHARING_GRES_PJ only (fits() refused the job otherwise)
                take = min(int(room[g]), need)
                if take > 0:
                    self.sh_used[node, g] += take
                    room[g] -= take
                    need -= take
                    used.append(g)
                if not need:
                    break
        self._room_changed(node, kind)
        self._shared_busy(node, used)
        return tuple(used)

    def release_shared(self, req: SlurmRequest, node: int, gpus: tuple[int, ...]) -> None:
        """Undo ``allocate`` of a one-GPU mps/shard job (a per-job slice the prolog could not place): its CPUs,
        memory and count come back, and the GPU's gpu records are usable again once it has no mps/shard job."""
        (g,) = gpus
        kind = SHARED_KINDS[req.gres]
        self.cpu[node] += req.cpus
        self.mem[node] += req.memory_mib
        self.sh_used[node, g] -= req.count
        self.room[kind][node, g] += req.count
        self._room_changed(node, kind)
        if not self.sh_used[node, g]:
            back = ((self.rec_gpu[node] == g) & self.rec_whole[node] & self.rec_shared_busy[node]).nonzero()[0]
            self.rec_shared_busy[node, back] = False
            free = back[self.rec_free[node, back]]
            self.usable_any[node] += len(free)
            np.add.at(self.usable_by_type[:, node], self.rec_type[node, free], 1)
        self._nowhere.clear()  # counts rose: a request that fitted nowhere may fit now

    def _shared_busy(self, node: int, gpus) -> None:
        """The gpu records of these GPUs (not MIG instances) take no gpu job now that they have mps/shard jobs."""
        on = self.rec_gpu[node] == gpus[0] if len(gpus) == 1 else np.isin(self.rec_gpu[node], gpus)
        busy = on & self.rec_whole[node]
        newly = (busy & ~self.rec_shared_busy[node] & self.rec_free[node]).nonzero()[0]
        self.rec_shared_busy[node] |= busy
        self._unusable(node, newly)

    def _unusable(self, node: int, recs: np.ndarray) -> None:
        """These gpu records of ``node`` were usable and are not now: the per-node counts follow."""
        if len(recs) == 1:
            self.usable_any[node] -= 1
            self.usable_by_type[self.rec_type[node, recs[0]], node] -= 1
        elif len(recs):
            self.usable_any[node] -= len(recs)
            np.subtract.at(self.usable_by_type[:, node], self.rec_type[node, recs], 1)

    def _room_changed(self, node: int, kind: int) -> None:
        row = self.room[kind][node]
        self.room_max[kind][node] = _MAX(row)
        self.room_sum[kind][node] = _SUM(row)


# what jobs change in a SlurmState (every other attribute describes the cluster, or caches what does)
_COUNTS = ("cpu", "mem", "rec_free", "rec_shared_busy", "gpu_taken", "usable_any", "usable_by_type", "sh_used")
_ROOMS = ("room", "room_max", "room_sum")  # {sharing kind: array}


def _copy_counts(dst: SlurmState, src: SlurmState) -> None:
    for name in _COUNTS:
        setattr(dst, name, getattr(src, name).copy())
    for name in _ROOMS:
        setattr(dst, name, {k: v.copy() for k, v in getattr(src, name).items()})


def natural_key(name: str) -> tuple:
    """Sort key of Slurm's ``strnatcmp`` for node names: digit runs compare as numbers ('n2' < 'n10')."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


# the ufuncs' reductions called directly (ndarray.max and friends go through a Python wrapper each call)
_MIN, _MAX, _SUM, _ANY = np.minimum.reduce, np.maximum.reduce, np.add.reduce, np.logical_or.reduce


def consec_pick(ok: np.ndarray, weight: np.ndarray, cpus: np.ndarray) -> int:
    """eval_nodes.c ``_eval_nodes_consec`` for a one-node job: lowest weight, tightest set, best-fit node.

    Only the lowest-weight sets can win, so the sets are the runs of consecutive usable nodes of that weight (a
    node of another weight, or an unusable one, ends a run); the first run with the fewest idle CPUs in total,
    and in it the first node with the fewest.
    """
    # ndarray methods, not the np.* wrappers: this runs for every job placed (about a third of a candidate's score)
    idx = ok.nonzero()[0]
    if not len(idx):
        return -1
    w = weight[idx]
    low = _MIN(w)
    if _MAX(w) != low:
        idx = idx[w == low]
    starts = ((idx[1:] - idx[:-1]) != 1).nonzero()[0] + 1
    c = cpus[idx]
    if not len(starts):
        return int(idx[c.argmin()])
    set_cpus = np.add.reduceat(c, np.concatenate(([0], starts)))
    best = int(set_cpus.argmin())  # first of the tightest
    lo = int(starts[best - 1]) if best else 0
    hi = int(starts[best]) if best < len(starts) else len(idx)
    return int(idx[lo + int(c[lo:hi].argmin())])


def route_all(router: Router, pods: tuple[Pod, ...]) -> tuple[list, list]:
    """Each pod's SlurmRequest (None: refused at submission) and why each refused pod is refused (the router's
    violation codes; 'refused' when it gives none)."""
    requests = [router(p) for p in pods]
    why = getattr(router, "refusal", None)
    refusals: dict[Pod, tuple[str, ...]] = {}  # equal pods are refused for the same reasons: asked once each
    out = []
    for p, r in zip(pods, requests, strict=False):
        if r is None:
            if p not in refusals:
                refusals[p] = (why(p) if why else ()) or ("refused",)
            out.append(refusals[p])
        else:
            out.append(())
    return requests, out


class SlurmPolicy:
    """Slurm's placement for a rendered configuration, behind a submission router (Pod -> SlurmRequest | None)."""

    def __init__(
        self,
        name: str,
        router: Router,
        cluster_fn: Callable[[SimCluster], SimCluster] | None = None,
        mig_slices: dict[str, int] | None = None,
        slices_per_gpu: int = 7,
        mig_shares: dict[str, int] | None = None,
    ):
        """``cluster_fn`` renders the configuration from the trace cluster; ``mig_slices`` (MIG GRES type ->
        compute slices) turns on the slice occupancy figure; ``mig_shares`` (MIG GRES type -> milli-GPU
        it stands for) counts jobs Slurm gave a MIG instance smaller than their share ("undersized":
        an untyped ``gpu:1`` may be given any gpu record, a 1g.5gb slice included)."""
        self.name = name
        self.router = router
        self.cluster_fn = cluster_fn
        self.mig_slices = mig_slices or {}
        self.slices_per_gpu = slices_per_gpu
        self.mig_shares = mig_shares or {}

    def start(
        self,
        cluster: SimCluster,
        pods: tuple[Pod, ...],
        rng: np.random.Generator,
        routed: tuple[list, list] | None = None,
        state: SlurmState | None = None,
    ) -> None:
        """``routed``: ``route_all(router, pods)`` of an earlier start with the same router and pods, and
        ``state``: a ``SlurmState(cluster).fresh()`` of the same cluster (a candidate scored on several arrival
        orders routes its pods and builds its state once)."""
        if self.cluster_fn is not None:
            cluster = self.cluster_fn(cluster)
        self.cluster = cluster
        self.state = state if state is not None else SlurmState(cluster)
        self.requests, self.why = routed if routed is not None else route_all(self.router, pods)
        self.rejected = 0
        self.refused_codes: dict[str, int] = {}
        codes = {code: self.mig_slices.get(t, 0) for t, code in self.state.types.items()}
        self.rec_slices = np.vectorize(lambda c: codes.get(c, 0), otypes=[np.int64])(self.state.rec_type)
        self.mig_gpus = sum(1 for n in cluster.nodes for g in n.gpus if g.mode == Mode.MIG and not g.per_job)
        self.gpus = cluster.gpu_count
        shares = {code: self.mig_shares.get(t, GPU_MILLI) for t, code in self.state.types.items()}
        self.rec_share = np.vectorize(lambda c: shares.get(c, GPU_MILLI), otypes=[np.int64])(self.state.rec_type)
        self.pod_milli = [p.gpu_milli for p in pods]
        self.may_undersize = bool((self.rec_share < GPU_MILLI).any())  # only MIG slices stand for less than a GPU
        self.pod_ls_share = [p.qos == "LS" and p.num_gpu == 1 and p.gpu_milli < GPU_MILLI for p in pods]
        self.undersized = 0
        self.ls_not_mig = 0
        self.carriers = carriers(self.state, cluster)
        self.slices = Slices()

    def place(self, pod: int) -> bool:
        req = self.requests[pod]
        if req is None:
            self.rejected += 1
            for code in self.why[pod]:
                self.refused_codes[code] = self.refused_codes.get(code, 0) + 1
            return False
        node = self.state.choose_node(req)
        if node < 0:
            return False
        got = self.state.allocate(req, node)
        if req.mig_profile and not self._slice(req, node, got):
            return False
        if (
            self.may_undersize
            and req.gres == "gpu"
            and got
            and int(self.rec_share[node, list(got)].min()) < self.pod_milli[pod]
        ):
            self.undersized += 1
        if self.pod_ls_share[pod] and not (req.gres == "gpu" and got and self.state.rec_mig[node, list(got)].all()):
            self.ls_not_mig += 1
        return True

    def _slice(self, req: SlurmRequest, node: int, got: tuple[int, ...]) -> bool:
        """The prolog places the job's per-job MIG slice on the GPU Slurm gave it; where it cannot, the job's
        allocation is undone (Slurm requeues it) and False."""
        key = (node, got[0])
        carrier = self.carriers.get(key)
        if carrier is None:
            raise ValueError(
                f"a {req.mig_profile} slice was given shards of GPU {got[0]} of node {self.state.names[node]}, "
                "which is no per-job MIG GPU"
            )
        if self.slices.place(carrier, key, req.mig_profile) is None:
            self.state.release_shared(req, node, got)
            return False
        return True

    def _per_job_slices(self) -> int:
        """Compute slices of the instances on the per-job MIG GPUs."""
        total = 0
        for key, held in self.slices.on.items():
            model = get_model(self.carriers[key].model)
            total += sum(model.profile(p).compute_slices for p, _ in held)
        return total

    def metrics(self) -> dict[str, float]:
        s = self.state
        out: dict[str, float] = {
            "rejected": float(self.rejected),
            "undersized": float(self.undersized),
            "ls_share_not_on_mig": float(self.ls_not_mig),  # placed LS fractional jobs without a MIG slice
            # refused at submission, by violation code (a job with two violations counts under each)
            **{f"refused {code}": float(n) for code, n in sorted(self.refused_codes.items())},
        }
        if self.mig_gpus and self.mig_slices:
            used = (self.rec_slices * (~s.rec_free & s.rec_mig)).sum()
            out["slices_occupied"] = 100.0 * used / (self.slices_per_gpu * self.mig_gpus)  # MIG GPUs only
            out["mig_gpus"] = float(self.mig_gpus)
        if self.carriers:
            out["slices_refused"] = float(self.slices.refused)  # admitted by Slurm, no placement on its GPU
        if self.mig_slices and self.gpus:
            used_all = occupied_slices(s, self.rec_slices, self.slices_per_gpu, self._per_job_slices())
            out["slices_occupied_all"] = 100.0 * used_all / (self.slices_per_gpu * self.gpus)
            out["gpus"] = float(self.gpus)
        return out


def carriers(state: SlurmState, cluster: SimCluster) -> dict[tuple[int, int], Carrier]:
    """(node index in the state's order, GPU index) -> its carrier, for every per-job MIG GPU."""
    by_name = {n.name: n for n in cluster.nodes}
    out = {}
    for i, name in enumerate(state.names):
        for g, gpu in enumerate(by_name[name].gpus):
            if gpu.per_job:
                out[(i, g)] = Carrier(gpu.model, gpu.slices, gpu.units)
    return out


def occupied_slices(s: SlurmState, rec_slices: np.ndarray, slices_per_gpu: int, per_job: int = 0) -> int:
    """Compute slices occupied over every GPU of the cluster, whatever its mode (S2/S3's "all GPUs" figure).

    - a MIG GPU: the compute slices of its allocated MIG instances (``rec_slices``: per gpu record);
    - a GPU allocated whole (a gpu record of a non-MIG GPU): all ``slices_per_gpu``, as a whole-GPU job
      holds a 7g.40gb under MIG;
    - an mps/shard GPU: the share of it its jobs hold, in slices rounded up once per GPU:
      ``ceil(slices_per_gpu x units used / units)`` (mps 30 + 20 of 100 on an A100: ceil(3.5) = 4);
    - a per-job MIG GPU: the compute slices of its instances (``per_job``, summed over those GPUs);
    - an idle GPU, or a MIG GPU without instances: 0.
    """
    mig = int((rec_slices * (~s.rec_free & s.rec_mig)).sum())
    whole = int(s.gpu_taken.sum()) * slices_per_gpu
    shared = (s.sh_cap > 0) & ~s.gpu_taken & ~s.per_job
    cap = np.maximum(s.sh_cap, 1)
    part = np.minimum(-(-slices_per_gpu * s.sh_used // cap), slices_per_gpu)
    return mig + whole + int(part[shared].sum()) + per_job
