"""Benchmark only: how long a node hook process waits on the test doubles (bench/node_hooks.py).

bench/node_hooks.py names a file in GPUSHARE_BENCH_DOUBLES for the timed hook
processes it starts, and has them import this module before the hook's own
code (``clocked``: the hook scripts run with -IS, so neither PYTHONPATH nor
``site``, which would import a sitecustomize, is read there); nothing else
does (without the variable this module does nothing; on PYTHONPATH, ``site``
imports it as any sitecustomize). It wraps, when (and only if) the hook
imports them, four seams of the product, timing each call with
``time.perf_counter`` from the hook's side:

- ``slurm_gpushare.proc.run`` when ``argv[0]`` is the fake
  ``nvidia-cuda-mps-control`` (docker/fakes): spawn, the fake's interpreter
  start, its work, its exit and the reap ("mps client");
- ``slurm_gpushare.node.mps.ProcessHandle.wait``: the epilog waiting for the
  fake daemon to exit after ``quit`` ("daemon exit");
- every ``nvml*`` method of ``slurm_gpushare.gpu.fakenvml.FakeNvml``: the
  fake NVML's JSON state read (and written) under its lock per call, where
  pynvml calls into the driver ("fake NVML"). Nested calls count once;
- the import of ``slurm_gpushare.gpu.fakenvml`` itself (its module body,
  the hardware catalogue it reads, anything else it is first to import),
  where a real node imports pynvml ("fake NVML import"; the hooks import the
  stdlib modules the product needs before it, so those stay the product's).

Any other command the hook runs is counted apart ("other", by name), as the
product's. CPU time is recorded beside wall time where the hook is charged
for it: the fake client's (``getrusage(RUSAGE_CHILDREN)`` around the call: the
hook reaps it, so the client's CPU is in the hook's own rusage as its parent
sees it) and the fake NVML's (``time.process_time`` around the call and the import). At exit
one line of ``key=value`` words is appended to the file: ``mps_ms mps_cpu
mps_n wait_ms wait_n nvml_ms nvml_cpu nvml_n import_ms import_cpu import_n
other_ms other_n other`` (ms
summed over the calls, n the number of calls, ``other`` the other commands'
names, comma-separated, or ``-``).
"""

import os
import sys

_OUT = os.environ.get("GPUSHARE_BENCH_DOUBLES")
_FAKE = "nvidia-cuda-mps-control"
_SEEN = {
    "mps_ms": 0.0,
    "mps_cpu": 0.0,
    "mps_n": 0,
    "wait_ms": 0.0,
    "wait_n": 0,
    "nvml_ms": 0.0,
    "nvml_cpu": 0.0,
    "nvml_n": 0,
    "import_ms": 0.0,
    "import_cpu": 0.0,
    "import_n": 0,
    "other_ms": 0.0,
    "other_n": 0,
}
_OTHER: list = []


def _timed(key, fn, guard=None, cpu=None):
    """``fn`` timed into _SEEN[key + "_ms"] (with ``cpu``, a clock in seconds: also _SEEN[key + "_cpu"]),
    counted in _SEEN[key + "_n"]; with ``guard``, calls made while another guarded call runs are neither
    timed nor counted."""
    from time import perf_counter

    def wrapper(*args, **kwargs):
        if guard is not None:
            if guard[0]:
                return fn(*args, **kwargs)
            guard[0] = True
        c0 = cpu() if cpu else 0.0
        t0 = perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _SEEN[key + "_ms"] += (perf_counter() - t0) * 1000
            if cpu:
                _SEEN[key + "_cpu"] += (cpu() - c0) * 1000
            _SEEN[key + "_n"] += 1
            if guard is not None:
                guard[0] = False

    wrapper.__wrapped__ = fn
    return wrapper


def _children_cpu() -> float:
    import resource  # on the first fake client call only

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _patch_proc(module) -> None:
    run = module.run
    fake, other = _timed("mps", run, cpu=_children_cpu), _timed("other", run)

    def dispatch(argv, *args, **kwargs):
        if os.path.basename(str(argv[0])) == _FAKE:
            return fake(argv, *args, **kwargs)
        _OTHER.append(os.path.basename(str(argv[0])))
        return other(argv, *args, **kwargs)

    module.run = dispatch


def _patch_mps(module) -> None:
    module.ProcessHandle.wait = _timed("wait", module.ProcessHandle.wait)


def _patch_fakenvml(module) -> None:
    from time import process_time

    cls, guard = module.FakeNvml, [False]
    for name, value in list(vars(cls).items()):
        if name.startswith("nvml") and callable(value):
            setattr(cls, name, _timed("nvml", value, guard, process_time))


_PATCHES = {
    "slurm_gpushare.proc": _patch_proc,
    "slurm_gpushare.node.mps": _patch_mps,
    "slurm_gpushare.gpu.fakenvml": _patch_fakenvml,
}


class _Finder:
    """Finds nothing itself: for the three modules above, the spec the other finders give, its loader's
    exec_module followed by the patch (before the importer binds any name from the module)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is _Finder or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run_module = spec.loader.exec_module
        if name == "slurm_gpushare.gpu.fakenvml":  # its import (what it imports first with it) is the double's
            from time import process_time

            run_module = _timed("import", run_module, cpu=process_time)

        def exec_module(module):
            run_module(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _report() -> None:
    words = [f"{k}={v:.3f}" if k.endswith("_ms") else f"{k}={v}" for k, v in _SEEN.items()]
    line = " ".join([*words, f"other={','.join(_OTHER) or '-'}"]) + "\n"
    fd = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


if _OUT:
    import atexit

    sys.meta_path.insert(0, _Finder)
    atexit.register(_report)
