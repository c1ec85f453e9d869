"""`python -m slurm_gpushare.cli`: the `gpushare` command, for units that name the interpreter (node install's)."""

from . import main

main(prog_name="gpushare")
