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

if [ ! -f "$venv/.complete" ]; then
  echo "launch/env.sh: creating $venv (first run: downloads torch, several GB)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$req"
  dali=""; if grep -q '^nvidia-dali' "$req"; then dali=", nvidia.dali"; fi
  "$venv/bin/python" -c "import torch, torchvision, tensorboard$dali" # fail here, not mid-run
  touch "$venv/.complete"
fi

export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
exec "$@"
