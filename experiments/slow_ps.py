"""The parameter server with slow workers, an experiment
(imagenet_recipes/experiments/slow_workers/): train/ps.py's run, where --worker-slowdown gives
each worker a step-time factor (a sleep of (factor - 1) x each step's time), from
--slowdown-from-epoch on: how sync, async and ESync behave when one worker is slower.

    torchrun --nproc_per_node=4 experiments/slow_ps.py --mode esync --worker-slowdown 1,1,3 \\
             -a resnet18 data/synthetic

Every option of train/ps.py works here, --evaluator included.
"""
from imagenet_recipes.experiments.slow_workers.ps import main

if __name__ == "__main__":
    main(description=__doc__)
