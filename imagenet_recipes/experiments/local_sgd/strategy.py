"""Local SGD's schedule and averaging (LocalSGD), and the DDP strategy that runs it
(LocalSGDStrategy): gradients stay on their rank after the warm-up, the models are averaged
every period, and whatever is validated or saved is the ranks' average."""
from __future__ import annotations

from typing import Iterable, List, Optional

import torch
import torch.nn as nn

from ...errors import UsageError
from ...options.strategy import StrategyOptions
from ...precision import Precision
from ...strategies.ddp import DDPStrategy
from .options import LocalSGDOptions


class LocalSGD:
    """When a post-local SGD run communicates (T. Lin, S. U. Stich, K. K. Patel, M. Jaggi,
    "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020), on the schedule of torch's
    PeriodicModelAverager and post-local SGD hook: optimizer steps 0 .. warmup_steps - 1
    all-reduce gradients as DDP does; from then on each rank steps on its own gradients, and
    the models are averaged after step s when (s - warmup_steps) is a multiple of `period`.
    The step count is the engine's, kept in the checkpoint.

    Each average moves the weights from the anchor (the weights all ranks held when their local
    steps began) by the ranks' mean change: plainly (outer lr 1, no momentum), or by an outer
    SGD step with Nesterov momentum on the negated mean change, DiLoCo's outer optimizer
    (A. Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
    2023), whose state is kept in the checkpoint too."""

    def __init__(self, period: int, warmup_steps: int, outer_lr: float = 1.0,
                 outer_momentum: float = 0.0):
        self.period, self.warmup_steps = period, warmup_steps
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.step = 0  # optimizer steps taken
        self.in_sync = True  # every rank holds the same weights (DDP keeps them so)
        # Averaging the changes since the anchor (instead of the weights themselves) rounds at
        # the scale of the updates, as DDP's gradient average does.
        self.anchor: Optional[List[torch.Tensor]] = None
        self.outer: Optional[torch.optim.SGD] = None  # over the anchor, when there is one
        self.outer_state: Optional[dict] = None  # from a checkpoint, until `outer` exists

    @property
    def plain(self) -> bool:
        return self.outer_lr == 1 and self.outer_momentum == 0

    def begin(self, params: List[torch.Tensor]) -> None:
        """The local steps begin from these weights (the same on every rank)."""
        if self.anchor is None:
            self.anchor = [p.detach().clone() for p in params]
        if not self.plain and self.outer is None:
            # The anchor stays (the outer optimizer's momentum is keyed by its tensors).
            self.outer = torch.optim.SGD(self.anchor, lr=self.outer_lr,
                                         momentum=self.outer_momentum,
                                         nesterov=self.outer_momentum > 0)
            if self.outer_state is not None:
                self.outer.load_state_dict(self.outer_state)

    def apply(self, params: List[torch.Tensor], mean_changes: List[torch.Tensor]) -> None:
        """Every rank's weights become the anchor moved by the ranks' mean change."""
        if self.outer is None:
            for p, a, change in zip(params, self.anchor, mean_changes):
                p.detach().copy_(a + change)
            self.anchor = None  # the next local steps start from the weights of then
        else:
            for a, change in zip(self.anchor, mean_changes):
                a.grad = change.neg()  # the outer gradient: the way back to the anchor
            self.outer.step()
            for p, a in zip(params, self.anchor):
                p.detach().copy_(a)
        self.in_sync = True

    def state_dict(self) -> dict:
        state = {"local_sgd_step": self.step}  # torch's optimizers ignore both keys
        outer = self.outer.state_dict() if self.outer is not None else self.outer_state
        if outer is not None:
            state["local_sgd_outer"] = outer
        return state

    def load_state_dict(self, state: dict) -> None:
        self.step = state.get("local_sgd_step", 0)
        self.outer_state = state.get("local_sgd_outer")

    @property
    def local(self) -> bool:
        """Whether the step about to be taken keeps its gradients on its rank."""
        return self.step >= self.warmup_steps

    def stepped(self) -> bool:
        """Count a step; whether the models are to be averaged after it."""
        local = self.local  # of the step just taken
        average = local and (self.step - self.warmup_steps) % self.period == 0
        self.step += 1
        self.in_sync = not local or average
        return average


