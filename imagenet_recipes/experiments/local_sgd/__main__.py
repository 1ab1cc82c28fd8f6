"""Post-local SGD and DiLoCo on DDP, an experiment (imagenet_recipes/experiments/local_sgd/):
train/ddp.py's run, where after --local-sgd-warmup-steps of plain DDP each process steps on its
own gradients and the models are averaged every --local-sgd-period steps (with
--local-sgd-outer-lr / --local-sgd-outer-momentum: DiLoCo's outer Nesterov step).

    torchrun --nproc_per_node=4 -m imagenet_recipes.experiments.local_sgd \\
             --local-sgd-period 4 --local-sgd-warmup-steps 500 -a resnet50 /data/imagenet

Every option of train/ddp.py works here; evaluate its checkpoints with train/ddp.py -e.
"""
from imagenet_recipes.experiments.local_sgd import main

if __name__ == "__main__":
    main(description=__doc__)
