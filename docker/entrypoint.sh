#!/bin/bash
# Entrypoint of the gpushare-slurm image. First argument is the role:
#   munge-key   one-shot: create /etc/munge/munge.key in its volume if absent
#   config      one-shot: copy the rendered config (/conf-src, a bind mount of
#               $GPUSHARE_CONF_DIR) into the /etc/slurm volume; add a test
#               slurmdbd.conf unless the rendered dir has one
#   slurmdbd    munged + slurmdbd -D
#   slurmctld   munged, register the cluster in slurmdbd if absent, slurmctld -D
#   munged      start munged (daemonised) and return
#   dirs        create the spool/state/log/pid directories slurm.conf names
#   wait-nodes  [SECONDS] wait until every node is idle in sinfo (exit 1 on timeout)
#   slurmd      fake GPU devices from gres.conf, munged, slurmd -D (entrypoint-node.sh)
#   other       munged (when a key exists), then exec the command (e.g. bash)
# Extra arguments after a daemon role go to the daemon (e.g. slurmd -vvv).
set -euo pipefail
LIB=/usr/local/lib/gpushare-docker
say() { echo "gpushare-entrypoint[$ROLE]: $*" >&2; }

wait_for() {  # seconds description test...
  local secs=$1 what=$2; shift 2
  local i
  for ((i = 0; i < secs * 2; i++)); do "$@" && return 0; sleep 0.5; done
  say "timed out after ${secs}s waiting for $what"; return 1
}

start_munge() {
  wait_for 60 /etc/munge/munge.key test -s /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
  fi
  wait_for 10 munged sh -c 'munge -n | unmunge >/dev/null 2>&1'
}

wait_conf() { wait_for 60 /etc/slurm/slurm.conf test -s /etc/slurm/slurm.conf; }

conf_value() {  # key: value from slurm.conf, last wins, case-insensitive key
  awk -F= -v k="$(echo "$1" | tr A-Z a-z)" '
    { sub(/#.*/, ""); gsub(/^[ \t]+|[ \t]+$/, "") }
    tolower($1) == k { v = $2; sub(/[ \t].*/, "", v) } END { print v }' /etc/slurm/slurm.conf
}

ensure_dirs() {  # directories slurm.conf names: spool, state, log and pid dirs
  local d
  d=$(conf_value StateSaveLocation); d=${d:-/var/spool/slurmctld}
  mkdir -p "$d"; chown slurm:slurm "$d"
  d=$(conf_value SlurmdSpoolDir); d=${d:-/var/spool/slurmd}
  mkdir -p "$d"
  local key
  for key in SlurmctldLogFile SlurmdLogFile SlurmSchedLogFile SlurmctldPidFile SlurmdPidFile; do
    d=$(conf_value "$key")
    [[ -n $d ]] || continue
    d=$(dirname "$d")
    [[ -d $d ]] || { mkdir -p "$d"; chown slurm:slurm "$d"; }
  done
  chown slurm:slurm /var/log/slurm
}

ROLE=${1:-bash}
[[ $# -gt 0 ]] && shift

case $ROLE in
munge-key)
  if [[ -s /etc/munge/munge.key ]]; then
    say "munge.key present"
  else
    mungekey --create --keyfile=/etc/munge/munge.key
    say "munge.key created"
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  ;;
config)
  src=${GPUSHARE_CONF_SRC:-/conf-src}
  [[ -s $src/slurm.conf ]] || { say "no slurm.conf in $src (set GPUSHARE_CONF_DIR to a rendered config dir)"; exit 1; }
  # Keep gres.d: each node mounts its own tmpfs there (its MIG include); deleting
  # the mount point under a running node makes a reconfigure fail to find it.
  mkdir -p /etc/slurm/gres.d
  find /etc/slurm -mindepth 1 -maxdepth 1 ! -name gres.d -exec rm -rf {} +
  cp -rL "$src"/. /etc/slurm/
  if [[ ! -f /etc/slurm/slurmdbd.conf ]]; then
    cat >/etc/slurm/slurmdbd.conf <<CONF
# test-cluster slurmdbd.conf, written by docker/entrypoint.sh (config role)
AuthType=auth/munge
DbdHost=${SLURMDBD_HOST:-slurmdbd}
DbdPort=6819
SlurmUser=slurm
PidFile=/run/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=${SLURMDB_HOST:-mariadb}
StoragePort=3306
StorageLoc=${SLURMDB_NAME:-slurm_acct_db}
StorageUser=${SLURMDB_USER:-slurm}
StoragePass=${SLURMDB_PASSWORD:-gpushare-test}
CONF
  fi
  chown -R root:root /etc/slurm
  find /etc/slurm -type d -exec chmod 0755 {} + ; find /etc/slurm -type f -exec chmod 0644 {} +
  find /etc/slurm -type f \( -name '*.sh' -o -name '*prolog*' -o -name '*epilog*' \) -exec chmod 0755 {} +
  chown slurm:slurm /etc/slurm/slurmdbd.conf; chmod 0600 /etc/slurm/slurmdbd.conf
  say "config copied from $src: $(cd /etc/slurm && echo *)"
  ;;
slurmdbd)
  start_munge
  wait_for 60 /etc/slurm/slurmdbd.conf test -s /etc/slurm/slurmdbd.conf
  exec slurmdbd -D "$@"
  ;;
slurmctld)
  start_munge; wait_conf; ensure_dirs
  cluster=$(conf_value ClusterName)
  if [[ $(conf_value AccountingStorageType) == accounting_storage/slurmdbd && -n $cluster ]]; then
    wait_for 120 "slurmdbd (sacctmgr show cluster)" sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$cluster"; then
      sacctmgr -i add cluster "$cluster" >&2
      say "cluster $cluster registered in slurmdbd"
    fi
  fi
  exec slurmctld -D "$@"
  ;;
slurmd)
  exec "$LIB/entrypoint-node.sh" "$@"
  ;;
munged)
  start_munge
  ;;
dirs)
  wait_conf; ensure_dirs
  ;;
wait-nodes)  # [SECONDS]: until every node in sinfo is idle (run in slurmctld)
  secs=${1:-120} states=
  for ((i = 0; i < secs; i++)); do
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
    if [[ -n $states ]] && ! grep -qv ' idle$' <<<"$states"; then
      echo "all nodes idle after ${i}s: $(echo $states)"; exit 0
    fi
    sleep 1
  done
  echo "not all nodes idle after ${secs}s:" >&2; echo "$states" >&2; exit 1
  ;;
*)
  if [[ -s /etc/munge/munge.key ]]; then start_munge; fi
  exec "$ROLE" "$@"
  ;;
esac
