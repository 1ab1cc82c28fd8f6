"""Horovod data-parallel training: one process per device, gradients all-reduced by Horovod.

    horovodrun -np 4 python train/hvd.py -a resnet50 -b 256 --opt-level O2 /data/imagenet
    horovodrun -np 2 --gloo python train/hvd.py -a resnet18 data/synthetic    # CPU

Horovod must be built for the installed torch first: `bash launch/install_horovod.sh`.
(The clone's train/hvd.py is not called horovod.py: a script's folder comes first on sys.path
and would shadow the horovod package.)
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="hvd", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
