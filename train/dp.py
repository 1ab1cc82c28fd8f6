"""nn.DataParallel: one process drives every visible GPU (-b is the batch across all of them).

    python train/dp.py -a resnet50 -b 1024 /data/imagenet

Kept as a baseline: DDP (train/ddp.py) is faster even on one node, because DataParallel
replicates the model and gathers outputs on GPU 0 every step, under one Python thread.
"""
from _package import main_of

main = main_of("imagenet_recipes.cli")

if __name__ == "__main__":
    main(entry="dp", description=__doc__)
