"""nn.DataParallel: one process drives every visible GPU (-b is the batch across all of them).

    python train/dp.py -a resnet50 -b 1024 /data/imagenet

Kept as a baseline: DDP (train/ddp.py) is faster even on one node, because DataParallel
replicates the model and gathers outputs on GPU 0 every step, under one Python thread.
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="dp", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
