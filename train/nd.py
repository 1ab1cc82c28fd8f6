"""Non-distributed training: one process, one device (a GPU if present, else the CPU).

    python train/nd.py -a resnet50 -b 256 /data/imagenet
    python train/nd.py -a resnet18 --image-size 64 -b 64 --epochs 3 data/synthetic   # CPU demo
"""
from _package import main_of

main = main_of("imagenet_recipes.cli")

if __name__ == "__main__":
    main(entry="nd", description=__doc__)
