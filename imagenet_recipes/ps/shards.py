"""--num-servers K: the model's parameters in K shards, one per server process.

Server 0 (rank 0, the coordinator in server.py) holds shard 0 and everything that is not a
parameter: counters, schedule, BatchNorm buffers, ESync's state service, the log, evaluations
and checkpoints. Servers 1..K-1 (ranks 1..K-1, `ShardServer` here) hold one shard each, with
the update rule's state (momentum) of its parameters, and do what the coordinator tells them:

  sync, esync  each worker pushes its slice of a round to every server at once. A shard sums
               the slices it gets; the coordinator, when its own round is complete, tells each
               shard to apply round r with its lr multiplier and worker count. The shard
               applies once it has that many slices and answers every waiting worker with its
               new parameters. So all shards make the same update as one server would.
  async        each slice is applied on arrival, with the lr multiplier and the count of live
               workers the worker last heard from the coordinator (at most one update old); a
               shard counts the pushes it applied, so it knows each slice's staleness itself.

The coordinator reads the shards back (`shard_state`) for checkpoints and evaluations: in sync
and esync the state after round r exactly; in async the shards' state of that moment.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed.rpc as rpc

from . import wire
from .options import RuleOptions
from .update_rules import make_rule


def split_by_size(sizes: Sequence[int], shards: int) -> List[List[int]]:
    """Parameter indices per shard: the largest tensor first onto the emptiest shard (greedy
    longest-processing-time, within 4/3 of the best balance), each shard in model order."""
    load = [0] * shards
    members: List[List[int]] = [[] for _ in range(shards)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(shards), key=lambda k: (load[k], k))
        members[k].append(i)
        load[k] += sizes[i]
    return [sorted(m) for m in members]


def model_shards(params: Sequence[torch.Tensor], shards: int) -> List[List[int]]:
    return split_by_size([p.numel() for p in params], shards)


def pick(tensors: Sequence[torch.Tensor], indices: Sequence[int]) -> List[torch.Tensor]:
    return [tensors[i] for i in indices]


def merge_optimizer_states(states: Sequence[dict], shards: Sequence[Sequence[int]]) -> dict:
    """One optimizer state dict over all parameters from the shards' own (SGD: one group), in
    the layout a single server's optimizer has, so checkpoints do not depend on K."""
    if not any(states):
        return {}
    merged: Dict[int, dict] = {}
    for state, indices in zip(states, shards):
        for local, value in state["state"].items():
            merged[indices[int(local)]] = value
    group = dict(states[0]["param_groups"][0])
    group["params"] = sorted(i for indices in shards for i in indices)
    return {"state": dict(sorted(merged.items())), "param_groups": [group]}


def split_optimizer_state(state: dict, indices: Sequence[int]) -> dict:
    """One shard's part of a whole-model optimizer state dict (the inverse of merging)."""
    if not state:
        return {}
    kept = {local: state["state"][i] for local, i in enumerate(indices) if i in state["state"]}
    group = dict(state["param_groups"][0])
    group["params"] = list(range(len(indices)))
    return {"state": kept, "param_groups": [group]}


