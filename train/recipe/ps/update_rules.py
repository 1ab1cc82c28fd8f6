"""How the server turns what the workers push into the next model, one class per --mode.

    sync   a round of N gradients -> SGD on their mean: the same update as DDP with N ranks
    esync  a round of N model deltas (each worker's local progress since the round began) ->
           the global model moves by --global-lr times their mean; the workers' own SGD
           (at --local-lr) made the deltas, so the server keeps no optimizer
    async  every single gradient -> one SGD step at once, with the weights as they are now

The server calls these under its lock; they never touch RPC, logging or counters.
"""
from __future__ import annotations

from typing import List

import torch

from ..schedule import scaled_lr


def esync_local_lr(cfg) -> float:
    """The rate of an ESync worker's own local SGD steps (and the lr the server logs)."""
    return cfg.local_lr or scaled_lr(cfg, cfg.batch_size)


def esync_local_optimizer(params, cfg) -> torch.optim.SGD:
    """An ESync worker's own SGD: at esync_local_lr, with --local-momentum (default
    --momentum; the authors' workers step without momentum)."""
    momentum = cfg.momentum if cfg.local_momentum is None else cfg.local_momentum
    return torch.optim.SGD(params, lr=esync_local_lr(cfg), momentum=momentum,
                           weight_decay=cfg.weight_decay)


class UpdateRule:
    def __init__(self, cfg, params: List[torch.Tensor], workers: int):
        self.cfg, self.params = cfg, params
        self.base_lr = self.initial_lr(cfg, workers)
        self.optimizer = None

    def initial_lr(self, cfg, workers: int) -> float:
        raise NotImplementedError

    def apply_round(self, summed: List[torch.Tensor], n: int, lr_multiplier: float) -> None:
        raise NotImplementedError

    def apply_push(self, grads: List[torch.Tensor], lr_multiplier: float) -> None:
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
                                         momentum=self.cfg.momentum,
                                         weight_decay=self.cfg.weight_decay)

    def state_dict(self) -> dict:
        return {} if self.optimizer is None else self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.optimizer is not None and state:
            self.optimizer.load_state_dict(state)


class SyncSGD(UpdateRule):
    def initial_lr(self, cfg, workers: int) -> float:
        return scaled_lr(cfg, cfg.batch_size * workers)  # one update per global batch N*b

    def __init__(self, cfg, params, workers):
        super().__init__(cfg, params, workers)
        self._make_sgd()

    @torch.no_grad()
    def apply_round(self, summed, n, lr_multiplier):
        self._sgd_step([g.div_(n) for g in summed], lr_multiplier)


class ESyncAverage(UpdateRule):
    def initial_lr(self, cfg, workers: int) -> float:
        # The logged lr is the workers' local one: the server only averages.
        return esync_local_lr(cfg)

    @torch.no_grad()
    def apply_round(self, summed, n, lr_multiplier):
        scale = self.cfg.global_lr / n
        for p, delta in zip(self.params, summed):
            p.add_(delta, alpha=scale)


class AsyncSGD(UpdateRule):
    def initial_lr(self, cfg, workers: int) -> float:
        return scaled_lr(cfg, cfg.batch_size)  # each update is one worker's batch of b

    def __init__(self, cfg, params, workers):
        super().__init__(cfg, params, workers)
        self._make_sgd()

    @torch.no_grad()
    def apply_push(self, grads, lr_multiplier):
        self._sgd_step(grads, lr_multiplier)


RULES = {"sync": SyncSGD, "esync": ESyncAverage, "async": AsyncSGD}
