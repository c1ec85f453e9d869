"""The placement simulator: the cluster as rendered, Slurm's placement of a job on it, seeded arrivals, the
replay engine and the trace reader. Pure. sim/paper/ (the FGD paper's baselines) is for bench/ and tests only."""
