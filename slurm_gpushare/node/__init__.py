"""Node runtime: MIG layout (``mig``), the node's gres.conf include (``gresconf``), and the
per-job hooks: ``prolog`` / ``taskprolog`` / ``epilog`` over ``journal`` files, MPS daemons
(``mps``), repairs (``reconcile``) and safe layout changes (``relayout``).

Planning is pure (live state + policy slots in, actions out); only the
``apply_*`` / ``execute_*`` functions and the backend change GPUs. Modules are
imported on demand, so a hook that needs one does not pay for the others (the
task prolog imports only ``paths`` and ``taskprolog``).
"""
