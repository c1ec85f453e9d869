"""systemd units for the long-lived services, shipped in the package (docs/admins/install.md).

- ``gpushare-exporter.service``: ``gpushare exporter`` (Prometheus metrics of the cluster's GPU sharing),
  as the system user ``gpushare`` (docs/admins/exporter.md: a user that may run squeue, scontrol, sshare and
  sacctmgr).
- ``gpushare-live.service``: the live planner's loop, ``gpushare live apply --every 60``, as root
  (it creates reservations, drains nodes and writes the slurm.conf directory; docs/admins/live-loop.md).
- ``gpushare-node-boot.service``: on each GPU node, ``gpushare node boot`` once before slurmd starts (MIG
  mode, MIG layouts, compute modes, the gres include; docs/admins/node-runtime.md); slurmd requires it.
  ``gpushare node install`` installs and enables it, running the interpreter it was started with.

They run ``/usr/local/bin/gpushare`` on ``/etc/gpushare/policy.yaml`` (the boot unit: on the node config,
``/etc/gpushare/node.yaml``); a site with other paths copies a unit and edits it, or adds a drop-in
(``systemctl edit``). Copy them with::

    install -m 0644 "$(python -c 'import slurm_gpushare.systemd as s; print(s.__path__[0])')"/*.service \\
        /etc/systemd/system/
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent
UNITS = ("gpushare-exporter.service", "gpushare-live.service", "gpushare-node-boot.service")
BOOT_UNIT = "gpushare-node-boot.service"


def unit_paths() -> list[Path]:
    """The shipped unit files, in UNITS order."""
    return [DIR / name for name in UNITS]
