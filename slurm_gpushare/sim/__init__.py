"""slurm_gpushare.sim."""
