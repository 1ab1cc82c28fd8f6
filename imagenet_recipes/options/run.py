"""The run options: presets, seeds and stopping, checkpoints and evaluation, logging."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..registry import ENGINE_LOOP
from .fields import CHECKPOINTING, LOGGING, NOT_NEGATIVE, OPTIMIZATION, POSITIVE_COUNT, PRESETS
from .fields import Bound, Section, opt


@dataclass(frozen=True)
class RunOptions(Section):
    """What a run starts from, when it stops, and what it writes."""
    config: Optional[str] = field(default=None, metadata=opt(
        PRESETS, "--config", metavar="NAME|FILE|RUN_DIR",
        help="a preset by name (listed above), a TOML/YAML/JSON file, or a run directory (repeats "
             "its saved config): its values become the defaults, and flags on the command line "
             "override them"))
    steps_per_epoch: int = field(default=0, metadata=opt(
        OPTIMIZATION, "--steps-per-epoch",
        help="cap optimizer steps per epoch (0: the whole epoch); for benchmarks and sweeps",
        bound=NOT_NEGATIVE))
    desired_acc: Optional[float] = field(default=None, metadata=opt(
        OPTIMIZATION, "--desired-acc", help="stop once validation top-1 (%%) reaches this value"))
    seed: int = field(default=0, metadata=opt(
        OPTIMIZATION, "--seed", help="seed of initialisation, data order and augmentation; "
                                     "every run is seeded, and its log records the seed"))
    deterministic: bool = field(default=False, metadata=opt(
        OPTIMIZATION, "--deterministic", help="use deterministic algorithms (slower on GPU)"))
    resume: Optional[str] = field(default=None, metadata=opt(
        CHECKPOINTING, "--resume",
        help="start from a checkpoint file, or a run dir's newest checkpoint, in a new run "
             "dir; 'auto': continue the newest run of this script and arch under --logdir "
             "(or --run-name) in its own dir"))
    start_epoch: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--start-epoch",
        help="manual epoch number (useful on restarts; --resume overrides it)",
        bound=NOT_NEGATIVE))
    checkpoint_every: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--checkpoint-every", help="also checkpoint every N optimizer steps "
                                                  "inside an epoch (0: only at epoch ends)",
        bound=NOT_NEGATIVE))
    save_every: int = field(default=0, metadata=opt(
        CHECKPOINTING, "--save-every",
        help="also keep every Nth epoch's checkpoint as checkpoint-epochE.pth (0: keep only "
             "the newest, the one before it and the best)",
        bound=Bound(low=0, says="must be >= 0 (0: off)")))
    export_weights: Optional[str] = field(default=None, metadata=opt(
        CHECKPOINTING, "--export-weights", metavar="FILE", needs=ENGINE_LOOP,
        help="at the end, write the best model's weights (with -e: the evaluated ones) to FILE "
             "alone, fp32, as torchvision's models load them"))
    evaluate: bool = field(default=False, metadata=opt(
        CHECKPOINTING, "-e", "--evaluate",
        help="only evaluate the model (with --resume or --pretrained)", needs=ENGINE_LOOP,
        elsewhere="the parameter server validates checkpoints with --evaluator RUN_DIR"))
    print_freq: int = field(default=10, metadata=opt(
        LOGGING, "-p", "--print-freq", help="print and log every N optimizer steps",
        bound=POSITIVE_COUNT))
    logdir: str = field(default="runs", metadata=opt(
        LOGGING, "--logdir",
        help="parent folder of run dirs (TensorBoard, JSONL log, checkpoints)"))
    run_name: Optional[str] = field(default=None, metadata=opt(
        LOGGING, "--run-name",
        help="run dir name under --logdir (default: <script>-<arch>-<time>)"))
