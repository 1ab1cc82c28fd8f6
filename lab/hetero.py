"""Slow and uneven workers, the whole study: bench.hetero's comparison of DDP and the parameter
server's modes, with the local SGD experiment's two methods beside them (RESULTS.md, "Slow and
uneven workers: which method").

    launch/env.sh python lab/hetero.py                    # every method, profile and split
    launch/env.sh python lab/hetero.py --quick            # smoke run
    launch/env.sh python lab/hetero.py --methods ddp local-sgd diloco --profiles one-2x

Every option of `python -m imagenet_recipes.bench.hetero` works here, plus the local SGD ones
below. The methods added, both on train/ddp.py (DDP's sampler: the iid split only):
  local-sgd  `-m imagenet_recipes.experiments.local_sgd` --local-sgd-period H after
             --local-sgd-warmup-steps W (imagenet_recipes/experiments/local_sgd/README.md)
  diloco     the same with DiLoCo's outer step (--outer-lr 0.7 --outer-momentum 0.9 by default)
The experiment's config takes the slow workers' options itself, so every profile applies.
"""
from __future__ import annotations

import sys

from imagenet_recipes.bench import hetero
from imagenet_recipes.bench.jobs import launcher

LOCAL_SGD = "imagenet_recipes.experiments.local_sgd"


def add_options(parser) -> None:
    parser.add_argument("--local-sgd-period", type=int, default=4)
    parser.add_argument("--local-sgd-warmup-steps", type=int, default=14,
                        help="the lr warm-up's steps at the default size (640 images, 3 x 16)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="diloco's outer lr")
    parser.add_argument("--outer-momentum", type=float, default=0.9,
                        help="diloco's outer Nesterov momentum")


def start(method: str, args) -> tuple:
    outer = (["--local-sgd-outer-lr", str(args.outer_lr), "--local-sgd-outer-momentum",
              str(args.outer_momentum)] if method == "diloco" else [])
    return launcher("ddp", args.workers, LOCAL_SGD), [
        "--local-sgd-period", str(args.local_sgd_period), "--local-sgd-warmup-steps",
        str(args.local_sgd_warmup_steps), *outer]


LOCAL_SGD_METHODS = hetero.MoreMethods(
    names=("local-sgd", "diloco"), start=start, add_options=add_options,
    quick={"--local-sgd-warmup-steps": ("local_sgd_warmup_steps", 2)})

if __name__ == "__main__":
    sys.exit(hetero.main(more=LOCAL_SGD_METHODS))
