"""A worker (ranks 1..N): pulls the model, trains on its own shard, pushes to the server.

sync   gradient of one batch per step; the push returns the updated model once every worker
       of the step has pushed.
async  the same gradient, applied by the server at once; the push returns the newest model.
esync  local SGD steps for as long as the state service says they fit into the slowest
       worker's step; then the model delta of the round is pushed and averaged.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Iterator, Tuple

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn

from ..data import Shard, build_loaders
from ..metrics import correct_topk
from ..models import build_model
from ..precision import Precision
from ..strategies import pick_device
from . import server as srv
from . import wire
from .update_rules import esync_local_optimizer


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


class Worker:
    def __init__(self, cfg, worker: int, workers: int, slowdown: float):
        self.cfg, self.worker, self.workers, self.slowdown = cfg, worker, workers, slowdown
        local_rank = int(os.environ.get("LOCAL_RANK", worker))
        gpu = (local_rank - 1) % torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.device = pick_device(cfg.device, gpu)
        if self.device.type == "cuda":
            # As the other entries do: otherwise pinned memory and the first CUDA call of every
            # worker open a context on GPU 0.
            torch.cuda.set_device(self.device)
        torch.backends.cudnn.benchmark = not cfg.deterministic
        self.loader, _, self.num_classes = build_loaders(
            cfg, worker_shard(worker - 1, workers, cfg.split), self.device)
        self.steps_per_epoch = len(self.loader)
        if cfg.steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.steps_per_epoch)
        torch.manual_seed((cfg.seed or 0) + worker)  # weights are replaced by the first pull
        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        # The parameter server trains at O0 (fp32, or float64 with --float64).
        self.precision = Precision.from_config(cfg)
        self.precision.bind(self.device, notice=lambda message: None)
        self.model = self.precision.convert_module(
            build_model(cfg.arch, self.num_classes).to(self.device, memory_format=memory_format))
        self.model.train()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.bytes_pushed = self.bytes_pulled = 0
        self.step = 0  # the server step of the weights this worker holds
        self.lost_peers: list = []  # workers the server has given up on

    # --- helpers ------------------------------------------------------------------------------
    def _batches(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, float]]:
        """This worker's shard, epoch after epoch, for as long as the server wants (from the
        server's epoch and, after a resume, its position in that epoch's global order)."""
        for epoch in itertools.count(self.first_epoch):
            skip = self.first_epoch_samples if epoch == self.first_epoch else 0
            self.loader.set_epoch(epoch, skip)
            batches = iter(self.loader)
            steps = self.steps_per_epoch - skip // (self.cfg.batch_size * self.workers)
            for _ in range(min(steps, len(self.loader))):
                t = time.perf_counter()
                images, targets = next(batches)
                yield images, targets, time.perf_counter() - t

    def _call(self, fn, *args):
        """A blocking call to the server; its failures end this worker with the reason."""
        try:
            result = rpc.rpc_sync(wire.SERVER, fn, args=args)
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

    def _take(self, reply: wire.Reply) -> dict:
        params, bufs, control = reply
        wire.load_into(self.model, params, bufs)
        self.bytes_pulled += wire.nbytes(params) + wire.nbytes(bufs)
        self.step = control["step"]
        self.lost_peers = control["lost"]
        return control

    def _compute(self, images, targets) -> dict:
        """Forward and backward of one batch, slowed down by the --worker-slowdown factor (a
        sleep, so an emulated slow worker does not take CPU from the others)."""
        start = time.perf_counter()
        output = self.model(self.precision.convert_input(images))
        loss = self.criterion(self.precision.convert_output(output), targets)
        self.model.zero_grad(set_to_none=True)
        loss.backward()
        correct1, correct5 = correct_topk(output, targets)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        busy = time.perf_counter() - start
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * busy)
        n = len(targets)
        return {"count": n, "loss": loss.item() * n, "correct1": correct1.item(),
                "correct5": correct5.item(), "compute_time": time.perf_counter() - start,
                "steps": 1}

    def _push(self, fn, tensors, stats: dict) -> dict:
        bufs = wire.snapshot(wire.buffers(self.model))
        self.bytes_pushed += wire.nbytes(tensors) + wire.nbytes(bufs)
        stats.update(bytes_pushed=self.bytes_pushed, bytes_pulled=self.bytes_pulled, pushes=1)
        start = time.perf_counter()
        reply = self._call(fn, self.worker, tensors, bufs, stats)
        seconds = time.perf_counter() - start
        control = self._take(reply)
        # The push's round trip, less the time the server held it waiting for other workers.
        control["comm_time"] = seconds - control.get("wait_time", 0.0)
        return control

    # --- the loops --------------------------------------------------------------------------------
    def run(self) -> None:
        # A preemption warning reaches every process (torchrun or srun pass it on); the server
        # decides when to stop and tells the workers in its next reply.
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, lambda num, frame: print(
                f"=> worker {self.worker}: {signal.Signals(num).name}: the server will stop "
                "the run at its next update", flush=True))
        control = self._take(self._call(srv.register, self.worker, self.steps_per_epoch))
        self.first_epoch, self.first_epoch_samples = control["epoch"], control["epoch_samples"]
        loop = {"sync": self._gradient_loop, "async": self._gradient_loop,
                "esync": self._esync_loop}[self.cfg.mode]
        if not control["stop"]:
            loop()
        self._call(srv.goodbye, self.worker)

    def say_goodbye(self) -> None:
        """After a failure: tell the server we heard, if it is still there."""
        try:
            rpc.rpc_sync(wire.SERVER, srv.goodbye, args=(self.worker,), timeout=5)
        except Exception:
            pass

    def _gradient_loop(self) -> None:
        fn = srv.push_round if self.cfg.mode == "sync" else srv.push_async
        comm = wait = 0.0  # of the previous push, reported with the next one
        for images, targets, data_time in self._batches():
            stats = self._compute(images, targets)
            stats.update(data_time=data_time, comm_time=comm, wait_time=wait,
                         pulled_step=self.step)
            control = self._push(fn, wire.gradients(self.model), stats)
            comm, wait = control["comm_time"], control.get("wait_time", 0.0)
            if control["stop"]:
                return

    def _esync_loop(self) -> None:
        optimizer = esync_local_optimizer(self.model.parameters(), self.cfg)
        local_lr = optimizer.defaults["lr"]
        batches = self._batches()
        comm = wait = 0.0
        multiplier = 1.0
        while True:
            for group in optimizer.param_groups:
                group["lr"] = local_lr * multiplier
            start_params = wire.snapshot(wire.parameters(self.model))
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
                optimizer.step()
                for k in ("count", "loss", "correct1", "correct5", "compute_time", "steps"):
                    totals[k] += step[k]
                totals["data_time"] += data_time
                local_steps += 1
            with torch.no_grad():
                delta = [p.detach().cpu() - p0 for p, p0 in
                         zip(wire.parameters(self.model), start_params)]
            totals.update(local_steps=local_steps, comm_time=comm, wait_time=wait)
            control = self._push(srv.push_round, delta, totals)
            comm = control["comm_time"] + query_time
            wait = control.get("wait_time", 0.0)
            multiplier = control["lr_multiplier"]
            if control["stop"]:
                return
