"""`gpushare-task-prolog`: slurm.conf TaskProlog (as the user, every task start)."""

from ..node.taskprolog import main

__all__ = ["main"]
