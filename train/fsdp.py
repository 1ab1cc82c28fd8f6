"""FSDP2: one process per device, weights, gradients and optimizer state sharded over them
(torch.distributed.fsdp.fully_shard).

    torchrun --nproc_per_node=8 train/fsdp.py -a resnet50 -b 256 --opt-level O1 /data/imagenet
    torchrun --nproc_per_node=2 train/fsdp.py -a resnet18 --image-size 64 data/synthetic  # CPU

The same training as train/ddp.py at O0 and O1, with each rank holding 1/N
of the model's state; checkpoints are the same files the other scripts write. For
ResNet-class models DDP is as fast or faster: FSDP pays off for models whose weights and
optimizer state crowd a GPU's memory (see imagenet_recipes/strategies/fsdp.py).
"""
from _package import main_of

main = main_of("imagenet_recipes.cli")

if __name__ == "__main__":
    main(entry="fsdp", description=__doc__)
