"""Model EMA: an exponential moving average of the weights, validated and checkpointed with them.

The average is an fp32 copy of the bare model (never the DDP / DataParallel wrapper), updated
every --model-ema-steps optimizer steps from the tensors the optimizer updated: the fp32
masters under O2, so a half model does not round the average away (a decay of 0.999 moves it
by 0.1 % of the difference, below bf16's resolution). Buffers (BatchNorm statistics) are
averaged too, as torchvision's references do (`use_buffers=True`). Every rank holds the same
weights after each step, so every rank's average is the same and validation can shard it.

The decay is torchvision's: --model-ema-decay is scaled by global batch x steps / epochs, so
its published recipes (decay 0.99998, every 32 steps) carry over unchanged. During the lr
warm-up the average restarts at every update (it follows the weights), as there.
"""
from __future__ import annotations

import copy
from typing import Dict, List

import torch
import torch.nn as nn

from .options import EmaOptions


def ema_decay_per_update(cfg: EmaOptions, global_batch: int, epochs: int) -> float:
    """torchvision's rule: alpha = (1 - decay) x global batch x steps / epochs, capped at 1."""
    alpha = (1.0 - cfg.model_ema_decay) * global_batch * cfg.model_ema_steps / epochs
    return 1.0 - min(1.0, alpha)


class ModelEMA:
    def __init__(self, module: nn.Module, decay: float, every: int):
        self.decay, self.every = decay, every
        # fp32, or float64 for a --float64 run (whose parity checks need its precision)
        wide = torch.float64 if any(p.dtype == torch.float64 for p in module.parameters()) \
            else torch.float32
        self.module = copy.deepcopy(module).to(wide).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.updates = 0  # updates since the average (re)started

    def _sources(self, module: nn.Module, masters: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        """The model's current state in the average's order: masters where there are some."""
        params = [masters.get(name, p) for name, p in module.named_parameters()]
        return params + list(module.buffers())

    @torch.no_grad()
    def update(self, module: nn.Module, masters: Dict[str, torch.Tensor], step: int,
               restart: bool = False) -> None:
        """After optimizer step `step` (1-based): average in `module`'s weights if this step is
        an update step; `restart`: copy them instead (the warm-up)."""
        if step % self.every:
            return
        targets = list(self.module.parameters()) + list(self.module.buffers())
        sources = [s.detach().to(t.dtype) for t, s in zip(targets, self._sources(module,
                                                                                  masters))]
        if restart or self.updates == 0:
            torch._foreach_copy_(targets, sources)
            self.updates = 0 if restart else 1
            return
        floats = [(t, s) for t, s in zip(targets, sources) if t.is_floating_point()]
        torch._foreach_lerp_([t for t, _ in floats], [s for _, s in floats], 1.0 - self.decay)
        for t, s in zip(targets, sources):  # counters (num_batches_tracked): the latest
            if not t.is_floating_point():
                t.copy_(s)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.updates = state["updates"]
