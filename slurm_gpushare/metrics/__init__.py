"""Prometheus metrics: the controller exporter (``collect`` pure, ``exporter`` the scrape and HTTP side).

Reads Slurm through ``slurm.client``; never runs a command itself.
"""