class RoundSums:
    """The tensors of one round, summed in the parameters' own dtype (a half push is added up
    in float32), and whether any worker's gradient overflowed (then nothing is applied)."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params = params
        self.sums: List[Optional[torch.Tensor]] = [None] * len(params)
        self.pushes = 0
        self.steps = 0  # the workers' local steps in the round (ESync; 1 per push in sync)
        self.overflow = False

    def add(self, tensors: Sequence[torch.Tensor], steps: int = 1) -> None:
        self.pushes += 1
        self.steps += steps
        if not tensors:  # the worker's loss scaler found an inf or NaN: skip the round
            self.overflow = True
            return
        for i, t in enumerate(tensors):
            if self.sums[i] is None:
                self.sums[i] = t.to(self.params[i].dtype, copy=True)
            else:
                self.sums[i] += t

    def mean_steps(self) -> float:
        return self.steps / self.pushes if self.pushes else 1.0


def as_params(tensors: Sequence[torch.Tensor], params: Sequence[torch.Tensor]):
    """A pushed gradient in the dtype of the parameters it updates."""
    return [t.to(p.dtype) for t, p in zip(tensors, params)]


class ShardServer:
    """Server k >= 1: one shard's parameters and update rule, driven by the coordinator."""

    def __init__(self, rule_options: RuleOptions, workers: int):
        self.rule_options, self.workers = rule_options, workers
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.graceful = True  # the RPC shutdown: graceful unless a process is gone
        self.failed = False
        self.params: List[torch.Tensor] = []
        self.rule = None
        self.step = 0  # the coordinator's step these parameters are at (sync, esync)
        self._rounds: Dict[int, RoundSums] = {}
        self._waiting: Dict[int, List[torch.futures.Future]] = {}  # workers, per round
        # round -> (workers in it, lr multiplier, whether a worker's step overflowed, the
        # workers' mean local steps in it)
        self._orders: Dict[int, tuple] = {}
        # async: the pushes applied so far, and that count when each worker last pulled
        self.applied = 0
        self._pulled: Dict[int, int] = {}
        self._state_requests: List[tuple] = []  # (step, future)

    def load(self, params: List[torch.Tensor], optimizer_state: dict, step: int) -> None:
        with self.lock:
            self.params = [p.clone() for p in params]
            self.rule = make_rule(self.rule_options, self.params, self.workers)
            self.rule.load_state_dict(optimizer_state)
            self.step = step

    # --- sync and esync --------------------------------------------------------------------------
    def push_round(self, round_: int, tensors: List[torch.Tensor]) -> torch.futures.Future:
        future = torch.futures.Future()
        with self.lock:
            self._rounds.setdefault(round_, RoundSums(self.params)).add(tensors)
            self._waiting.setdefault(round_, []).append(future)
            done = self._try_apply(round_)
        self._release(done)
        return future

    def apply_round(self, round_: int, workers: int, lr_multiplier: float,
                    overflow: bool, mean_steps: float) -> None:
        with self.lock:
            self._orders[round_] = (workers, lr_multiplier, overflow, mean_steps)
            done = self._try_apply(round_)
        self._release(done)

    @torch.no_grad()
    def _try_apply(self, round_: int) -> list:
        """Under the lock: apply the round if ordered and complete; what to release."""
        sums = self._rounds.get(round_)
        if round_ not in self._orders or sums is None or sums.pushes < self._orders[round_][0]:
            return []
        workers, multiplier, overflow, mean_steps = self._orders.pop(round_)
        del self._rounds[round_]
        if not (overflow or sums.overflow):
            self.rule.apply_round(sums.sums, workers, multiplier, mean_steps)
        self.step = round_ + 1
        reply = wire.snapshot(self.params)
        done = [(f, reply) for f in self._waiting.pop(round_)]
        return done + self._answer_state_requests()

    # --- async ------------------------------------------------------------------------------
    @torch.no_grad()
    def push_async(self, worker: int, grads: List[torch.Tensor], lr_multiplier: float,
                   workers: int) -> List[torch.Tensor]:
        with self.lock:
            staleness = self.applied - self._pulled.get(worker, self.applied)
            if grads:
                self.rule.apply_push(as_params(grads, self.params), lr_multiplier, staleness,
                                     workers)
            self.applied += 1
            self._pulled[worker] = self.applied
            return wire.snapshot(self.params)

    # --- the coordinator's reads, and the end -----------------------------------------------------
    def state(self, step: Optional[int]) -> torch.futures.Future:
        """Parameters and optimizer state once round `step` is applied (None: now)."""
        future = torch.futures.Future()
        with self.lock:
            self._state_requests.append((step, future))
            done = self._answer_state_requests()
        self._release(done)
        return future

    def _answer_state_requests(self) -> list:
        ready = [(s, f) for s, f in self._state_requests if s is None or s <= self.step]
        if not ready:
            return []
        self._state_requests = [r for r in self._state_requests if r not in ready]
        state = (wire.snapshot(self.params), wire.clone_nested(self.rule.state_dict()))
        return [(f, state) for _, f in ready]

    def end(self, graceful: bool, failure: Optional[str]) -> None:
        """The run is over: fail whatever still waits (a run that failed), then let go."""
        with self.lock:
            waiting = [f for fs in self._waiting.values() for f in fs]
            waiting += [f for _, f in self._state_requests]
            self._waiting, self._state_requests = {}, []
            self.graceful, self.failed = graceful, failure is not None
        for f in waiting:
            f.set_exception(RuntimeError(failure or "the parameter server ended the run"))
        self.ended.set()

    @staticmethod
    def _release(done: list) -> None:
        for future, value in done:
            future.set_result(value)

    def serve(self, coordinator_alive) -> None:
        """Until the coordinator ends the run, or stops answering."""
        while not self.ended.wait(5.0):
            if not coordinator_alive():
                self.graceful, self.failed = False, True
                return


_SHARD: Optional[ShardServer] = None  # this process's shard server, for the RPC entry points


# --- RPC entry points of servers 1..K-1 (module-level: RPC sends them by qualified name) --------
def shard_load(params: List[torch.Tensor], optimizer_state: dict, step: int) -> None:
    _SHARD.load(params, optimizer_state, step)


@rpc.functions.async_execution
def shard_push_round(round_: int, tensors: List[torch.Tensor]) -> torch.futures.Future:
    return _SHARD.push_round(round_, tensors)


def shard_apply_round(round_: int, workers: int, lr_multiplier: float, overflow: bool,
                      mean_steps: float) -> None:
    _SHARD.apply_round(round_, workers, lr_multiplier, overflow, mean_steps)


def shard_push_async(worker: int, grads: List[torch.Tensor], lr_multiplier: float,
                     workers: int) -> List[torch.Tensor]:
    return _SHARD.push_async(worker, grads, lr_multiplier, workers)


@rpc.functions.async_execution
def shard_state(step: Optional[int]) -> torch.futures.Future:
    return _SHARD.state(step)


def shard_end(graceful: bool, failure: Optional[str]) -> None:
    _SHARD.end(graceful, failure)


def coordinator_alive(timeout: float = 30.0) -> bool:
    try:
        rpc.rpc_sync(wire.SERVER, wire.ping, timeout=timeout)
        return True
    except Exception:
        return False
