#!/bin/bash
# Test-cluster node setup from the site policy, run by entrypoint-node.sh
# before the fake device files are made and slurmd starts (at every container
# start: a `docker restart` is the node's reboot):
#   1. the fake NVML state for this node's GPUs, /var/lib/gpushare/fake-nvml.json:
#      kept in the container, so a restart finds it and reboots it (`fake-nvml
#      reboot`: every MIG instance and process gone, compute modes DEFAULT, MIG
#      mode kept on A100/A30 and lost on Hopper); a new container, or a state of
#      other GPUs, gets a fresh one (model, count, MIG mode on where the policy's
#      node group shares a GPU with MIG, as an admin's one-time `nvidia-smi -mig 1`)
#   2. /etc/gpushare/node.yaml: policy, fake NVML and state dir for the node hooks, and
#      live_policy (the live planner's policy file) when the policy has live.enabled
#   3. `gpushare node boot`, as gpushare-node-boot.service runs it before slurmd on a
#      real node: MIG mode, the MIG layout (the live policy's once the live planner
#      wrote one), per-job MIG GPUs, MPS compute modes (exclusive_process where the
#      policy says), the gres include at the policy's cluster.paths.gres_include
#   4. /run/gpushare-textfile-dir: the policy's cluster.metrics.textfile_dir, for the
#      node_exporter entrypoint-node.sh starts (absent when the policy sets none)
# Needs the slurm-gpushare package in the image and the policy mounted at
# $GPUSHARE_POLICY (compose: GPUSHARE_POLICY_FILE on the host). Skipped, with a
# message, when either is missing.
set -euo pipefail
NODE=${SLURMD_NODENAME:-$(hostname -s)}
POLICY=${GPUSHARE_POLICY:-/etc/gpushare/policy.yaml}
STATE=${GPUSHARE_FAKE_NVML:-/var/lib/gpushare/fake-nvml.json}
say() { echo "gpushare-node-setup[$NODE]: $*" >&2; }

if ! command -v gpushare >/dev/null; then say "no gpushare command in this image; skipped"; exit 0; fi
if [[ ! -s $POLICY ]]; then say "no policy at $POLICY; skipped"; exit 0; fi

read -r model count mig state_dir textfile_dir live_policy < <(/opt/gpushare/bin/python - "$POLICY" "$NODE" <<'PY'
import posixpath, sys
from slurm_gpushare.policy import load_file
site = load_file(sys.argv[1])
live = getattr(site.policy, "live", None)
live_policy = "-"
if live is not None and live.enabled:
    live_policy = live.policy_file or posixpath.join(site.cluster.paths.slurm_conf_dir, "gpushare-live.yaml")
group = site.group_for_node(sys.argv[2])
mig = ",".join(str(s.index) for s in group.gpus if s.mode == "mig")
metrics = getattr(site.cluster, "metrics", None)
textfile_dir = getattr(metrics, "textfile_dir", None) or "-"
print(group.model.name, len(group.gpus), mig or "-", site.cluster.paths.state_dir, textfile_dir, live_policy)
PY
)
[[ $mig == - ]] && mig=
if [[ $textfile_dir == - ]]; then rm -f /run/gpushare-textfile-dir; else echo "$textfile_dir" >/run/gpushare-textfile-dir; fi
mkdir -p "$(dirname "$STATE")"
if [[ -s $STATE ]] && gpushare node fake-nvml reboot --state "$STATE" --model "$model" --count "$count"; then
  say "fake NVML rebooted (a container restart)"
else
  gpushare node fake-nvml init --state "$STATE" --model "$model" --count "$count" --mig "$mig" --force
fi
export GPUSHARE_FAKE_NVML=$STATE
# Where the node hooks (gpushare-prolog, -epilog, -task-prolog) find the policy and
# this fake NVML: slurmd passes them none of its own environment.
umask 022
cat >/etc/gpushare/node.yaml <<CONF
# written by docker/node-setup.sh: read by the gpushare node hooks
policy: $POLICY
fake_nvml: $STATE
state_dir: $state_dir
CONF
# live.enabled: the live planner's policy (written by `gpushare plan --live --apply`) wins while it exists
if [[ $live_policy != - ]]; then echo "live_policy: $live_policy" >>/etc/gpushare/node.yaml; fi
gpushare node boot --node-config /etc/gpushare/node.yaml --node "$NODE"
