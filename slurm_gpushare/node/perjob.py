"""Per-job MIG on the node: the instance a job's slice needs, made by the prolog and destroyed by the epilog.

On a GPU the policy shares per job (``Share.is_per_job_mig``), a job whose SLURM_JOB_EXTRA records a profile
(``gpushare-mig=<profile>``, set by the submission filter and read strictly by ``jobenv.mig_record``) gets one
GPU instance (GI) of that profile with one compute instance (CI) spanning it, made beside the instances of the
GPU's other jobs, which cannot move. For each such device of the journal ``plan_prolog`` wrote (its profile,
nothing placed yet), under a lock per GPU (``gpu_lock``, as the MPS lock: an flock under the state dir):

- observe (``observe_gpu``): the GPU's GIs and the GI profiles NVML offers on it;
- plan (``plan_slice``, pure): the profile must be one the GPU allows; the start is hardware.migplace's
  choice by its default rule (largest-first: the most placements of the largest profiles left), never the
  reuse of an idle instance (bench/RESULTS.md, "Per-job MIG churn": reuse helps only the first-start rule a
  little and is mixed for the others; and nothing of the job before is left in an instance made for each
  job); no legal start refuses the job;
- execute (``make_slice``): the journal records the intent (profile, start) before anything is made, then the
  GI's id once made, then the CI's, then the MIG device's UUID, which the task file hands the job as its
  CUDA_VISIBLE_DEVICES (``taskprolog``).

A prolog run again for a job whose journal it finds (Slurm runs the prolog again when it retries it; a heal of
the node may too) reuses the instance that journal records for the job on the same GPU (``earlier``) when NVML
still has it whole: its GI at the same start, of the same profile and id, its CI and its MIG device
(``plan_reuse``, pure). Only when it is gone is a new one planned; what is left of it (a GI without its CI or
MIG device) is destroyed first, so the job's journal never names two instances, nor leaves one unnamed.

A slice that cannot be placed or made (NVML_ERROR_INSUFFICIENT_RESOURCES and the like) refuses the job, never
the node: the prolog writes its journal ready with ``taskprolog.REFUSE_ENV`` and the reason (as ``mpsmem``
does), so its tasks fail with a message in the job's output; what this run made is destroyed again, or left in
the journal for the epilog. The epilog's ``DestroySlice`` destroys the CI, then the GI, once the job's
processes are gone (``destroy_slice``; found by id, or by its start where a crash came between the create and
the journal), and the health check's reconcile does the same for a journal whose job ended. The hardware
catalogue is imported only when a slice is planned: other jobs' hooks never load it.
"""

from __future__ import annotations

import os
import time

from ..atomic import flocked
from ..errors import GpushareError
from ..gpu.backend import IN_USE, GpuError
from ..policy.share import FAIL, MAX_SLICE_REQUEUES, RECORD_PREFIX, Mode
from ..records import record, replace
from .journal import Device, Journal
from .observed import WriteJournal

TYPE_CHECKING = False  # for type checkers only
if TYPE_CHECKING:
    from ..gpu.backend import GiProfile, GpuInstance

REFUSED_CODE = "mig-slice"  # the task file's refusal code for a job whose slice could not be made (taskprolog)
REQUEUE_CODE = "mig-slice-requeue"  # the same, for a job the health check requeues (``refusal_code``)
WHOLE_MODE = "mig-whole"  # Device.mode of a per-job GPU a job holds whole: its full instance, made as a slice
WHOLE_WAIT_S = 20.0  # a whole-GPU job waits at most this long for ended jobs' instances to leave its GPU
WHOLE_WAIT_STEP_S = 1.0
DESTROY_TRIES = 5  # a GI destroy that NVML answers IN_USE ("in use by another client") is tried again, 1 s apart
DESTROY_WAIT_S = 1.0


class SliceFailed(GpushareError):
    """NVML refused to make the slice; ``left`` is the device as far as it exists still (None: nothing)."""

    def __init__(self, why: str, left: Device | None):
        self.left = left
        super().__init__(why)


