"""A worker (the ranks after the servers): pulls the model, trains on its data shard, pushes.

sync   gradient of one batch per step; the push returns the updated model once every worker
       of the step has pushed.
async  the same gradient, applied by the server at once; the push returns the newest model.
esync  local SGD steps for as long as the state service says they fit into the slowest
       worker's step; then the model delta of the round is pushed and averaged.

A worker computes at any opt level, through the same precision plugin as the engine: its
optimizer is the local SGD (esync) or a `GradientCapture` that keeps the unscaled gradients for
the push (sync, async), so loss scaling, overflow skipping and O2's fp32 masters work as in
the engine. The servers hold float32 weights (O2's masters) and answer with them. With
--num-servers K a push goes to every server at once, each its own shard of the tensors.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Iterator, List, Optional, Tuple

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn

from .. import lifecycle
from ..data import Shard, build_loaders
from ..metrics import correct_topk
from ..models import build_model
from ..options import StrategyOptions
from ..precision import Precision
from ..run_plan import plan_as_given
from ..strategies.base import Strategy
from . import server as srv
from . import shards, wire
from .options import WorkerOptions
from .update_rules import ESYNC_AVERAGES, esync_local_optimizer


def worker_shard(index: int, workers: int, split: str) -> Shard:
    """Worker `index` of N reads an IID shard (like DDP rank index of N), or with
    --split by-class all images of the classes c with c % N == index."""
    # torchrun's count includes the server, which loads only the validation set.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if split != "by-class":
        return Shard(rank=index, world_size=workers, local_world_size=local, is_main=False)
    return Shard(local_world_size=local, is_main=False, train_subset=lambda targets: [
        i for i, t in enumerate(targets) if t % workers == index])


class WorkerStopped(Exception):
    """The server ended the run with an error (or is gone)."""


class GradientCapture(torch.optim.Optimizer):
    """A sync or async worker's "optimizer": the precision plugin steps it like any other
    (after removing the loss scale, and not at all when the scaler found an inf or NaN), and
    its step keeps the gradients for the push; the server makes the update."""

    def __init__(self, params):
        super().__init__(params, {})
        self.captured: Optional[List[torch.Tensor]] = None

    @torch.no_grad()
    def step(self, closure=None):
        self.captured = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu()
                         for p in self.param_groups[0]["params"]]


class WorkerStrategy(Strategy):
    """A worker's device, model and precision: one process, no collectives (the servers are
    reached over RPC), the GPU `gpu`; the backward and the optimizer step are the single-process
    strategy's, O2's fp32 masters included. Only worker 1 prints the precision's notices."""

    name = "ps"

    def __init__(self, options: StrategyOptions, worker: int, gpu: int):
        super().__init__(Precision.from_config(options.precision),
                         device=options.distribution.device)
        self.rank, self.local_rank = worker - 1, gpu


