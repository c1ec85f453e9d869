#!/usr/bin/env bash
# Build everything the dockerized Slurm test cluster needs, from nothing.
#
#   docker/bootstrap.sh [--install] [--no-wheel] [--rebuild-base] [--pull-none]
#
# Idempotent: every step checks first and is skipped when already done
# (base image present, docker layer cache for the project images).
#
#   --install       install docker.io docker-compose debootstrap with apt when
#                   missing, and start `dockerd --iptables=false` (overlay2,
#                   then vfs) when `docker info` fails; log /var/log/dockerd.log
#   --no-wheel      build the Slurm image without slurm-gpushare, under its
#                   own tag gpushare-slurm:<SLURM_SUITE>-plain (passes
#                   --build-arg GPUSHARE_WHEEL=none): Slurm, munge, the fake
#                   GPU tools and the test users, no /opt/gpushare; the image
#                   of a site's own Slurm before it installs the package
#                   (tests/cluster/test_install_plain_slurm.py). The default
#                   image gpushare-slurm:<SLURM_SUITE> is left as it is.
#   --rebuild-base  re-run debootstrap even when debian:<suite>-slim exists
#
# Environment:
#   SLURM_SUITE     Debian suite of the Slurm image: trixie (default, Slurm
#                   24.11) or sid (Slurm 26.05)
#   MARIADB_SUITE   Debian suite of the MariaDB image (default bookworm:
#                   trixie's MariaDB 11.8 breaks slurmdbd 24.11)
#   DEBIAN_MIRROR   mirror for debootstrap (default http://deb.debian.org/debian)
#   PYSLURM_ARCHIVE pyslurm source archive to build into the Slurm image
#                   (default: ../shared/vendor/pyslurm-*.tar.gz beside the
#                   checkout; built only when its X.Y is the image's Slurm)
#
# Images produced: debian:<suite>-slim (base, from debootstrap),
# gpushare-slurm:<SLURM_SUITE> (with --no-wheel: gpushare-slurm:<SLURM_SUITE>-plain),
# gpushare-mariadb:<MARIADB_SUITE>,
# gpushare-prometheus:trixie (Debian's prometheus; trixie whatever SLURM_SUITE,
# the test cluster's Prometheus server when a project asks for one).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
SUITE=${SLURM_SUITE:-trixie}
DB_SUITE=${MARIADB_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
INSTALL=0 WHEEL=1 REBUILD_BASE=0

for arg in "$@"; do
  case $arg in
    --install) INSTALL=1 ;;
    --no-wheel) WHEEL=0 ;;
    --rebuild-base) REBUILD_BASE=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bootstrap: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '[bootstrap %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case $SUITE in trixie|sid|bookworm) ;; *) die "SLURM_SUITE must be trixie, sid or bookworm, not '$SUITE'";; esac

install_tools() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
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

ensure_base() {  # debian:<suite>-slim from debootstrap, unless present
  local suite=$1 tag="debian:$1-slim"
  if ((!REBUILD_BASE)) && docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag present"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap missing (run with --install)"
  local dir
  dir=$(mktemp -d "/tmp/gpushare-rootfs-$suite.XXXXXX")
  log "debootstrap --variant=minbase $suite -> $tag"
  debootstrap --variant=minbase "$suite" "$dir" "$MIRROR" >"$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; die "debootstrap $suite failed (log $dir.log)"; }
  # Keep images small and apt quiet, as the official slim images do.
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$dir/etc/apt/apt.conf.d/90gpushare-norecommends"
  # sid's Release expires within days; a snapshot mirror or a clock ahead of it breaks apt.
  echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/90gpushare-snapshot"
  tar -C "$dir" -c . | docker import -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
  rm -rf "$dir" "$dir.log"
  log "$tag imported"
}

