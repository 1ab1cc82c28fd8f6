#!/usr/bin/env bash
# A short smoke test on the oldest supported stack (requirements-oldest.txt: torch 2.11.0,
# torchvision 0.26.0), CPU only. launch/test.sh runs it before the main suite, so CI does too:
#
#   bash tests/smoke_oldest.sh
#
# In that stack's own virtualenv (launch/env.sh with RECIPES_REQUIREMENTS=requirements-oldest.txt:
# built on first use, then cached by the file's hash like the main one) it runs
#   1. the in-process unit tests: precision, config/sampling/schedule/models, recipe features,
#      the log reader and the scaling model;
#   2. three entry scripts for a few steps on a generated ImageFolder: nd.py (fp32), a
#      2-process torchrun ddp_apex.py at O2 (bfloat16 model, fp32 masters) and a 3-process
#      torchrun ps.py --mode sync (a server and 2 workers);
# and fails unless each run exits 0, ends "finished" and logs only finite losses.
# RECIPES_OLDEST_VENV=/path puts that virtualenv elsewhere, =system uses the current python as
# is (it must hold the pinned torch and torchvision: checked first). RECIPES_VENV, the main
# suite's, is ignored here: it would run the smoke on the main stack. Python 3.12:
#   PYENV_VERSION=3.12.1 RECIPES_OLDEST_VENV=/tmp/venv-oldest-py312 bash tests/smoke_oldest.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
export RECIPES_REQUIREMENTS=requirements-oldest.txt
export RECIPES_VENV="${RECIPES_OLDEST_VENV:-}"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore  # 2 cores in CI: one compute thread per process
env=launch/env.sh
say() { echo "smoke_oldest: $*"; }

# The pinned versions, or stop: a venv that silently holds another torch would test nothing.
$env python - "$RECIPES_REQUIREMENTS" <<'EOF'
import re, sys, torch, torchvision
pins = dict(re.findall(r"^(torch|torchvision)==(\S+)", open(sys.argv[1]).read(), re.M))
have = {"torch": torch.__version__, "torchvision": torchvision.__version__}
print(f"smoke_oldest: Python {sys.version.split()[0]}, "
      + ", ".join(f"{k} {v}" for k, v in have.items()))
for name, pin in pins.items():
    if have[name].split("+")[0] != pin:
        sys.exit(f"smoke_oldest: {name} is {have[name]}, {sys.argv[1]} pins {pin}")
EOF

$env python -m pytest -q -p no:cacheprovider tests/test_precision.py tests/test_units.py \
  tests/test_recipe.py tests/tools/test_bench_common.py tests/tools/test_scaling_model.py

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="$work/data"
$env python data/make_synthetic.py "$data" --classes 4 --train-per-class 16 --val-per-class 5 \
  --min-size 40 --max-size 72 --workers 1 >/dev/null
tiny=(-a resnet18 --image-size 32 -j 1 -p 1 -b 8 --epochs 1 --steps-per-epoch 3 --seed 2
      --logdir "$work/runs")
torchrun=(torchrun --standalone)

say "nd.py (fp32, 1 process)"
$env python train/nd.py "${tiny[@]}" --run-name nd "$data"
say "ddp_apex.py --opt-level O2 (bfloat16, 2 processes)"
$env "${torchrun[@]}" --nproc_per_node=2 train/ddp_apex.py "${tiny[@]}" --opt-level O2 \
  --amp-dtype bfloat16 --run-name ddp_apex "$data"
say "ps.py --mode sync (a server and 2 workers)"
$env "${torchrun[@]}" --nproc_per_node=3 train/ps.py "${tiny[@]}" --mode sync --run-name ps "$data"

$env python - "$work/runs" nd ddp_apex ps <<'EOF'
import math, sys
from pathlib import Path
from imagenet_recipes.bench.common import read_log
for name in sys.argv[2:]:
    log = read_log(Path(sys.argv[1]) / name)
    train = [r["loss"] for r in log.get("train", [])]
    val = [r["loss"] for r in log.get("val", []) if r.get("loss") is not None]
    end = (log.get("end") or [{}])[-1].get("reason")
    ok = train and val and all(math.isfinite(x) for x in train + val) and end == "finished"
    print(f"smoke_oldest: {name}: train losses {[round(x, 3) for x in train]}, "
          f"val {[round(x, 3) for x in val]}, end {end!r}: {'ok' if ok else 'FAILED'}")
    if not ok:
        sys.exit(f"smoke_oldest: {name} did not finish with finite losses")
EOF
say "passed in $((SECONDS - start)) s"
