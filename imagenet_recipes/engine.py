"""The training engine: setup, epoch loop, train step, validation, logging, checkpoints.

It knows nothing about how the work is distributed or at which precision it runs: those are the
`strategy` and `precision` objects, and this file only calls their methods.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch

from . import checkpoint, lifecycle, summary
from .advice import data_wait_note, gpu_hints, out_of_memory
from .compiled_graphs import GraphCount
from .config import TrainConfig, exit_on_usage_error
from .data import build_loaders
from .data.augment import smallest_crop
from .ema import ModelEMA, ema_decay_per_update
from .errors import UsageError
from .machine import cores_per_process
from .metrics import Stopwatch, SumMeter, correct_topk, summarize
from .models import arch_slug, build_model, input_size_refusal, load_command
from .options import (AugmentOptions, EmaOptions, LoaderOptions, LossOptions, OptimizerOptions,
                      PlanOptions, ScheduleOptions, StrategyOptions)
from .optim import build_optimizer
from .presets import scaling_note
from .progress import RunClock, duration
from .registry import ENTRIES
from .run_plan import plan_as_given, plan_run
from .runlog import RunLog, console
from .schedule import build_scheduler, lr_warnings, set_position
from .targets import build_criterion, build_mixer
from .validation import evaluate


def make_deterministic() -> None:
    """--deterministic: the same run gives the same weights, on CUDA too. An op without a
    deterministic kernel raises, naming itself, rather than warning once and varying silently;
    cuBLAS needs a fixed workspace configuration for reproducible matmuls (read when its first
    handle is made, so before the model's first step), unless the user set one."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True


class Preempted(Exception):
    """A stop signal arrived; a checkpoint has been written."""


class Trainer:
    def __init__(self, cfg: TrainConfig, strategy, entry: str):
        self.cfg, self.strategy, self.entry = cfg, strategy, entry
        self.epoch, self.step = cfg.start_epoch, 0
        self.best = summary.Best()  # the model's best validation top-1 and its epoch
        self.best_ema = summary.Best()  # the same for the --model-ema average
        self.samples_seen = 0  # training samples of the run so far, all processes
        self.resume_epoch_step = 0  # optimizer steps of self.epoch already done (mid-epoch resume)
        self.stop_signal = None  # set by SIGTERM / SIGUSR1 (preemption warning)
        self._data_wait_told = False  # the note on waiting for data comes once per run
        self.graphs = GraphCount(cfg.compile)  # with --compile: graphs made, train and val apart
        self.log = RunLog(None, enabled=False)

    # === setup ===================================================================================
    def setup(self) -> None:
        """Each part once what it needs is there: the process and its plan, the data, the
        checkpoint (matched to the data's classes), the model and what trains it, the run dir."""
        self._set_up_process()
        self.train_loader, self.val_loader, self.num_classes = build_loaders(
            LoaderOptions.of(self.cfg), self.strategy.data_shard(), self.device, self.plan)
        resume_state = self._load_resume_state(self.num_classes)
        self._build_training()
        if resume_state:
            self._restore(resume_state)
        self.ema = self._build_ema(resume_state) if self.cfg.model_ema else None
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self._on_stop_signal)
        self._open_run_dir(resume_state)

    def _set_up_process(self) -> None:
        """The device, the run's plan (the world size is known from here on), the seed and
        --deterministic; an input size the model cannot take is refused before any data."""
        cfg, strategy = self.cfg, self.strategy
        self.device = strategy.setup_environment()
        too_small = input_size_refusal(cfg.arch, smallest_crop(AugmentOptions.of(cfg)))
        if too_small:
            raise UsageError(too_small)
        self.plan = plan_run(PlanOptions.of(cfg), strategy.world_size, self.device.type)
        strategy.follow(self.plan)
        self.precision = strategy.precision
        self.step_hooks = cfg.step_hooks(strategy.rank, strategy.world_size)
        self.seed = cfg.seed
        torch.manual_seed(self.seed)  # same initial weights on every rank
        if cfg.deterministic:
            make_deterministic()
        torch.backends.cudnn.benchmark = not cfg.deterministic

    def _build_training(self) -> None:
        """The model (converted, placed and wrapped by the strategy), its optimizer, the
        optimizer steps of an epoch, the schedule over them, the loss and the batch mixer."""
        cfg, strategy = self.cfg, self.strategy
        self.model = strategy.setup_module(build_model(cfg.arch, self.num_classes,
                                                       cfg.pretrained, cfg.zero_init_residual))
        self.optimizer = strategy.setup_optimizer(build_optimizer(
            OptimizerOptions.of(cfg), strategy.module, strategy.named_optimizer_params(),
            self.plan.lr))
        self.steps_per_epoch = len(self.train_loader) // self.plan.grad_accum
        if cfg.steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.steps_per_epoch)
        if self.steps_per_epoch == 0 and not cfg.evaluate:
            raise UsageError(f"the training set is too small for one step of global batch "
                             f"{self.plan.global_batch}: lower -b/--batch-size or --grad-accum")
        self.scheduler = build_scheduler(self.optimizer, ScheduleOptions.of(cfg),
                                         self.steps_per_epoch, self.plan.lr)
        self.criterion = build_criterion(LossOptions.of(cfg), self.num_classes)
        self.mixer = build_mixer(AugmentOptions.of(cfg), self.num_classes)

    def _load_resume_state(self, num_classes: int) -> Optional[dict]:
        strategy = self.strategy
        state = lifecycle.find_resume_state(self.cfg, self._run_prefix(),
                                            strategy.broadcast_object, strategy.is_main())
        if state is not None:
            lifecycle.check_resume_matches(state, arch=self.cfg.arch, num_classes=num_classes)
        return state

    def _build_ema(self, resume_state: Optional[dict]) -> Optional[ModelEMA]:
        """The moving average of the bare model's weights, continued from the checkpoint's if
        it has one."""
        decay = ema_decay_per_update(EmaOptions.of(self.cfg), self.plan.global_batch,
                                     self.cfg.epochs)
        ema = ModelEMA(self.strategy.module, decay, self.cfg.model_ema_steps)
        saved = (resume_state or {}).get("model_ema")
        if saved:
            ema.load_state_dict(saved)
        elif resume_state and self.cfg.evaluate:
            if self.strategy.is_main():
                console(f"note: {resume_state['path']} holds no EMA weights: evaluating the "
                        "model only")
            return None
        return ema

    def _restore(self, state: dict) -> None:
        self.strategy.load_module_state_dict(state["model"])
        if self.cfg.evaluate:
            # Named as the training run named them: an end-of-epoch checkpoint holds the epoch
            # to run next, its weights are those of the epoch before.
            self.epoch = max(0, state["epoch"] - (0 if state.get("epoch_step") else 1))
            self.step = state.get("step", 0)
            self.samples_seen = state.get("samples_seen", 0)
            return
        self.strategy.load_optimizer_state_dict(self.optimizer, state["optimizer"])
        self.precision.load_state_dict(state.get("precision", {}))
        self.epoch, self.step = state["epoch"], state["step"]
        # older checkpoints: counted in this run's global batch
        self.samples_seen = state.get("samples_seen", self.step * self.plan.global_batch)
        self.resume_epoch_step = lifecycle.resume_step_in_epoch(
            state, self.plan, self.steps_per_epoch, self.strategy.world_size)
        set_position(self.scheduler, self.epoch * self.steps_per_epoch + self.resume_epoch_step)
        self.best = summary.Best(state.get("best_top1", 0.0), state.get("best_epoch"))
        self.best_ema = summary.Best(state.get("best_ema_top1", 0.0), state.get("best_ema_epoch"))
        rng = state.get("rng", [])
        if len(rng) == self.strategy.world_size:
            checkpoint.set_rng_state(rng[self.strategy.rank], self.strategy.cuda_devices)
            self.train_loader.load_state_dict(rng[self.strategy.rank].get("data"))
        elif self.strategy.is_main():
            console(f"note: checkpoint has RNG states of {len(rng)} ranks, this run has "
                    f"{self.strategy.world_size}: RNG streams restart from --seed")

    def _run_prefix(self) -> str:
        return f"{self.entry}-{arch_slug(self.cfg.arch)}-"

    def _open_run_dir(self, resume_state: Optional[dict]) -> None:
        cfg, strategy = self.cfg, self.strategy
        self.run_dir = lifecycle.run_directory(cfg, self._run_prefix(), resume_state,
                                               strategy.broadcast_object,
                                               writes_checkpoints=not cfg.evaluate)
        # the records show the config as the plan resolved it (what earlier versions wrote)
        self.run_config = lifecycle.planned_config(cfg, self.plan)
        self.log = lifecycle.open_log(self.run_dir, self.run_config, strategy.is_main())
        lifecycle.write_run_record(
            self.log, self.run_config, self.entry, resume_state, **strategy.describe(),
            precision=self.precision.describe(), global_batch=self.plan.global_batch,
            lr=self.plan.lr, num_classes=self.num_classes, steps_per_epoch=self.steps_per_epoch,
            train_samples_per_rank=self.train_loader.num_samples, device=str(self.device))
        self.log.print(f"=> {self.entry}: {cfg.arch} on {strategy.world_size} process(es), "
                       f"device {self.device}, {self._precision_text()}, global batch "
                       f"{self.plan.global_batch}, lr {self.plan.lr:.4g}, seed {cfg.seed}; "
                       f"logging to {self.run_dir}")
        for line in scaling_note(cfg.config, cfg.lr, self.plan):
            self.log.print(f"=> {line}")
        # None for a tool's own Trainer (bench.bare_loop, bench.gpu)
        entry = ENTRIES.get(self.entry)
        visible = torch.cuda.device_count() if self.device.type == "cuda" else 0
        for line in gpu_hints(self.entry, entry.script, entry.distributed, self.device.type,
                              visible, strategy.local_world_size, self.precision.opt_level,
                              cfg.share_gpus) if entry else ():
            self.log.print(line)
        if not cfg.evaluate:
            for line in lr_warnings(OptimizerOptions.of(cfg), cfg.warmup_epochs,
                                    self.plan.global_batch, self.plan.lr):
                self.log.print(line)
        if resume_state and cfg.evaluate:
            self.log.print(f"=> evaluating {resume_state['path']}: the weights of epoch "
                           f"{self.epoch} (step {self.step})")
        elif resume_state:
            self.log.print(f"=> resumed from {resume_state['path']} at epoch {self.epoch}, "
                           f"step {self.step}")

    def _precision_text(self) -> str:
        described = self.precision.describe()
        scaling = described["loss_scaling"]
        return f"{described['opt_level']} {described['dtype']}" + (
            "" if scaling == "none" else f" with {scaling} loss scaling")

    @property
    def best_top1(self) -> float:
        return self.best.top1

    # === the loop ================================================================================
    def fit(self) -> None:
        if self.cfg.evaluate:
            self.validate()
            if self.ema is not None:
                self.validate_ema()
            if self.cfg.export_weights:  # the same on every rank: safe around a collective
                self.export_weights(self.strategy.module_state_dict())
            return
        reason = "finished"
        self.clock = RunClock(total=self.cfg.epochs * self.steps_per_epoch)
        self.clock.start(done=self.epoch * self.steps_per_epoch + self.resume_epoch_step)
        started, epochs_run, samples_at_start = time.perf_counter(), 0, self.samples_seen
        for self.epoch in range(self.epoch, self.cfg.epochs):
            epochs_run += 1
            train = self.train_one_epoch()
            val = self.validate()
            ema = self.validate_ema() if self.ema is not None else None
            is_best = self.best.offer(val["top1"], self.epoch)
            ema_is_best = ema is not None and self.best_ema.offer(ema["top1"], self.epoch)
            self.save_checkpoint(is_best, ema_is_best=ema_is_best)
            if self.strategy.is_main():
                summary.append_csv_row(self.run_dir, summary.csv_row(
                    self.epoch, self.optimizer.param_groups[0]["lr"], train, val, ema))
            if self.cfg.desired_acc is not None and val["top1"] >= self.cfg.desired_acc:
                reason = f"reached --desired-acc {self.cfg.desired_acc}"
                break
        self.finish(reason, epochs_run, time.perf_counter() - started,
                    self.samples_seen - samples_at_start)

    def finish(self, reason: str, epochs: int, seconds: float, samples: int) -> None:
        """The end record and the closing lines: the bests, the time, where the best model is
        and how to evaluate it."""
        best_path = self.run_dir / checkpoint.BEST
        entry = ENTRIES.get(self.entry)  # None for a tool's own Trainer
        evaluate = summary.evaluate_command(entry.launcher, entry.script, best_path,
                                            self.cfg.data, sys.argv[0]) if entry else None
        best_ema = self.best_ema if self.ema is not None else None
        lifecycle.write_end_record(
            self.log, self.epoch, self.step, self.best.top1, reason,
            samples_seen=self.samples_seen, best_epoch=self.best.epoch,
            **({"best_ema_top1": best_ema.top1, "best_ema_epoch": best_ema.epoch}
               if best_ema else {}),
            seconds=seconds, img_s=samples / seconds if seconds > 0 else None,
            best_model=str(best_path), evaluate_command=evaluate)
        for line in summary.closing_lines(reason, epochs, seconds, samples, self.best, best_ema,
                                          best_path, evaluate):
            self.log.print(line)
        if self.cfg.export_weights and self.strategy.is_main() and best_path.is_file():
            self.export_weights(checkpoint.load(best_path)["model"])

    def export_weights(self, model_state: dict) -> None:
        """--export-weights: the weights alone, for torchvision (the main rank writes)."""
        if self.cfg.export_weights and self.strategy.is_main():
            checkpoint.export_weights(model_state, Path(self.cfg.export_weights))
            self.log.print(f"=> weights exported to {self.cfg.export_weights} (load them with "
                           f"{load_command(self.cfg.arch, self.num_classes)})")

    def train_one_epoch(self) -> Dict[str, float]:
        """The epoch's optimizer steps (from where a mid-epoch checkpoint stopped): at each log
        interval the interval's record and a stop signal's checkpoint, every --checkpoint-every
        steps a checkpoint; then the epoch's record."""
        cfg = self.cfg
        self.model = self.strategy.train_model()
        start, self.resume_epoch_step = self.resume_epoch_step, 0
        self.train_loader.set_epoch(self.epoch, start_sample=start * self.plan.global_batch)
        interval = SumMeter(("loss", "correct1", "correct5"), self.device)
        # zeros, not empty: a resumed epoch may have no step left in this configuration
        epoch_sums = dict.fromkeys(("count", "loss", "correct1", "correct5"), 0.0)
        batches = iter(self.train_loader)
        watch, epoch_start, data_time = Stopwatch(self.device), time.perf_counter(), 0.0
        epoch_data_time = 0.0
        last_logged = start
        for epoch_step in range(start, self.steps_per_epoch):
            step_start = time.perf_counter()
            with self.graphs.during("train"):
                waited = self.train_step(batches, interval)
            data_time, epoch_data_time = data_time + waited, epoch_data_time + waited
            for hook in self.step_hooks:  # an experiment's (TrainConfig.step_hooks)
                hook(self.epoch, time.perf_counter() - step_start)
            done = epoch_step + 1
            if done % cfg.print_freq == 0 or done == self.steps_per_epoch:
                self._end_interval(interval, epoch_sums, done - last_logged, watch.lap(),
                                   data_time, done)
                last_logged, data_time = done, 0.0
            if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
                    and done < self.steps_per_epoch):
                self.save_checkpoint(False, epoch_step=done)
        return self._end_epoch(epoch_sums, time.perf_counter() - epoch_start, epoch_data_time)

    def _end_interval(self, interval: SumMeter, epoch_sums: dict, steps: int, seconds: float,
                      data_time: float, done: int) -> None:
        """A log interval's end (collectives: every rank calls this at the same step): its sums
        over the ranks join the epoch's, its record and line are written, and a stop signal
        that reached any rank ends the run here with a mid-epoch checkpoint."""
        sums = interval.reduce(self.strategy.all_reduce_sum)
        interval.reset()
        for k, v in sums.items():
            epoch_sums[k] = epoch_sums.get(k, 0.0) + v
        self._log_interval(sums, steps, seconds, data_time, done)
        if self._stop_requested_anywhere():
            self.save_checkpoint(False, epoch_step=done)
            raise Preempted(self.stop_signal)

    def _end_epoch(self, epoch_sums: dict, epoch_time: float,
                   epoch_data_time: float) -> Dict[str, float]:
        """The epoch's record and line, what the CPU decoded in the GPU decoder's place, and
        (once a run) how long the steps waited for data."""
        cfg, strategy = self.cfg, self.strategy
        stats = summarize(epoch_sums)
        img_s = stats["count"] / epoch_time
        decoded = self._cpu_decoded(self.train_loader)
        self.log.write("train_epoch", epoch=self.epoch, step=self.step,
                       samples_seen=self.samples_seen, **stats,
                       img_s=img_s, img_s_per_proc=img_s / strategy.world_size,
                       epoch_time=epoch_time, skipped=self._skipped(self.train_loader),
                       **decoded, **self.graphs.fields("train"))
        self.log.print(f" * Train epoch {self.epoch}: loss {stats['loss']:.4f}  "
                       f"top1 {stats['top1']:.3f}  top5 {stats['top5']:.3f}  {img_s:.1f} img/s "
                       f"({img_s / strategy.world_size:.1f}/proc)  {epoch_time:.1f}s")
        self._say_cpu_decoded(decoded, "training")
        if not self._data_wait_told:  # once, after the first epoch this run trains
            self._data_wait_told = True
            note = data_wait_note(epoch_data_time / max(epoch_time, 1e-9), cfg.backend,
                                  self.train_loader.workers,
                                  cores_per_process(strategy.local_world_size), self.device.type,
                                  cfg.gpu_decoder, decoded.get("cpu_decoded", 0))
            if note:
                self.log.print(note)
        return {**stats, "img_s": img_s, "epoch_time": epoch_time}

    def train_step(self, batches: Iterator, meter: SumMeter) -> float:
        """One optimizer step: --grad-accum micro-batches (gradient sync on the last only), the
        model's forward (in its precision) and the strategy's backward, the optimizer step and
        the schedule. Adds the micro-batches' loss and hits to `meter`; returns the seconds
        spent waiting for data."""
        strategy, accumulate = self.strategy, self.plan.grad_accum
        data_time = 0.0
        for micro in range(accumulate):
            t = time.perf_counter()
            images, targets = next(batches)
            data_time += time.perf_counter() - t
            # MixUp / CutMix: the loss sees soft targets; accuracy is scored on the labels.
            images, goal = self.mixer(images, targets) if self.mixer else (images, targets)
            with strategy.micro_step(last=micro == accumulate - 1):
                output = self.model(images)  # in the loss's dtype, whatever the model ran in
                loss = self.criterion(output, goal)
                strategy.backward(loss / accumulate)
            correct1, correct5 = correct_topk(output, targets)
            meter.add(len(targets), loss=loss * len(targets), correct1=correct1,
                      correct5=correct5)
        strategy.optimizer_step(self.optimizer)
        self.optimizer.zero_grad()
        self.scheduler.step()
        self.step += 1
        self.samples_seen += self.plan.global_batch
        if self.ema is not None:
            # torchvision's references restart the average throughout the lr warm-up.
            self.ema.update(strategy.module, dict(strategy.named_optimizer_params()), self.step,
                            restart=self.epoch < self.cfg.warmup_epochs)
        return data_time

    def _log_interval(self, sums: dict, steps: int, seconds: float, data_time: float,
                      done: int) -> None:
        stats = summarize(sums)
        img_s = stats["count"] / seconds
        step_time = seconds / steps
        lr = self.optimizer.param_groups[0]["lr"]
        epoch_eta = duration(step_time * (self.steps_per_epoch - done))
        run_eta = self.clock.eta(done=self.epoch * self.steps_per_epoch + done)
        decoded = self._cpu_decoded(self.train_loader, reasons=False)  # collective
        self.log.write("train", epoch=self.epoch, step=self.step, epoch_step=done,
                       samples_seen=self.samples_seen,
                       steps_per_epoch=self.steps_per_epoch, **stats, lr=lr, img_s=img_s,
                       img_s_per_proc=img_s / self.strategy.world_size,
                       data_time=data_time / steps, step_time=step_time,
                       loss_scale=self.precision.loss_scale(), **decoded)
        width = len(str(self.steps_per_epoch))
        self.log.print(
            f"Epoch [{self.epoch}][{done:>{width}}/{self.steps_per_epoch}]  "
            f"loss {stats['loss']:.4f}  top1 {stats['top1']:6.2f}  top5 {stats['top5']:6.2f}  "
            f"lr {lr:.4g}  img/s {img_s:.1f} ({img_s / self.strategy.world_size:.1f}/proc)  "
            f"data {data_time / steps:.3f}s  step {step_time:.3f}s  " + (
                f"cpu-decoded {decoded['cpu_decoded']}  " if decoded else "") +
            f"ETA epoch {epoch_eta}, run {run_eta}")

    def validate(self) -> Dict[str, float]:
        with self.graphs.during("val"):
            stats = evaluate(self.strategy.eval_model(), self.val_loader, self.device,
                             self.criterion, self.strategy.all_reduce_sum)
        decoded = self._cpu_decoded(self.val_loader)
        self.log.write("val", epoch=self.epoch, step=self.step,
                       samples_seen=self.samples_seen, **stats,
                       skipped=self._skipped(self.val_loader), **decoded,
                       **self.graphs.fields("val"))
        self.log.print(f" * Val epoch {self.epoch}: loss {stats['loss']:.4f}  "
                       f"top1 {stats['top1']:.3f}  top5 {stats['top5']:.3f}  "
                       f"({stats['count']} images, {stats['seconds']:.1f}s)" + (
                           "" if self.cfg.evaluate else
                           f"  best top1 {max(self.best_top1, stats['top1']):.3f}"))
        self._say_cpu_decoded(decoded, "validation")
        return stats

    def validate_ema(self) -> Dict[str, float]:
        """The moving average, scored like the model (it is not what `best` refers to), in its
        own precision: fp32 (float64 with --float64)."""
        stats = evaluate(self.strategy.eval_average(self.ema.module), self.val_loader,
                         self.device, self.criterion, self.strategy.all_reduce_sum)
        self.log.write("val_ema", epoch=self.epoch, step=self.step,
                       samples_seen=self.samples_seen, **stats)
        self.log.print(f" * Val epoch {self.epoch} EMA: loss {stats['loss']:.4f}  "
                       f"top1 {stats['top1']:.3f}  top5 {stats['top5']:.3f}")
        return stats

    def _sum_over_ranks(self, value: float) -> float:
        """One number summed over all ranks (collective: every rank must call it)."""
        box = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        return self.strategy.all_reduce_sum(box).item()

    def _skipped(self, loader) -> int:
        """Unreadable files met by all ranks in the loader's last pass (collective)."""
        return int(self._sum_over_ranks(loader.skipped))

    def _cpu_decoded(self, loader, reasons: bool = True) -> Dict[str, object]:
        """For a loader that decodes on the device (`fallbacks`: data/__init__.py): its images
        of this pass so far that torchvision decoded on the CPU instead, summed over the ranks,
        and with `reasons` their count per reason (collective). {} for the other loaders."""
        fallbacks = getattr(loader, "fallbacks", None)
        if fallbacks is None:
            return {}
        if not reasons:
            return {"cpu_decoded": int(self._sum_over_ranks(sum(fallbacks.values())))}
        every_rank = sum((Counter(ranks) for ranks in
                          self.strategy.gather_objects(dict(fallbacks))), Counter())
        return {"cpu_decoded": sum(every_rank.values()),
                "cpu_decoded_reasons": dict(every_rank.most_common())}

    def _say_cpu_decoded(self, decoded: Dict[str, object], split: str) -> None:
        """One line when images of the pass were decoded on the CPU, not by --gpu-decoder
        (`decoded`: _cpu_decoded's)."""
        if decoded.get("cpu_decoded"):
            why = "; ".join(f"{n} {reason}" for reason, n in
                            decoded["cpu_decoded_reasons"].items())
            self.log.print(f" * {decoded['cpu_decoded']} {split} images decoded on the CPU by "
                           f"torchvision, not by --gpu-decoder {self.cfg.gpu_decoder}: {why}")

    def _on_stop_signal(self, signum, frame) -> None:
        # Only a flag: the step in flight finishes, then every rank stops at the same step.
        self.stop_signal = signal.Signals(signum).name
        lifecycle.say_from_signal_handler(f"=> rank {self.strategy.rank}: {self.stop_signal} "
                                          "received; checkpointing at the next print interval")

    def _stop_requested_anywhere(self) -> bool:
        return self._sum_over_ranks(1.0 if self.stop_signal else 0.0) > 0

    def save_checkpoint(self, is_best: bool, epoch_step: Optional[int] = None,
                        ema_is_best: bool = False) -> None:
        """End-of-epoch checkpoint, or (with `epoch_step`) one taken inside the epoch;
        `is_best` / `ema_is_best` also copy it to model_best.pth / model_best_ema.pth."""
        # Every rank contributes its RNG state, so a resumed run continues every rank's stream,
        # the training loader's own (DALI's augmentation) included.
        rng = self.strategy.gather_objects({**checkpoint.rng_state(self.strategy.cuda_devices),
                                            "data": self.train_loader.state_dict()})
        start = time.perf_counter()
        # On every rank: a strategy whose state is sharded (FSDP) gathers it collectively.
        model_state = self.strategy.module_state_dict()
        optimizer_state = self.strategy.optimizer_state_dict(self.optimizer)
        failure = None
        if self.strategy.is_main():
            try:
                self._write_checkpoint(model_state, optimizer_state, rng, is_best, epoch_step,
                                       start, ema_is_best)
            except Exception as err:  # a full disk, and anything else that stops rank 0 here
                failure = err
        # Every rank learns how the write went: a rank that went on into the next collective
        # while rank 0 exits would wait there until --dist-timeout.
        error = self.strategy.broadcast_object(None if failure is None else str(failure))
        if failure is not None:
            raise failure
        if error is not None:
            raise checkpoint.CheckpointWriteError(f"rank 0 failed: {error}")

    def _write_checkpoint(self, model_state: dict, optimizer_state: dict, rng: list,
                          is_best: bool, epoch_step: Optional[int], start: float,
                          ema_is_best: bool) -> None:
        state = {
            "arch": self.cfg.arch, "num_classes": self.num_classes,
            "epoch": self.epoch + 1 if epoch_step is None else self.epoch,
            "epoch_step": epoch_step or 0,
            "epoch_samples": (epoch_step or 0) * self.plan.global_batch,
            "step": self.step, "samples_seen": self.samples_seen, "best_top1": self.best.top1,
            "best_epoch": self.best.epoch, "best_ema_top1": self.best_ema.top1,
            "best_ema_epoch": self.best_ema.epoch,
            "model": model_state, "optimizer": optimizer_state,
            "model_ema": self.ema.state_dict() if self.ema is not None else None,
            "precision": self.precision.state_dict(), "rng": rng,
            "world_size": self.strategy.world_size, "config": self.run_config.to_dict(),
        }
        keep = (epoch_step is None and self.cfg.save_every
                and (self.epoch + 1) % self.cfg.save_every == 0)
        path = checkpoint.save(state, self.run_dir, is_best, ema_is_best,
                               keep_as=f"checkpoint-epoch{self.epoch}.pth" if keep else None)
        self.log.write("checkpoint", epoch=self.epoch, step=self.step, path=str(path),
                       best=is_best, seconds=time.perf_counter() - start)

    def close(self, teardown: bool = True) -> None:
        """Flush the logs and stop loader workers; `teardown=False` after a peer failure,
        where leaving the process group would wait on the peer that is gone."""
        for loader in (getattr(self, "train_loader", None), getattr(self, "val_loader", None)):
            if loader is not None:
                loader.close()
        self.log.close()
        if not teardown:
            self.strategy.abandon()
        else:
            # The strategy frees the wrapper before leaving the group; nothing here may keep
            # it alive (under FSDP the optimizer's parameters hold the group's device mesh).
            self.model = self.optimizer = self.scheduler = self.ema = None
            self.strategy.teardown()


