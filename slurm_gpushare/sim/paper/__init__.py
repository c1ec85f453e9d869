"""slurm_gpushare.sim.paper."""