@record
class GpuSlices:
    """What planning a slice reads of one GPU: its GPU instances, and the GI profile id NVML gives each profile
    constant it offers (none while MIG mode is off)."""

    gis: tuple[GpuInstance, ...]
    profile_ids: dict[int, int]


@record
class SlicePlan:
    device: Device  # with its start
    profile_id: int  # what NVML creates the GI by
    ci_constant: int  # NVML_COMPUTE_INSTANCE_PROFILE_* of the CI that spans the GI


@record
class SliceRefused:
    """Why a job's slice is not made; ``code`` is bounded (metrics.textfile.SLICE_REFUSALS): placement (no free
    placement beside the GPU's instances), profile (no record, or a profile the GPU does not make), mig_off (NVML
    offers no such profile: MIG mode off), nvml (NVML refused to make it, or its instances cannot be read)."""

    why: str
    code: str = "nvml"


@record
class DestroySlice:
    """The epilog's step: destroy the job's CI, then its GI."""

    device: Device

    def __str__(self) -> str:
        d = self.device
        return f"destroy the {d.profile} instance at memory slice {d.start} of GPU {d.gpu_index} (GI {d.gi})"


def gpu_lock(state_dir: str, index: int) -> str:
    """The lock file that serialises changes to one GPU's instances (prolog, epilog, health)."""
    return os.path.join(state_dir, "mig", f"gpu{int(index)}.lock")


def planned(device: Device, record: str | None, model_name: str) -> Device:
    """A per-job GPU's device as the prolog plans it: the slice the job's record names, or, for a job without one
    (it holds the GPU whole: Slurm never gives a GPU as gpu and as its shards at once), the model's full instance
    (``WHOLE_MODE``; "" where the catalogue has none), whatever the policy's ``profiles`` list: those limit the
    slices users ask for."""
    if record is not None:
        return replace(device, profile=record)
    return replace(device, mode=WHOLE_MODE, profile=whole_profile_name(model_name))


def whole_profile_name(model_name: str) -> str:
    """The model's whole-GPU MIG profile (hardware.packing.whole_profile: 7g.40gb on an A100-40GB), or ""."""
    from ..hardware import CatalogueError, get_model
    from ..hardware.packing import whole_profile

    try:
        profile = whole_profile(get_model(model_name))
    except CatalogueError:
        return ""
    return profile.name if profile is not None else ""


def pending(journal: Journal) -> list[Device]:
    """The journal's per-job devices not made yet."""
    return [d for d in journal.devices if d.per_job and d.mig_uuid is None]


# ---- observe ------------------------------------------------------------------------------


def observe_gpu(backend, index: int) -> GpuSlices:
    profiles: list[GiProfile] = backend.gpu_instance_profiles(index)
    return GpuSlices(tuple(backend.gpu_instances(index)), {p.constant: p.id for p in profiles})


# ---- plan (pure) --------------------------------------------------------------------------


def plan_slice(device: Device, model_name: str, allowed: tuple[str, ...], seen: GpuSlices) -> SlicePlan | SliceRefused:
    """Where the device's instance goes (migplace's default rule, no reuse), or why it cannot be made."""
    from ..hardware import CatalogueError, get_model, migplace

    where = f"GPU {device.gpu_index} ({device.gpu_uuid})"
    whole = device.mode == WHOLE_MODE
    if not device.profile:
        if whole:
            return SliceRefused(
                f"{where}: the catalogue has no whole-GPU MIG profile for {model_name or 'its model'}", "profile"
            )
        return SliceRefused(
            f"the job's extra field is not gpushare's record of a MIG profile ({RECORD_PREFIX}...)", "profile"
        )
    if not whole and device.profile not in allowed:
        return SliceRefused(
            f"{device.profile} is not one of the profiles {where} makes per job: {', '.join(allowed)}", "profile"
        )
    try:
        model = get_model(model_name)
        profile = model.profile(device.profile)
        instances = [(model.profile_for_constant(g.profile_constant).name, g.start) for g in seen.gis]
        choice = migplace.choose(
            model, profile.name, instances, allowed=None if whole else allowed, rule=migplace.DEFAULT_RULE
        )
    except (CatalogueError, ValueError) as exc:
        return SliceRefused(f"{where}: its instances cannot be read against the catalogue: {exc}")
    if profile.nvml_constant not in seen.profile_ids:
        return SliceRefused(f"NVML offers no {profile.name} on {where} (is MIG mode on?)", "mig_off")
    if choice is None:
        held = ", ".join(f"{n} at {s}" for n, s in sorted(instances, key=lambda i: i[1])) or "none"
        why = f"{where} has no free placement for {profile.name} beside its instances ({held})"
        late = f": ended jobs' instances still there after {WHOLE_WAIT_S:g} s" if whole else ""
        return SliceRefused(why + late, "placement")
    return SlicePlan(
        replace(device, start=choice.start), seen.profile_ids[profile.nvml_constant], profile.full_compute_constant
    )


