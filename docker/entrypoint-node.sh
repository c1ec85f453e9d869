#!/bin/bash
# Compute node of the test cluster: node setup from the policy, fake GPU
# device files, munged, slurmd.
# The node name is the container hostname (compose sets hostname: = the Slurm
# NodeName), or $SLURMD_NODENAME. The /dev/nvidia* files to create are read
# from the node's lines of /etc/slurm/gres.conf and the files it Includes
# (docker/fake_gpus.py), so the device set follows the rendered config.
# slurmd runs as `slurmd` (argv[0] matters to Slurm) in the foreground; extra
# arguments are passed to it.
#   GPUSHARE_FAKE_GPUS=0   make no device files
#   GPUSHARE_NODE_SETUP=0  skip docker/node-setup.sh (fake NVML, MIG, gres include)
#   GPUSHARE_NODE_EXPORTER=0  do not start prometheus-node-exporter
# prometheus-node-exporter (:9100) runs in the background with the textfile
# collector on the directory node-setup.sh found in the policy (cluster.metrics.
# textfile_dir; Debian's /var/lib/prometheus/node-exporter when unset) and the
# cpu and meminfo collectors only: the others read host or privileged files
# that make no sense, or fail, in a container. Log: /var/log/node-exporter.log.
set -euo pipefail
LIB=/usr/local/lib/gpushare-docker
NODE=${SLURMD_NODENAME:-$(hostname -s)}
say() { echo "gpushare-node[$NODE]: $*" >&2; }

for _ in $(seq 1 120); do [[ -s /etc/slurm/slurm.conf ]] && break; sleep 0.5; done
[[ -s /etc/slurm/slurm.conf ]] || { say "no /etc/slurm/slurm.conf"; exit 1; }
"$LIB/entrypoint.sh" dirs

# GPUSHARE_CGROUP_PARENT (testcluster/compose.py, cgroup v1 hosts): /sys/fs/cgroup/<hierarchy> here is the
# project's own cgroup of the host, made empty by docker at the first mount. Its cpuset gets this node's CPUs
# and memory nodes (a child cpuset without them takes no task), and what an earlier container of this node
# left below it goes (rmdir: only empty cgroups, deepest first), so job ids that start again at 1 meet none.
if [[ -n ${GPUSHARE_CGROUP_PARENT:-} ]]; then
  cs=/sys/fs/cgroup/cpuset
  [[ -n $(cat "$cs/cpuset.cpus") ]] || awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status >"$cs/cpuset.cpus"
  [[ -n $(cat "$cs/cpuset.mems") ]] || awk '/^Mems_allowed_list:/ {print $2}' /proc/self/status >"$cs/cpuset.mems"
  for d in /sys/fs/cgroup/*/"slurm_$NODE"; do
    [[ -d $d ]] && { find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  done
  say "cgroups under the host's $GPUSHARE_CGROUP_PARENT (cpuset $(cat "$cs/cpuset.cpus") mems $(cat "$cs/cpuset.mems"))"
fi

if [[ ${GPUSHARE_NODE_SETUP:-1} == 1 ]]; then
  "$LIB/node-setup.sh" || { say "node setup failed"; exit 1; }
fi

if [[ ${GPUSHARE_FAKE_GPUS:-1} == 1 && -f /etc/slurm/gres.conf ]]; then
  rc=0; python3 "$LIB/fake_gpus.py" --gres-conf /etc/slurm/gres.conf --node "$NODE" || rc=$?
  if ((rc == 3)); then say "gres.conf Includes a file that does not exist; not starting slurmd"; exit 1; fi
  ((rc == 0)) || exit "$rc"
fi

if [[ ${GPUSHARE_NODE_EXPORTER:-1} == 1 ]]; then
  if command -v prometheus-node-exporter >/dev/null; then
    textfile_dir=/var/lib/prometheus/node-exporter
    [[ -s /run/gpushare-textfile-dir ]] && textfile_dir=$(cat /run/gpushare-textfile-dir)
    mkdir -p "$textfile_dir"
    prometheus-node-exporter --web.listen-address=:9100 --collector.disable-defaults \
      --collector.textfile --collector.textfile.directory="$textfile_dir" \
      --collector.cpu --collector.meminfo >>/var/log/node-exporter.log 2>&1 &
    say "prometheus-node-exporter on :9100, textfile directory $textfile_dir (pid $!)"
  else
    say "no prometheus-node-exporter in this image; not started"
  fi
fi

# A job container (JobContainerType / NamespaceType: per-job MIG isolation) binds each job's new mount namespace
# file under BasePath, and the kernel refuses that bind (EINVAL, "ns base mount failed") unless the new namespace's
# id is above that of slurmd's own namespace (fs/namespace.c mnt_ns_loop). On a real node slurmd runs in the
# initial namespace, the lowest id; in this container its namespace is one of many on the host, and Linux 6.18
# hands namespace ids out from per-CPU ranges, so a job's namespace made on another CPU can get a lower id than
# the container's (seen: ids 12278-12287 refused beside the container's 15337, 15357 and up accepted). Before
# slurmd starts, each CPU makes throwaway namespaces until it hands out ids above the container's.
if grep -Eq '^(JobContainerType|NamespaceType)=' /etc/slurm/slurm.conf 2>/dev/null; then
  python3 - <<'PY' || say "could not raise the mount namespace ids (jobs may fail: ns base mount failed)"
import fcntl, os, struct, sys
NS_GET_MNTNS_ID = (2 << 30) | (8 << 16) | (0xB7 << 8) | 5  # _IOR(0xb7, 5, __u64), Linux 6.10+
def ns_id(path="/proc/self/ns/mnt"):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, NS_GET_MNTNS_ID, buf)
        return struct.unpack("Q", buf)[0]
    finally:
        os.close(fd)
try:
    own = ns_id()
except OSError:
    sys.exit(0)  # an older kernel: ids are one sequence, always above the container's
made = 0
for cpu in sorted(os.sched_getaffinity(0)):
    os.sched_setaffinity(0, {cpu})
    for _ in range(20000):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.unshare(os.CLONE_NEWNS)
            os.write(w, struct.pack("Q", ns_id()))
            os._exit(0)
        got = struct.unpack("Q", os.read(r, 8))[0]
        os.waitpid(pid, 0); os.close(r); os.close(w)
        made += 1
        if got > own:
            break
print(f"gpushare-node: {made} throwaway mount namespaces; new ids are above this container's ({own})", file=sys.stderr)
PY
fi

"$LIB/entrypoint.sh" munged
args=(-D)
[[ -n ${SLURMD_NODENAME:-} ]] && args+=(-N "$SLURMD_NODENAME")
# With no extra arguments (the node service), slurmd is started again when it dies after running a while,
# and its jobs' slurmstepd processes live on: what a real node's slurmd.service does with KillMode=process
# (Debian's unit) and Restart=on-failure. One that fails within 10 s of its start (a bad config) is not
# retried: the container exits with its status. A stop signal goes to slurmd and ends the loop. Extra
# arguments (slurmd -G, -vvv) run slurmd once, as it is.
(($# > 0)) && exec slurmd "${args[@]}" "$@"
pid=
trap '[[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null; [[ -n $pid ]] && wait "$pid"; exit 0' TERM INT
while :; do
  started=$SECONDS
  slurmd "${args[@]}" &
  pid=$!
  rc=0; wait "$pid" || rc=$?
  ((rc == 0)) && exit 0
  if ((SECONDS - started < 10)); then say "slurmd exited $rc within 10 s of its start; not starting it again"; exit "$rc"; fi
  say "slurmd exited $rc; starting it again in 1 s"
  sleep 1
done
