"""Flags of torchvision's classification references and of timm's train.py, as users bring them.

A spelling that means exactly the same here is accepted as an alias of ours (`--model` for
`-a`, `--smoothing` for `--label-smoothing`); one whose meaning or values differ is refused
with a one-line hint naming ours. A refused flag still takes its value off the command line,
so `--lr-scheduler cosineannealinglr /data` is reported as `--lr-scheduler`, not as an unknown
`/data`.
"""
from __future__ import annotations

from typing import Dict, Tuple

# our field -> other projects' flags with the same meaning and the same values
ALIASES: Dict[str, Tuple[str, ...]] = {
    "arch": ("--model",),                              # torchvision, timm
    "warmup_epochs": ("--lr-warmup-epochs",),          # torchvision
    "warmup_method": ("--lr-warmup-method",),          # torchvision
    "warmup_start_factor": ("--lr-warmup-decay",),     # torchvision: LinearLR's start_factor
    "label_smoothing": ("--smoothing",),               # timm
    "mixup_alpha": ("--mixup",),                       # timm
    "cutmix_alpha": ("--cutmix",),                     # timm
    "clip_grad_norm": ("--clip-grad",),                # timm (its default --clip-mode norm)
    "print_freq": ("--log-interval",),                 # timm
}

# flag -> (takes a value, the hint): what differs here and what to type instead
REFUSED: Dict[str, Tuple[bool, str]] = {
    "--amp": (False, "mixed precision is --opt-level O1 (autocast + loss scaling; "
                     "--amp-dtype float16|bfloat16), or O2 (the recommended GPU setting)"),
    "--data-path": (True, "the dataset root is the last argument: ... /data/imagenet"),
    "--data-dir": (True, "the dataset root is the last argument: ... /data/imagenet"),
    "--lr-scheduler": (True, "use --lr-schedule step|multistep|cosine|linear|poly "
                             "(steplr = step, cosineannealinglr = cosine)"),
    "--sched": (True, "use --lr-schedule step|multistep|cosine|linear|poly"),
    "--output-dir": (True, "use --logdir DIR: each run gets a folder of its own in it "
                           "(--run-name names it)"),
    "--output": (True, "use --logdir DIR: each run gets a folder of its own in it "
                       "(--run-name names it)"),
    "--test-only": (False, "use -e/--evaluate with --resume CHECKPOINT"),
    "--weights": (True, "use --pretrained FILE (a local weights file; nothing is downloaded)"),
    "--use-deterministic-algorithms": (False, "use --deterministic"),
    "--aa": (True, "use --auto-augment imagenet|ra|ta_wide (with --ra-magnitude)"),
    "--warmup-lr": (True, "use --warmup-start-factor: the warm-up's start as a fraction of --lr"),
    "--min-lr": (True, "use --lr-min (absolute, like timm's)"),
    "--input-size": (True, "use --image-size (the train crop); --val-crop-size for validation"),
    "--img-size": (True, "use --image-size (the train crop); --val-crop-size for validation"),
    "--crop-pct": (True, "use --val-resize-size and --val-crop-size"),
    "--reprob": (True, "use --random-erase P (torchvision's RandomErasing, which fills with 0; "
                       "timm's default fills with noise)"),
    "--num-classes": (True, "the class count comes from the dataset's folders"),
    "--torchcompile": (True, "use --compile"),
}
