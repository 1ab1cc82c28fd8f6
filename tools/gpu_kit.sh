#!/usr/bin/env bash
# What a GPU node without a package registry needs beside this clone, fetched on a machine that
# has one: the GPU decoders' wheels, Horovod's files, and (from a clone of timm) the peers'
# scripts. For the node's Python version (default 3.12) on x86_64 Linux.
#
#   bash tools/gpu_kit.sh DIR [--python-version 3.12] [--timm CLONE]
#
# DIR gets
#   wheels/    torchcodec 0.17.0 (10 MB), nvidia-nvimgcodec-cu13 0.9.0.20 (25 MB),
#              nvidia-nvjpeg 13.3.2.43 (4 MB: what requirements.txt resolves; nvImageCodec 0.9
#              decodes regions with interpolated chroma only on nvJPEG 13.2 or newer) and
#              py-spy 0.4.3 (3 MB, for bench.loader_threads on the node's cores); and
#              `commit`, this clone's commit, which gpu_session.sh records where the node's
#              copy of the tree has no .git
#   horovod/   launch/horovod_files.sh's files (34 MB, 28 of them cmake's)
#   benchmark.py, train.py   timm's, copied from --timm CLONE (a clone of
#              huggingface/pytorch-image-models at the tag of the installed timm), for
#              gpu_session.sh --peers DIR
# On the node (tools/README.md, "The GPU run"):
#   pip install --no-index --no-deps DIR/wheels/*.whl
#   bash launch/install_horovod.sh --gpu --python python3 --find-links DIR/horovod
set -euo pipefail
dir="" version=3.12 timm=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) version="${2:?}"; shift 2 ;;
    --timm) timm="${2:?}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
               exit 0 ;;
    -*) echo "gpu_kit: unknown option $1" >&2; exit 2 ;;
    *) dir="$1"; shift ;;
  esac
done
if [ -z "$dir" ]; then
  echo "gpu_kit: usage: tools/gpu_kit.sh DIR [--python-version V] [--timm CLONE]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$dir/wheels"
python3 -m pip --disable-pip-version-check download --quiet --no-deps --only-binary :all: \
  --python-version "$version" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir/wheels" torchcodec==0.17.0 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43 \
  py-spy==0.4.3
rm -f "$dir"/wheels/nvidia_nvjpeg-13.0.*.whl  # an older kit's: pip would take both
commit="$(git -C "$here/.." rev-parse --short HEAD)"
git -C "$here/.." diff --quiet HEAD || commit+=" (plus uncommitted changes)"
echo "$commit" > "$dir/wheels/commit"
bash "$here/../launch/horovod_files.sh" "$dir/horovod" "$version" >/dev/null
if [ -n "$timm" ]; then
  cp "$timm/benchmark.py" "$timm/train.py" "$dir/"
fi
du -ab "$dir" | sort -k2 | awk '{ printf "%12s  %s\n", $1, $2 }'