def with_device(journal: Journal, device: Device) -> Journal:
    """The journal with ``device`` in place of the device of the same GRES index."""
    devices = tuple(device if d.slurm_index == device.slurm_index else d for d in journal.devices)
    return replace(journal, devices=devices)


def rewrite(actions: list, journal: Journal) -> list:
    """The prolog's actions writing ``journal`` (in each write's state) instead of the one planned."""
    return [WriteJournal(journal.with_state(a.journal.state)) if isinstance(a, WriteJournal) else a for a in actions]


# ---- execute ------------------------------------------------------------------------------


def make_slice(plan: SlicePlan, journal: Journal, backend, store) -> Device:
    """Journal the intent, make the GI at the planned start, then its CI; the device with its MIG UUID.

    SliceFailed when NVML refuses, with what is left (this call destroys what it made where NVML lets it)."""
    dev, index = plan.device, plan.device.gpu_index
    store.write(with_device(journal, dev).with_state("preparing"))  # before anything exists
    try:
        gi = backend.create_gpu_instance(index, plan.profile_id, dev.start)
    except GpushareError as exc:
        raise SliceFailed(str(exc), None) from None
    dev = replace(dev, gi=gi.id)
    store.write(with_device(journal, dev).with_state("preparing"))
    try:
        ci = backend.create_compute_instance(index, gi.id, plan.ci_constant)
        dev = replace(dev, ci=ci.id)
        store.write(with_device(journal, dev).with_state("preparing"))
        uuid = next((m.uuid for m in backend.mig_devices(index) if (m.gi_id, m.ci_id) == (gi.id, ci.id)), None)
        if uuid is None:
            raise GpuError(f"find the MIG device of GI {gi.id} CI {ci.id}", index, dev.gpu_uuid, detail="not listed")
    except GpushareError as exc:
        why = destroy_instances(backend, dev, tries=1)
        raise SliceFailed(str(exc) + (f"; left: {why}" if why else ""), dev if why else None) from None
    return replace(dev, mig_uuid=uuid, visible=uuid)


def earlier(device: Device, journals: dict[int, Journal], job_id: int) -> Device | None:
    """The instance the job's journal from an earlier prolog run records on the device's GPU, with the device's
    profile and mode, placed (its GI's id journaled), and that no other job's journal claims (its start on that
    GPU); None without one."""
    previous = journals.get(job_id)
    if previous is None:
        return None
    claimed = {(d.gpu_index, d.start) for j in journals.values() if j.job_id != job_id for d in j.devices if d.per_job}
    same = (device.gpu_index, device.gpu_uuid, device.profile, device.mode)
    return next(
        (
            d
            for d in previous.devices
            if d.per_job
            and d.start is not None
            and d.gi is not None
            and (d.gpu_index, d.gpu_uuid, d.profile, d.mode) == same
            and (d.gpu_index, d.start) not in claimed
        ),
        None,
    )


