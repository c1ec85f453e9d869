#!/usr/bin/env bash
# Build everything the dockerized Slurm test cluster needs, from nothing.
#
#   docker/bootstrap.sh [--install] [--no-wheel] [--rebuild-base]
#
# Idempotent: every step checks first and is skipped when already done
# (base image present, pyslurm wheel cached, docker layer cache for the
# project images). Independent steps run side by side (the two Debian bases;
# then the Slurm, MariaDB and Prometheus images); a table of the steps' times
# ends the output.
#
#   --install       install docker.io docker-compose mmdebstrap with apt when
#                   missing (no recommends; apparmor where the kernel has it
#                   and apparmor_parser is missing), and start `dockerd
#                   --iptables=false` (overlay2, then vfs) when `docker info`
#                   fails; log /var/log/dockerd.log
#   --no-wheel      build the Slurm image without slurm-gpushare, under its
#                   own tag gpushare-slurm:<SLURM_SUITE>-plain (passes
#                   --build-arg GPUSHARE_WHEEL=none): Slurm, munge, the fake
#                   GPU tools and the test users, no /opt/gpushare, no pyslurm;
#                   the image of a site's own Slurm before it installs the
#                   package (tests/cluster/test_install_plain_slurm.py). The
#                   default image gpushare-slurm:<SLURM_SUITE> is left as it is.
#   --rebuild-base  re-make debian:<suite>-slim even when it exists
#
# Environment:
#   SLURM_SUITE     Debian suite of the Slurm image: trixie (default, Slurm
#                   24.11) or sid (Slurm 26.05)
#   MARIADB_SUITE   Debian suite of the MariaDB image (default bookworm:
#                   trixie's MariaDB 11.8 breaks slurmdbd 24.11)
#   DEBIAN_MIRROR   mirror for the bases (default http://deb.debian.org/debian)
#   PYSLURM_ARCHIVE pyslurm source archive (default: ../shared/vendor/pyslurm-*.tar.gz
#                   beside the checkout); its wheel is built once per archive
#                   and suite in gpushare-pyslurm-build:<suite>
#                   (Dockerfile.pyslurm), kept in docker/.build/pyslurm-cache/,
#                   and installed into the Slurm image when its X.Y is the
#                   image's Slurm (24.11: trixie; none exists for sid's 26.05)
#   GPUSHARE_PYSLURM  when the pyslurm wheel is not cached yet:
#                   background (default): the images are built without it at
#                   once, and a detached job builds the wheel, then reruns this
#                   script to add it to the Slurm image (log
#                   docker/.build/pyslurm-background.log; it waits for
#                   /tmp/gpushare-image-build.lock, the lock `gpushare
#                   testcluster` builds under);
#                   wait (default under pytest, PYTEST_CURRENT_TEST set): build
#                   it first, so that the Slurm image has it when this ends;
#                   skip: no pyslurm
#
# Images produced: debian:<suite>-slim (bases, from mmdebstrap, else debootstrap),
# gpushare-slurm:<SLURM_SUITE> (with --no-wheel: gpushare-slurm:<SLURM_SUITE>-plain),
# gpushare-mariadb:<MARIADB_SUITE>,
# gpushare-prometheus:trixie (Debian's prometheus; trixie whatever SLURM_SUITE,
# the test cluster's Prometheus server when a project asks for one),
# gpushare-pyslurm-build:<SLURM_SUITE> (the pyslurm wheel's builder).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BUILD=$HERE/.build
SUITE=${SLURM_SUITE:-trixie}
DB_SUITE=${MARIADB_SUITE:-bookworm}
PROM_SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_LOCK=/tmp/gpushare-image-build.lock
INSTALL=0 WHEEL=1 REBUILD_BASE=0
T0=$EPOCHREALTIME

WHEEL_ONLY=()
[[ ${1:-} == --pyslurm-wheel-only ]] && { WHEEL_ONLY=("$2" "$3"); shift 3; }  # the background job's first half
for arg in "$@"; do
  case $arg in
    --install) INSTALL=1 ;;
    --no-wheel) WHEEL=0 ;;
    --rebuild-base) REBUILD_BASE=1 ;;
    -h|--help) sed -n '2,54p' "$0"; exit 0 ;;
    *) echo "bootstrap: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
