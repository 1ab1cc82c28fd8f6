"""Flags of torchvision's classification references and of timm's train.py, as users bring them,
and those of apex and of pytorch/examples' imagenet script that have no meaning here.

A spelling that means exactly the same here is accepted as an alias of ours (`--model` for
`-a`, `--smoothing` for `--label-smoothing`); one whose meaning or values differ is refused
with a one-line hint naming ours. A refused flag still takes its value off the command line,
so `--lr-scheduler cosineannealinglr /data` is reported as `--lr-scheduler`, not as an unknown
`/data`.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, Tuple

from .errors import UsageError

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
    "--no-accel": (False, "use --device cpu (pytorch/examples' way to train on the CPU)"),
}

# pytorch/examples' own process launching; here torchrun (or srun) starts the processes.
LEGACY_DIST_OPTIONS = ("--dist-url", "--dist-backend", "--world-size", "--rank", "--gpu",
                       "--multiprocessing-distributed")

# Options of apex's `amp.initialize` that have no meaning here. apex's amp module was removed
# upstream in 2025; the opt levels are implemented on native torch.amp (see precision.py).
APEX_ONLY_OPTIONS = ("--keep-batchnorm-fp32", "--master-weights", "--cast-model-type",
                     "--patch-torch-functions")


def refuse_hub_weights(pretrained) -> None:
    """pytorch/examples' --pretrained is a switch that downloads torchvision's weights; ours takes
    a local weights FILE. Given bare, or followed by the dataset folder (`--pretrained
    /data/imagenet`: the switch, then the data), it is refused with the way here."""
    why = ("nothing is downloaded here: download the weights beforehand (e.g. torchvision's "
           "resnet50-*.pth) and pass their path, --pretrained FILE")
    if pretrained == "":
        raise UsageError(f"--pretrained needs a weights FILE (pytorch/examples' --pretrained "
                         f"downloads them; {why})")
    if pretrained and Path(pretrained).is_dir():
        raise UsageError(f"--pretrained takes a weights FILE, got the folder {pretrained} "
                         f"({why})")


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Every refused flag, hidden from -h, parsed so that the refusal can name it."""
    for flag, (takes_value, _) in REFUSED.items():
        arity = dict(nargs=1) if takes_value else dict(action="store_const", const=True)
        parser.add_argument(flag, dest="peer_" + flag.strip("-").replace("-", "_"),
                            default=None, help=argparse.SUPPRESS, **arity)
    for prefix, flags in (("apex_only_", APEX_ONLY_OPTIONS), ("legacy_", LEGACY_DIST_OPTIONS)):
        for flag in flags:
            parser.add_argument(flag, dest=prefix + flag.strip("-").replace("-", "_"),
                                nargs="?", const=True, default=None, help=argparse.SUPPRESS)


def refuse_other_projects_flags(ns: dict) -> None:
    """Take the refused flags out of the parsed namespace `ns`; UsageError naming the first
    group of them that was given, and what to type instead."""
    refuse_hub_weights(ns.get("pretrained"))
    for flag, (_, hint) in REFUSED.items():
        if ns.pop("peer_" + flag.strip("-").replace("-", "_")) is not None:
            raise UsageError(f"{flag} is not an option here: {hint}")
    apex_used = [k for k, v in list(ns.items()) if k.startswith("apex_only_") and v is not None]
    for k in [k for k in ns if k.startswith("apex_only_")]:
        ns.pop(k)
    if apex_used:
        flags = ", ".join("--" + k[len("apex_only_"):].replace("_", "-") for k in apex_used)
        raise UsageError(
            f"{flags}: apex-only option. NVIDIA apex's amp module was removed upstream in 2025; "
            "this recipe implements the opt levels on native torch.amp. O2 always keeps fp32 "
            "master weights and fp32 BatchNorm. Choose the behaviour with --opt-level O0..O3 and "
            "--amp-dtype, and drop this option.")
    legacy = [k for k in list(ns) if k.startswith("legacy_")]
    used = ["--" + k[len("legacy_"):].replace("_", "-") for k in legacy if ns.pop(k) is not None]
    if used:
        raise UsageError(
            f"{', '.join(used)}: pytorch/examples' own process launching is not used here. Start "
            "one process per GPU with torchrun, e.g. torchrun --nproc_per_node=4 train/ddp.py "
            "...; multi-node: add --nnodes, --rdzv-backend=c10d and --rdzv-endpoint=HOST:PORT "
            "(see README, Multi-node)")
