#!/usr/bin/env bash
# Build Horovod 0.28.1 from source for the torch installed in this project's venv, and install it.
#
#   launch/env.sh bash launch/install_horovod.sh            # CPU: Gloo controller + Gloo CPU ops
#   launch/env.sh bash launch/install_horovod.sh --gpu      # GPU cluster: + NCCL GPU ops
#   bash launch/install_horovod.sh --gpu --python python3 --find-links FILES   # no registry
#
# Options:
#   --gpu         also build NCCL GPU operations (HOROVOD_GPU_OPERATIONS=NCCL), see below.
#   --wheel-only  build (or find) the cached wheel and print its path; do not touch the venv.
#   --rebuild     ignore the cached wheel and the venv marker; build from scratch.
#   --sdist FILE  build from this local horovod-0.28.1.tar.gz instead of downloading it.
#   --find-links DIR  machine without a package registry: pip uses only the files in DIR
#                 (--no-index). DIR holds the wheels of what the environment lacks among
#                 setuptools, cloudpickle, psutil, pyyaml, packaging, cffi, pycparser, and
#                 cmake<4 if there is no cmake 3.13-3.x on PATH; horovod-0.28.1.tar.gz there is
#                 used as the sdist unless --sdist says otherwise. launch/horovod_files.sh DIR
#                 fetches them, on a machine with a registry.
#   --python PY   install into PY's environment instead of the active virtualenv (a GPU node's
#                 system Python, where torch is installed; pip may change a system environment
#                 there: PIP_BREAK_SYSTEM_PACKAGES=1).
#
# Why from source: there is no Horovod wheel on PyPI, and the sdist's C++ extension has to be
# compiled against the exact torch it is imported with. Horovod 0.28.1 predates torch 2.15, whose
# headers need C++20, so the sdist's CMakeLists are patched (C++17 for the core, C++20 for the
# torch extension) before building.
#
# Caching (a build takes 6-10 min on 2 cores: 9.9 min with an nvcc present, which compiles the
# CUDA kernels too):
#   * the wheel is kept in ${XDG_CACHE_HOME:-~/.cache}/imagenet-recipes/horovod-wheels/<key>/,
#     <key> = torch version + python version + variant (+ CUDA archs) + sha256 of this script,
#     so a changed torch, python, variant or build recipe gets a fresh build. A cache hit is a
#     plain `pip install` (seconds).
#   * a marker <environment>/.horovod-<key> says "this environment already has this build"; then
#     the script only re-checks that horovod.torch imports and exits.
#
# CUDA toolkit: torch here is a CUDA build, so Horovod's CMake compiles its CUDA code whenever an
# `nvcc` is visible (even for the CPU variant). The toolkit root is resolved from the nvcc on PATH
# (following symlinks and `exec .../nvcc` wrapper scripts) or taken from $CUDA_HOME, and exported as
# CUDA_HOME / HOROVOD_CUDA_HOME / CUDAToolkit_ROOT so CMake and torch.utils.cpp_extension agree on
# where cudart lives. Without an nvcc none of this happens and a pure CPU build is made.
#
# GPU variant (--gpu), for cluster users:
#   * needs nvcc (e.g. `module load cuda/13.x`, or CUDA_HOME=/path/to/cuda) on the build node and
#     a CUDA build of torch (the default from requirements.txt).
#   * NCCL comes from the nvidia-nccl-cu13 wheel that torch already pulled into the venv, so Horovod
#     and torch share one libnccl.so.2. Set HOROVOD_NCCL_HOME (with include/ and lib/) beforehand to
#     use another NCCL instead. It is linked shared (the wheel has no static lib).
#   * GPU code is compiled for HOROVOD_BUILD_CUDA_CC_LIST (default 80,90,100,120: A100, H100/H200,
#     B200, RTX Blackwell; PTX of the highest for newer GPUs). Narrow it to your cluster's GPUs,
#     e.g. HOROVOD_BUILD_CUDA_CC_LIST=90, to shorten the build.
#   * build on any node with the toolkit (no GPU needed), e.g. once on a login node: the wheel is
#     cached in your home directory and later runs on compute nodes install it in seconds.
#   * check: `horovodrun --check-build` lists "[X] NCCL" under Available Tensor Operations.
#   * run:   `launch/env.sh horovodrun -np 8 -H node1:4,node2:4 python train/hvd.py ...`
#
# Other knobs: MAKEFLAGS (default -j<nproc>), TMPDIR (where the build tree goes; it is removed after
# a successful build and kept, with build.log, after a failed one). A build's log is kept beside
# its cached wheel (build.log) and its time is printed.
set -euo pipefail

