"""slurm-gpushare: one site policy rendered into every Slurm layer for shared GPUs."""

__version__ = "0.1.0"
