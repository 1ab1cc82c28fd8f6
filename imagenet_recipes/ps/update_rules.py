"""How the server turns what the workers push into the next model, one class per --mode.

    sync   a round of N gradients -> SGD on their mean: the same update as DDP with N ranks
    esync  a round of N model deltas (each worker's local progress since the round began) ->
           the global model moves by --global-lr times their mean (--esync-average mean:
           ESyncMean), or by FedNova's normalised average (normalized: ESyncNormalized); the
           workers' own SGD (at --local-lr) made the deltas, so the server keeps no optimizer
    async  every single gradient -> one SGD step at once, with the weights as they are now:
           at the schedule's rate and --momentum (--async-rule plain: AsyncSGD), or at a rate
           divided by the gradient's staleness and with the momentum asynchrony adds taken out
           (staleness: StalenessAwareAsyncSGD)

rule_class(ps) picks the class and make_rule makes the rule; each mode's rules are registered
by name (ASYNC_RULES, ESYNC_AVERAGES), so a rule is a subclass, not a branch. A rule reads
options.RuleOptions: the parameter server's section, the optimizer's, and a worker's batch.

The server calls these under its lock; they never touch RPC, logging or counters.
"""
from __future__ import annotations

from typing import List

import torch

from ..schedule import scaled_lr
from .options import ParameterServerOptions, RuleOptions


def esync_local_lr(options: RuleOptions) -> float:
    """The rate of an ESync worker's own local SGD steps (and the lr the server logs)."""
    return options.ps.local_lr or scaled_lr(options.optimizer, options.batch_size)


def esync_local_optimizer(params, options: RuleOptions) -> torch.optim.SGD:
    """An ESync worker's own SGD: at esync_local_lr, with --local-momentum (default
    --momentum; the authors' workers step without momentum)."""
    local = options.ps.local_momentum
    return torch.optim.SGD(params, lr=esync_local_lr(options),
                           momentum=options.optimizer.momentum if local is None else local,
                           weight_decay=options.optimizer.weight_decay)


class UpdateRule:
    def __init__(self, options: RuleOptions, params: List[torch.Tensor], workers: int):
        self.options, self.params = options, params
        self.base_lr = self.initial_lr(options, workers)
        self.optimizer = None

    def initial_lr(self, options: RuleOptions, workers: int) -> float:
        raise NotImplementedError

    def apply_round(self, summed: List[torch.Tensor], n: int, lr_multiplier: float,
                    mean_steps: float = 1.0) -> None:
        """A complete round: `summed` over its `n` pushes; `mean_steps`: the workers' mean
        local step count in it (ESync's; 1 for sync)."""
        raise NotImplementedError

    def apply_push(self, grads: List[torch.Tensor], lr_multiplier: float, staleness: int = 0,
                   workers: int = 1) -> None:
        """One worker's gradient (async), `staleness` updates after the weights it was
        computed on, while `workers` workers push."""
        raise NotImplementedError

    def _sgd_step(self, grads: List[torch.Tensor], lr_multiplier: float) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * lr_multiplier
        self.optimizer.step()
        for p in self.params:
            p.grad = None

    def _make_sgd(self) -> None:
        self.optimizer = torch.optim.SGD(self.params, lr=self.base_lr,
                                         momentum=self.options.optimizer.momentum,
                                         weight_decay=self.options.optimizer.weight_decay)

    def state_dict(self) -> dict:
        return {} if self.optimizer is None else self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.optimizer is not None and state:
            self.optimizer.load_state_dict(state)


class SyncSGD(UpdateRule):
    def initial_lr(self, options, workers: int) -> float:
        # one update per global batch N*b
        return scaled_lr(options.optimizer, options.batch_size * workers)

    def __init__(self, options, params, workers):
        super().__init__(options, params, workers)
        self._make_sgd()

    @torch.no_grad()
    def apply_round(self, summed, n, lr_multiplier, mean_steps=1.0):
        self._sgd_step([g.div_(n) for g in summed], lr_multiplier)


