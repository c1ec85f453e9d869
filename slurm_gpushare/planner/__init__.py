"""Placement by workload: demand model, planner, Slurm placement simulator, the paper's baselines. Pure."""
