"""What the root hooks share: reading their inputs, and failing in one readable line.

A root hook that cannot make the node safe exits non-zero; Slurm then
drains the node with the bare reason "Prolog error". So the hook first sets
the drain reason itself, through scontrol (seen on 24.11: the reason set
by the hook is kept when slurmctld drains the node for the failure). The
reason holds only what the hook wrote: ids, UUIDs, paths, numbers.
"""

from __future__ import annotations

import os
import re
import sys
import time

from ..node.jobenv import node_name, node_name_or_none, slurm_conf
from . import Seen

_PRINTABLE = re.compile(r"[^\x20-\x7e]")
REASON_MAX = 200


def fail(hook: str, environ, message: str, runner=None) -> int:
    """Print one line, set the node's drain reason, return the exit status."""
    from ..errors import GpushareError

    line = _PRINTABLE.sub("?", f"{hook}: {message}")
    print(line, file=sys.stderr)
    node = node_name_or_none(environ)
    if node is not None:
        try:
            drain(node, line, environ, runner)
        except GpushareError as exc:  # no scontrol here: the exit status still drains the node
            print(f"{hook}: could not set the drain reason: {exc}", file=sys.stderr)
    return 1


def drain(node: str, reason: str, environ, runner=None) -> None:
    from ..node.mps import SAFE_PATH
    from ..proc import run
    from ..slurm.cli_backend import CliClient

    env = {"PATH": SAFE_PATH}
    conf = slurm_conf(environ)
    if conf is not None:
        env["SLURM_CONF"] = conf
    text = reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 3] + "..."
    CliClient(runner or run, timeout=15, env=env).drain(node, text, check=False)


def load(environ):
    """(node config, node spec) for the node Slurm names; (node config, None) on a node outside the policy
    (node.yaml ``outside_policy: yes``), where the hook has nothing of ours to do."""
    from ..node.nodeconfig import config_path, node_spec, read_config

    node = node_name(environ)
    config = read_config(config_path(environ))
    return config, None if config.outside_policy else node_spec(config, node)


def guarded(hook: str, body, environ=None, runner=None, metrics: str | None = None) -> int:
    """Run ``body(environ)``; any failure, ours or not, becomes one line and a drained node.

    With ``metrics`` (the hook's short name) the body is ``body(environ, seen)``
    and fills ``seen`` (a ``Seen``); the run is then counted, and dcgm-exporter's
    job mapping updated, when the policy turns them on (``_metrics``). A metrics
    directory that cannot be written never changes the exit status; a bug in
    that step is raised, as any bug.

    Without ``environ`` this is the hook process slurmd started (its console
    script calls ``main()``): then the cyclic garbage collector is off for the
    run and what the run built is frozen out of the collection at exit (``_no_gc``).
    Callers in a longer-lived process pass the environment and keep the collector."""
    from ..errors import GpushareError

    if environ is None:
        _no_gc()
    environ = dict(os.environ if environ is None else environ)
    seen = Seen()
    start = time.monotonic()
    error: Exception | None = None
    message = ""
    try:
        body(environ) if metrics is None else body(environ, seen)
    except GpushareError as exc:
        error, message = exc, str(exc)
    except Exception as exc:  # a bug must still drain the node, not leave it half set up
        error, message = exc, f"internal error: {type(exc).__name__}: {exc}"
    if metrics is not None:
        spec = seen.spec
        if spec is not None and (spec.textfile_dir is not None or spec.dcgm_job_mapping_dir is not None):
            from ._metrics import after_run

            try:
                after_run(hook, metrics, seen, error, time.monotonic() - start)
            except Exception as exc:  # a bug in the metrics step: loud in slurmd's log, but never drains the node
                print(
                    f"{hook}: the metrics step failed (a bug; the job is not affected): {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                )
    return 0 if error is None else fail(hook, environ, message, runner)


def _no_gc() -> None:
    """A hook process lives ~50 ms and frees everything at exit: the cyclic collector's passes over the
    objects its imports create (a gen-0 pass every 700 allocations, older generations as they fill) and the
    full collection in the interpreter's teardown are ~15 M instructions of a 150 M hook, a tenth
    (bench/node_hooks.py, callgrind). Reference counting still frees everything not in a cycle at once."""
    import atexit
    import gc

    gc.disable()
    atexit.register(gc.freeze)  # at exit: the teardown's collection then skips the objects the run made


def run(argv, **kwargs):
    """``proc.run``, imported on the first command: only MPS jobs run a command when nothing fails."""
    from ..proc import run as proc_run

    return proc_run(argv, **kwargs)


def mps_command(config) -> dict:
    """MpsControl's ``command`` when the node config names the control binary."""
    return {} if config.mps_control_str is None else {"command": (config.mps_control_str,)}
