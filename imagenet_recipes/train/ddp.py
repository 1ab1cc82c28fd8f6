"""DistributedDataParallel: one process per device, -b images per process.

    torchrun --nproc_per_node=4 train/ddp.py -a resnet50 -b 256 /data/imagenet
    # multi-node: on every node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
             --rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=$JOB_ID train/ddp.py \\
             --config nvidia_rn50_amp --global-batch published /data/imagenet

NCCL on GPUs, gloo on CPU. Add --opt-level O1/O2 for mixed precision (or use ddp_apex.py).
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="ddp", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