PYSLURM=${GPUSHARE_PYSLURM:-}
[[ -n $PYSLURM ]] || { [[ -n ${PYTEST_CURRENT_TEST:-} ]] && PYSLURM=wait || PYSLURM=background; }

log() { printf '[bootstrap %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case $SUITE in trixie|sid|bookworm) ;; *) die "SLURM_SUITE must be trixie, sid or bookworm, not '$SUITE'";; esac
case $PYSLURM in wait|background|skip) ;; *) die "GPUSHARE_PYSLURM must be wait, background or skip, not '$PYSLURM'";; esac

# ---- timing ----------------------------------------------------------------
declare -A T_START T_END T_NOTE
declare -a T_ORDER=()
now() { local t=$EPOCHREALTIME; echo "${t/,/.}"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
mark_start() { T_ORDER+=("$1"); T_START[$1]=$(now); }
mark_end() { T_END[$1]=$(now); T_NOTE[$1]=${2:-}; }

timing_table() {
  local t0=${T0/,/.} name
  printf '\n[bootstrap] step times (s from the start of bootstrap.sh; %s CPUs)\n' "$(nproc)" >&2
  printf '  %-34s %7s %7s %7s  %s\n' step start end took note >&2
  for name in "${T_ORDER[@]}"; do
    [[ -n ${T_END[$name]:-} ]] || continue
    printf '  %-34s %7s %7s %7s  %s\n' "$name" "$(elapsed "$t0" "${T_START[$name]}")" \
      "$(elapsed "$t0" "${T_END[$name]}")" "$(elapsed "${T_START[$name]}" "${T_END[$name]}")" \
      "${T_NOTE[$name]}" >&2
  done
  printf '  %-34s %7s %7s %7s\n' total 0.0 "$(elapsed "$t0" "$(now)")" "$(elapsed "$t0" "$(now)")" >&2
  printf '  %s; load average %s\n' "$PYSLURM_NOTE" "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
}

# ---- host: apt, dockerd ----------------------------------------------------
install_tools() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  ((${#missing[@]})) || return 0
  # dockerd loads its AppArmor profile with apparmor_parser where the kernel has AppArmor
  [[ -d /sys/kernel/security/apparmor ]] && ! command -v apparmor_parser >/dev/null && missing+=(apparmor)
  log "apt-get install --no-install-recommends ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

start_dockerd() {
  docker info >/dev/null 2>&1 && return 0
  local driver
  for driver in overlay2 vfs; do
    log "starting dockerd --iptables=false --storage-driver=$driver (log /var/log/dockerd.log)"
    nohup dockerd --iptables=false --storage-driver="$driver" >>/var/log/dockerd.log 2>&1 &
    local pid=$! i
    for i in $(seq 1 30); do
      if docker info >/dev/null 2>&1; then log "dockerd up ($driver, pid $pid)"; return 0; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  die "dockerd did not start; see /var/log/dockerd.log"
}

# ---- steps (each runs in the background, its output in docker/.build/step-*.log) ----
base_tmpdir() {  # a tmpfs for the rootfs when there is room: dpkg's writes stay in memory
  local free
  free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [[ -w /dev/shm && ${free:-0} -gt 2000000 ]]; then echo /dev/shm; else echo "${TMPDIR:-/tmp}"; fi
}

step_base() {  # suite: debian:<suite>-slim, minbase, apt without recommends, dpkg without fsync
  local suite=$1 tag="debian:$1-slim"
  if command -v mmdebstrap >/dev/null; then
    TMPDIR=$(base_tmpdir) mmdebstrap --variant=minbase --mode=root --format=tar \
      --dpkgopt=force-unsafe-io \
      --aptopt='APT::Install-Recommends "false"' --aptopt='APT::Install-Suggests "false"' \
      --aptopt='Acquire::Check-Valid-Until "false"' \
      "$suite" - "$MIRROR" | docker import -c 'CMD ["/bin/bash"]' - "$tag"
    return
  fi
  command -v debootstrap >/dev/null || die "neither mmdebstrap nor debootstrap installed (run with --install)"
  local dir
  dir=$(mktemp -d "$(base_tmpdir)/gpushare-rootfs-$suite.XXXXXX")
  debootstrap --variant=minbase "$suite" "$dir" "$MIRROR"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$dir/etc/apt/apt.conf.d/90gpushare-norecommends"
  # sid's Release expires within days; a snapshot mirror or a clock ahead of it breaks apt.
  echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/90gpushare-snapshot"
  echo force-unsafe-io >"$dir/etc/dpkg/dpkg.cfg.d/90gpushare-unsafe-io"
  tar -C "$dir" -c . | docker import -c 'CMD ["/bin/bash"]' - "$tag"
  rm -rf "$dir"
}

pip_ca() {  # the CA bundle the host's pip trusts (a TLS-intercepting proxy's CA, say), if any
  local ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
  [[ -n $ca && -f $ca ]] && echo "$ca"
  return 0
}

wheel_sources_sum() {  # a checksum of what goes into the wheel (pyproject.toml's [tool.hatch.build.targets.wheel])
  (cd "$REPO" && find pyproject.toml README.md slurm_gpushare templates etc -type f \
     ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null | sort -z | xargs -0 sha256sum | sha256sum)
}

step_wheel() {  # docker/.build/wheel/: the project's wheel (built when its sources changed); docker/.build/deps/: its dependencies
  [[ -f $REPO/pyproject.toml ]] || die "no $REPO/pyproject.toml: cannot build the slurm-gpushare wheel (use --no-wheel)"
  local sum
  sum=$(wheel_sources_sum)
  if [[ $sum == "$(cat "$BUILD/wheel.sum" 2>/dev/null)" ]] && ls "$BUILD"/wheel/*.whl >/dev/null 2>&1; then
    echo "wheel: sources unchanged since $(ls "$BUILD"/wheel/*.whl)"
  else
    rm -rf "$BUILD/wheel.new" "$BUILD/wheel.sum"
    python3 -m pip wheel -q --no-deps -w "$BUILD/wheel.new" "$REPO"
    ls "$BUILD"/wheel.new/*.whl >/dev/null || die "pip wheel produced no wheel"
    rm -rf "$BUILD/wheel" && mv "$BUILD/wheel.new" "$BUILD/wheel"
    echo "$sum" >"$BUILD/wheel.sum"
  fi
  mkdir -p "$BUILD/deps"
  # written only when it differs: an unchanged file keeps the image's dependency layer cached
  python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$REPO/pyproject.toml" >"$BUILD/deps/requirements.new"
  cmp -s "$BUILD/deps/requirements.new" "$BUILD/deps/requirements.txt" \
    && rm "$BUILD/deps/requirements.new" || mv "$BUILD/deps/requirements.new" "$BUILD/deps/requirements.txt"
  local ca
  ca=$(pip_ca)
  # only in the build context; the layer removes it after pip runs
  if [[ -n $ca ]]; then cmp -s "$ca" "$BUILD/deps/pip-ca.pem" || cp "$ca" "$BUILD/deps/pip-ca.pem"; fi
}

build_image() {  # tag dockerfile build-args... (CPU_SHARES: the build containers' CPU weight, default 1024)
  local tag=$1 file=$2 line; shift 2
  DOCKER_BUILDKIT=0 docker build --force-rm --network host --cpu-shares "${CPU_SHARES:-1024}" "$@" \
    -t "$tag" -f "$HERE/$file" "$HERE" | while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done
}

# ---- pyslurm ---------------------------------------------------------------
pyslurm_archive() {
  local src=${PYSLURM_ARCHIVE:-}
  [[ -n $src ]] || src=$(ls "$REPO"/../shared/vendor/pyslurm-*.tar.gz 2>/dev/null | head -n1 || true)
  [[ -n $src && -f $src ]] && echo "$src"
  return 0
}

pyslurm_cache_dir() {  # docker/.build/pyslurm-cache/<archive sha>-<suite>: the wheel, or NONE
  local archive=$1 sum
  sum=$(sha256sum "$archive" | cut -c1-16)
  echo "$BUILD/pyslurm-cache/$sum-$SUITE"
}

pyslurm_state() {  # ready | none | missing
  local dir=$1
  if ls "$dir"/pyslurm-*.whl >/dev/null 2>&1; then echo ready
  elif [[ -f $dir/NONE ]]; then echo none
  else echo missing; fi
}

step_pyslurm() {  # archive dir: the wheel into dir (once: a second caller waits on the first's lock)
  local archive=$1 dir=$2 rc=0
  mkdir -p "$dir"
  exec 8>"$dir.lock"
  if ! flock -n 8; then
    # a background build at the lowest CPU weight is under way, and this run waits for it: its full weight now
    docker ps -q --filter label=gpushare-pyslurm-build | xargs -r docker update --cpu-shares 1024 >/dev/null || true
    flock 8
  fi
  [[ $(pyslurm_state "$dir") == missing ]] || return 0
  # the suite's Slurm X.Y from its base and the mirror, before the builder is built (sid: 26.05, no pyslurm)
  local want have
  want=$(basename "$archive" | sed -E 's/^pyslurm-([0-9]+\.[0-9]+).*/\1/')
  have=$(docker run --rm --network host "debian:$SUITE-slim" bash -c \
    'apt-get update -qq >/dev/null && apt-cache show --no-all-versions libslurm-dev | sed -n "s/^Version: //p"' | cut -d. -f1,2)
  if [[ -n $have && $have != "$want" ]]; then
    echo "pyslurm: $(basename "$archive") is for Slurm $want, $SUITE has Slurm $have: no pyslurm"
    touch "$dir/NONE"
    return 0
  fi
  CPU_SHARES=${PYSLURM_CPU_SHARES:-1024} build_image "gpushare-pyslurm-build:$SUITE" Dockerfile.pyslurm --build-arg SUITE="$SUITE"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  docker run --rm --network none --cpu-shares "${PYSLURM_CPU_SHARES:-1024}" --label gpushare-pyslurm-build \
    -v "$archive:/src/$(basename "$archive"):ro" -v "$dir.tmp:/out" \
    "gpushare-pyslurm-build:$SUITE" "/src/$(basename "$archive")" /out || rc=$?
  if ((rc == 3)); then touch "$dir/NONE"; rm -rf "$dir.tmp"; return 0; fi
  ((rc == 0)) || die "pyslurm wheel build failed (exit $rc)"
  docker run --rm --network none --entrypoint dpkg-query "gpushare-pyslurm-build:$SUITE" -W -f '${Version}' libslurm-dev \
    >"$dir.tmp/slurm-version"
  mv "$dir.tmp"/* "$dir/" && rmdir "$dir.tmp"
}

stage_pyslurm() {  # docker/.build/pyslurm/: the cached wheel and the Slurm version it was built for, or nothing
  local dir=${1:-} stage="$BUILD/pyslurm"
  mkdir -p "$stage"
  if [[ -n $dir && $(pyslurm_state "$dir") == ready ]]; then
    local whl f
    whl=$(ls "$dir"/pyslurm-*.whl | head -n1)
    for f in "$stage"/*; do [[ ! -e $f || $f == */slurm-version || $f == "$stage/$(basename "$whl")" ]] || rm -f "$f"; done
    # copied only when it differs: an unchanged file keeps the layer cached
    for f in "$whl" "$dir/slurm-version"; do cmp -s "$f" "$stage/$(basename "$f")" || cp -p "$f" "$stage/"; done
  else
    rm -f "$stage"/*
  fi
}

pyslurm_background() {  # archive dir: detached: build the wheel, then rebuild the images with it
  local archive=$1 dir=$2 logf="$BUILD/pyslurm-background.log" args=()
  ((REBUILD_BASE)) && args+=(--rebuild-base)
  mkdir -p "$(dirname "$dir")"
  if ! flock -n "$dir.bg" true; then
    log "pyslurm wheel: a background job is already building it (log $logf)"
    return 0
  fi
  log "pyslurm wheel not cached: building it in the background (log $logf); the Slurm image gets it when done"
  # Detached, with no file descriptor but 0-2 (a caller's `flock LOCK bootstrap.sh` would hand it the image
  # build lock, which it would then hold while it waits), and the lowest CPU share: the images come first.
  setsid -f env PYSLURM_CPU_SHARES=2 GPUSHARE_PYSLURM=wait SLURM_SUITE="$SUITE" bash -c '
      for fd in $(ls /proc/$$/fd); do ((fd > 2)) && eval "exec $fd>&-"; done
      exec flock "$3.bg" bash -c "bash \"\$1\" --pyslurm-wheel-only \"\$2\" \"\$3\" && flock \"\$4\" bash \"\$1\" \"\${@:5}\"" _ "$@"
    ' _ "$HERE/bootstrap.sh" "$archive" "$dir" "$IMAGE_LOCK" "${args[@]}" >>"$logf" 2>&1 </dev/null
}

# ---- the step graph ----------------------------------------------------------
declare -A DEPS=() CMDS=() STATE=() PIDS=() BASE_STEP=()
declare -a STEPS=()
add_step() {  # name "deps" [VAR=value...] command...
  local name=$1 deps=$2; shift 2
  STEPS+=("$name"); DEPS[$name]=$deps; CMDS[$name]=$(printf '%q ' "$@"); STATE[$name]=pending
}

launch() {
  local name=$1 logf="$BUILD/step-${1//[:\/]/_}.log"
  mark_start "$name"
  log "$name: started (log $logf)"
  ( eval "${CMDS[$name]}" ) >"$logf" 2>&1 &
  PIDS[$!]=$name STATE[$name]=running
}

ready() {  # 0: every dependency ok; 1: one not yet; 2: one failed
  local d
  for d in ${DEPS[$1]}; do
    case ${STATE[$d]} in ok) ;; failed|blocked) return 2 ;; *) return 1 ;; esac
  done
}

run_graph() {  # FAILED=1 when a step failed (never returns non-zero: a caller's `||` would turn off set -e in the steps)
  local name pid rc failed=0 running
  while :; do
    running=0
    for name in "${STEPS[@]}"; do
      [[ ${STATE[$name]} == pending ]] || { [[ ${STATE[$name]} == running ]] && running=1; continue; }
      rc=0; ready "$name" || rc=$?
      case $rc in 0) launch "$name"; running=1 ;; 2) STATE[$name]=blocked; failed=1 ;; esac
    done
    ((running)) || break
    rc=0; wait -n -p pid || rc=$?
    name=${PIDS[$pid]}
    if ((rc == 0)); then
      STATE[$name]=ok; mark_end "$name"; log "$name: done"
    else
      STATE[$name]=failed; mark_end "$name" "FAILED (exit $rc)"; failed=1
      tail -30 "$BUILD/step-${name//[:\/]/_}.log" >&2
      log "$name: FAILED (exit $rc; log $BUILD/step-${name//[:\/]/_}.log)"
    fi
  done
  FAILED=$failed
}

add_base() {  # suite: the step that makes debian:<suite>-slim, unless it exists (BASE_STEP[suite]: its name or "")
  local suite=$1
  [[ -z ${BASE_STEP[$suite]+set} ]] || return 0
  BASE_STEP[$suite]=""
  if ((REBUILD_BASE)) || ! docker image inspect "debian:$suite-slim" >/dev/null 2>&1; then
    add_step "base:$suite" "" step_base "$suite"
    BASE_STEP[$suite]="base:$suite"
  fi
}

plan() {  # the graph for this run
  local bs bdb bp wheel_dep="" py_dep="" archive dir state suite
  for suite in "$SUITE" "$DB_SUITE" "$PROM_SUITE"; do add_base "$suite"; done
  bs=${BASE_STEP[$SUITE]} bdb=${BASE_STEP[$DB_SUITE]} bp=${BASE_STEP[$PROM_SUITE]}
  mkdir -p "$BUILD/wheel" "$BUILD/deps"
  if ((WHEEL)); then add_step wheel "" step_wheel; wheel_dep=wheel; fi
  archive=$(pyslurm_archive)
  PYSLURM_NOTE="no pyslurm archive (../shared/vendor/ or \$PYSLURM_ARCHIVE)"
  ((WHEEL)) || PYSLURM_NOTE="--no-wheel: no pyslurm"
  [[ $PYSLURM != skip ]] || PYSLURM_NOTE="GPUSHARE_PYSLURM=skip: no pyslurm"
  STAGE_DIR=""
  if ((WHEEL)) && [[ -n $archive && $PYSLURM != skip ]]; then
    dir=$(pyslurm_cache_dir "$archive"); state=$(pyslurm_state "$dir")
    PYSLURM_NOTE="pyslurm: $state ($dir)"
    STAGE_DIR=$dir
    if [[ $state == missing && $PYSLURM == wait ]]; then
      add_step pyslurm "$bs" step_pyslurm "$archive" "$dir"; py_dep=pyslurm
    elif [[ $state == missing ]]; then
      add_step pyslurm-background "$bs" pyslurm_background "$archive" "$dir"
      PYSLURM_NOTE="pyslurm: building in the background (docker/.build/pyslurm-background.log)"
    fi
  fi
  local args=(--build-arg SUITE="$SUITE" --build-arg GPUSHARE_WHEEL=required)
  ((WHEEL)) || args=(--build-arg SUITE="$SUITE" --build-arg GPUSHARE_WHEEL=none)
  add_step "image:$SLURM_TAG" "$bs $wheel_dep $py_dep" step_slurm_image "${args[@]}"
  # the Slurm image is the longest: the others build beside it at a lower CPU weight
  add_step "image:gpushare-mariadb:$DB_SUITE" "$bdb" CPU_SHARES=512 \
    build_image "gpushare-mariadb:$DB_SUITE" Dockerfile.mariadb --build-arg SUITE="$DB_SUITE"
  add_step "image:gpushare-prometheus:$PROM_SUITE" "$bp" CPU_SHARES=256 \
    build_image "gpushare-prometheus:$PROM_SUITE" Dockerfile.prometheus --build-arg SUITE="$PROM_SUITE"
}

step_slurm_image() {  # build-args...
  stage_pyslurm "$STAGE_DIR"
  build_image "$SLURM_TAG" Dockerfile "$@"
  grep -h '^pyslurm: ' "$BUILD/step-image_${SLURM_TAG//[:\/]/_}.log" 2>/dev/null | tail -n1 || true
}

# ---- main ------------------------------------------------------------------
# One function, called on the last line: bash has read the whole file before it runs, so an edit
# of this file while a run (the detached pyslurm job's, say) is under way does not change that run.
main() {
  mkdir -p "$BUILD"
  if ((${#WHEEL_ONLY[@]})); then  # pyslurm_background's first half
    step_pyslurm "${WHEEL_ONLY[@]}"
    exit 0
  fi
  if ((INSTALL)); then
    mark_start "apt: docker.io docker-compose mmdebstrap"; install_tools; mark_end "apt: docker.io docker-compose mmdebstrap"
    mark_start dockerd; start_dockerd; mark_end dockerd
  fi
  docker info >/dev/null 2>&1 || die "docker daemon not reachable (run with --install to start one)"
  command -v docker-compose >/dev/null || log "warning: docker-compose not installed (run with --install)"

  # the image without the package has a tag of its own: never the one the other clusters run
  SLURM_TAG="gpushare-slurm:$SUITE"
  ((WHEEL)) || SLURM_TAG="gpushare-slurm:$SUITE-plain"
  plan
  log "$PYSLURM_NOTE"
  FAILED=0
  run_graph
  timing_table
  ((FAILED == 0)) || die "a step failed (above)"
  log "done: $SLURM_TAG gpushare-mariadb:$DB_SUITE gpushare-prometheus:$PROM_SUITE"
}

main "$@"; exit $?
