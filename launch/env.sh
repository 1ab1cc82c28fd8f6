#!/usr/bin/env bash
# Run a command inside this project's Python environment, creating it on first use.
#
#   launch/env.sh python -m pytest -q
#   launch/env.sh torchrun --nproc_per_node=2 train/ddp.py ...
#   launch/env.sh python -m bench.sweep --dry-run
#
# The virtualenv lives outside the repository, keyed by the hash of requirements.txt, so a fresh
# clone (or CI) on the same machine reuses it and a changed requirements.txt gets a new one.
# RECIPES_VENV=/path overrides the location; RECIPES_VENV=system uses the current python as is.
# RECIPES_REQUIREMENTS=FILE (relative to the repository, or absolute) builds and uses the venv of
# another requirements file instead, keyed by its own hash: requirements-oldest.txt is the oldest
# supported torch/torchvision (launch/smoke_oldest.sh).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The engine package (train/recipe) and the tools (bench/) import as plain packages:
# `python -m bench.sweep` from anywhere, and `import recipe` in a tool, with no path edits in code.
export PYTHONPATH="$repo/train:$repo${PYTHONPATH:+:$PYTHONPATH}"

if [ "${RECIPES_VENV:-}" = "system" ]; then
  exec "$@"
fi

req="${RECIPES_REQUIREMENTS:-requirements.txt}"
case "$req" in /*) ;; *) req="$repo/$req" ;; esac
key="$(sha256sum "$req" | cut -c1-16)"
venv="${RECIPES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/imagenet-recipes/venv-$key}"

build() {
  echo "launch/env.sh: creating $venv (first run: downloads torch, several GB)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$req"
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

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$(dirname "$venv")"
  if command -v flock >/dev/null; then
    # Several processes may get here at once (every node of a SLURM job, on a shared home):
    # one builds the environment while the others wait for it, then use it.
    exec 9>"$venv.lock"
    flock 9
    [ -f "$venv/.complete" ] || build
    flock -u 9
    exec 9>&-
  else
    build
  fi
fi

export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
exec "$@"