def plan_reuse(old: Device, model_name: str, seen: GpuSlices, migs, cis) -> Device | None:
    """Pure: ``old`` (the job's instance from an earlier run, ``earlier``) as the device to hand the job again when
    NVML still has it whole: its GI (``leftover``), the journaled CI in it (``cis``: the GI's compute instances'
    ids), and the MIG device of that GI and CI with the journaled UUID. None when it is not whole."""
    if not leftover(old, model_name, seen) or old.ci is None or old.mig_uuid is None or old.ci not in cis:
        return None
    if not any((m.uuid, m.gi_id, m.ci_id) == (old.mig_uuid, old.gi, old.ci) for m in migs):
        return None
    return replace(old, visible=old.mig_uuid)


def leftover(old: Device, model_name: str, seen: GpuSlices) -> bool:
    """Pure: the GPU still holds ``old``'s GI (its journaled id, at its start, of its profile), whole or not."""
    from ..hardware import CatalogueError, get_model

    try:
        constant = get_model(model_name).profile(old.profile or "").nvml_constant
    except (CatalogueError, ValueError):
        return False
    return any(g.id == old.gi and g.start == old.start and g.profile_constant == constant for g in seen.gis)


def prolog_slices(
    journal: Journal, node, backend, store, journals: dict[int, Journal] | None = None
) -> tuple[Journal, SliceRefused | None]:
    """Make the journal's pending slices, each under its GPU's lock: the journal with them and None, or the
    journal holding only what is left of them and why the job is refused (``node``: prolog.NodeLayout). An
    instance that the job's journal from an earlier run (in ``journals``, the node's) records is reused while
    NVML has it whole; what is left of one that is not is destroyed before a new one is planned."""
    for dev in pending(journal):
        with flocked(gpu_lock(node.state_dir, dev.gpu_index)):
            share, model = node.shares[dev.gpu_index], node.models.get(dev.gpu_index, "")
            old = earlier(dev, journals or {}, journal.job_id)
            try:
                seen, again = _reused(dev, old, model, backend)
                if again is None:
                    plan = plan_slice(dev, model, share.profiles, seen)
                    if isinstance(plan, SliceRefused):
                        return _without_slices(journal, None), _refusal(dev, plan)
                    again = make_slice(plan, journal, backend, store)
            except SliceFailed as exc:
                return _without_slices(journal, exc.left), _refusal(dev, SliceRefused(str(exc)))
        journal = with_device(journal, again)
    return journal, None


def _reused(dev: Device, old: Device | None, model: str, backend) -> tuple[GpuSlices, Device | None]:
    """What the GPU holds now, and the job's earlier instance there (``old``) to hand it again where NVML has it
    whole (with the device's GRES index and minor), else None, having destroyed what was left of it (SliceFailed
    where that fails: the GPU would hold an instance of the job that its journal does not name)."""
    seen = observe_gpu(backend, dev.gpu_index)
    if old is None or not leftover(old, model, seen):
        return seen, None
    cis = [c.id for c in backend.compute_instances(dev.gpu_index, old.gi)]
    again = plan_reuse(old, model, seen, backend.mig_devices(dev.gpu_index), cis)
    if again is not None:
        return seen, replace(again, slurm_index=dev.slurm_index, minor=dev.minor)
    why = destroy_instances(backend, old, tries=1)
    if why:
        raise SliceFailed(why, old)
    return observe_gpu(backend, dev.gpu_index), None


def _refusal(dev: Device, refused: SliceRefused) -> SliceRefused:
    """Why the job is refused, short: the task file keeps 300 characters of it and the job's output 200."""
    return replace(refused, why=f"{dev.profile or 'no profile'}: {refused.why}")


def _without_slices(journal: Journal, left: Device | None) -> Journal:
    """A refused job's journal: its per-job devices gone but those made already (a job with several per-job GPUs)
    and what still exists of the one that failed, for the epilog to destroy."""
    kept = tuple(d for d in journal.devices if not d.per_job or d.mig_uuid is not None)
    return replace(journal, devices=kept + ((left,) if left is not None else ()))


