"""DDP + mixed precision with apex's opt levels, implemented on native torch.amp.

    torchrun --nproc_per_node=4 train/ddp_apex.py -a resnet50 -b 208 -j 20 --opt-level O2 /data/imagenet
    torchrun --nproc_per_node=2 train/ddp_apex.py -a resnet18 --image-size 64 data/synthetic  # CPU, bf16

Same as train/ddp.py with --opt-level defaulting to O1 (autocast + dynamic loss scaling). On a
CPU the half type is bfloat16, which needs no loss scaling. NVIDIA apex itself is not needed.
"""
from _package import main_of

main = main_of("imagenet_recipes.cli")

if __name__ == "__main__":
    main(entry="ddp_apex", description=__doc__)  # --opt-level O1 by default