build_wheel() {
  local out="$HERE/.build"
  mkdir -p "$out"
  rm -f "$out"/*.whl "$out"/pip-ca.pem
  if ((!WHEEL)); then
    log "--no-wheel: image built without slurm-gpushare"
    return 1
  fi
  [[ -f $REPO/pyproject.toml ]] || die "no $REPO/pyproject.toml: cannot build the slurm-gpushare wheel (use --no-wheel)"
  log "building slurm-gpushare wheel"
  python3 -m pip wheel -q --no-deps -w "$out" "$REPO" >&2
  ls "$out"/*.whl >/dev/null 2>&1 || die "pip wheel produced no wheel in $out"
  # The image's pip fetches the wheel's dependencies from PyPI: give it the CA
  # bundle the host's pip trusts (a TLS-intercepting proxy's CA, say). It is
  # only in the build context, and removed from the image after pip runs.
  local ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
  if [[ -n $ca && -f $ca ]]; then cp "$ca" "$out/pip-ca.pem"; log "pip CA bundle for the image build: $ca"; fi
}

stage_pyslurm() {  # docker/.build/pyslurm/: the pyslurm source the image's own layer builds, when there is one
  local dir="$HERE/.build/pyslurm" src=${PYSLURM_ARCHIVE:-}
  mkdir -p "$dir"
  [[ -n $src ]] || src=$(ls "$REPO"/../shared/vendor/pyslurm-*.tar.gz 2>/dev/null | head -n1 || true)
  if [[ -n $src && -f $src ]]; then
    # copied only when it differs: an unchanged file keeps the layer cached
    cmp -s "$src" "$dir/$(basename "$src")" || { rm -f "$dir"/pyslurm-*.tar.gz; cp -p "$src" "$dir/"; }
    log "pyslurm source for the image: $src (built only where its X.Y is the image's Slurm)"
  else
    rm -f "$dir"/pyslurm-*.tar.gz
    log "no pyslurm archive (../shared/vendor/ or \$PYSLURM_ARCHIVE): image without pyslurm"
  fi
  if [[ -f $HERE/.build/pip-ca.pem ]]; then
    cmp -s "$HERE/.build/pip-ca.pem" "$dir/pip-ca.pem" || cp -p "$HERE/.build/pip-ca.pem" "$dir/pip-ca.pem"
  fi
}

((INSTALL)) && { install_tools; start_dockerd; }
docker info >/dev/null 2>&1 || die "docker daemon not reachable (run with --install to start one)"
command -v docker-compose >/dev/null || log "warning: docker-compose not installed (run with --install)"

PROM_SUITE=trixie
ensure_base "$SUITE"
ensure_base "$DB_SUITE"
ensure_base "$PROM_SUITE"

wheel_arg=required
build_wheel || wheel_arg=none
stage_pyslurm

export DOCKER_BUILDKIT=0
build_image() {  # tag dockerfile build-args...
  local tag=$1 file=$2; shift 2
  local logf="$HERE/.build/build-${tag//[:\/]/_}.log"
  log "building $tag (log $logf)"
  if ! docker build --force-rm --network host "$@" -t "$tag" -f "$HERE/$file" "$HERE" >"$logf" 2>&1; then
    tail -30 "$logf" >&2
    die "docker build $tag failed (log $logf)"
  fi
}
# the image without the package has a tag of its own: never the one the other clusters run
slurm_tag="gpushare-slurm:$SUITE"
[[ $wheel_arg == none ]] && slurm_tag="gpushare-slurm:$SUITE-plain"
build_image "$slurm_tag" Dockerfile \
  --build-arg SUITE="$SUITE" --build-arg GPUSHARE_WHEEL="$wheel_arg"
build_image "gpushare-mariadb:$DB_SUITE" Dockerfile.mariadb --build-arg SUITE="$DB_SUITE"
build_image "gpushare-prometheus:$PROM_SUITE" Dockerfile.prometheus --build-arg SUITE="$PROM_SUITE"
log "done: $slurm_tag gpushare-mariadb:$DB_SUITE gpushare-prometheus:$PROM_SUITE"
