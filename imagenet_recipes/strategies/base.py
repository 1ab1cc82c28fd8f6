"""The strategy interface and the single-process strategy (`nd`).

The engine only ever calls these methods; each subclass, in a module of its own, overrides the
few that its way of distributing changes. Strategy-specific lines in the subclasses are marked
`# DDP: ...` / `# DataParallel: ...` / `# Horovod: ...`, the way Horovod's own examples mark
theirs, so diffing two of these modules shows exactly what one strategy adds.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, List, NoReturn, Optional, Tuple, Type

import torch
import torch.nn as nn

from ..data.sampling import Shard
from ..errors import UsageError
from ..gpu_expected import refusal, why_no_cuda
from ..options.fields import Section
from ..options.strategy import StrategyOptions
from ..precision import Precision
from ..runlog import console


def pick_device(requested: str, local_rank: int = 0, share_gpus: bool = False) -> torch.device:
    """CUDA if present (or asked for), else CPU; a GPU request on a GPU-less host is an error,
    and so is `auto` where the job was given GPUs that torch cannot use (gpu_expected.py).
    `share_gpus`: local ranks beyond the GPU count wrap around onto the same GPUs."""
    if requested == "cuda" and not torch.cuda.is_available():
        cause, fix = why_no_cuda(torch)
        raise UsageError(f"--device cuda was requested but torch cannot use CUDA: {cause}. "
                         f"Fix: {fix}; or --device cpu")
    if requested == "auto":
        refused = refusal(torch)
        if refused:
            raise UsageError(refused)
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if share_gpus:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if local_rank >= torch.cuda.device_count():
        raise UsageError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} "
                         "visible. Launch at most one process per GPU (--nproc_per_node), "
                         "or add --share-gpus to try several processes on one GPU.")
    return torch.device("cuda", local_rank)


class Strategy:
    """Single process, single device. The base class is also the 'no distribution' strategy.

    The strategy owns the model and optimizer lifecycle, in this order: `setup_environment`
    (process group, device) -> `setup_module` (convert, place, cast, share rank 0's weights,
    make O2 masters, wrap) -> `setup_optimizer` -> per step `micro_step` / `backward` /
    `optimizer_step` -> `module_state_dict` / `load_module_state_dict` for checkpoints.
    Precision is a plugin it calls (`self.precision`); the plugin never calls back.
    """

    name = "nd"
    # The option sections that only this strategy reads (its registry entry's capabilities'
    # options: DDP's hooks, Horovod's compression); sections() gathers them along the lineage.
    SECTIONS: Tuple[Type[Section], ...] = ()
    rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
    share_gpus = False  # several local ranks on one GPU (DDP's --share-gpus)

    def __init__(self, precision: Optional[Precision] = None, *, device: str = "auto",
                 compile: bool = False):
        self.precision = precision or Precision()
        self.device_request, self.compile = device, compile
        self.channels_last = False  # the plan's (follow)

    @classmethod
    def sections(cls) -> Tuple[Type[Section], ...]:
        """The sections this strategy and its bases read beside the shared ones
        (StrategyOptions.of(cfg, cls.sections()) is what `build` takes)."""
        found: List[Type[Section]] = []
        for klass in reversed(cls.__mro__):
            found += [s for s in vars(klass).get("SECTIONS", ()) if s not in found]
        return tuple(found)

    @classmethod
    def build(cls, options: StrategyOptions) -> "Strategy":
        """The strategy a run's options ask for (config.parse_args has refused the options of
        other entry scripts)."""
        return cls(Precision.from_config(options.precision), **cls.arguments(options))

    @classmethod
    def arguments(cls, options: StrategyOptions) -> dict:
        """The constructor's keyword arguments that the options set; a subclass adds its own
        to its base's."""
        return {"device": options.distribution.device, "compile": options.compile}

    def follow(self, plan) -> None:
        """What the run's plan (run_plan.RunPlan, made once the environment gives the world
        size) decides for the strategy: the memory layout. A strategy that must know the
        micro-batches per step adds them."""
        self.channels_last = plan.channels_last

    # --- environment -----------------------------------------------------------------------------
    def setup_environment(self) -> torch.device:
        self.device = pick_device(self.device_request, self.local_rank, self.share_gpus)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif self.device_request == "auto" and self.is_main():
            console("=> no CUDA GPU here: training on the CPU (--device cpu chooses it without "
                    "this note)")
        self.precision.bind(self.device, notice=console if self.is_main() else _silent)
        return self.device

    # --- model -----------------------------------------------------------------------------------
    def setup_module(self, model: nn.Module) -> nn.Module:
        """The model to train: converted, on its device, cast, identical on every rank, wrapped
        and in its precision (precision.InPrecision: the loops call `model(images)` and get
        the output in the loss's dtype). `self.module` keeps the bare model (state dicts)."""
        model = self._convert_module(model)
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        model = self.precision.convert_module(model.to(self.device, memory_format=memory_format))
        self.module = model
        wrapped = self._wrap_and_share(model)
        # After the broadcast, so that every rank's fp32 masters are rank 0's weights.
        self.precision.setup_masters(model)
        self.model = self.precision.wrap(torch.compile(wrapped) if self.compile else wrapped)
        return self.model

    def train_model(self) -> nn.Module:
        """The model to train with, in training mode (the partner of `eval_model`)."""
        return self.model.train()

    def _convert_module(self, model: nn.Module) -> nn.Module:
        """Changes made before placing and casting (e.g. SyncBatchNorm)."""
        return model

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        """Wrap the model for training and give every rank rank 0's weights and buffers."""
        return model

    def eval_model(self) -> nn.Module:
        """The model to run validation with, in its precision: it must not communicate,
        because validation shards differ in size and a collective in forward would wait
        forever. `evaluate` puts it in eval mode."""
        return self.model

    def eval_average(self, average: nn.Module) -> nn.Module:
        """A moving average of the weights (--model-ema), to validate: rank 0's buffers on
        every rank, run in fp32 (float64 under --float64) whatever the training precision."""
        self.share_buffers(average)
        return Precision(float64=self.precision.float64).wrap(average)

    def share_buffers(self, module: nn.Module) -> None:
        """Give every rank rank 0's buffers of `module` (collective). Each rank updates its
        BatchNorm running statistics with its own batches, and checkpoints hold rank 0's."""

    def module_state_dict(self) -> dict:
        """Called on every rank (a sharding strategy would gather here)."""
        return self.precision.module_state_dict(self.module)

    def load_module_state_dict(self, state: dict) -> None:
        """Every rank loads the same checkpoint: no broadcast needed afterwards."""
        self.precision.load_module_state_dict(self.module, state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        """Called on every rank (a sharding strategy would gather here)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    # --- optimizer and step ----------------------------------------------------------------------
    def named_optimizer_params(self) -> List[Tuple[str, torch.Tensor]]:
        """What the optimizer must update (fp32 masters under O2), named after the model's
        parameters (for parameter groups)."""
        return self.precision.named_optimizer_params(self.module)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def micro_step(self, last: bool):
        """Context for one micro-batch's forward and backward. With gradient accumulation the
        micro-batches before the last skip the gradient reduction, except under O2: there each
        micro-batch's reduced half gradients are summed in the fp32 masters (as apex with
        torch DDP), so every one is reduced."""
        if last or self.precision.has_masters:
            return contextlib.nullcontext()
        return self._no_sync()

    def _no_sync(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)
        if self.precision.has_masters:
            self._reduce_gradients()
            self.precision.accumulate_grads()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscaling, the overflow check and the update see fully reduced gradients, so every
        rank skips (or takes) the same steps."""
        if not self.precision.has_masters:  # O2 reduced and moved them in `backward`
            self._reduce_gradients()
        self.precision.optimizer_step(optimizer)

    def _reduce_gradients(self) -> None:
        """Wait until every gradient is averaged over the ranks (DDP does it in backward)."""

    # --- collectives -----------------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def gather_objects(self, obj: Any) -> List[Any]:
        """Every rank's `obj`, in rank order (all ranks receive the list)."""
        return [obj]

    def barrier(self) -> None:
        pass

    # --- bookkeeping -----------------------------------------------------------------------------
    def data_shard(self) -> Shard:
        """What the data loaders need to know of this process (sharded by the GLOBAL rank)."""
        return Shard(rank=self.rank, world_size=self.world_size,
                     local_world_size=self.local_world_size, is_main=self.is_main(),
                     gather=self.gather_objects)

    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_devices(self) -> int:
        """Devices one process drives (DataParallel drives several)."""
        return 1

    @property
    def cuda_devices(self) -> List[torch.device]:
        """The GPUs this process drives: their RNG states go into its checkpoints."""
        return [self.device] if self.device.type == "cuda" else []

    def describe(self) -> dict:
        return {"strategy": self.name, "world_size": self.world_size,
                "devices_per_process": self.num_devices, "backend": None}

    def explain_failure(self, err: BaseException) -> Optional[str]:
        """A one-paragraph explanation if `err` means a peer process died or hung, else None."""
        return None

    def teardown(self) -> None:
        pass

    def abandon(self) -> None:
        """This process ends after a failure without leaving its group (leaving would wait on
        the peer that failed): what runs beside the training and talks to the peers stops."""

    def end_failed_process(self, code: int) -> NoReturn:
        """End this process with `code` after a failure; its logs are closed already."""
        sys.exit(code)


def _silent(message: str) -> None:
    pass
