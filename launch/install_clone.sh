#!/usr/bin/env bash
# Make this clone's imagenet_recipes package importable by a Python, from any folder:
#
#   bash launch/install_clone.sh [PYTHON]        # default: python3 on PATH
#
# It asks PYTHON, from outside the clone, which imagenet_recipes it imports. Inside the clone the
# clone's own folder would answer and hide a missing install (the scripts in train/ run with
# train/ first on sys.path, where it does not). Where the answer is not this clone, the clone is
# installed editable without dependencies (`pip install --no-deps -e`: the environment has
# torch and the rest; nothing of it changes): first with no download (setuptools from the
# environment, for a machine without a registry), then with pip's own build environment. A
# Python whose environment is marked as the system's (PEP 668, e.g. a distribution's or a
# container's system Python) gets `--break-system-packages`: only this clone's link is added.
# It then asks again and fails loudly where the package still does not import from there.
#
# Exit status: 0 when PYTHON imports this clone's package; 2 when it cannot be made to.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-python3}"

# installed_from: the folder holding the imagenet_recipes that $python imports outside the clone
# (-P: nothing prepended to sys.path; and run from /, so no relative entry names the clone)
installed_from() {
  local code='import pathlib, imagenet_recipes as p'
  code+='; print(pathlib.Path(p.__file__).resolve().parents[1])'
  (cd / && "$python" -P -c "$code" 2>/dev/null)
}

[ "$(installed_from)" = "$(realpath "$repo")" ] && exit 0

prefix="$("$python" -c 'import sys; print(sys.prefix)' 2>/dev/null)" || {
  echo "install_clone: cannot run $python" >&2; exit 2; }
echo "install_clone: installing $repo into $prefix (pip install --no-deps -e)" >&2
pip_install() {
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps "$@" -e "$repo"
}
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for attempt in --no-build-isolation ""; do
  pip_install $attempt 2>"$log" && break
  if grep -q externally-managed-environment "$log"; then
    echo "install_clone: $prefix is a system environment (PEP 668): adding only this clone" \
         "with --break-system-packages" >&2
    pip_install $attempt --break-system-packages 2>"$log" && break
  fi
done

found="$(installed_from)"
if [ "$found" != "$(realpath "$repo")" ]; then
  cat "$log" >&2
  echo "install_clone: $python still does not import this clone's imagenet_recipes" \
       "(${found:-none found}); install it by hand: $python -m pip install --no-deps -e $repo" >&2
  exit 2
fi