class ESyncMean(UpdateRule):
    """--esync-average mean: the deltas' plain mean (the ESync authors'). A worker that took 4
    local steps then counts 4 times as much as one that took 1, so with uneven speeds the model
    drifts toward the fast workers' objective (FedNova: J. Wang, Q. Liu, H. Liang, G. Joshi, H.
    V. Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
    Optimization", NeurIPS 2020)."""

    def initial_lr(self, options, workers: int) -> float:
        # The logged lr is the workers' local one: the server only averages.
        return esync_local_lr(options)

    @staticmethod
    def pushed_delta(delta: List[torch.Tensor], local_steps: int) -> List[torch.Tensor]:
        """What a worker sends for its round of `local_steps` steps: its model delta."""
        return delta

    def round_scale(self, n: int, mean_steps: float) -> float:
        return self.options.ps.global_lr / n

    @torch.no_grad()
    def apply_round(self, summed, n, lr_multiplier, mean_steps=1.0):
        scale = self.round_scale(n, mean_steps)
        for p, delta in zip(self.params, summed):
            p.add_(delta, alpha=scale)


class ESyncNormalized(ESyncMean):
    """--esync-average normalized: FedNova's rule with equal weights. Each worker sends its delta
    per local step, and the server multiplies their mean by the round's mean step count, so
    each worker counts once and the step size stays that of the mean (the workers' momentum
    buffers carry over from round to round, so the step count, not FedNova's momentum-reset
    norm, is what sets the deltas' sizes apart)."""

    @staticmethod
    def pushed_delta(delta, local_steps):
        return [d.div_(max(1, local_steps)) for d in delta]

    def round_scale(self, n, mean_steps):
        return super().round_scale(n, mean_steps) * mean_steps


def async_momentum(momentum: float, workers: int) -> float:
    """The explicit momentum that, with the momentum asynchrony adds, makes --momentum in all.
    With M workers pushing in turn, asynchrony behaves like momentum 1 - 1/M (I. Mitliagkas,
    C. Zhang, S. Hadjis, C. Re, "Asynchrony begets Momentum, with an Application to Deep
    Learning", Allerton 2016). Taking the two as compounding, (1 - explicit) / M = 1 -
    momentum, so explicit = 1 - M (1 - momentum), and never below 0: from M = 1 / (1 -
    momentum) workers on (10 at 0.9), asynchrony alone brings more than was asked for."""
    return max(0.0, 1.0 - max(1, workers) * (1.0 - momentum))


class AsyncSGD(UpdateRule):
    """--async-rule plain: SGD at the schedule's rate with --momentum, whatever the gradient's
    age."""

    def initial_lr(self, options, workers: int) -> float:
        # each update is one worker's batch of b
        return scaled_lr(options.optimizer, options.batch_size)

    def __init__(self, options, params, workers):
        super().__init__(options, params, workers)
        self._make_sgd()

    @torch.no_grad()
    def apply_push(self, grads, lr_multiplier, staleness=0, workers=1):
        self._sgd_step(grads, lr_multiplier)


class StalenessAwareAsyncSGD(AsyncSGD):
    """--async-rule staleness (the default): the rate divided by the gradient's staleness (the
    updates other workers made since its weights were pulled; 0 and 1 keep the full rate), as
    in W. Zhang, S. Gupta, X. Lian, J. Liu, "Staleness-aware Async-SGD for Distributed Deep
    Learning", IJCAI 2016, and the momentum corrected for the workers' count
    (async_momentum)."""

    @torch.no_grad()
    def apply_push(self, grads, lr_multiplier, staleness=0, workers=1):
        for group in self.optimizer.param_groups:
            group["momentum"] = async_momentum(self.options.optimizer.momentum, workers)
        super().apply_push(grads, lr_multiplier / max(1, staleness), staleness, workers)


# Each mode's rules by the name its option gives (--async-rule, --esync-average; the names are
# the options' choices, options.py): a new rule is a subclass registered here, never a branch in
# the server.
ASYNC_RULES = {"plain": AsyncSGD, "staleness": StalenessAwareAsyncSGD}
ESYNC_AVERAGES = {"mean": ESyncMean, "normalized": ESyncNormalized}


def rule_class(ps: ParameterServerOptions) -> type:
    """The UpdateRule subclass of --mode and, within it, of its rule."""
    if ps.mode == "async":
        return ASYNC_RULES[ps.async_rule]
    if ps.mode == "esync":
        return ESYNC_AVERAGES[ps.esync_average]
    return SyncSGD


def make_rule(options: RuleOptions, params: List[torch.Tensor], workers: int) -> UpdateRule:
    """The update rule of the run's options over `params`, for `workers` workers."""
    return rule_class(options.ps)(options, params, workers)
