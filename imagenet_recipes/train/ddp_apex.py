"""DDP + mixed precision with apex's opt levels, implemented on native torch.amp.

    torchrun --nproc_per_node=8 train/ddp_apex.py --config nvidia_rn50_amp /data/imagenet
    torchrun --nproc_per_node=8 train/ddp_apex.py --config nvidia_rn50_amp --data-backend dali-gpu /data/imagenet
    torchrun --nproc_per_node=2 train/ddp_apex.py -a resnet18 --image-size 64 data/synthetic  # CPU, bf16

Same as train/ddp.py with --opt-level defaulting to O1 (autocast + dynamic loss scaling). On a
CPU the half type is bfloat16, which needs no loss scaling. NVIDIA apex itself is not needed.
"""
from imagenet_recipes.cli import main as run


def main(argv=None) -> None:
    run(entry="ddp_apex", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
