"""The optimisation options: the batch (what the run plan resolves), the optimizer, the lr
schedule, the loss and the weights' moving average."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import UsageError
from ..registry import ENGINE_LOOP, WHOLE_WEIGHTS
from .fields import (FRACTION, NOT_NEGATIVE, OPTIMIZATION, POSITIVE, POSITIVE_COUNT,
                     REGULARIZATION, Bound, Section, opt)

OPTIMIZERS = ("sgd", "nesterov", "adamw", "rmsprop", "lars", "lamb")
LR_SCHEDULES = ("step", "multistep", "cosine", "linear", "poly")
WARMUP_METHODS = ("linear", "constant")
LOSSES = ("ce", "bce")


@dataclass(frozen=True)
class BatchOptions(Section):
    """The batch per process and across them: what run_plan resolves into the run's batch,
    accumulation and lr scaling."""
    batch_size: int = field(default=256, metadata=opt(
        OPTIMIZATION, "-b", "--batch-size", help="mini-batch size PER PROCESS",
        bound=POSITIVE_COUNT))
    grad_accum: int = field(default=1, metadata=opt(
        OPTIMIZATION, "--grad-accum", "--batches-per-allreduce",
        help="micro-batches accumulated per optimizer step (Horovod's name: batches per "
             "all-reduce)", needs=ENGINE_LOOP, bound=POSITIVE_COUNT))
    global_batch: Optional[str] = field(default=None, metadata=opt(
        OPTIMIZATION, "--global-batch", metavar="N|published", needs=ENGINE_LOOP,
        help="this global batch on any number of processes: -b is the most per process, "
             "--grad-accum the rest (published: the --config preset's)"))
    allow_large_batch: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--allow-large-batch", help="a preset at over 4x its published global "
        "batch without LARS/LAMB (refused otherwise: not what the recipe was validated at)"))


    @classmethod
    def rules(cls, values) -> None:
        given = values.global_batch
        if given is not None and given != "published" and not (given.isdigit()
                                                                and int(given) > 0):
            raise UsageError(f"--global-batch takes a positive number of images or 'published', "
                             f"got {given!r}")


@dataclass(frozen=True)
class OptimizerOptions(Section):
    """The optimizer, its lr (per 256 images) and its regularisation."""
    lr: float = field(default=0.1, metadata=opt(
        OPTIMIZATION, "--lr", "--learning-rate",
        help="learning rate for a global batch of 256; scaled linearly by global batch / 256",
        bound=POSITIVE))
    no_lr_scaling: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--no-lr-scaling",
        help="use --lr as is, without linear scaling by global batch"))
    optimizer: str = field(default="sgd", metadata=opt(
        OPTIMIZATION, "--opt", help="sgd, nesterov (SGD with Nesterov momentum), adamw, "
        "rmsprop, lars or lamb (the last two from timm.optim)", choices=OPTIMIZERS,
        needs=ENGINE_LOOP, elsewhere="the parameter server's update rule is SGD"))
    momentum: float = field(default=0.9, metadata=opt(
        OPTIMIZATION, "--momentum", help="momentum of sgd, nesterov, rmsprop and lars",
        bound=NOT_NEGATIVE))
    weight_decay: float = field(default=1e-4, metadata=opt(
        REGULARIZATION, "--wd", "--weight-decay", help="weight decay", bound=NOT_NEGATIVE))
    norm_weight_decay: Optional[float] = field(default=None, metadata=opt(
        REGULARIZATION, "--norm-weight-decay",
        help="weight decay of normalisation layers' weights and biases (default: --wd)",
        bound=NOT_NEGATIVE,
        needs=ENGINE_LOOP, elsewhere="the parameter server decays every parameter alike"))
    bias_weight_decay: Optional[float] = field(default=None, metadata=opt(
        REGULARIZATION, "--bias-weight-decay",
        help="weight decay of the other layers' biases (default: --wd)", needs=ENGINE_LOOP,
        bound=NOT_NEGATIVE,
        elsewhere="the parameter server decays every parameter alike"))


@dataclass(frozen=True)
class ScheduleOptions(Section):
    """How long the run trains and the lr over it."""
    epochs: int = field(default=90, metadata=opt(
        OPTIMIZATION, "--epochs", help="total epochs to run", bound=POSITIVE_COUNT))
    lr_schedule: str = field(default="multistep", metadata=opt(
        OPTIMIZATION, "--lr-schedule",
        help="step: x --lr-gamma every --lr-step-size epochs; multistep: x --lr-gamma at each "
             "of --lr-steps; cosine, linear, poly: from the peak to --lr-min at the last epoch",
        choices=LR_SCHEDULES))
    lr_steps: tuple = field(default=(30, 60, 80), metadata=opt(
        OPTIMIZATION, "--lr-steps", help="multistep: the epochs where the lr drops",
        nargs="+", type=int))
    lr_step_size: int = field(default=30, metadata=opt(
        OPTIMIZATION, "--lr-step-size", help="step: epochs between drops", bound=POSITIVE_COUNT))
    lr_gamma: float = field(default=0.1, metadata=opt(
        OPTIMIZATION, "--lr-gamma", help="step and multistep: factor of each drop",
        bound=FRACTION))
    lr_min: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--lr-min", help="cosine, linear, poly: the lr at the end (absolute)",
        bound=NOT_NEGATIVE))
    lr_power: float = field(default=2.0, metadata=opt(
        OPTIMIZATION, "--lr-power", help="poly: the exponent (linear is poly with 1)",
        bound=POSITIVE))
    warmup_epochs: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--warmup-epochs", help="lr warm-up over this many epochs (may be a "
                                              "fraction), step by step"))
    warmup_method: str = field(default="linear", metadata=opt(
        OPTIMIZATION, "--warmup-method", help="linear: from --warmup-start-factor x lr up to "
        "lr; constant: --warmup-start-factor x lr throughout", choices=WARMUP_METHODS))
    warmup_start_factor: float = field(default=0.0, metadata=opt(
        OPTIMIZATION, "--warmup-start-factor", help="the warm-up's starting fraction of the lr",
        bound=FRACTION))

    @classmethod
    def rules(cls, values) -> None:
        if values.warmup_epochs < 0 or (values.warmup_epochs > 0
                                        and values.warmup_epochs >= values.epochs):
            raise UsageError(f"--warmup-epochs must be in [0, --epochs), got "
                             f"{values.warmup_epochs}")
        if values.warmup_method == "constant" and values.warmup_epochs \
                and not values.warmup_start_factor:
            raise UsageError("--warmup-method constant trains the warm-up at --warmup-start-factor "
                             "x lr: give it a factor > 0 (torchvision's default: 0.01)")


@dataclass(frozen=True)
class LossOptions(Section):
    """The loss and its targets."""
    label_smoothing: float = field(default=0.0, metadata=opt(
        REGULARIZATION, "--label-smoothing", help="label smoothing of the loss", evaluation=True,
        bound=Bound(low=0, high=1, high_open=True)))
    loss: str = field(default="ce", metadata=opt(
        REGULARIZATION, "--loss", help="ce: softmax cross-entropy; bce: binary cross-entropy "
        "per class on the (smoothed, mixed) targets, as in timm's ResNet strikes back",
        choices=LOSSES, needs=ENGINE_LOOP, evaluation=True))


@dataclass(frozen=True)
class EmaOptions(Section):
    """The exponential moving average of the weights."""
    model_ema: bool = field(default=False, metadata=opt(
        REGULARIZATION, "--model-ema", help="keep an exponential moving average of the "
        "weights, validated and checkpointed with the model", needs=WHOLE_WEIGHTS,
        elsewhere="the average is of whole weights, which a sharding strategy does not hold",
        evaluation=True))
    model_ema_steps: int = field(default=32, metadata=opt(
        REGULARIZATION, "--model-ema-steps", help="update the average every N optimizer "
                                                  "steps", needs=WHOLE_WEIGHTS,
        bound=POSITIVE_COUNT))
    model_ema_decay: float = field(default=0.99998, metadata=opt(
        REGULARIZATION, "--model-ema-decay",
        help="torchvision's definition, kept so that its recipes carry over: each update "
             "keeps 1 - (1 - decay) x global batch x --model-ema-steps / --epochs of the "
             "average", needs=WHOLE_WEIGHTS,
        bound=Bound(low=0, high=1, low_open=True, high_open=True)))
