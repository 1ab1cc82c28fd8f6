"""The one list of what the project offers: strategies and what each provides, entry scripts,
opt levels, data backends and what each does.

The CLI's choices, the sweep, the plots and the RESULTS tables all read these tables instead of
keeping lists of their own, so adding a strategy or a data backend is one line here plus its
module. Plain data only (no torch import), so the tools can read it cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Tuple


# Capabilities: what a strategy offers beyond what every script has. A config field names the
# one it needs (options.opt's `needs`); a script shows and accepts the field only when its
# strategy provides it, and refuses it otherwise, naming the scripts that have it.
ENGINE_LOOP = "the engine's loop"       # imagenet_recipes.engine: optimizers, EMA, MixUp, compile, -e
PROCESSES = "one process per device"    # a group of processes, one per device
COLLECTIVE_TIMEOUT = "collective timeouts"  # torch.distributed's own (--dist-timeout)
SYNC_BN = "BatchNorm over processes"
SHARE_GPUS = "several processes per GPU"
DDP_COMM_HOOKS = "DDP communication hooks"
HOROVOD_COMPRESSION = "Horovod's gradient compression"
WHOLE_WEIGHTS = "whole weights on every rank"  # the engine's loop, unsharded: --model-ema
# server processes beside the workers, which hold the weights (--mode, --num-servers)
SERVERS = "parameter servers"
ALL_GPUS = "every visible GPU from one process"  # DataParallel
CAPABILITIES = frozenset({ENGINE_LOOP, PROCESSES, COLLECTIVE_TIMEOUT, SYNC_BN, SHARE_GPUS,
                          DDP_COMM_HOOKS, HOROVOD_COMPRESSION, WHOLE_WEIGHTS, SERVERS, ALL_GPUS})


@dataclass(frozen=True)
class StrategySpec:
    """One way of distributing the work: the loop that runs it and what it provides. A strategy
    of the engine's loop (ENGINE_LOOP) names the class that implements it there; one with a loop
    of its own names that loop's module."""
    provides: FrozenSet[str]
    path: str = ""             # ENGINE_LOOP: "module:Class" in imagenet_recipes.strategies
    # the module whose main(entry, description, argv) runs an entry script of this strategy
    main: str = "imagenet_recipes.cli"


STRATEGIES: Dict[str, StrategySpec] = {
    "nd": StrategySpec(frozenset({ENGINE_LOOP, WHOLE_WEIGHTS}), "base:Strategy"),
    "dp": StrategySpec(frozenset({ENGINE_LOOP, WHOLE_WEIGHTS, ALL_GPUS}),
                       "dp:DataParallelStrategy"),
    "ddp": StrategySpec(frozenset({ENGINE_LOOP, WHOLE_WEIGHTS, PROCESSES, COLLECTIVE_TIMEOUT,
                                   SYNC_BN, SHARE_GPUS, DDP_COMM_HOOKS}), "ddp:DDPStrategy"),
    "hvd": StrategySpec(frozenset({ENGINE_LOOP, WHOLE_WEIGHTS, PROCESSES, SYNC_BN,
                                   HOROVOD_COMPRESSION}), "horovod:HorovodStrategy"),
    "fsdp": StrategySpec(frozenset({ENGINE_LOOP, PROCESSES, COLLECTIVE_TIMEOUT, SYNC_BN}),
                         "fsdp:FSDPStrategy"),
    # the parameter server: its own loop, with its own options (ps.config.PSConfig)
    "ps": StrategySpec(frozenset({PROCESSES, COLLECTIVE_TIMEOUT, SERVERS}),
                       main="imagenet_recipes.ps.main"),
}


def engine_strategies() -> Tuple[str, ...]:
    """The STRATEGIES the engine's loop runs (each with a Strategy class)."""
    return tuple(name for name, spec in STRATEGIES.items() if ENGINE_LOOP in spec.provides)


@dataclass(frozen=True)
class Entry:
    """One entry script: which strategy it runs and how users launch it."""
    name: str                  # the `entry` field of every log record, e.g. "ddp_apex"
    script: str                # path from the repository root
    strategy: str              # its key in STRATEGIES
    label: str                 # how plots and tables name it
    launcher: str              # "python" | "torchrun" | "horovodrun"
    defaults: Dict[str, object] = field(default_factory=dict)  # config defaults it changes

    def provides(self, capability: str) -> bool:
        return capability in STRATEGIES[self.strategy].provides

    @property
    def distributed(self) -> bool:
        """One process per device (scales with the process count)."""
        return self.provides(PROCESSES)


ENTRIES: Dict[str, Entry] = {e.name: e for e in (
    Entry("nd", "train/nd.py", "nd", "nd", "python"),
    Entry("dp", "train/dp.py", "dp", "DataParallel", "python"),
    Entry("ddp", "train/ddp.py", "ddp", "DDP", "torchrun"),
    Entry("ddp_apex", "train/ddp_apex.py", "ddp", "DDP (apex)", "torchrun",
          defaults={"opt_level": "O1"}),
    Entry("hvd", "train/hvd.py", "hvd", "Horovod", "horovodrun"),
    Entry("fsdp", "train/fsdp.py", "fsdp", "FSDP2", "torchrun"),
    Entry("ps", "train/ps.py", "ps", "PS", "torchrun"),  # parameter server
)}


