#!/bin/bash
# Entrypoint of gpushare-pyslurm-build:<suite> (docker/Dockerfile.pyslurm):
#   pyslurm-build ARCHIVE OUTDIR
# builds the wheel of the pyslurm source archive ARCHIVE against this image's
# Slurm into OUTDIR, or exits 3 when the archive's X.Y is not this Slurm's
# (pyslurm X.Y builds only against Slurm X.Y). Unoptimised C (-O0) in
# parallel: the wheel serves the test cluster, where its speed does not matter,
# and builds in a third of the time.
set -euo pipefail
archive=$1 out=$2
slurm=$(dpkg-query -W -f '${Version}' libslurm-dev | cut -d. -f1,2)
want=$(basename "$archive" | sed -E 's/^pyslurm-([0-9]+\.[0-9]+).*/\1/')
if [[ $want != "$slurm" ]]; then
  echo "pyslurm-build: $(basename "$archive") is for Slurm $want, this is Slurm $slurm" >&2
  exit 3
fi
src=$(mktemp -d)
tar -xzf "$archive" -C "$src" --strip-components=1
cd "$src"
jobs=$(nproc)
# setup.py looks for libslurmfull.so in SLURM_LIB_DIR and its slurm-wlm subdirectory
export SLURM_LIB_DIR=/usr/lib/$(gcc -print-multiarch) SLURM_INCLUDE_DIR=/usr/include
export PYSLURM_BUILD_JOBS=$jobs CFLAGS="-O0 -g0"
python3 setup.py build_ext -j "$jobs" bdist_wheel -d "$out"
ls "$out"/pyslurm-*.whl >/dev/null
