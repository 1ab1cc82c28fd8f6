#!/usr/bin/env bash
# Run a command inside this project's Python environment, creating it on first use.
#
#   launch/env.sh python -m pytest -q
#   launch/env.sh torchrun --nproc_per_node=2 train/ddp.py ...
#   launch/env.sh python -m imagenet_recipes.bench.sweep --dry-run
#
# The virtualenv lives outside the repository, keyed by the hash of requirements.txt, so a fresh
# clone (or CI) on the same machine reuses it and a changed requirements.txt gets a new one; the
# clone is installed in it in editable mode (the imagenet_recipes package, pyproject.toml).
# An environment the user activated (a virtualenv or conda environment: VIRTUAL_ENV or
# CONDA_PREFIX, which sbatch and srun pass on to the job's nodes) is used as it is when it has
# torch, with the clone installed in it where it is not (editable, no dependencies): nothing is
# built or downloaded, and one line on stderr says which environment runs. Only without one is
# the project's own virtualenv used (built on first use).
# RECIPES_VENV=/path overrides the location; RECIPES_VENV=system uses the current python with
# its own packages, and installs the clone in it (editable, no dependencies) if it is not.
# RECIPES_REQUIREMENTS=FILE (relative to the repository, or absolute) builds and uses the venv of
# another requirements file instead, keyed by its own hash: requirements-oldest.txt is the oldest
# supported torch/torchvision (tests/smoke_oldest.sh).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# install_clone PYTHON: this clone into PYTHON's environment, editable and without dependencies,
# so that the entry scripts and `python -m imagenet_recipes.bench.<tool>` import it from any
# folder (launch/install_clone.sh: nothing is downloaded where the environment has setuptools).
install_clone() {
  bash "$repo/launch/install_clone.sh" "$1" || exit 2
}

if [ "${RECIPES_VENV:-}" = "system" ]; then
  # the current python as it is, with this clone installed in it once
  install_clone python
  exec "$@"
fi

# in_environment PREFIX CMD...: run CMD in the environment at PREFIX (its bin/ first on PATH)
in_environment() {
  local prefix=$1
  shift
  if [ "$PWD" = "$repo" ]; then  # what a run prints for the user to type starts with this script
    export RECIPES_ENV_SH=launch/env.sh
  else
    export RECIPES_ENV_SH="$repo/launch/env.sh"
  fi
  export PATH="$prefix/bin:$PATH"
  export VIRTUAL_ENV="$prefix" RECIPES_ACTIVE_TOLD="$prefix"
  exec "$@"
}

# A registry that does not answer fails the build within minutes, not hours: pip's own timeout
# (seconds per request) and retries, where the caller set none
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" PIP_RETRIES="${PIP_RETRIES:-5}"

req="${RECIPES_REQUIREMENTS:-requirements.txt}"
case "$req" in /*) ;; *) req="$repo/$req" ;; esac
key="$(sha256sum "$req" | cut -c1-16)"
venv="${RECIPES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/imagenet-recipes/venv-$key}"

if [ -z "${RECIPES_VENV:-}" ] && [ -z "${RECIPES_REQUIREMENTS:-}" ]; then
  active="${VIRTUAL_ENV:-${CONDA_PREFIX:-}}"
  # (the project's own virtualenv, active in a command this script started, is not another one)
  if [ -n "$active" ] && [ "$active" != "$venv" ] && [ -x "$active/bin/python" ] &&
      "$active/bin/python" -c \
      "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" \
      2>/dev/null; then
    if [ "$active" != "${RECIPES_ACTIVE_TOLD:-}" ]; then  # once, not in each nested call
      echo "launch/env.sh: the active environment $active (its torch; nothing built)" >&2
    fi
    if command -v flock >/dev/null; then  # every node of a job may get here at once
      exec 9>>"$active/.imagenet-recipes.lock"
      flock 9
      install_clone "$active/bin/python"
      flock -u 9
      exec 9>&-
    else
      install_clone "$active/bin/python"
    fi
    in_environment "$active" "$@"
  fi
fi

build() {
  echo "launch/env.sh: creating $venv (first run: downloads torch, several GB)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  # pip itself is upgraded only to install something: a requirements file that names nothing
  # (tests/test_env_sh.py's) builds its environment without a registry
  if grep -qv '^[[:space:]]*\(#.*\)\{0,1\}$' "$req"; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r "$req"
  fi
  # fail here, not mid-run: import what the file asks for of these
  local modules=() package module
  for package in torch torchvision tensorboard nvidia-dali; do
    module="${package/nvidia-dali/nvidia.dali}"
    # DALI has Linux wheels only: requirements.txt skips it elsewhere (a platform marker)
    if [ "$package" = nvidia-dali ] && [ "$(uname -s)" != Linux ]; then continue; fi
    if grep -q "^$package" "$req"; then modules+=("$module"); fi
  done
  [ ${#modules[@]} = 0 ] || "$venv/bin/python" -c "import $(IFS=,; echo "${modules[*]}")"
  touch "$venv/.complete"
}

# The environment is shared by every clone on the machine (keyed by the requirements, not the
# clone); the clone installed in it is the one named in $venv/.clone, and another clone's first
# command installs itself in its place.
ready() {
  [ -f "$venv/.complete" ] && [ "$(cat "$venv/.clone" 2>/dev/null)" = "$repo" ]
}

prepare() {
  [ -f "$venv/.complete" ] || build
  if [ "$(cat "$venv/.clone" 2>/dev/null)" != "$repo" ]; then
    install_clone "$venv/bin/python"
    echo "$repo" > "$venv/.clone"
  fi
}

if ! ready; then
  mkdir -p "$(dirname "$venv")"
  if command -v flock >/dev/null; then
    # Several processes may get here at once (every node of a SLURM job, on a shared home):
    # one builds the environment while the others wait for it, then use it.
    exec 9>"$venv.lock"
    flock 9
    ready || prepare
    flock -u 9
    exec 9>&-
  else
    prepare
  fi
fi

in_environment "$venv" "$@"
