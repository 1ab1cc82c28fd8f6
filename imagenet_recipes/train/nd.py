"""Non-distributed training: one process, one device (a GPU if present, else the CPU).

    python train/nd.py --config nvidia_rn50_amp /data/imagenet
    python train/nd.py -a resnet18 --image-size 64 -b 64 --epochs 3 data/synthetic   # CPU demo
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="nd", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
