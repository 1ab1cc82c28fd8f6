"""One typed config for every entry script, and the argparse CLI generated from it.

The flags follow pytorch/examples/imagenet (`-a -b -j --lr --wd -p -e --resume ...`) because that
is what users already type; everything else is an addition, never a rename.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .errors import UsageError
from .peer_flags import ALIASES, add_refused_flags, refuse_other_projects_flags
from .presets import checkpoint_settings, config_file_defaults, preset_listing
from .registry import (COLLECTIVE_TIMEOUT, DATA_BACKENDS, DDP_COMM_HOOKS, ENGINE_LOOP, ENTRIES,
                       GPU_DECODERS, HOROVOD_COMPRESSION, OPT_LEVELS, SHARE_GPUS, SYNC_BN,
                       WHOLE_WEIGHTS, entries_providing)

LR_SCHEDULES = ("step", "multistep", "cosine", "linear", "poly")
WARMUP_METHODS = ("linear", "constant")
OPTIMIZERS = ("sgd", "nesterov", "adamw", "rmsprop", "lars", "lamb")
AUTO_AUGMENT = ("none", "imagenet", "ra", "ta_wide")
LOSSES = ("ce", "bce")
COMM_HOOK_CHOICES = ("none", "fp16", "bf16", "powersgd")


# Help groups, in the order `-h` shows them (presets first: --config and what it can name).
PRESETS = "presets"
DATA, AUGMENTATION, MODEL, OPTIMIZATION, REGULARIZATION, PRECISION, DISTRIBUTION = (
    "data", "augmentation", "model", "optimization", "regularization", "precision",
    "distribution")
CHECKPOINTING, LOGGING = "checkpointing", "logging"
HELP_GROUPS = (PRESETS, DATA, AUGMENTATION, MODEL, OPTIMIZATION, REGULARIZATION, PRECISION,
               DISTRIBUTION, CHECKPOINTING, LOGGING)


def opt(group: str, *flags: str, help: str, needs: Optional[str] = None,
        elsewhere: str = "", evaluation: bool = False, **argparse_kwargs: Any) -> dict:
    """Field metadata: the help group, CLI flags and help of one config field. `needs`: the
    capability (registry.CAPABILITIES) a script's strategy must provide for the option to
    mean something (default: none, every script has it); the other scripts leave it out of
    -h and refuse it, adding `elsewhere` (where to look instead) to the message. `evaluation`:
    the field decides a checkpoint's score, so `-e --resume CHECKPOINT` takes it from the run
    that wrote the checkpoint (the command line still overrides)."""
    return {"group": group, "flags": flags, "help": help, "needs": needs,
            "elsewhere": elsewhere, "evaluation": evaluation, "argparse": argparse_kwargs}


@dataclass
class TrainConfig:
    # --- data -----------------------------------------------------------------------------------
    data: Optional[str] = field(default=None, metadata=opt(
        DATA, "data", help="dataset root with train/ and val/ ImageFolder trees "
                           "(not needed with --dummy / --data-backend synthetic)", nargs="?"))
    data_backend: str = field(default="pytorch", metadata=opt(
        DATA, "--data-backend", help="data loader", choices=tuple(DATA_BACKENDS), evaluation=True))
    gpu_decoder: str = field(default="torchcodec", metadata=opt(
        DATA, "--gpu-decoder", choices=tuple(GPU_DECODERS),
        help="--data-backend gpu's JPEG decoder: torchcodec (nvJPEG's CUDA decoder, whole "
             "images), nvimgcodec (nvImageCodec: only each crop's region, with the GPU's hardware "
             "JPEG decoder where it has one; nvimgcodec-whole: whole images, where regions fail)"))
    gpu_hw_decoder_load: float = field(default=0.65, metadata=opt(
        DATA, "--gpu-hw-decoder-load", help="--gpu-decoder nvimgcodec: as --dali-hw-decoder-load"))
    dali_hw_decoder_load: float = field(default=0.65, metadata=opt(
        DATA, "--dali-hw-decoder-load",
        help="--data-backend dali-gpu: the share of each batch that the GPU's hardware JPEG "
             "decoder takes (A100, H100, H200), the CUDA decoder the rest (DALI's own "
             "default); DALI's threads are -j"))
    dummy: bool = field(default=False, metadata=opt(
        DATA, "--dummy", help="use synthetic data (same as --data-backend synthetic)",
        evaluation=True))
    workers: int = field(default=-1, metadata=opt(
        DATA, "-j", "--workers",
        help="data loading workers per process (-1: derived from the cores)"))
    config: Optional[str] = field(default=None, metadata=opt(
        PRESETS, "--config", metavar="NAME|FILE|RUN_DIR",
        help="a preset by name (listed above), a TOML/YAML/JSON file, or a run directory (repeats "
             "its saved config): its values become the defaults, and flags on the command line "
             "override them"))
    image_size: int = field(default=224, metadata=opt(
        DATA, "--image-size", "--train-crop-size", help="train crop size", evaluation=True))
    val_resize_size: int = field(default=0, metadata=opt(
        DATA, "--val-resize-size",
        help="validation resizes the shorter side to this (0: val crop / 0.875, e.g. 256 for "
             "224)", evaluation=True))
    val_crop_size: int = field(default=0, metadata=opt(
        DATA, "--val-crop-size", help="validation center crop (0: the train crop size)",
        evaluation=True))
    synthetic_train_size: int = field(default=1_281_167, metadata=opt(
        DATA, "--synthetic-train-size", help="images per epoch of the synthetic backend"))
    synthetic_val_size: int = field(default=50_000, metadata=opt(
        DATA, "--synthetic-val-size", help="validation images of the synthetic backend",
        evaluation=True))
    synthetic_classes: int = field(default=1000, metadata=opt(
        DATA, "--synthetic-classes", help="classes of the synthetic backend", evaluation=True))

    # --- augmentation ---------------------------------------------------------------------------
    auto_augment: str = field(default="none", metadata=opt(
        AUGMENTATION, "--auto-augment",
        help="policy after the random crop and flip: imagenet (AutoAugment's ImageNet policy), "
             "ra (RandAugment, 2 ops at --ra-magnitude), ta_wide (TrivialAugment wide)",
        choices=AUTO_AUGMENT))
    ra_magnitude: int = field(default=9, metadata=opt(
        AUGMENTATION, "--ra-magnitude", help="RandAugment magnitude (of 30 bins)"))
    random_erase: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--random-erase", help="probability of random erasing per training image"))
    mixup_alpha: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--mixup-alpha", help="MixUp's Beta(alpha, alpha) (0: off); with "
        "--cutmix-alpha too, each batch gets one of the two at random", needs=ENGINE_LOOP))
    cutmix_alpha: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--cutmix-alpha", help="CutMix's Beta(alpha, alpha) (0: off)",
        needs=ENGINE_LOOP))
    ra_sampler: bool = field(default=False, metadata=opt(
        AUGMENTATION, "--ra-sampler",
        help="repeated augmentation: each image appears --ra-reps times per epoch (on "
             "different ranks, with different crops), the epoch keeps its length"))
    ra_reps: int = field(default=3, metadata=opt(
        AUGMENTATION, "--ra-reps", help="copies of each image with --ra-sampler"))
    progressive_resize: Optional[tuple] = field(default=None, metadata=opt(
        AUGMENTATION, "--progressive-resize",
        help="FFCV's progressive resizing: the train crop grows linearly from MIN to MAX "
             "pixels (multiples of 32) between epochs START and END",
        nargs=4, type=int, metavar=("MIN", "MAX", "START", "END"), evaluation=True))

    # --- model ----------------------------------------------------------------------------------
    arch: str = field(default="resnet50", metadata=opt(
        MODEL, "-a", "--arch",
        help="torchvision model name, e.g. resnet18, resnet50; timm's as timm/NAME, e.g. "
             "timm/resnet50d", evaluation=True))
    pretrained: Optional[str] = field(default=None, metadata=opt(
        MODEL, "--pretrained", nargs="?", const="",  # bare: pytorch/examples' (peer_flags)
        help="path of a local weights file (state_dict) to start from"))
    zero_init_residual: bool = field(default=False, metadata=opt(
        MODEL, "--zero-init-residual", help="start the last BatchNorm of each residual block "
                                            "at zero (ResNet family; Goyal et al.)"))
    channels_last: Optional[bool] = field(default=None, metadata=opt(
        MODEL, "--channels-last",
        help="the channels_last memory format for the model and the batches; unset: on where "
             "it is the faster layout (a CPU at crops of 112 px and more; a GPU with a half "
             "type), off for small crops on a CPU and for fp32 on a GPU", evaluation=True))
    compile: bool = field(default=False, metadata=opt(
        MODEL, "--compile", help="torch.compile the model", needs=ENGINE_LOOP))

    # --- optimization ---------------------------------------------------------------------------
    epochs: int = field(default=90, metadata=opt(
        OPTIMIZATION, "--epochs", help="total epochs to run"))
    batch_size: int = field(default=256, metadata=opt(
        OPTIMIZATION, "-b", "--batch-size", help="mini-batch size PER PROCESS"))
    lr: float = field(default=0.1, metadata=opt(
        OPTIMIZATION, "--lr", "--learning-rate",
        help="learning rate for a global batch of 256; scaled linearly by global batch / 256"))
    no_lr_scaling: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--no-lr-scaling",
        help="use --lr as is, without linear scaling by global batch"))
    optimizer: str = field(default="sgd", metadata=opt(
        OPTIMIZATION, "--opt", help="sgd, nesterov (SGD with Nesterov momentum), adamw, "
        "rmsprop, lars or lamb (the last two from timm.optim)", choices=OPTIMIZERS,
        needs=ENGINE_LOOP, elsewhere="the parameter server's update rule is SGD"))
    momentum: float = field(default=0.9, metadata=opt(
        OPTIMIZATION, "--momentum", help="momentum of sgd, nesterov, rmsprop and lars"))
    lr_schedule: str = field(default="multistep", metadata=opt(
        OPTIMIZATION, "--lr-schedule",
        help="step: x --lr-gamma every --lr-step-size epochs; multistep: x --lr-gamma at each "
             "of --lr-steps; cosine, linear, poly: from the peak to --lr-min at the last epoch",
        choices=LR_SCHEDULES))
    lr_steps: tuple = field(default=(30, 60, 80), metadata=opt(
        OPTIMIZATION, "--lr-steps", help="multistep: the epochs where the lr drops",
        nargs="+", type=int))
    lr_step_size: int = field(default=30, metadata=opt(
        OPTIMIZATION, "--lr-step-size", help="step: epochs between drops"))
    lr_gamma: float = field(default=0.1, metadata=opt(
        OPTIMIZATION, "--lr-gamma", help="step and multistep: factor of each drop"))
    lr_min: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--lr-min", help="cosine, linear, poly: the lr at the end (absolute)"))
    lr_power: float = field(default=2.0, metadata=opt(
        OPTIMIZATION, "--lr-power", help="poly: the exponent (linear is poly with 1)"))
    warmup_epochs: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--warmup-epochs", help="lr warm-up over this many epochs (may be a "
                                              "fraction), step by step"))
    warmup_method: str = field(default="linear", metadata=opt(
        OPTIMIZATION, "--warmup-method", help="linear: from --warmup-start-factor x lr up to "
        "lr; constant: --warmup-start-factor x lr throughout", choices=WARMUP_METHODS))
    warmup_start_factor: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--warmup-start-factor", help="the warm-up's starting fraction of the lr"))
    clip_grad_norm: Optional[float] = field(default=None, metadata=opt(
        OPTIMIZATION, "--clip-grad-norm", help="clip the global gradient norm to this "
        "(measured on the reduced, unscaled gradients)", needs=ENGINE_LOOP,
        elsewhere="the parameter server does not clip"))
    grad_accum: int = field(default=1, metadata=opt(
        OPTIMIZATION, "--grad-accum", "--batches-per-allreduce",
        help="micro-batches accumulated per optimizer step (Horovod's name: batches per "
             "all-reduce)", needs=ENGINE_LOOP))
    global_batch: Optional[str] = field(default=None, metadata=opt(
        OPTIMIZATION, "--global-batch", metavar="N|published", needs=ENGINE_LOOP,
        help="this global batch on any number of processes: -b is the most per process, "
             "--grad-accum the rest (published: the --config preset's)"))
    allow_large_batch: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--allow-large-batch", help="a preset at over 4x its published global "
        "batch without LARS/LAMB (refused otherwise: not what the recipe was validated at)"))
    steps_per_epoch: int = field(default=0, metadata=opt(
        OPTIMIZATION, "--steps-per-epoch",
        help="cap optimizer steps per epoch (0: the whole epoch); for benchmarks and sweeps"))
    desired_acc: Optional[float] = field(default=None, metadata=opt(
        OPTIMIZATION, "--desired-acc", help="stop once validation top-1 (%%) reaches this value"))
    seed: int = field(default=0, metadata=opt(
        OPTIMIZATION, "--seed", help="seed of initialisation, data order and augmentation; "
                                     "every run is seeded, and its log records the seed"))
    deterministic: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--deterministic", help="use deterministic algorithms (slower on GPU)"))

    # --- regularization -------------------------------------------------------------------------
    weight_decay: float = field(default=1e-4, metadata=opt(
        REGULARIZATION, "--wd", "--weight-decay", help="weight decay"))
    norm_weight_decay: Optional[float] = field(default=None, metadata=opt(
        REGULARIZATION, "--norm-weight-decay",
        help="weight decay of normalisation layers' weights and biases (default: --wd)",
        needs=ENGINE_LOOP, elsewhere="the parameter server decays every parameter alike"))
    bias_weight_decay: Optional[float] = field(default=None, metadata=opt(
        REGULARIZATION, "--bias-weight-decay",
        help="weight decay of the other layers' biases (default: --wd)", needs=ENGINE_LOOP,
        elsewhere="the parameter server decays every parameter alike"))
    label_smoothing: float = field(default=0.0, metadata=opt(
        REGULARIZATION, "--label-smoothing", help="label smoothing of the loss", evaluation=True))
    loss: str = field(default="ce", metadata=opt(
        REGULARIZATION, "--loss", help="ce: softmax cross-entropy; bce: binary cross-entropy "
        "per class on the (smoothed, mixed) targets, as in timm's ResNet strikes back",
        choices=LOSSES, needs=ENGINE_LOOP, evaluation=True))
    model_ema: bool = field(default=False, metadata=opt(
        REGULARIZATION, "--model-ema", help="keep an exponential moving average of the "
        "weights, validated and checkpointed with the model", needs=WHOLE_WEIGHTS,
        elsewhere="the average is of whole weights, which a sharding strategy does not hold",
        evaluation=True))
    model_ema_steps: int = field(default=32, metadata=opt(
        REGULARIZATION, "--model-ema-steps", help="update the average every N optimizer "
                                                  "steps", needs=WHOLE_WEIGHTS))
    model_ema_decay: float = field(default=0.99998, metadata=opt(
        REGULARIZATION, "--model-ema-decay",
        help="torchvision's definition, kept so that its recipes carry over: each update "
             "keeps 1 - (1 - decay) x global batch x --model-ema-steps / --epochs of the "
             "average", needs=WHOLE_WEIGHTS))

    # --- precision ------------------------------------------------------------------------------
    opt_level: str = field(default="O0", metadata=opt(
        PRECISION, "--opt-level",
        help="apex-style mixed precision level on native torch.amp: O0 fp32, O1 autocast + "
             "dynamic loss scaling, O2 half model with fp32 master weights and fp32 "
             "BatchNorm, O3 pure half", choices=OPT_LEVELS, evaluation=True))
    amp_dtype: str = field(default="auto", metadata=opt(
        PRECISION, "--amp-dtype", help="half type of O1-O3 (auto: float16 on GPU, bfloat16 on CPU)",
        choices=("auto", "float16", "bfloat16"), evaluation=True))
    loss_scale: Optional[str] = field(default=None, metadata=opt(
        PRECISION, "--loss-scale",
        help="'dynamic' or a fixed number (apex's loss_scale). Default: the level's own, "
             "dynamic for O1/O2 with float16, none otherwise; refused with bfloat16, which "
             "needs none"))
    float64: bool = field(default=False, metadata=opt(
        PRECISION, "--float64", help="run O0 in float64 (model, inputs, loss): slow, for "
                                     "checking that strategies compute exactly the same thing",
        evaluation=True))

    # --- distribution ---------------------------------------------------------------------------
    device: str = field(default="auto", metadata=opt(
        DISTRIBUTION, "--device", help="auto (CUDA if present), cpu or cuda",
        choices=("auto", "cpu", "cuda")))
    share_gpus: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--share-gpus",
        help="let more processes than GPUs run on one node, local rank r on GPU r mod the GPU "
             "count, communicating over gloo (NCCL refuses two ranks on one GPU): for trying "
             "the multi-process paths on a one-GPU machine, not for speed",
        needs=SHARE_GPUS, elsewhere="one process per node has nothing to share"))
    sync_bn: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--sync-bn", help="synchronise BatchNorm statistics across processes",
        needs=SYNC_BN, elsewhere="one process has nothing to synchronise"))
    ddp_comm_hook: str = field(default="none", metadata=opt(
        DISTRIBUTION, "--ddp-comm-hook",
        help="gradient communication hook (PyTorch built-ins): fp16 / bf16 compress gradients "
             "to half for the all-reduce, powersgd sends low-rank approximations with error "
             "feedback", choices=COMM_HOOK_CHOICES, needs=DDP_COMM_HOOKS,
        elsewhere="Horovod's counterpart is --fp16-allreduce"))
    powersgd_rank: int = field(default=1, metadata=opt(
        DISTRIBUTION, "--powersgd-rank", help="PowerSGD matrix approximation rank",
        needs=DDP_COMM_HOOKS))
    powersgd_start_step: int = field(default=10, metadata=opt(
        DISTRIBUTION, "--powersgd-start-step",
        help="PowerSGD: plain all-reduce for this many steps first (PyTorch suggests about "
             "10%% of training, at least 2)", needs=DDP_COMM_HOOKS))
    fp16_allreduce: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--fp16-allreduce", help="compress gradients to fp16 for the all-reduce",
        needs=HOROVOD_COMPRESSION, elsewhere="DDP's counterpart is --ddp-comm-hook fp16"))
    dist_timeout: float = field(default=600.0, metadata=opt(
        DISTRIBUTION, "--dist-timeout",
        help="seconds a collective (or the process-group start) may wait for a peer before "
             "the run fails with an error naming the cause", needs=COLLECTIVE_TIMEOUT))

    # --- checkpointing --------------------------------------------------------------------------
    resume: Optional[str] = field(default=None, metadata=opt(
        CHECKPOINTING, "--resume",
        help="start from a checkpoint file, or a run dir's newest checkpoint, in a new run "
             "dir; 'auto': continue the newest run of this script and arch under --logdir "
             "(or --run-name) in its own dir"))
    start_epoch: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--start-epoch",
        help="manual epoch number (useful on restarts; --resume overrides it)"))
    checkpoint_every: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--checkpoint-every", help="also checkpoint every N optimizer steps "
                                                  "inside an epoch (0: only at epoch ends)"))
    save_every: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--save-every", needs=ENGINE_LOOP,
        help="also keep every Nth epoch's checkpoint as checkpoint-epochE.pth (0: keep only "
             "the newest, the one before it and the best)"))
    export_weights: Optional[str] = field(default=None, metadata=opt(
        CHECKPOINTING, "--export-weights", metavar="FILE", needs=ENGINE_LOOP,
        help="at the end, write the best model's weights (with -e: the evaluated ones) to FILE "
             "alone, fp32, as torchvision's models load them"))
    evaluate: bool = field(default=False, metadata=opt(
        CHECKPOINTING, "-e", "--evaluate",
        help="only evaluate the model (with --resume or --pretrained)", needs=ENGINE_LOOP,
        elsewhere="the parameter server validates checkpoints with --evaluator RUN_DIR"))

    # --- logging --------------------------------------------------------------------------------
    print_freq: int = field(default=10, metadata=opt(
        LOGGING, "-p", "--print-freq", help="print and log every N optimizer steps"))
    logdir: str = field(default="runs", metadata=opt(
        LOGGING, "--logdir",
        help="parent folder of run dirs (TensorBoard, JSONL log, checkpoints)"))
    run_name: Optional[str] = field(default=None, metadata=opt(
        LOGGING, "--run-name", help="run dir name under --logdir (default: <script>-<arch>-<time>)"))

    # ---------------------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return "synthetic" if self.dummy else self.data_backend

    def largest_train_crop(self) -> int:
        """The train crop in pixels: under --progressive-resize its MAX (the loaders then ignore
        --image-size)."""
        if self.progressive_resize is not None:
            return self.progressive_resize[1]
        return self.image_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def step_hooks(self, rank: int, ranks: int, what: str = "processes") -> tuple:
        """What runs after each training step of process `rank` of `ranks` (a parameter-server
        worker: its index among the workers), each hook called as hook(epoch, seconds the step
        took). The product has none; a config built on it adds its own (the benchmarks'
        bench.slow_workers: a sleep that emulates a slower device). Each process asks once
        before it trains, so a setting that does not fit the processes stops every one of them
        first (UsageError)."""
        return ()

    def validate_extra(self) -> None:
        """Checks of a subclass's own fields (the parameter server's, say)."""

    def save(self, path: Path, **extra: Any) -> None:
        path.write_text(json.dumps({**self.to_dict(), **extra}, indent=2, sort_keys=True))


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def build_parser(description: str = "", defaults: Optional[dict] = None,
                 config_cls: type = TrainConfig, entry: Optional[str] = None
                 ) -> argparse.ArgumentParser:
    """The CLI of one entry script: its options in help groups. Options of other entries are
    parsed (so that `parse_args` can say where they belong) but left out of -h."""
    parser = _Parser(description=description, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: parser.add_argument_group(f"{name} options") for name in HELP_GROUPS}
    groups[PRESETS].description = preset_listing()
    defaults = defaults or {}
    for f in dataclasses.fields(config_cls):
        meta = f.metadata
        default = defaults.get(f.name, f.default)
        shown = meta["needs"] is None or entry is None or ENTRIES[entry].provides(meta["needs"])
        unset = default is None or default is False  # nothing worth printing
        help_text = meta["help"] if unset else f"{meta['help']} (default: {default})"
        kwargs = dict(meta["argparse"], help=help_text if shown else argparse.SUPPRESS)
        if f.type in ("bool", "Optional[bool]"):
            # --x / --no-x: a preset may switch on what the command line switches off again
            # (a flag that is itself a negation, --no-lr-scaling, stays a plain switch)
            negated = meta["flags"][-1].startswith("--no-")
            kwargs["action"] = "store_true" if negated else argparse.BooleanOptionalAction
        elif "type" not in kwargs and "choices" not in kwargs:
            kwargs["type"] = _scalar_type(f.type)
        if meta["flags"][0].startswith("-"):
            kwargs["dest"] = f.name
        if meta["group"] not in groups:  # a subclass's own group (the parameter server's)
            groups[meta["group"]] = parser.add_argument_group(f"{meta['group']} options")
        # the other projects' spellings go before ours: messages name a field by its last flag
        flags = (*meta["flags"][:-1], *ALIASES.get(f.name, ()), meta["flags"][-1])
        groups[meta["group"]].add_argument(*flags, default=default, **kwargs)
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK instead. Accept both.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None,
                        help=argparse.SUPPRESS)
    add_refused_flags(parser)
    return parser


class _Parser(argparse.ArgumentParser):
    """An error is one line naming the problem (the usage block only with -h)."""

    def error(self, message: str):
        unknown = [w for w in message.split() if w.startswith("--")]
        if message.startswith("unrecognized arguments") and unknown:
            known = [s for action in self._actions for s in action.option_strings
                     if action.help != argparse.SUPPRESS]
            close = difflib.get_close_matches(unknown[0].split("=")[0], known, n=1, cutoff=0.8)
            message = f"unknown option {unknown[0]}" + (f"; did you mean {close[0]}?"
                                                         if close else "")
        self.exit(2, f"{self.prog}: error: {message} (see -h)\n")


def refuse_other_entries_options(ns: dict, config_cls: type, entry: str) -> None:
    """UsageError for an option set on the command line that this entry script does not
    have, naming the scripts that do."""
    for f in dataclasses.fields(config_cls):
        needs = f.metadata["needs"]
        if needs is None or ENTRIES[entry].provides(needs) or ns[f.name] == f.default:
            continue
        scripts = ", ".join(ENTRIES[name].script for name in entries_providing(needs))
        hint = f"; {f.metadata['elsewhere']}" if f.metadata["elsewhere"] else ""
        raise UsageError(f"{f.metadata['flags'][-1]} is an option of {scripts}, not of "
                         f"{ENTRIES[entry].script}{hint}")


def _early_options(argv: Optional[list]) -> argparse.Namespace:
    """--config, -e and --resume, read before the full parser is built: what they name
    gives the defaults."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--config")
    early.add_argument("--resume")
    early.add_argument("-e", "--evaluate", action="store_true")
    known, _ = early.parse_known_args(argv)
    return known


