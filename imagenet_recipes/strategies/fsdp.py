"""FSDP2: one process per device, parameters, gradients and optimizer state sharded over the
ranks (`torch.distributed.fsdp.fully_shard`; `train/fsdp.py`).

Each residual block (every child of the model's top-level nn.Sequential stages, e.g. ResNet's
layer1..layer4) is its own FSDP unit, so only one block's full weights exist at a time in
forward and backward; the rest of the model (stem, head) is the root unit.

What differs from DDP, and why:
- Precision: O0 and O1 (fp32 shards; autocast in forward as for every strategy, gradients
  reduced in fp32). FSDP2's MixedPrecisionPolicy would cast BatchNorm's weights to the half
  type while its running statistics stay fp32, which the CPU kernels refuse ("expected scalar
  type BFloat16 but found Float"); autocast keeps normalisation in fp32. O2/O3's fp32 masters
  of half weights have no counterpart on shards: refused.
- Overflow: each rank holds a shard of the gradients, so its own check would see only part of
  them. The gradients are DTensors, and torch's DTensor dispatch max-reduces the GradScaler's
  found-inf flag over the shards (found_inf_reduce_handler), so every rank skips the same steps.
- Checkpoints: saved and loaded collectively as full (unsharded) state dicts, gathered on rank 0,
  with the optimizer state numbered as torch.optim numbers it. A checkpoint is therefore the
  same file nd, DDP and Horovod write: an FSDP run resumes on another world size or another
  strategy, and the other way round. (A ResNet-50's state is about 300 MB; torch.distributed's
  sharded checkpoint format pays off for models whose state does not fit one host.)
- Validation: a forward through the sharded model all-gathers, and validation shards differ in
  length, so each rank would wait on the others. Validation runs on a plain replica loaded
  with the gathered weights and rank 0's buffers (one collective before it, none inside).
- Not offered (the registry's capabilities: -h leaves them out, the command line refuses them):
  --model-ema (an average of whole weights), DDP's hooks, Horovod's options.
"""
from __future__ import annotations

import contextlib
import copy
from typing import List

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

from ..errors import UsageError
from ..options.strategy import StrategyOptions
from .process_group import ProcessGroupStrategy

_GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)  # on rank 0, in host memory
_EVERY_RANK = StateDictOptions(full_state_dict=True)  # every rank loads the whole state


class FSDPStrategy(ProcessGroupStrategy):
    """One process per device; weights, gradients and optimizer state sharded over the ranks."""

    name = "fsdp"

    @classmethod
    def build(cls, options: StrategyOptions) -> "FSDPStrategy":
        level = options.precision.opt_level
        if level in ("O2", "O3"):
            raise UsageError(f"--opt-level {level} keeps half weights (O2: with fp32 "
                             "masters); train/fsdp.py shards fp32 weights: use --opt-level O1 "
                             "(autocast) or O0")
        return super().build(options)

    # --- model -----------------------------------------------------------------------------------
    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        # FSDP: every rank starts from rank 0's weights and buffers (as DDP's constructor
        # does), then keeps only its shard of each parameter.
        self.share_buffers(model)
        for param in model.parameters():
            torch.distributed.broadcast(param.data, src=0)
        self._replica = copy.deepcopy(model)  # for validation (module docstring)
        for unit in _blocks(model):
            fully_shard(unit)
        fully_shard(model)
        self.wrapper = model
        return model

    def eval_model(self) -> nn.Module:
        self.share_buffers(self.module)  # rank 0's BatchNorm statistics, as DDP validates with
        state = get_model_state_dict(self.module, options=_EVERY_RANK)
        self._replica.load_state_dict(state)
        return self.precision.wrap(self._replica)

    def _no_sync(self):
        # FSDP: accumulation micro-steps keep their unsharded gradients; the last reduces
        return _gradient_sync_off(self.module)

    # --- state -----------------------------------------------------------------------------------
    def module_state_dict(self) -> dict:
        """Collective: the whole model, on rank 0 (empty on the others)."""
        return get_model_state_dict(self.module, options=_GATHERED)

    def load_module_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.module, state, options=_EVERY_RANK)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        """Collective: the whole optimizer state on rank 0, keyed by parameter number as
        torch.optim.Optimizer.state_dict keys it (FSDP's own keys are parameter names)."""
        state = get_optimizer_state_dict(self.module, optimizer, options=_GATHERED)
        return _by_number(state, self._parameter_names(optimizer)) if state else state

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        named = _by_name(state, self._parameter_names(optimizer))
        set_optimizer_state_dict(self.module, optimizer, named, options=_EVERY_RANK)

    def _parameter_names(self, optimizer: torch.optim.Optimizer) -> List[str]:
        """The optimizer's parameters' names, in torch.optim's numbering order."""
        names = {id(p): name for name, p in self.module.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _blocks(model: nn.Module) -> List[nn.Module]:
    """The units sharded on their own: the children of the model's top-level Sequentials."""
    return [block for child in model.children() if isinstance(child, nn.Sequential)
            for block in child.children()]


@contextlib.contextmanager
def _gradient_sync_off(model: nn.Module):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _by_number(state: dict, names: List[str]) -> dict:
    number = {name: i for i, name in enumerate(names)}
    groups = [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {number[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _by_name(state: dict, names: List[str]) -> dict:
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