def await_empty(backend, state_dir: str, indexes, own: Journal | None = None) -> list[int]:
    """Wait, at most ``WHOLE_WAIT_S``, until these per-job GPUs (allocated whole) hold no GPU instance: instances
    of jobs whose epilog has not run yet, or has not finished. Each try reads one GPU under its lock, and no lock
    is held between tries (the caller holds no journal lock either: the epilog that destroys them needs it).
    The instances ``own`` (the job's journal from an earlier run of its prolog) records do not count: the prolog
    reuses them. The GPUs still occupied (their prolog then refuses the job, never the node)."""
    mine = {(d.gpu_index, d.gi, d.start) for d in (own.devices if own else ()) if d.per_job and d.gi is not None}
    deadline = time.monotonic() + WHOLE_WAIT_S
    left = list(indexes)
    while True:
        left = [i for i in left if _occupied(backend, state_dir, i, mine)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(WHOLE_WAIT_STEP_S)


def _occupied(backend, state_dir: str, index: int, mine=frozenset()) -> bool:
    with flocked(gpu_lock(state_dir, index)):
        return any((index, g.id, g.start) not in mine for g in backend.gpu_instances(index))


# ---- the epilog's side ----------------------------------------------------------------------


def destroys(journal: Journal, journals: dict[int, Journal]) -> list[DestroySlice]:
    """The journal's per-job instances to destroy: each placed one no other job's journal claims (a GI at the same
    start on the same GPU is another job's once this one's is gone)."""
    claimed = {
        (d.gpu_index, d.start)
        for j in journals.values()
        if j.job_id != journal.job_id
        for d in j.devices
        if d.per_job and d.start is not None
    }
    return [
        DestroySlice(d)
        for d in journal.devices
        if d.per_job and d.start is not None and (d.gpu_index, d.start) not in claimed
    ]


def destroy_slice(backend, device: Device, state_dir: str, sleep=time.sleep) -> str | None:
    """Destroy the device's CI then GI under the GPU's lock; why not (None: done, or nothing was there)."""
    with flocked(gpu_lock(state_dir, device.gpu_index)):
        return destroy_instances(backend, device, sleep=sleep)


def destroy_instances(
    backend, device: Device, tries: int = DESTROY_TRIES, sleep=time.sleep, held: list[str] | None = None
) -> str | None:
    """The CIs of the device's GI, then the GI: found by its id and start, or by the start alone where the id was
    never journaled. IN_USE (another client) is tried again ``tries`` times; then, where ``held`` is given, it is
    said there (a note: someone's client holds it, which no drain mends) instead of returned as a failure."""
    index = device.gpu_index
    for attempt in range(tries):
        try:
            gi = next((g for g in backend.gpu_instances(index) if _is_its(g, device)), None)
            if gi is None:
                return None
            for ci in backend.compute_instances(index, gi.id):
                backend.destroy_compute_instance(index, gi.id, ci.id)
            backend.destroy_gpu_instance(index, gi.id)
            return None
        except GpuError as exc:
            if exc.code != IN_USE or attempt + 1 >= tries:
                why = f"{device.profile} instance at memory slice {device.start} of GPU {index} not destroyed: {exc}"
                if exc.code == IN_USE and held is not None:
                    held.append(f"{why}: another NVML client holds it; tried again at the next run")
                    return None
                return why
            sleep(DESTROY_WAIT_S)
    return None


def unjournaled(journals: dict[int, Journal], index: int, uuid: str, gis, processes) -> tuple[list[Device], list[str]]:
    """Pure: the GPU instances of per-job GPU ``index`` that no journal names (a prolog killed between the create
    and the journal write, or an instance made by hand), each as a device to destroy, and a note for each such
    instance a process uses (left: nobody's job, but someone's work). A journal names an instance by its start
    (journaled before the create), so a live job's instance is never among them."""
    claimed = {
        d.start
        for j in journals.values()
        for d in j.devices
        if d.per_job and d.gpu_index == index and d.start is not None
    }
    out, notes = [], []
    for gi in gis:
        if gi.start in claimed:
            continue
        users = sorted(p.pid for p in processes if p.gi_id == gi.id)
        if users:
            notes.append(
                f"GPU {index}: GI {gi.id} at memory slice {gi.start} is in no journal but processes "
                f"{', '.join(map(str, users))} use it: left"
            )
            continue
        out.append(Device(-1, index, uuid, Mode.MIG.value, gi=gi.id, profile="unjournaled", start=gi.start))
    return out, notes


def destroy_unjournaled(backend, device: Device, state_dir: str, notes: list[str]) -> str | None:
    """Destroy an instance no journal names, under the GPU's lock, unless a process uses it by now or another NVML
    client holds it (each said in ``notes``: someone's work, which a drain would not mend; the next run tries
    again). What else keeps it is returned (a failure)."""
    with flocked(gpu_lock(state_dir, device.gpu_index)):
        users = [p.pid for p in backend.processes(device.gpu_index) if p.gi_id == device.gi]
        if users:
            notes.append(f"GI {device.gi} of GPU {device.gpu_index} not destroyed: processes {users} use it")
            return None
        return destroy_instances(backend, device, tries=1, held=notes)


def _is_its(gi: GpuInstance, device: Device) -> bool:
    return gi.start == device.start and (device.gi is None or gi.id == device.gi)


# ---- a refused job's requeue ------------------------------------------------------------------


def refusal_code(journal: Journal, node, restarts: int | None) -> tuple[str, str]:
    """(task file code, note for the reason) of a job whose slice could not be made: ``REQUEUE_CODE`` while the
    policy of its per-job GPUs requeues (``Share.on_slice_failure``; fail if any of them says fail) and Slurm's
    restart count is below ``MAX_SLICE_REQUEUES``, else ``REFUSED_CODE`` (with why it is not requeued)."""
    shares = [node.shares[d.gpu_index] for d in journal.devices if d.per_job and d.gpu_index in node.shares]
    if any(s.on_slice_failure == FAIL for s in shares):
        return REFUSED_CODE, ""
    if restarts is None or restarts >= MAX_SLICE_REQUEUES:
        return REFUSED_CODE, f"not requeued again, requeued {restarts if restarts is not None else '?'} times"
    return REQUEUE_CODE, ""


def requeue_dir(state_dir: str) -> str:
    """Where the prolog leaves a request to requeue a refused job (one file per job id): the prolog must not call
    Slurm, so the health check does, and the file outlives the job's journal (the epilog removes that)."""
    return os.path.join(state_dir, "mig", "requeue")


def request_requeue(state_dir: str, job_id: int, restarts: int, why: str) -> None:
    """Record that job ``job_id`` (refused at Slurm restart count ``restarts``) is to be requeued once."""
    from ..atomic import atomic_write

    os.makedirs(requeue_dir(state_dir), mode=0o700, exist_ok=True)
    atomic_write(os.path.join(requeue_dir(state_dir), str(int(job_id))), f"{int(restarts)} {why}"[:400] + "\n")


def requeue_requests(state_dir: str) -> dict[int, str]:
    """job id -> the request's text, for every request file (a name that is no job id is ignored)."""
    found = {}
    try:
        names = os.listdir(requeue_dir(state_dir))
    except FileNotFoundError:
        return {}
    for name in names:
        if name.isdigit() and name[0] != "0":
            try:
                with open(os.path.join(requeue_dir(state_dir), name), encoding="utf-8", errors="replace") as fh:
                    found[int(name)] = fh.read(1000)
            except FileNotFoundError:
                continue
    return found


def drop_request(state_dir: str, job_id: int, text: str) -> None:
    """Remove job ``job_id``'s request if it still says ``text`` (a newer refusal of the job, requeued and refused
    again meanwhile, is kept for the next run)."""
    path = os.path.join(requeue_dir(state_dir), str(int(job_id)))
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fh.read(1000) != text:
                return
        os.unlink(path)
    except FileNotFoundError:
        return