def run(strategy_class, entry: str, cfg: TrainConfig) -> None:
    """Set up, train, and turn bad input into exit 2, other failures into exit 1 with what the
    user can do about them. `entry` names the script in the registry (recipe/registry.py).
    Entry scripts reach it through imagenet_recipes.cli.main, which parsed `cfg`."""
    trainer = strategy = None
    try:
        strategy = strategy_class.build(StrategyOptions.of(cfg, strategy_class.sections()))
        trainer = Trainer(cfg, strategy, entry)
        trainer.setup()
        trainer.fit()
    except UsageError as err:
        if trainer is not None:
            trainer.close()
        exit_on_usage_error(err)
    except checkpoint.CheckpointWriteError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        trainer.close()
        sys.exit(lifecycle.EXIT_FAILED)
    except torch.OutOfMemoryError as err:
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        # the run's plan; an out-of-memory before it was made: -b and --grad-accum as given
        plan = getattr(trainer, "plan", None) or plan_as_given(PlanOptions.of(cfg),
                                                               strategy.world_size, "cuda")
        print("error: " + out_of_memory(first_line, plan.batch_size, plan.grad_accum,
                                         plan.global_batch, cfg.opt_level),
              file=sys.stderr, flush=True)
        if trainer is not None:
            trainer.close(teardown=False)  # the other ranks end by their own watch
        strategy.end_failed_process(lifecycle.EXIT_FAILED)
    except Preempted as stop:
        lifecycle.write_end_record(trainer.log, trainer.epoch, trainer.step,
                                   trainer.best_top1, f"preempted by {stop}",
                                   samples_seen=trainer.samples_seen)
        # Nobody leaves before rank 0 has written all of it: a launcher may kill the group as
        # soon as one rank exits (horovodrun does, after 5 s).
        trainer.strategy.barrier()
        trainer.log.print(lifecycle.preempted_message(entry, str(stop)))
        trainer.close()
        sys.exit(lifecycle.PREEMPTED_EXIT_CODE)
    except Exception as err:
        explanation = strategy.explain_failure(err) if strategy is not None else None
        if trainer is not None:
            trainer.close(teardown=False)  # peers learn of it by their own timeout
        if explanation is None:
            raise
        print(f"error: {explanation}", file=sys.stderr, flush=True)
        strategy.end_failed_process(lifecycle.EXIT_FAILED)
    except BaseException:  # KeyboardInterrupt, SystemExit
        if trainer is not None:
            trainer.close(teardown=False)
        raise
    # Leave the group together: a rank that closes its gloo connections while a peer still
    # has a collective in flight (its last checkpoint's) can take that peer down with an abort
    # ("terminate called without an active exception", seen under FSDP on a loaded machine).
    strategy.barrier()
    trainer.close()