def _show_settings(settings: dict, cfg: "TrainConfig", defaults: dict) -> None:
    """Say which of the checkpoint's settings an evaluation took (once, on the main rank)."""
    taken = [_shown_option(k, v) for k, v in settings.items()
             if getattr(cfg, k) == v and v != defaults.get(k, _FIELDS[k].default)]
    if taken and os.environ.get("RANK", "0") == "0":
        print(f"=> -e: the checkpoint's run set {', '.join(taken)} (a flag on the command line "
              "overrides)", flush=True)


def _shown_option(name: str, value: Any) -> str:
    """An option as it is typed: `--arch resnet18`, `--model-ema`, `--no-channels-last`."""
    flag = _FIELDS[name].metadata["flags"][-1]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, tuple) else value}"


def _scalar_type(annotation: str):
    base = annotation.replace("Optional[", "").rstrip("]")
    return {"int": int, "float": float, "str": str}[base]


def parse_args(argv: Optional[list] = None, description: str = "",
               defaults: Optional[dict] = None, config_cls: type = TrainConfig,
               entry: Optional[str] = None) -> TrainConfig:
    """Parse and validate the command line of `entry` (a registry name; None: every option
    is accepted); raises UsageError on bad input. A subclass of TrainConfig adds its own
    fields (and checks, in its `validate_extra`)."""
    defaults = dict(defaults or {})
    script_defaults = dict(defaults)
    early, settings = _early_options(argv), {}
    if early.config:
        # the file's values sit between the script's defaults and the command line
        defaults.update(config_file_defaults(early.config, config_cls))
    elif early.evaluate and early.resume and early.resume != "auto":
        settings = checkpoint_settings(early.resume, [
            f.name for f in dataclasses.fields(config_cls) if f.metadata.get("evaluation")])
        defaults.update(settings)
    parser = build_parser(description, defaults, config_cls, entry)
    ns = vars(parser.parse_args(argv))
    ns.pop("local_rank")
    refuse_other_projects_flags(ns)
    if entry is not None:
        refuse_other_entries_options(ns, config_cls, entry)
    ns["lr_steps"] = tuple(ns["lr_steps"])
    if ns["progressive_resize"] is not None:
        ns["progressive_resize"] = tuple(ns["progressive_resize"])
    cfg = config_cls(**ns)
    validate(cfg)
    cfg.validate_extra()
    if settings:
        _show_settings(settings, cfg, script_defaults)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Checks that need no filesystem or device; those live next to the code that uses them."""
    for name in ("batch_size", "epochs", "grad_accum", "print_freq", "image_size",
                 "lr_step_size", "ra_reps", "model_ema_steps"):
        if getattr(cfg, name) <= 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be a positive integer, got {getattr(cfg, name)}")
    if cfg.save_every < 0:
        raise UsageError(f"--save-every must be >= 0 (0: off), got {cfg.save_every}")
    if cfg.start_epoch < 0 or (cfg.start_epoch >= cfg.epochs and not cfg.evaluate):
        raise UsageError(f"--start-epoch {cfg.start_epoch} must be in [0, --epochs {cfg.epochs})")
    for name, low, inclusive in (("lr", 0.0, False), ("momentum", 0.0, True),
                                 ("weight_decay", 0.0, True), ("dist_timeout", 0.0, False),
                                 ("synthetic_train_size", 0, False),
                                 ("synthetic_val_size", 0, False), ("synthetic_classes", 0, False)):
        value = getattr(cfg, name)
        if value < low or (value == low and not inclusive):
            flag = {"weight_decay": "--wd"}.get(name, "--" + name.replace("_", "-"))
            raise UsageError(f"{flag} must be {'>=' if inclusive else '>'} {low}, got {value}")
    if cfg.evaluate and not (cfg.resume or cfg.pretrained):
        raise UsageError("-e/--evaluate needs weights to score: --resume CHECKPOINT (or a run "
                         "dir: its newest checkpoint; RUN_DIR/model_best.pth: its best), or "
                         "--pretrained FILE")
    if cfg.ddp_comm_hook == "powersgd" and (cfg.powersgd_rank < 1
                                            or cfg.powersgd_start_step < 2):
        raise UsageError("PowerSGD needs --powersgd-rank >= 1 and --powersgd-start-step >= 2 "
                         "(error feedback needs one uncompressed step)")
    if cfg.compile and cfg.sync_bn:
        raise UsageError("--compile with --sync-bn is refused: torch.compile fails on DDP with "
                         "SyncBatchNorm (pytorch#107372, open) and the cross-rank BatchNorm "
                         "that Horovod and gloo use is not tested compiled. Drop one of them")
    if cfg.steps_per_epoch < 0 or cfg.checkpoint_every < 0:
        raise UsageError("--steps-per-epoch and --checkpoint-every must be >= 0")
    if cfg.backend != "synthetic" and not cfg.data:
        raise UsageError("the dataset path is missing: pass DATA (a folder with train/ and val/), "
                         "or use --dummy for synthetic data")
    if cfg.loss_scale not in (None, "dynamic"):
        try:
            if float(cfg.loss_scale) <= 0:
                raise ValueError
        except ValueError:
            raise UsageError(f"--loss-scale must be 'dynamic' or a positive number, "
                             f"got {cfg.loss_scale!r}") from None
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise UsageError("--label-smoothing must be in [0, 1)")
    for flag in ("dali_hw_decoder_load", "gpu_hw_decoder_load"):
        if not 0.0 <= getattr(cfg, flag) <= 1.0:
            raise UsageError(f"--{flag.replace('_', '-')} is a share of each batch, in [0, 1]; "
                             f"got {getattr(cfg, flag)}")
    if cfg.warmup_epochs < 0 or (cfg.warmup_epochs > 0 and cfg.warmup_epochs >= cfg.epochs):
        raise UsageError(f"--warmup-epochs must be in [0, --epochs), got {cfg.warmup_epochs}")
    validate_recipe(cfg)


def validate_recipe(cfg: TrainConfig) -> None:
    """The recipe options' ranges."""
    for name, low, high in (("warmup_start_factor", 0.0, 1.0), ("random_erase", 0.0, 1.0),
                            ("lr_gamma", 0.0, 1.0), ("ra_magnitude", 0, 30)):
        value = getattr(cfg, name)
        if not low <= value <= high:
            raise UsageError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got "
                             f"{value}")
    if cfg.warmup_method == "constant" and cfg.warmup_epochs and not cfg.warmup_start_factor:
        raise UsageError("--warmup-method constant trains the warm-up at --warmup-start-factor "
                         "x lr: give it a factor > 0 (torchvision's default: 0.01)")
    for name in ("lr_min", "mixup_alpha", "cutmix_alpha", "val_resize_size", "val_crop_size"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got "
                             f"{getattr(cfg, name)}")
    if cfg.lr_power <= 0:
        raise UsageError(f"--lr-power must be > 0, got {cfg.lr_power}")
    if cfg.clip_grad_norm is not None and cfg.clip_grad_norm <= 0:
        raise UsageError(f"--clip-grad-norm must be > 0, got {cfg.clip_grad_norm}")
    if not 0.0 < cfg.model_ema_decay < 1.0:
        raise UsageError(f"--model-ema-decay must be in (0, 1), got {cfg.model_ema_decay}")
    for name in ("norm_weight_decay", "bias_weight_decay"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
    if cfg.progressive_resize is not None:
        low, high, start, end = cfg.progressive_resize
        if not (0 < low <= high and 0 <= start < end):
            raise UsageError(f"--progressive-resize MIN MAX START END needs 0 < MIN <= MAX and "
                             f"START < END, got {' '.join(map(str, cfg.progressive_resize))}")


def exit_on_usage_error(err: UsageError) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
