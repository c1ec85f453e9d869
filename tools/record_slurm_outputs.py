"""Record the raw Slurm outputs the Slurm client's parser tests replay: tests/data/slurm/recorded-<version>/.

Brings up the test cluster (etc/small-lab.yaml, its own compose project), makes the frozen moment of the
client contract test (tests/cluster/test_slurm_client.py ``frozen_moment``: alice's running GPU, MIG, shard
and MPS jobs, bob's three held ones), writes what `squeue --json` and `scontrol show node|partition --json`
print and the CLI backend's `gpushare slurm dump`, then takes the cluster down.

    .venv/bin/python tools/record_slurm_outputs.py [--suite trixie|sid] [--out tests/data/slurm]

Needs docker and the images (docker/bootstrap.sh). Overwrites the four files of that Slurm version.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.slurm import commands  # noqa: E402
from slurm_gpushare.testcluster.cluster import TestCluster  # noqa: E402
from tests.cluster.test_slurm_client import client_dump, frozen_moment  # noqa: E402

RAW = (
    ("squeue.json", commands.SQUEUE_JSON),
    ("scontrol-show-node.json", commands.NODES_JSON),
    ("scontrol-show-partition.json", commands.PARTITIONS_JSON),
)


def record(cluster: TestCluster, out_root: Path) -> Path:
    """Write the raw outputs and the dump of one frozen moment under out_root/recorded-<version>/."""
    version = cluster.slurm(list(commands.VERSION)).stdout.split()[-1]
    out = out_root / f"recorded-{version}"
    out.mkdir(parents=True, exist_ok=True)
    with frozen_moment(cluster) as (since, _jobs, _held):
        for name, argv in RAW:
            (out / name).write_text(cluster.slurm(list(argv)).stdout)
        dump = client_dump(cluster, "cli", since)
        (out / "client-dump.json").write_text(json.dumps(dump, indent=1, sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        choices=("trixie", "sid"),
        default="trixie",
        help="Debian suite of the Slurm image: trixie (Slurm 24.11) or sid (26.05)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "tests" / "data" / "slurm",
        help="directory that holds recorded-<version>/ (default: tests/data/slurm)",
    )
    parser.add_argument("--project", default="gpushare-record", help="compose project name")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = TestCluster(
            ROOT / "etc" / "small-lab.yaml",
            project=args.project,
            suite=args.suite,
            workdir=Path(tmp),
            docker_dir=ROOT / "docker",
        )
        cluster.build()
        try:
            cluster.up()
            cluster.wait_idle(timeout=240)
            cluster.slurm(["gpushare", "accounts", "apply", "/etc/gpushare/policy.yaml"], timeout=120)
            print(f"recorded into {record(cluster, args.out)}")
        finally:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
