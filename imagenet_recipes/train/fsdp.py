"""FSDP2: one process per device, weights, gradients and optimizer state sharded over them
(torch.distributed.fsdp.fully_shard).

    torchrun --nproc_per_node=8 train/fsdp.py --config nvidia_rn50_amp /data/imagenet
    torchrun --nproc_per_node=2 train/fsdp.py -a resnet18 --image-size 64 data/synthetic  # CPU

The same training as train/ddp.py at O0 and O1, with each rank holding 1/N
of the model's state; checkpoints are the same files the other scripts write. For
ResNet-class models DDP is as fast or faster: FSDP pays off for models whose weights and
optimizer state crowd a GPU's memory (see imagenet_recipes/strategies/fsdp.py).
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="fsdp", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
