"""The parameter server (rank 0): the RPC surface the workers call, rounds, counters, logging,
background evaluations and checkpoints. What an update does is update_rules.py's; finding dead
workers is monitor.py's.

RPC handlers run on the RPC agent's thread pool, several at once; one lock guards the model and
the counters. Rounds of sync and esync are completed with futures (`async_execution`): a worker's
push returns a future that is fulfilled when the last worker of the round has arrived, so no
thread waits or polls. The forward pass never runs here during training; validation does, on
snapshots, in a background thread.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn

from .. import checkpoint
from ..metrics import summarize
from ..progress import RunClock
from ..runlog import RunLog
from ..schedule import LrMultiplier
from ..validation import evaluate
from . import shards, wire
from .evaluator import BackgroundJobs
from .monitor import PROBE_AFTER_S, FailureMonitor
from .state_service import EsyncStateService
from .options import ServerOptions
from .update_rules import make_rule

_SERVER: Optional["ParameterServer"] = None  # this process's server, for the RPC entry points


# --- RPC entry points (module-level functions: RPC sends them by qualified name) ------------------
@rpc.functions.async_execution
def register(worker: int, steps_per_epoch: int) -> torch.futures.Future:
    return _SERVER.register(worker, steps_per_epoch)


@rpc.functions.async_execution
def push_round(worker: int, tensors: List[torch.Tensor], bufs: List[torch.Tensor],
               stats: dict) -> torch.futures.Future:
    return _SERVER.push_round(worker, tensors, bufs, stats)


def push_async(worker: int, grads: List[torch.Tensor], bufs: List[torch.Tensor],
               stats: dict) -> wire.Reply:
    return _SERVER.push_async(worker, grads, bufs, stats)


def esync_should_step(worker: int, round_: int, local_steps: int) -> bool:
    return _SERVER.esync_should_step(worker, round_, local_steps)


def goodbye(worker: int) -> List[int]:
    return _SERVER.goodbye(worker)


def epoch_stats(sums: Dict[str, float]) -> dict:
    """An epoch's training loss and accuracy. An update can carry more than an epoch's samples
    (an ESync round whose fast workers took many local steps, on a small data set): the epochs it
    completes after the first had no report of their own, and have no loss or accuracy (None),
    rather than a loss of 0."""
    if sums["count"]:
        return summarize(sums)
    return {"loss": None, "top1": None, "top5": None, "count": 0}


class WorkerFailure(Exception):
    """A worker died or hung and the mode cannot go on without it."""


class _Interval:
    """Sums over one print interval: training metrics and per-worker timings."""

    def __init__(self, workers: int):
        self.start = time.perf_counter()
        self.updates = 0
        self.metrics = {"count": 0.0, "loss": 0.0, "correct1": 0.0, "correct5": 0.0}
        self.per_worker: Dict[int, Dict[str, float]] = {w: {} for w in range(1, workers + 1)}

    def add(self, worker: int, stats: dict) -> None:
        for k in self.metrics:
            self.metrics[k] += stats[k]
        sums = self.per_worker[worker]
        for k in ("steps", "count", "compute_time", "comm_time", "wait_time", "data_time",
                  "local_steps", "staleness", "pushes", "overflows"):
            sums[k] = sums.get(k, 0.0) + stats.get(k, 0.0)
        sums["staleness_max"] = max(sums.get("staleness_max", 0), stats.get("staleness", 0))
        for k in ("bytes_pushed", "bytes_pulled", "bytes_pushed_per_server",
                  "bytes_pulled_per_server", "loss_scale"):
            sums[k] = stats.get(k)  # running totals (and the newest scale): the latest counts


class ParameterServer:
    def __init__(self, options: ServerOptions, config_record: dict, model: nn.Module,
                 num_classes: int, workers: int, val_loader, eval_device: torch.device,
                 log: RunLog, run_dir: Path):
        """`config_record`: the run's config as planned (flat), kept in each checkpoint."""
        self.options, self.config_record = options, config_record
        self.mode, self.workers = options.ps.mode, workers
        self.model, self.num_classes = model, num_classes
        self.params, self.bufs = wire.parameters(model), wire.buffers(model)
        # --num-servers: this server updates shard 0; servers 1..K-1 the others (shards.py).
        self.shards = shards.model_shards(self.params, options.ps.num_servers)
        self.own = shards.pick(self.params, self.shards[0])
        self._restored_optimizer: dict = {}  # the whole model's, for the other shards
        self.val_loader, self.eval_device, self.log, self.run_dir = (
            val_loader, eval_device, log, run_dir)
        self.lock = threading.Lock()
        self.finished = threading.Event()  # training over, or failed
        self.departed = threading.Event()  # every live worker has said goodbye
        self.failure: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self.stop_signal: Optional[str] = None  # SIGTERM / SIGUSR1: checkpoint and exit 75

        # Counters. A "step" is one server update: a round (sync, esync) or one push (async).
        self.step = 0
        self.samples = 0
        self.epoch = 0
        self.best_top1 = 0.0
        self.live = set(range(1, workers + 1))
        self.lost: Dict[int, str] = {}
        self.said_goodbye: set = set()
        self.last_contact = {w: time.monotonic() for w in self.live}

        self.rule = make_rule(options.rule, self.own, workers)
        self.base_lr = self.rule.base_lr
        self.state_service = EsyncStateService(workers, options.ps.max_local_steps,
                                               options.ps.esync_rule, options.ps.esync_epsilon)

        self._registered: Dict[int, int] = {}
        self._register_futures: List[torch.futures.Future] = []
        self._round: Dict[int, tuple] = {}  # worker -> (future, arrival time)
        self._round_sums = shards.RoundSums(self.own)
        self._round_bufs: List[Optional[torch.Tensor]] = [None] * len(self.bufs)
        self._round_started: Optional[float] = None
        self.jobs = BackgroundJobs()
        self._eval_model: Optional[nn.Module] = None
        self._train_t0 = time.monotonic()
        self._resumed_at: Optional[Tuple[int, int]] = None  # (epoch, samples into it)

    # --- start: every worker registers, then all get the initial model at once ------------------
    def register(self, worker: int, steps_per_epoch: int) -> torch.futures.Future:
        future = torch.futures.Future()
        with self.lock:
            self.last_contact[worker] = time.monotonic()
            self._registered[worker] = steps_per_epoch
            self._register_futures.append(future)
            if len(self._registered) < self.workers:
                return future
            # One epoch = every worker through its own shard once (with -b per worker).
            self.samples_per_epoch = sum(self._registered.values()) * self.options.batch_size
            # The schedule counts sync-sized steps (N batches), whatever the mode.
            self.schedule = LrMultiplier(self.options.schedule, max(1, self.samples_per_epoch // (
                self.options.batch_size * self.workers)), self.base_lr)
            if self._resumed_at is not None:
                # The checkpoint's epoch and position in it, not its sample count divided by
                # this run's epoch length: another number of workers gives another length.
                epoch, into = self._resumed_at
                self.samples = epoch * self.samples_per_epoch + min(into, self.samples_per_epoch)
            self.epoch = min(self.samples // self.samples_per_epoch, self.options.schedule.epochs)
            if self.epoch >= self.options.schedule.epochs:
                self.stop_reason = "finished"  # resumed a run that had already ended
            self._resume_position = self._position_to_resume_at()
            self._interval = _Interval(self.workers)
            self._epoch_started = time.perf_counter()
            self._epoch_metrics = {k: 0.0 for k in self._interval.metrics}
            self.log.restart_clock()
            self._train_t0 = time.monotonic()
            self.clock = RunClock(total=self.options.schedule.epochs * self.samples_per_epoch)
            self.clock.start(done=self.samples)
            self._load_shards()
            reply = self._reply(everything=True, epoch_samples=self._resume_position)
            futures, self._register_futures = self._register_futures, []
        for f in futures:
            f.set_result(reply)
        return future

    def _position_to_resume_at(self) -> int:
        """Global samples of the current epoch the workers skip (a resume inside an epoch).

        sync with the IID split reads the epoch's global order round by round, as DDP does, so
        it continues exactly where it stopped when the rounds (workers x -b) still fit. async
        and esync workers move through their shards at their own pace, so no prefix of the
        global order is done: they (and a sync run whose rounds no longer fit) read the epoch
        again from its start."""
        into = self.samples - self.epoch * self.samples_per_epoch
        if into <= 0 or self.epoch >= self.options.schedule.epochs:
            return 0
        round_size, split = self.options.batch_size * self.workers, self.options.ps.split
        if self.mode == "sync" and split == "iid" and into % round_size == 0:
            return into
        self.log.print(f"note: resumed inside epoch {self.epoch} after {into} samples; --mode "
                       f"{self.mode} (--split {split}, rounds of {round_size}) cannot "
                       "continue that epoch's order exactly, so the workers read it again from "
                       "its start")
        self.samples = self.epoch * self.samples_per_epoch  # the whole epoch is still to come
        return 0

    def _lr_multiplier(self) -> float:
        return self.schedule(self.samples // (self.options.batch_size * self.workers))

    def _load_shards(self) -> None:
        """Give servers 1..K-1 their shards: the initial or restored weights and optimizer
        state (under the lock, before any worker can push)."""
        for k, indices in enumerate(self.shards[1:], start=1):
            rpc.rpc_sync(wire.server_name(k), shards.shard_load, args=(
                wire.snapshot(shards.pick(self.params, indices)),
                shards.split_optimizer_state(self._restored_optimizer, indices), self.step))
        self._restored_optimizer = {}

    def _reply(self, everything: bool = False, **extra) -> wire.Reply:
        """This server's shard of the current model (`everything`: the whole model, as at the
        start), the BatchNorm buffers, and what a worker needs to know (under the lock)."""
        control = {"step": self.step, "epoch": self.epoch,
                   "stop": self.stop_reason is not None,
                   "lr_multiplier": self._lr_multiplier(), "lost": sorted(self.lost), **extra}
        params = self.params if everything else self.own
        return wire.snapshot(params), wire.snapshot(self.bufs), control

    # --- sync and esync: rounds ----------------------------------------------------------------
    def push_round(self, worker: int, tensors, bufs, stats: dict) -> torch.futures.Future:
        """sync: `tensors` are gradients; esync: model deltas since the round's start."""
        future = torch.futures.Future()
        with self.lock:
            if self.failure:
                future.set_exception(WorkerFailure(self.failure))
                return future
            now = time.monotonic()
            self.last_contact[worker] = now
            if not self._round:
                self._round_started = now
            first = not self._round
            self._round_sums.add(tensors, stats.get("local_steps", 1))
            wire.average_buffers(self._round_bufs, bufs, first)
            self._round[worker] = (future, now)
            self._interval.add(worker, stats)
            self.samples += int(stats["count"])
            if len(self._round) < len(self.live):
                return future
            self._apply_round()
            arrivals, self._round = self._round, {}
            self._after_update()
            params, bufs_now, control = self._reply()
            released = time.monotonic()
        for w, (f, arrived) in arrivals.items():
            f.set_result((params, bufs_now, {**control, "wait_time": released - arrived}))
        return future

    @torch.no_grad()
    def _apply_round(self) -> None:
        """This shard's update; the other servers are told to make theirs (and to answer the
        workers waiting on them) as soon as their slices of the round are in."""
        n, multiplier = len(self._round), self._lr_multiplier()
        overflow, mean_steps = self._round_sums.overflow, self._round_sums.mean_steps()
        if not overflow:  # a worker's loss scaler found an inf or NaN: nobody updates
            self.rule.apply_round(self._round_sums.sums, n, multiplier, mean_steps)
        for k in range(1, len(self.shards)):
            rpc.rpc_async(wire.server_name(k), shards.shard_apply_round,
                          args=(self.step, n, multiplier, overflow, mean_steps))
        wire.divide_float(self._round_bufs, n)
        for b, mean in zip(self.bufs, self._round_bufs):
            b.copy_(mean)
        self._round_sums = shards.RoundSums(self.own)

    def esync_should_step(self, worker: int, round_: int, local_steps: int) -> bool:
        self.last_contact[worker] = time.monotonic()
        return self.state_service.should_step(worker - 1, round_, local_steps)

    # --- async: every push is an update -----------------------------------------------------------
    @torch.no_grad()
    def push_async(self, worker: int, grads, bufs, stats: dict) -> wire.Reply:
        with self.lock:
            if self.failure:
                raise WorkerFailure(self.failure)
            self.last_contact[worker] = time.monotonic()
            # Staleness: how many updates other workers made since this gradient's weights.
            staleness = self.step - stats["pulled_step"]
            self._interval.add(worker, {**stats, "staleness": staleness})
            self.samples += int(stats["count"])
            if grads:  # empty: the worker's loss scaler found an inf or NaN
                self.rule.apply_push(shards.as_params(grads, self.own), self._lr_multiplier(),
                                     staleness, len(self.live))
            for b, value in zip(self.bufs, bufs):  # the newest worker's BatchNorm statistics
                b.copy_(value)
            self._after_update()
            return self._reply(staleness=staleness)

    # --- after every update: epochs, logging, evaluation, checkpoints, the end --------------------
    def _after_update(self) -> None:
        ps, run, epochs = self.options.ps, self.options.run, self.options.schedule.epochs
        self.step += 1
        self._interval.updates += 1
        if self._interval.updates >= run.print_freq:
            self._log_interval()
        epoch_now = min(self.samples // self.samples_per_epoch, epochs)
        while self.epoch < epoch_now:
            self._end_epoch()
        if ps.eval_every > 0 and self.step % ps.eval_every == 0:
            self._submit_eval(checkpoint_after=False)
        if run.checkpoint_every and self.step % run.checkpoint_every == 0:
            self._submit_checkpoint(is_best=False)
        if self.epoch >= epochs and self.stop_reason is None:
            self.stop_reason = "finished"
        if self.stop_signal and self.stop_reason is None:
            self.stop_reason = f"preempted by {self.stop_signal}"

    def _log_interval(self) -> None:
        iv, self._interval = self._interval, _Interval(self.workers)
        seconds = time.perf_counter() - iv.start
        for k, v in iv.metrics.items():
            self._epoch_metrics[k] += v
        if iv.metrics["count"] == 0:
            return
        stats = summarize(iv.metrics)
        img_s = stats["count"] / seconds
        lr = self.base_lr * self._lr_multiplier()
        self.log.write("train", epoch=self.epoch, step=self.step, samples_seen=self.samples,
                       mode=self.mode, **stats,
                       lr=lr, img_s=img_s, img_s_per_proc=img_s / len(self.live),
                       step_time=seconds / iv.updates, live_workers=len(self.live),
                       data_time=_mean(iv.per_worker, "data_time", "steps"))
        for w, sums in iv.per_worker.items():
            if not sums:
                continue
            pushes = max(sums["pushes"], 1)
            self.log.write(
                "worker", worker=w, step=self.step, samples_seen=self.samples,
                samples=int(sums["count"]),
                steps=int(sums["steps"]), compute_time=sums["compute_time"],
                comm_time=sums["comm_time"], wait_time=sums["wait_time"],
                data_time=sums["data_time"], seconds=seconds,
                bytes_pushed=sums["bytes_pushed"], bytes_pulled=sums["bytes_pulled"],
                bytes_pushed_per_server=sums["bytes_pushed_per_server"],
                bytes_pulled_per_server=sums["bytes_pulled_per_server"],
                overflows=int(sums["overflows"]), loss_scale=sums["loss_scale"],
                local_steps=sums["local_steps"] / pushes if self.mode == "esync" else None,
                staleness=sums["staleness"] / pushes if self.mode == "async" else None,
                staleness_max=sums["staleness_max"] if self.mode == "async" else None)
        self.log.print(
            f"Epoch [{self.epoch}] step {self.step:>5}  loss {stats['loss']:.4f}  top1 "
            f"{stats['top1']:6.2f}  lr {lr:.4g}  img/s {img_s:.1f}  ETA run "
            f"{self.clock.eta(done=self.samples)}  " + "  ".join(
                f"w{w}:{_worker_summary(self.mode, s)}" for w, s in iv.per_worker.items() if s))

    def _end_epoch(self) -> None:
        self._log_interval()
        started, now = self._epoch_started, time.perf_counter()
        stats = epoch_stats(self._epoch_metrics)
        self.log.write("train_epoch", epoch=self.epoch, step=self.step,
                       samples_seen=self.samples, **stats,
                       img_s=stats["count"] / (now - started),
                       img_s_per_proc=stats["count"] / (now - started) / len(self.live),
                       epoch_time=now - started, skipped=0)
        if stats["count"]:
            self.log.print(f" * Train epoch {self.epoch}: loss {stats['loss']:.4f}  top1 "
                           f"{stats['top1']:.3f}  {stats['count'] / (now - started):.1f} img/s  "
                           f"{now - started:.1f}s")
        else:
            self.log.print(f" * Train epoch {self.epoch}: no worker reported in it (the last "
                           f"update's samples covered it whole)  {now - started:.1f}s")
        self._epoch_started = now
        self._epoch_metrics = {k: 0.0 for k in self._epoch_metrics}
        save_every = self.options.run.save_every  # this epoch's checkpoint kept under its name
        keep_as = (f"checkpoint-epoch{self.epoch}.pth"
                   if save_every and (self.epoch + 1) % save_every == 0 else None)
        if self.options.ps.eval_every == 0:
            self._submit_eval(checkpoint_after=True, keep_as=keep_as)
        else:
            self._submit_checkpoint(is_best=False, keep_as=keep_as)
        self.epoch += 1

    # --- background work on snapshots ---------------------------------------------------------
    def restore(self, state: dict) -> None:
        """Continue from a checkpoint: weights, optimizer, counters (the epoch follows from the
        samples once the workers have registered)."""
        self.model.load_state_dict(state["model"])
        self.rule.load_state_dict(shards.split_optimizer_state(state["optimizer"],
                                                               self.shards[0]))
        self._restored_optimizer = state["optimizer"]
        self.step, self.samples = state["step"], state.get("samples", 0)
        self.best_top1 = state.get("best_top1", 0.0)
        if "epoch_samples" in state:  # older checkpoints hold only the sample count
            self._resumed_at = (state["epoch"], state["epoch_samples"])

    def _snapshot_state(self) -> dict:
        """The checkpoint of now (under the lock). The other servers' shards arrive later:
        `_complete` waits for them, in the background job."""
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        # sync, esync: the shards as of this round; async has no rounds: as they are then
        as_of = None if self.mode == "async" else self.step
        pending = [rpc.rpc_async(wire.server_name(k), shards.shard_state, args=(as_of,))
                   for k in range(1, len(self.shards))]
        # "epoch": epochs completed, as in the engine's checkpoints
        completed = min(self.samples // self.samples_per_epoch, self.options.schedule.epochs)
        return {"arch": self.options.model.arch, "num_classes": self.num_classes, "model": state,
                "optimizer": wire.clone_nested(self.rule.state_dict()), "_shards": pending,
                "epoch": completed, "epoch_step": 0,
                "epoch_samples": self.samples - completed * self.samples_per_epoch,
                "step": self.step, "samples": self.samples, "mode": self.mode,
                "world_size": self.workers + len(self.shards), "config": self.config_record}

    def _complete(self, state: dict) -> dict:
        """The whole model and optimizer state: the other servers' shards filled in."""
        names = [name for name, _ in self.model.named_parameters()]
        optimizers = [state["optimizer"]]
        for indices, future in zip(self.shards[1:], state.pop("_shards")):
            params, optimizer = future.wait()
            if isinstance(params, BaseException):
                raise params
            for i, value in zip(indices, params):
                state["model"][names[i]] = value
            optimizers.append(optimizer)
        state["optimizer"] = shards.merge_optimizer_states(optimizers, self.shards)
        return state

    def _submit_eval(self, checkpoint_after: bool, keep_as: Optional[str] = None) -> None:
        """Evaluate the weights of now in the background; `checkpoint_after`: then checkpoint
        them (also kept as `keep_as`, a name in the run dir, where given)."""
        state = self._snapshot_state()
        epoch = self.epoch
        taken = time.monotonic() - self._train_t0
        self.jobs.submit(lambda: self._evaluate(state, epoch, taken, checkpoint_after, keep_as))

    def _submit_checkpoint(self, is_best: bool, keep_as: Optional[str] = None) -> None:
        state = self._snapshot_state()
        self.jobs.submit(lambda: self._write_checkpoint(state, is_best, keep_as))

    def write_final_checkpoint(self) -> None:
        """After a stop signal, once every worker has left: the model as it is now."""
        self._write_checkpoint(self._snapshot_state(), is_best=False)

    def _evaluate(self, state: dict, epoch: int, taken: float, checkpoint_after: bool,
                  keep_as: Optional[str] = None) -> None:
        state = self._complete(state)
        if self._eval_model is None:
            from ..models import build_model
            self._eval_model = build_model(self.options.model.arch, self.num_classes).to(
                self.eval_device)
        self._eval_model.load_state_dict(state["model"])
        # the evaluation copy is a float32 model, whatever precision the server trains in
        stats = evaluate(self._eval_model, self.val_loader, self.eval_device,
                         nn.CrossEntropyLoss())
        is_best = stats["top1"] > self.best_top1
        self.best_top1 = max(self.best_top1, stats["top1"])
        step = state["step"]
        self.log.write("val", epoch=epoch, step=step, samples_seen=state["samples"],
                       train_elapsed=taken, **stats, skipped=0)
        self.log.print(f" * Val epoch {epoch} step {step}: loss {stats['loss']:.4f}  top1 "
                       f"{stats['top1']:.3f}  top5 {stats['top5']:.3f}  ({stats['count']} "
                       f"images, {stats['seconds']:.1f}s)  best top1 {self.best_top1:.3f}")
        if checkpoint_after:
            self._write_checkpoint(state, is_best, keep_as)
        desired = self.options.run.desired_acc
        if desired is not None and stats["top1"] >= desired:
            with self.lock:
                if self.stop_reason is None:
                    self.stop_reason = f"reached --desired-acc {desired}"

    def _write_checkpoint(self, state: dict, is_best: bool, keep_as: Optional[str] = None) -> None:
        start = time.perf_counter()
        if "_shards" in state:  # not yet completed by an evaluation
            state = self._complete(state)
        state["best_top1"] = self.best_top1
        path = checkpoint.save(state, self.run_dir, is_best, keep_as=keep_as)
        self.log.write("checkpoint", epoch=state["epoch"], step=state["step"],
                       path=str(path), best=is_best, seconds=time.perf_counter() - start)

    # --- the end, and failures -----------------------------------------------------------------
    def goodbye(self, worker: int) -> List[int]:
        """A worker is done; the answer is the workers lost so far (the last news it gets)."""
        with self.lock:
            self.said_goodbye.add(worker)
            self._maybe_finish()
            return sorted(self.lost)

    def _maybe_finish(self) -> None:
        if self.live <= self.said_goodbye:
            self.departed.set()
            self.finished.set()

    def failure_monitor(self) -> FailureMonitor:
        return FailureMonitor(self._suspects, self._lose, self.finished,
                              self.options.distribution.dist_timeout)

    def _suspects(self) -> Tuple[List[int], float]:
        """The workers this server waits on now, and for how long it has waited."""
        with self.lock:
            now = time.monotonic()
            if self._round:  # a round waits on whoever has not pushed yet
                return ([w for w in self.live if w not in self._round],
                        now - self._round_started)
            silent = [w for w in self.live if w not in self.said_goodbye
                      and now - self.last_contact[w] > PROBE_AFTER_S]
            return silent, min((now - self.last_contact[w] for w in silent), default=0.0)

    def _lose(self, worker: int, reason: str) -> None:
        with self.lock:
            if worker not in self.live:
                return
            self.live.discard(worker)
            self.lost[worker] = reason
            self.log.write("worker_lost", worker=worker, step=self.step, reason=reason,
                           live_workers=len(self.live))
            self.log.print(f"=> worker {worker} lost at step {self.step}: {reason}")
            if self.mode == "async" and self.live:
                # async needs nobody in particular: carry on with the others
                self._maybe_finish()
                return
            self.failure = (f"worker {worker} was lost at server step {self.step} ({reason}); "
                            f"--mode {self.mode} needs every worker in every round, so the run "
                            "stops (--mode async carries on without lost workers)")
            waiting, self._round = self._round, {}
            self.finished.set()
        for future, _ in waiting.values():
            future.set_exception(WorkerFailure(self.failure))

    def end_shards(self) -> None:
        """Tell servers 1..K-1 the run is over (and, after a failure, why)."""
        for k in range(1, len(self.shards)):
            try:
                rpc.rpc_sync(wire.server_name(k), shards.shard_end,
                             args=(not self.lost, self.failure), timeout=10)
            except Exception as err:  # gone already: nothing to tell it
                print(f"note: server {k}: {str(err).splitlines()[0][:200]}", flush=True)


def _mean(per_worker: Dict[int, Dict[str, float]], key: str, per: str) -> float:
    total = sum(s.get(key, 0.0) for s in per_worker.values())
    count = sum(s.get(per, 0.0) for s in per_worker.values())
    return total / count if count else 0.0


def _worker_summary(mode: str, s: Dict[str, float]) -> str:
    pushes = max(s["pushes"], 1)
    text = f"{s['compute_time'] / pushes:.2f}s+{s['comm_time'] / pushes:.2f}s"
    if mode == "esync":
        text += f" x{s['local_steps'] / pushes:.1f}"
    if mode == "async":
        text += f" st{s['staleness'] / pushes:.1f}"
    return text
