"""Accounting: GPU-equivalent usage, Slurm's Fair Tree recomputed, tenant set-up plans, reports.

Pure: everything here takes parsed records, trees and the site policy, and
returns values; the Slurm commands that produce the inputs and apply the
plans live in ``slurm_gpushare.slurm``.
"""
