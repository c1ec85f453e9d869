"""Node runtime: MIG layout (``mig``), the node's gres.conf include (``gresconf``).

Planning is pure (live state + policy slots in, actions out); only the
``apply_*`` functions and the backend change GPUs. Modules are imported on
demand, so a hook that needs one does not pay for the others.
"""