class Worker:
    def __init__(self, options: WorkerOptions, worker: int, workers: int, step_hooks):
        """Worker `worker` of `workers` (numbered from 1); `step_hooks`: what runs after each of
        its steps (the run config's step_hooks for it: an experiment's emulated slowdown)."""
        self.options, self.worker, self.workers = options, worker, workers
        self.ps = ps = options.ps
        self.step_hooks = step_hooks
        # The servers (ranks 0..K-1) train nothing: workers take the GPUs from the first one.
        servers = ps.num_servers
        local_rank = int(os.environ.get("LOCAL_RANK", servers + worker - 1))
        gpu = ((local_rank - servers) % torch.cuda.device_count() if torch.cuda.is_available()
               else 0)
        # setup_environment makes the worker's GPU the current one, as for the engine's
        # strategies: otherwise pinned memory and every worker's first CUDA call open a
        # context on GPU 0.
        self.strategy = WorkerStrategy(options.strategy, worker, gpu)
        self.device = self.strategy.setup_environment()
        plan = plan_as_given(options.plan, workers, self.device.type)
        self.strategy.follow(plan)
        run = options.run
        torch.backends.cudnn.benchmark = not run.deterministic
        self.loader, _, self.num_classes = build_loaders(
            options.loader, worker_shard(worker - 1, workers, ps.split), self.device, plan)
        self.steps_per_epoch = len(self.loader)
        if run.steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, run.steps_per_epoch)
        torch.manual_seed((run.seed or 0) + worker)  # weights are replaced by the first pull
        self.strategy.setup_module(build_model(options.model.arch, self.num_classes))
        self.model = self.strategy.train_model()  # called in its precision
        self.module = self.strategy.module  # the bare model: what the servers' tensors load into
        # What the optimizer steps (O2: the fp32 masters), in the model's parameter order.
        self.trained = [p for _, p in self.strategy.named_optimizer_params()]
        self.optimizer = (esync_local_optimizer(self.trained, options.rule)
                          if ps.mode == "esync"
                          else GradientCapture(self.trained))
        self.push_dtype = None if ps.push_dtype == "auto" else getattr(torch, ps.push_dtype)
        self.shards = shards.model_shards(self.trained, ps.num_servers)  # as the servers'
        self.criterion = nn.CrossEntropyLoss(label_smoothing=options.loss.label_smoothing)
        self.bytes_pushed = [0] * ps.num_servers  # per server
        self.bytes_pulled = [0] * ps.num_servers
        self.lr_multiplier = 1.0  # the schedule's, as the coordinator last said
        self.step = 0  # the server step of the weights this worker holds
        self.epoch = 0  # of this worker's shard (what the step hooks are told)
        self.lost_peers: list = []  # workers the server has given up on
        self.server_gone = False  # the server left without answering this worker's goodbye

    # --- helpers ------------------------------------------------------------------------------
    def _batches(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, float]]:
        """This worker's shard, epoch after epoch, for as long as the server wants (from the
        server's epoch and, after a resume, its position in that epoch's global order)."""
        for epoch in itertools.count(self.first_epoch):
            skip = self.first_epoch_samples if epoch == self.first_epoch else 0
            self.loader.set_epoch(epoch, skip)
            self.epoch = epoch
            batches = iter(self.loader)
            steps = self.steps_per_epoch - skip // (self.options.rule.batch_size * self.workers)
            for _ in range(min(steps, len(self.loader))):
                t = time.perf_counter()
                images, targets = next(batches)
                yield images, targets, time.perf_counter() - t

    def _call(self, fn, *args):
        """A blocking call to the server; its failures end this worker with the reason."""
        return self._wait(rpc.rpc_async(wire.SERVER, fn, args=args))

    @staticmethod
    def _wait(future: torch.futures.Future):
        """A call's result; a server's failure ends this worker with the reason."""
        try:
            result = future.wait()
        except Exception as err:
            text = str(err).strip()
            reason = next((line for line in text.splitlines() if "worker" in line
                           and "lost" in line), text.splitlines()[0] if text else repr(err))
            raise WorkerStopped(reason[:500]) from None
        # A round the server failed arrives as the exception object itself (async_execution
        # futures carry exceptions as values).
        if isinstance(result, BaseException):
            raise WorkerStopped(str(result)[:500])
        return result

    def _take(self, reply: wire.Reply, other_shards: List[List[torch.Tensor]] = ()) -> dict:
        """Load what the servers answered: from server 0 its shard (at the start: the whole
        model), the BatchNorm buffers and the control dict; from each other server its shard."""
        params, bufs, control = reply
        self.bytes_pulled[0] += wire.nbytes(params) + wire.nbytes(bufs)
        if other_shards:
            values: List[Optional[torch.Tensor]] = [None] * len(self.trained)
            for indices, tensors in zip(self.shards, [params, *other_shards]):
                for i, t in zip(indices, tensors):
                    values[i] = t
            for k, tensors in enumerate(other_shards, start=1):
                self.bytes_pulled[k] += wire.nbytes(tensors)
            params = values
        elif len(params) != len(self.trained):  # K = 1 answers the whole model every time
            raise WorkerStopped(f"server 0 sent {len(params)} tensors for "
                                f"{len(self.trained)} parameters")
        self.strategy.precision.load_parameters(self.module, params)
        wire.load_buffers(self.module, bufs)
        self.step = control["step"]
        self.lost_peers = control["lost"]
        self.lr_multiplier = control["lr_multiplier"]
        return control

    def _compute(self, images, targets) -> dict:
        """Forward, backward and the optimizer's step (esync: a local SGD step; sync, async:
        the gradients captured for the push) of one batch, then the step hooks (an experiment's,
        TrainConfig.step_hooks: e.g. an emulated slower device's sleep, counted as compute)."""
        start = time.perf_counter()
        output = self.model(images)
        loss = self.criterion(output, targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.module.zero_grad(set_to_none=True)  # O2: the half model's own gradients
        self.strategy.backward(loss)
        self.strategy.optimizer_step(self.optimizer)
        correct1, correct5 = correct_topk(output, targets)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        busy = time.perf_counter() - start
        for hook in self.step_hooks:
            hook(self.epoch, busy)
        n = len(targets)
        return {"count": n, "loss": loss.item() * n, "correct1": correct1.item(),
                "correct5": correct5.item(), "compute_time": time.perf_counter() - start,
                "steps": 1, "loss_scale": self.strategy.precision.loss_scale()}

    def _push(self, fn, tensors: List[torch.Tensor], stats: dict) -> dict:
        """Send each server its shard of `tensors` (gradients or deltas; empty: this step
        overflowed), all at once, and load the answers."""
        if self.push_dtype is not None:
            tensors = [t.to(self.push_dtype) for t in tensors]
        parts = [shards.pick(tensors, indices) if tensors else [] for indices in self.shards]
        bufs = wire.snapshot(wire.buffers(self.module))
        for k, part in enumerate(parts):
            self.bytes_pushed[k] += wire.nbytes(part) + (wire.nbytes(bufs) if k == 0 else 0)
        stats.update(bytes_pushed=sum(self.bytes_pushed), bytes_pulled=sum(self.bytes_pulled),
                     bytes_pushed_per_server=list(self.bytes_pushed),
                     bytes_pulled_per_server=list(self.bytes_pulled), pushes=1)
        start = time.perf_counter()
        others = [self._push_shard(k, part, rounds=fn is srv.push_round)
                  for k, part in enumerate(parts[1:], start=1)]
        reply = self._call(fn, self.worker, parts[0], bufs, stats)
        other_shards = [self._wait(f) for f in others]
        seconds = time.perf_counter() - start
        control = self._take(reply, other_shards)
        # The push's round trip, less the time the server held it waiting for other workers.
        control["comm_time"] = seconds - control.get("wait_time", 0.0)
        return control

    def _push_shard(self, server: int, part: List[torch.Tensor],
                    rounds: bool) -> torch.futures.Future:
        """sync, esync: a slice of this round, answered once the round is applied; async: a
        slice applied at once, with the schedule's lr as of this worker's last update."""
        if rounds:
            return rpc.rpc_async(wire.server_name(server), shards.shard_push_round,
                                 args=(self.step, part))
        live = self.workers - len(self.lost_peers)
        return rpc.rpc_async(wire.server_name(server), shards.shard_push_async,
                             args=(self.worker, part, self.lr_multiplier, live))

    # --- the loops --------------------------------------------------------------------------------
    def run(self) -> None:
        # A preemption warning reaches every process (torchrun or srun pass it on); the server
        # decides when to stop and tells the workers in its next reply.
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, lambda num, frame: lifecycle.say_from_signal_handler(
                f"=> worker {self.worker}: {signal.Signals(num).name}: the server will stop "
                "the run at its next update"))
        control = self._take(self._call(srv.register, self.worker, self.steps_per_epoch))
        self.first_epoch, self.first_epoch_samples = control["epoch"], control["epoch_samples"]
        loop = {"sync": self._gradient_loop, "async": self._gradient_loop,
                "esync": self._esync_loop}[self.ps.mode]
        if not control["stop"]:
            loop()
        self.leave()

    def leave(self) -> None:
        """Tell the server this worker is done, and learn which peers it lost since its last
        reply. The server has already said stop, so the run is over for this worker whatever
        the answer: a server that lost a worker ends without RPC's graceful barrier, and may be
        gone before its answer to the last goodbye leaves (then nobody is waited for either)."""
        try:
            self.lost_peers = self._call(srv.goodbye, self.worker)
        except WorkerStopped as err:
            print(f"note: worker {self.worker}: the server ended before answering its goodbye "
                  f"({err})", flush=True)
            self.server_gone = True

    def say_goodbye(self) -> None:
        """After a failure: tell the server we heard, if it is still there."""
        try:
            rpc.rpc_sync(wire.SERVER, srv.goodbye, args=(self.worker,), timeout=5)
        except Exception:
            pass

    def _gradient_loop(self) -> None:
        fn = srv.push_round if self.ps.mode == "sync" else srv.push_async
        comm = wait = 0.0  # of the previous push, reported with the next one
        for images, targets, data_time in self._batches():
            self.optimizer.captured = None
            stats = self._compute(images, targets)
            grads = self.optimizer.captured or []  # none: the loss scaler skipped this step
            stats.update(data_time=data_time, comm_time=comm, wait_time=wait,
                         pulled_step=self.step, overflows=0 if grads else 1)
            control = self._push(fn, grads, stats)
            comm, wait = control["comm_time"], control.get("wait_time", 0.0)
            if control["stop"]:
                return

    def _esync_loop(self) -> None:
        optimizer = self.optimizer
        local_lr = optimizer.defaults["lr"]
        batches = self._batches()
        comm = wait = 0.0
        multiplier = 1.0
        while True:
            for group in optimizer.param_groups:
                group["lr"] = local_lr * multiplier
            start_params = wire.snapshot(self.trained)
            totals = {"count": 0, "loss": 0.0, "correct1": 0.0, "correct5": 0.0,
                      "compute_time": 0.0, "data_time": 0.0, "steps": 0}
            local_steps, query_time = 0, 0.0
            while True:
                # The service times the steps itself, between this worker's queries.
                t = time.perf_counter()
                go = self._call(srv.esync_should_step, self.worker, self.step, local_steps)
                query_time += time.perf_counter() - t
                if not go:
                    break
                images, targets, data_time = next(batches)
                step = self._compute(images, targets)
                totals["loss_scale"] = step["loss_scale"]
                for k in ("count", "loss", "correct1", "correct5", "compute_time", "steps"):
                    totals[k] += step[k]
                totals["data_time"] += data_time
                local_steps += 1
            with torch.no_grad():
                delta = ESYNC_AVERAGES[self.ps.esync_average].pushed_delta(
                    [p.detach().cpu() - p0 for p, p0 in zip(self.trained, start_params)],
                    local_steps)
            totals.update(local_steps=local_steps, comm_time=comm, wait_time=wait)
            control = self._push(srv.push_round, delta, totals)
            comm = control["comm_time"] + query_time
            wait = control.get("wait_time", 0.0)
            multiplier = control["lr_multiplier"]
            if control["stop"]:
                return