HVD_VERSION=0.28.1
script="$(readlink -f "${BASH_SOURCE[0]}")"

log() { echo "install_horovod: $*"; }
die() { echo "install_horovod: ERROR: $*" >&2; exit 1; }

variant=cpu; wheel_only=0; rebuild=0; local_sdist=""; find_links=""; python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) variant=gpu ;;
    --wheel-only) wheel_only=1 ;;
    --rebuild) rebuild=1 ;;
    --sdist) [ $# -ge 2 ] || die "--sdist needs a file"; local_sdist="$2"; shift ;;
    --sdist=*) local_sdist="${1#--sdist=}" ;;
    --find-links) [ $# -ge 2 ] || die "--find-links needs a directory"; find_links="$2"; shift ;;
    --find-links=*) find_links="${1#--find-links=}" ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python="$2"; shift ;;
    --python=*) python="${1#--python=}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done
if [ -n "$find_links" ]; then
  [ -d "$find_links" ] || die "--find-links $find_links: no such directory"
  find_links="$(readlink -f "$find_links")"
  # Environment, not arguments: it also reaches the pip that setuptools may start.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$find_links"
  [ -n "$local_sdist" ] || [ ! -f "$find_links/horovod-$HVD_VERSION.tar.gz" ] \
    || local_sdist="$find_links/horovod-$HVD_VERSION.tar.gz"
fi
if [ -n "$local_sdist" ]; then
  [ -f "$local_sdist" ] || die "--sdist $local_sdist: no such file"
  local_sdist="$(readlink -f "$local_sdist")"
fi

# Refuse to install into whatever python happens to be first on PATH: the project's venv, or the
# Python named with --python.
if [ -n "$python" ]; then
  py="$(command -v "$python")" || die "--python $python: not found"
  prefix="$("$py" -c 'import sys; print(sys.prefix)')" || die "--python $python does not run"
  export PIP_BREAK_SYSTEM_PACKAGES=1  # a system Python's environment (PEP 668) is the target
else
  [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ] \
    || die "no virtualenv active; run it as: launch/env.sh bash launch/install_horovod.sh" \
           "[--gpu], or name the Python: --python PY"
  py="$VIRTUAL_ENV/bin/python" prefix="$VIRTUAL_ENV"
fi
pip=("$py" -m pip --disable-pip-version-check)

read -r torch_ver torch_cuda py_ver < <("$py" -c \
  'import sys, torch; print(torch.__version__, torch.version.cuda or "none", "%d.%d" % sys.version_info[:2])') \
  || die "cannot import torch in $prefix"
log "environment $prefix: python $py_ver, torch $torch_ver (CUDA: $torch_cuda), variant: $variant"

