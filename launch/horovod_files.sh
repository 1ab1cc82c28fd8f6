#!/usr/bin/env bash
# The files launch/install_horovod.sh needs on a machine without a package registry, fetched on
# one that has one: Horovod's source archive and the wheels its build and runtime need.
#
#   bash launch/horovod_files.sh DIR [PYTHON_VERSION]     # default: this python3's, e.g. 3.12
#
# Then, on the machine without a registry (DIR copied there):
#   bash launch/install_horovod.sh --gpu --python python3 --find-links DIR
#
# DIR gets horovod-0.28.1.tar.gz and the manylinux x86_64 wheels, for that Python version, of
# setuptools and wheel (the build; installed where the environment lacks them), cloudpickle,
# psutil, pyyaml, packaging and cffi (Horovod's runtime), and cmake 3.x (used only where the
# machine has no cmake 3.13-3.x), at the versions of launch/horovod-build-deps.txt. pip takes from DIR only what the environment lacks. Sizes in
# tools/README.md ("Horovod on the GPU machine"); about 34 MB, 28 of them cmake's.
#
# Versions are pinned (launch/horovod-build-deps.txt: those the suite is run with), so every
# machine builds with the same ones. A DIR that already holds them for that Python version
# (its .complete-* marker, keyed by this file and the pins) is not fetched again: a machine that
# has the files needs no registry. pip waits at most PIP_DEFAULT_TIMEOUT seconds (default 60)
# for the registry and tries PIP_RETRIES times (default 5).
set -euo pipefail
dir="${1:?usage: launch/horovod_files.sh DIR [PYTHON_VERSION]}"
version="${2:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" PIP_RETRIES="${PIP_RETRIES:-5}"
pins="$(dirname "$0")/horovod-build-deps.txt"
marker="$dir/.complete-py$version-$(cat "$0" "$pins" | sha256sum | cut -c1-16)"
if [ -f "$marker" ]; then
  echo "horovod_files: $dir already holds the files for Python $version" >&2
else
  mkdir -p "$dir"
  pip=(python3 -m pip --disable-pip-version-check download --quiet --dest "$dir")
  "${pip[@]}" --no-deps --no-binary :all: horovod==0.28.1
  "${pip[@]}" --only-binary :all: --python-version "$version" --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 -r "$pins"
  touch "$marker"
fi
ls -l "$dir" | awk 'NR > 1 { printf "%12s  %s\n", $5, $9 }'
