"""DDP with slow workers, an experiment (imagenet_recipes/experiments/slow_workers/):
train/ddp.py's run, where --worker-slowdown makes some processes emulate slower devices (a sleep
of (factor - 1) x each step's time), from --slowdown-from-epoch on.

    torchrun --nproc_per_node=3 experiments/slow_ddp.py --worker-slowdown 1,1,4 \\
             -a resnet18 data/synthetic

Every option of train/ddp.py works here; evaluate its checkpoints with train/ddp.py -e.
"""
from imagenet_recipes.experiments.slow_workers.ddp import main

if __name__ == "__main__":
    main(description=__doc__)