def entries_providing(capability: str) -> Tuple[str, ...]:
    """The entry scripts (names) whose strategy provides `capability`."""
    return tuple(name for name, entry in ENTRIES.items() if entry.provides(capability))


# The one-process entry every scaling efficiency is measured against (the sweep's baseline)
BASELINE = "nd"


def provides(entry: str, capability: str) -> bool:
    """Whether the entry named `entry` (as run records log it) provides `capability`; False
    for a name the registry does not list."""
    return entry in ENTRIES and ENTRIES[entry].provides(capability)


def runs_servers(entry: str) -> bool:
    """Whether a run of `entry` has server processes beside its workers: its workers are not
    its world size, and it has modes."""
    return provides(entry, SERVERS)


# apex's opt levels, implemented on native torch.amp (precision.py says what each one does).
OPT_LEVELS: Tuple[str, ...] = ("O0", "O1", "O2", "O3")

@dataclass(frozen=True)
class DataBackend:
    """One --data-backend: the module of imagenet_recipes.data that builds its loaders
    (`build(cfg, shard, device, plan)`, under the loader contract in data/__init__.py) and what
    the rest of the package needs to know of it without importing it (torch, DALI)."""
    module: str                     # imagenet_recipes.data.<module>
    worker_processes: bool = False  # DataLoader workers, started from the loader server
    decoding_workers: bool = False  # -j decides how many decode (processes or DALI threads)
    gpu_decoding: bool = False      # decodes on the GPU when there is one
    gpu_decoders: bool = False      # --gpu-decoder picks its decoder (GPU_DECODERS)
    made_up: bool = False           # makes its batches: there is no data to wait for
    options: str = ""               # its own option section (options.BACKEND_SECTIONS)
    # What to try when its loader is slower than training (advice.data_wait_note), on a GPU and
    # on a CPU. On a GPU, by default: a backend that decodes there.
    faster_on_gpu: str = ""
    faster_on_cpu: str = ""

    @property
    def path(self) -> str:
        return f"imagenet_recipes.data.{self.module}"


# --data-backend choices, in the order -h lists them.
DATA_BACKENDS: Dict[str, DataBackend] = {
    # worker processes read and decode
    "pytorch": DataBackend("pytorch", worker_processes=True, decoding_workers=True,
                           faster_on_cpu="decode with DALI's CPU pipeline: --data-backend "
                                         "dali-cpu"),
    "synthetic": DataBackend("synthetic", made_up=True, options="synthetic"),
    # DALI's pipeline: CPU threads decode; dali-gpu's mixed decoder uses the GPU's as well
    "dali-cpu": DataBackend("dali", decoding_workers=True),
    "dali-gpu": DataBackend("dali", decoding_workers=True, gpu_decoding=True, options="dali",
                            faster_on_gpu="give the GPU's hardware JPEG decoder more of each "
                                          "batch: --dali-hw-decoder-load 0.9"),
    # worker processes read the files; TorchCodec or nvImageCodec decodes the batch on the GPU
    "gpu": DataBackend("gpu_decode", worker_processes=True, gpu_decoding=True, gpu_decoders=True,
                       options="gpu_decode",
                       faster_on_gpu="or --data-backend dali-gpu",
                       faster_on_cpu="on a CPU this backend decodes in the training process: "
                                     "--data-backend dali-cpu or pytorch decode in workers "
                                     "beside it"),
}


@dataclass(frozen=True)
class GpuDecoder:
    """One --gpu-decoder of --data-backend gpu: what it imports (so the tools can say whether
    it is installed without importing it) and whether it decodes each crop's region only."""
    module: str
    regions: bool
    faster: str = ""  # what to try when it is slower than training (advice.data_wait_note)


_REGIONS = ("decode only each crop's pixels, with the GPU's hardware JPEG decoder where it has "
            "one: --gpu-decoder nvimgcodec")
# --gpu-decoder choices, the default first (data/jpeg_decoders.py makes them)
GPU_DECODERS: Dict[str, GpuDecoder] = {
    "torchcodec": GpuDecoder("torchcodec", regions=False, faster=_REGIONS),  # nvJPEG's CUDA decoder
    "nvimgcodec": GpuDecoder("nvidia.nvimgcodec", regions=True),  # and the hardware decoder
    # where regions fail
    "nvimgcodec-whole": GpuDecoder("nvidia.nvimgcodec", regions=False, faster=_REGIONS),
}


def backends_where(capability: str) -> Tuple[str, ...]:
    """The --data-backend names whose DataBackend has `capability` (a field name) set."""
    return tuple(name for name, b in DATA_BACKENDS.items() if getattr(b, capability))
