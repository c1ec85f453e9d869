"""Support for the hook tests: a test node with the small-lab policy, paths in a
temporary directory, a fake NVML for the node's group (MIG layout applied), gres.conf as rendered
plus the node's MIG include, a node config naming them, and the fake MPS control client."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from slurm_gpushare.gpu import open_backend, read_mig_minors
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.node.gresconf import node_gres_conf
from slurm_gpushare.node.mig import apply_actions, observe, plan_mig
from slurm_gpushare.node.mps import MpsControl
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import Result, run
from slurm_gpushare.render import render_all

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "docker" / "fakes"
FAKE_MPS = (sys.executable, str(FAKES / "nvidia-cuda-mps-control"))


class HookNode:
    def __init__(self, tmp: Path, node: str, policy: Path = ROOT / "etc" / "small-lab.yaml"):
        self.tmp, self.node = tmp, node
        raw = yaml.safe_load(policy.read_text())
        raw["cluster"]["paths"] = {
            "slurm_conf_dir": str(tmp / "etc"),
            "gres_include": str(tmp / "etc" / "gres.d" / "mig.conf"),
            "state_dir": str(tmp / "state"),
            "log_dir": str(tmp / "log"),
        }
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(yaml.safe_dump(raw))
        self.site = load_file(self.policy)
        group = self.site.group_for_node(node)
        self.slots = group.gpus
        self.state = tmp / "nvml.json"
        self.fake = FakeNvml.build(
            self.state,
            model=group.model.name,
            count=len(group.gpus),
            mig_enabled=[s.index for s in group.gpus if s.mode == "mig"],
            seed=node,
        )
        with open_backend(self.state) as backend:
            apply_actions(backend, plan_mig(self.slots, observe(backend)))
            include = node_gres_conf(node, self.slots, backend, read_mig_minors(backend.mig_minors_path))
        (tmp / "etc" / "gres.d").mkdir(parents=True)
        (tmp / "etc" / "gres.conf").write_text(render_all(self.site)["gres.conf"])
        (tmp / "etc" / "gres.d" / "mig.conf").write_text(include)
        self.config = tmp / "etc" / "node.yaml"
        self.config.write_text(f"policy: {self.policy}\nfake_nvml: {self.state}\nstate_dir: {tmp / 'state'}\n")
        os.chmod(self.config, 0o644)
        self.mps = MpsControl(run, command=FAKE_MPS, quit_wait=5)

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    def env(
        self, job_id: int, gpus: str | None = None, pct: int | None = None, uid: int | None = None, **extra
    ) -> dict:
        env = {
            "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_UID": str(os.getuid() if uid is None else uid),
            "SLURM_JOB_GID": str(os.getgid()),
            "SLURMD_NODENAME": self.node,
            "GPUSHARE_NODE_CONFIG": str(self.config),
        }
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = env["CUDA_VISIBLE_DEVICES"] = gpus
        if pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        env.update(extra)
        return env

    def backend(self):
        return open_backend(self.state)

    def journals(self) -> list[str]:
        d = self.state_dir / "jobs"
        return sorted(p.name for p in d.iterdir() if p.suffix == ".json") if d.exists() else []


def stop_daemons(state_dir: Path) -> None:
    """Quit every fake MPS daemon a test left under ``state_dir`` (real processes), then detach the key dirs'
    own tmpfs mounts left there (the hooks mount them where they may: as root)."""
    for control in sorted(Path(state_dir).glob("mps/*/pipe/control")):
        run(
            list(FAKE_MPS),
            input="quit\n",
            env={"CUDA_MPS_PIPE_DIRECTORY": str(control.parent), "PATH": os.defpath},
            check=False,
            timeout=10,
        )
    unmount_key_dirs(state_dir)


def key_dir_mounts(root: Path) -> list[str]:
    """The MPS key dirs' own tmpfs mounts (source ``mps.TMPFS_SOURCE``) at or under ``root``."""
    from slurm_gpushare.node.mps import TMPFS_SOURCE

    root_text = str(Path(root).resolve()).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _sep, rest = line.partition(" - ")
        point = fields.split(" ")[4].replace("\\040", " ")
        if rest.split(" ")[1:2] == [TMPFS_SOURCE] and (point + "/").startswith(root_text):
            found.append(point)
    return found


def unmount_key_dirs(root: Path) -> None:
    for point in key_dir_mounts(root):
        run(["umount", "--lazy", point], check=False, timeout=10)


def no_scontrol(argv, **_kw):
    """A runner for the hooks' drain call: pretends scontrol succeeded."""
    return Result(tuple(argv), 0, "", "")
