"""Console entry points for Slurm's Prolog, Epilog and TaskProlog (tiny on purpose).

Each creates the real things (runner, NVML backend, MPS control client) and
hands them to ``slurm_gpushare.node``, where planning and execution live.
The task prolog imports nothing but ``node.paths`` and ``node.taskprolog``.
"""