class LocalSGDStrategy(DDPStrategy):
    """DDP until the warm-up ends, then local steps and periodic averages (LocalSGD). Every
    method below adds its part to DDP's and calls it: with --local-sgd-period 0 this is DDP."""

    SECTIONS = (LocalSGDOptions,)

    def __init__(self, precision: Optional[Precision] = None, *, local_sgd_period: int = 0,
                 local_sgd_warmup_steps: int = 0, local_sgd_outer_lr: float = 1.0,
                 local_sgd_outer_momentum: float = 0.0, **common):
        super().__init__(precision, **common)
        self.local_sgd = (LocalSGD(local_sgd_period, local_sgd_warmup_steps, local_sgd_outer_lr,
                                   local_sgd_outer_momentum) if local_sgd_period else None)

    @classmethod
    def arguments(cls, options: StrategyOptions) -> dict:
        own = options.section(LocalSGDOptions)
        return {**super().arguments(options), "local_sgd_period": own.local_sgd_period,
                "local_sgd_warmup_steps": own.local_sgd_warmup_steps,
                "local_sgd_outer_lr": own.local_sgd_outer_lr,
                "local_sgd_outer_momentum": own.local_sgd_outer_momentum}

    def setup_module(self, model: nn.Module) -> nn.Module:
        if self.local_sgd and self.precision.scaling:
            # Each rank's loss scaler would see only its own gradients' overflows and drift
            # from the others'; the checkpoint keeps rank 0's.
            raise UsageError("--local-sgd-period with float16 loss scaling is not supported: "
                             "use --amp-dtype bfloat16 (or O0)")
        return super().setup_module(model)

    def eval_model(self) -> nn.Module:
        self._average_local_models()  # what is validated is the ranks' average
        return super().eval_model()

    def micro_step(self, last: bool):
        if self.local_sgd and self.local_sgd.local:  # no gradient leaves its rank
            return self._no_sync()
        return super().micro_step(last)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        local = self.local_sgd
        if local and local.local and local.in_sync:
            local.begin(self._trained_parameters())
        super().optimizer_step(optimizer)
        if local and local.stepped():
            self._average_models()

    # --- the models averaged ---------------------------------------------------------------------
    def _average(self, tensors: Iterable[torch.Tensor]) -> None:
        """Every rank's tensors replaced by their mean over the ranks, in one all-reduce (in
        place, so each keeps its memory format, unlike torch's averaging utility, which
        rebinds the parameters to views of one flat NCHW buffer)."""
        tensors = list(tensors)
        if not tensors:  # e.g. the state of SGD without momentum
            return
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).div_(self.world_size)
        self.all_reduce_sum(flat)
        for t, mean in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.detach().copy_(mean.view_as(t))

    def _trained_parameters(self) -> List[torch.Tensor]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _average_models(self) -> None:
        """Every rank's weights become the anchor moved by the ranks' mean change since it."""
        local, params = self.local_sgd, self._trained_parameters()
        changes = [p.detach() - a for p, a in zip(params, local.anchor)]
        self._average(changes)
        local.apply(params, changes)

    def _average_local_models(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Between two averaging points each rank holds a model of its own. What is validated
        or saved is their mean, so the models are averaged first (with an optimizer: its state
        too, e.g. the momentum buffers); a run resumed from the checkpoint then continues
        exactly as the uninterrupted run, which averaged at the same point."""
        if not self.local_sgd:
            return
        if not self.local_sgd.in_sync:  # averaging equal weights again could move them an ulp
            self._average_models()
        if optimizer is not None:
            self._average(t for state in optimizer.state.values() for t in state.values()
                          if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0)

    def module_state_dict(self) -> dict:
        self._average_local_models()
        return super().module_state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        if self.local_sgd and self.local_sgd.step > self.local_sgd.warmup_steps:
            self._average_local_models(optimizer)  # local steps were taken: states differ
        state = super().optimizer_state_dict(optimizer)
        if self.local_sgd:
            state.update(self.local_sgd.state_dict())
        return state

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if self.local_sgd:
            self.local_sgd.load_state_dict(state)
        super().load_optimizer_state_dict(optimizer, state)

    def describe(self) -> dict:
        described = super().describe()
        if self.local_sgd:
            described["local_sgd"] = {"period": self.local_sgd.period,
                                      "warmup_steps": self.local_sgd.warmup_steps,
                                      "outer_lr": self.local_sgd.outer_lr,
                                      "outer_momentum": self.local_sgd.outer_momentum}
        return described