# --- CUDA toolkit ---------------------------------------------------------------------------
# Resolve the real toolkit directory behind the nvcc on PATH. On this kind of image
# /usr/local/bin/nvcc is a shell wrapper `exec /usr/local/cuda-13.0/bin/nvcc "$@"`, so
# dirname(dirname(nvcc)) would give /usr/local, where CMake finds no cudart.
find_cuda_home() {
  if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
    readlink -f "$CUDA_HOME"; return 0
  fi
  local nvcc target
  nvcc="$(command -v nvcc 2>/dev/null)" || return 1
  nvcc="$(readlink -f "$nvcc")"
  # A wrapper script: follow its `exec <path>/nvcc` line (one level is all such wrappers use).
  if [ "$(head -c2 "$nvcc")" = "#!" ]; then
    target="$(sed -n 's/^[[:space:]]*exec[[:space:]]\{1,\}"\{0,1\}\([^"[:space:]]*\/nvcc\)"\{0,1\}.*/\1/p' "$nvcc" | head -n1)"
    [ -n "$target" ] && [ -x "$target" ] || return 1
    nvcc="$(readlink -f "$target")"
  fi
  dirname "$(dirname "$nvcc")"
}

cuda_home=""
if cuda_home="$(find_cuda_home)"; then
  [ -f "$cuda_home/include/cuda_runtime.h" ] \
    || die "nvcc found, but $cuda_home has no include/cuda_runtime.h; set CUDA_HOME to the toolkit root"
  cuda_ver="$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  log "CUDA toolkit: $cuda_home (nvcc $cuda_ver)"
else
  cuda_home=""
  log "no nvcc found: building without CUDA code"
fi

if [ "$variant" = gpu ]; then
  [ -n "$cuda_home" ] || die "--gpu needs the CUDA toolkit (nvcc) on the build node: module load cuda, or set CUDA_HOME"
  [ "$torch_cuda" != none ] || die "--gpu needs a CUDA build of torch, this one is $torch_ver"
  cc_list="${HOROVOD_BUILD_CUDA_CC_LIST:-80,90,100,120}"
else
  # The CPU variant still compiles Horovod's small CUDA kernels when nvcc exists (CMake requires
  # CUDA for a CUDA torch); one architecture is enough, they are never used without GPU ops.
  cc_list="${HOROVOD_BUILD_CUDA_CC_LIST:-90}"
fi

# --- cache key ------------------------------------------------------------------------------
script_sha="$(sha256sum "$script" | cut -c1-16)"
cuda_tag=""
[ -n "$cuda_home" ] && cuda_tag="-cuda${cuda_ver}-sm${cc_list//,/_}"
key="hvd${HVD_VERSION}-torch${torch_ver}-py${py_ver}-${variant}${cuda_tag}-${script_sha}"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/imagenet-recipes"
wheel_dir="$cache_root/horovod-wheels/$key"
marker="$prefix/.horovod-$key"
log "cache key: $key"

# Python one-liner that succeeds only if horovod.torch loads with the features of this variant.
import_check='import horovod.torch as hvd; assert hvd.gloo_built(), "Gloo missing"'
[ "$variant" = gpu ] && import_check+='; assert hvd.nccl_built(), "NCCL missing"'

if [ "$rebuild" = 0 ] && [ "$wheel_only" = 0 ] && [ -f "$marker" ] && "$py" -c "$import_check" 2>/dev/null; then
  log "already installed in this venv ($marker): nothing to do"
  exit 0
fi

# --- build the wheel (cache miss only) ------------------------------------------------------
# Horovod's runtime deps; also its setup_requires for build actions, which with
# --no-build-isolation must already be installed (else setuptools tries to fetch eggs itself).
# At the versions of launch/horovod-build-deps.txt (what launch/horovod_files.sh fetches):
# where the environment lacks one, pip installs that one; where it has one, it keeps it
pins="$(dirname "$script")/horovod-build-deps.txt"
"${pip[@]}" install --quiet cloudpickle psutil pyyaml packaging 'cffi>=1.4.0' setuptools wheel \
  -c <(grep -v '^cmake' "$pins")

wheel="$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)"
if [ "$rebuild" = 1 ] || [ -z "$wheel" ]; then
  start=$SECONDS
  work="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
  log "building horovod $HVD_VERSION in $work (6-10 min on 2 cores)"

  # cmake >= 3.13 is required by Horovod; < 4 because bundled third_party CMakeLists declare
  # very old minimum versions that CMake 4 rejects.
  if ! command -v cmake >/dev/null || ! "$py" - "$(cmake --version | sed -n '1s/[^0-9]*\([0-9.]*\).*/\1/p')" <<'EOF'
import sys
v = tuple(int(x) for x in sys.argv[1].split(".")[:2])
sys.exit(0 if (3, 13) <= v < (4, 0) else 1)
EOF
  then
    log "no suitable cmake on PATH: pip install $(grep '^cmake' "$pins")"
    "${pip[@]}" install --quiet "$(grep '^cmake' "$pins")"
  fi
  log "cmake: $(command -v cmake) ($(cmake --version | head -n1))"

  # The sdist is kept next to the wheels: a --rebuild or a new torch does not download it again.
  sdist_dir="$cache_root/horovod-sdist"
  sdist="$sdist_dir/horovod-$HVD_VERSION.tar.gz"
  if [ -n "$local_sdist" ]; then
    log "sdist: $local_sdist"
    sdist="$local_sdist"
  elif [ ! -f "$sdist" ]; then
    log "downloading the horovod $HVD_VERSION sdist from PyPI"
    "${pip[@]}" download --quiet --no-binary :all: --no-deps "horovod==$HVD_VERSION" -d "$sdist_dir"
  fi
  [ -f "$sdist" ] || die "pip download did not produce $sdist"
  tar -xzf "$sdist" -C "$work"
  [ -f "$work/horovod-$HVD_VERSION/setup.py" ] || die "$sdist is not the horovod $HVD_VERSION sdist"
  src="$work/horovod-$HVD_VERSION"

  # Patch the C++ standard. torch 2.15 headers require C++20, but only the torch extension
  # includes them; the core (and Gloo, which inherits the top-level setting) stays on C++17.
  log "patching CMakeLists: C++17 for the core, C++20 for horovod/torch"
  sed -i 's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
  sed -i 's/^\([[:space:]]*\)set(CMAKE_CXX_STANDARD 14)$/\1set(CMAKE_CXX_STANDARD 20)/' \
    "$src/horovod/torch/CMakeLists.txt"
  grep -qx 'set(CMAKE_CXX_STANDARD 17)' "$src/CMakeLists.txt" \
    || die "patch of CMakeLists.txt did not apply (sdist changed?)"
  grep -qx '[[:space:]]*set(CMAKE_CXX_STANDARD 20)' "$src/horovod/torch/CMakeLists.txt" \
    || die "patch of horovod/torch/CMakeLists.txt did not apply (sdist changed?)"
  ! grep -q 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" \
    || die "a C++14 setting is left in the patched CMakeLists"

  # Build configuration: PyTorch + Gloo only; MPI/TF/MXNet off so that whatever else is on the
  # machine cannot change what gets built. CMake compares GLOO case-sensitively.
  unset HOROVOD_GPU HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST \
        HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER HOROVOD_GPU_OPERATIONS
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO
  # setup.py passes -j8 to make unless MAKEFLAGS is set; match the cores instead.
  export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"

  if [ -n "$cuda_home" ]; then
    # CUDA_HOME: torch.utils.cpp_extension (used by Horovod's FindPytorch) takes include and
    # cudart library dirs from it; HOROVOD_CUDA_HOME: the nvcc CMake uses; CUDAToolkit_ROOT:
    # find_package(CUDAToolkit). All three must name the same real toolkit.
    export CUDA_HOME="$cuda_home" HOROVOD_CUDA_HOME="$cuda_home" CUDAToolkit_ROOT="$cuda_home"
    export HOROVOD_BUILD_CUDA_CC_LIST="$cc_list"
    log "CUDA code for compute capabilities $cc_list"
  else
    unset HOROVOD_CUDA_HOME
  fi

  if [ "$variant" = gpu ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
    if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
      # nvidia.nccl is a namespace package (no __file__), so ask importlib for its directory.
      HOROVOD_NCCL_HOME="$("$py" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)" \
        || die "no NCCL: nvidia-nccl-cu13 is not installed in the venv and HOROVOD_NCCL_HOME is unset"
    fi
    export HOROVOD_NCCL_HOME
    export HOROVOD_NCCL_INCLUDE="${HOROVOD_NCCL_INCLUDE:-$HOROVOD_NCCL_HOME/include}"
    nccl_lib="${HOROVOD_NCCL_LIB:-$HOROVOD_NCCL_HOME/lib}"
    [ -f "$HOROVOD_NCCL_INCLUDE/nccl.h" ] || die "no nccl.h in $HOROVOD_NCCL_INCLUDE"
    [ -e "$nccl_lib/libnccl.so" ] || [ -e "$nccl_lib/libnccl.so.2" ] || die "no libnccl.so(.2) in $nccl_lib"
    if [ ! -e "$nccl_lib/libnccl.so" ]; then
      # The wheel ships only the runtime name libnccl.so.2; the linker (-lnccl, CMake's
      # find_library(nccl)) wants libnccl.so. Give it one in the scratch tree; the built library
      # still records the SONAME libnccl.so.2.
      mkdir -p "$work/nccl-lib"
      ln -sf "$(readlink -f "$nccl_lib/libnccl.so.2")" "$work/nccl-lib/libnccl.so"
      export HOROVOD_NCCL_LIB="$work/nccl-lib"
    else
      export HOROVOD_NCCL_LIB="$nccl_lib"
    fi
    # torch loads the same libnccl.so.2 before horovod.torch's library; the rpath is a fallback.
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$(readlink -f "$nccl_lib")"
    log "NCCL: include $HOROVOD_NCCL_INCLUDE, lib $HOROVOD_NCCL_LIB (runtime $nccl_lib)"
  fi

  build_log="$work/build.log"
  log "pip wheel --no-build-isolation (log: $build_log)"
  if ! "${pip[@]}" wheel -v --no-build-isolation --no-deps --no-cache-dir -w "$work/dist" "$src" \
      >"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    die "build failed; full log in $build_log (build tree kept in $work)"
  fi
  built="$(ls "$work"/dist/horovod-*.whl)"
  # Publish atomically: a concurrent run sees either no wheel or a complete one.
  mkdir -p "$(dirname "$wheel_dir")"
  rm -rf "$wheel_dir.tmp.$$" && mkdir "$wheel_dir.tmp.$$"
  cp "$built" "$build_log" "$wheel_dir.tmp.$$/"
  rm -rf "$wheel_dir" && mv "$wheel_dir.tmp.$$" "$wheel_dir"
  wheel="$wheel_dir/$(basename "$built")"
  rm -rf "$work"
  log "built $wheel in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s on" \
      "$(nproc) cores (build log: $wheel_dir/build.log)"
else
  log "cached wheel: $wheel"
fi

if [ "$wheel_only" = 1 ]; then
  echo "$wheel"
  exit 0
fi

# --- install and check ----------------------------------------------------------------------
log "pip install $(basename "$wheel")"
# --force-reinstall: the version number is the same for every variant, pip would skip it otherwise.
"${pip[@]}" install --quiet --no-deps --force-reinstall "$wheel"
rm -f "$prefix"/.horovod-*   # whatever build was there before is gone now

log "horovodrun --check-build"
check="$("$py" -c 'import sys; from horovod.runner.launch import run_commandline
sys.exit(run_commandline())' --check-build 2>&1)" || { echo "$check" >&2; die "horovodrun --check-build failed"; }
echo "$check"
# The listing has "[X] Gloo" under both controllers and tensor operations.
grep -q '\[X\] PyTorch' <<<"$check" || die "the installed Horovod has no PyTorch support (see --check-build above)"
grep -q '\[X\] Gloo' <<<"$check" || die "the installed Horovod has no Gloo support (see --check-build above)"
if [ "$variant" = gpu ]; then
  grep -q '\[X\] NCCL' <<<"$check" || die "the installed Horovod has no NCCL support (see --check-build above)"
fi

log "single-process check: hvd.init()"
out="$("$py" -c "$import_check; hvd.init(); print(hvd.size())" 2>&1)" \
  || { echo "$out" >&2; die "import horovod.torch / hvd.init() failed (output above)"; }
[ "$(tail -n1 <<<"$out")" = 1 ] || { echo "$out" >&2; die "hvd.init() in one process did not give size 1"; }

touch "$marker"
log "OK: horovod $HVD_VERSION ($variant) installed in $prefix"
