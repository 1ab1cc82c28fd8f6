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
# machine has no cmake 3.13-3.x). pip takes from DIR only what the environment lacks. Sizes in
# docs/testing.md; about 34 MB, 28 of them cmake's.
set -euo pipefail
dir="${1:?usage: launch/horovod_files.sh DIR [PYTHON_VERSION]}"
version="${2:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
mkdir -p "$dir"
pip=(python3 -m pip --disable-pip-version-check download --quiet --dest "$dir")
"${pip[@]}" --no-deps --no-binary :all: horovod==0.28.1
# packaging<=26.3: what nvidia-dali-cuda130 2.4 accepts, so installing Horovod breaks nothing
"${pip[@]}" --only-binary :all: --python-version "$version" --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 setuptools wheel cloudpickle psutil pyyaml 'packaging<=26.3' \
  'cffi>=1.4.0' 'cmake>=3.18,<4'
ls -l "$dir" | awk 'NR > 1 { printf "%12s  %s\n", $5, $9 }'
