"""Run logging: rank 0 fans each record out to a JSONL file and to TensorBoard.

(Named `runlog`, not `logging`, so it never shadows the standard library module.)

JSONL schema: the one every run writes, the parameter server's included (plots, tables and
RESULTS.md read nothing else). One JSON object per line, always with `kind`, `time` (unix
seconds) and `elapsed` (seconds since the run started). Top-k values are percentages.
  kind="run"     first record (lifecycle.write_run_record): config (resolved), entry, strategy,
                 world_size, devices_per_process, backend, precision {opt_level, dtype,
                 loss_scaling}, global_batch, lr, num_classes, device, resumed_from, versions,
                 hardware, argv, commit (of this repository); process groups and Horovod add
                 sync_bn (--sync-bn's layer: SyncBatchNorm, CrossRankBatchNorm, or null);
                 the engine adds steps_per_epoch and train_samples_per_rank; the parameter
                 server adds mode, workers, servers, shard_sizes (parameters per server),
                 push_dtype and split
  kind="train"   every print interval: epoch, step (optimizer steps / server updates so far),
                 loss, top1, top5, count, lr, img_s (all processes), img_s_per_proc, data_time,
                 step_time; the engine adds epoch_step, steps_per_epoch and loss_scale, and
                 with --data-backend gpu cpu_decoded (the pass's images so far that torchvision
                 decoded on the CPU instead of the --gpu-decoder, all processes); the
                 parameter server adds mode and live_workers
  kind="train_epoch"  epoch, step, loss, top1, top5, count, img_s, img_s_per_proc, epoch_time,
                 skipped; with --data-backend gpu also cpu_decoded and cpu_decoded_reasons
                 ({reason: images}, all processes); with --compile compiled_graphs (the graphs
                 torch.compile made while this process trained, so far: 0 ran eagerly)
  kind="val"     epoch, step, loss, top1, top5, count, img_s, seconds, skipped (parameter
                 server: also train_elapsed, when the evaluated weights were taken; its
                 stand-alone evaluator: checkpoint); cpu_decoded, cpu_decoded_reasons and
                 compiled_graphs (made while it evaluated) as train_epoch's
  kind="val_ema"  with --model-ema: the moving average's validation, the fields of "val"
  kind="checkpoint"   epoch, step, path, best, seconds
  kind="end"     last record (lifecycle.write_end_record): epoch, step, best_top1, reason
                 ("finished", "preempted by SIGUSR1", "failed: ...", "reached --desired-acc
                 ..."); the engine adds, at a run's end, best_epoch, best_ema_top1 and
                 best_ema_epoch (with --model-ema), seconds and img_s (this invocation's
                 training), best_model and evaluate_command (recipe/summary.py); the parameter
                 server adds lost_workers
Parameter-server runs also write:
  kind="worker"  worker, step, samples, steps, compute_time, comm_time, wait_time, data_time,
                 seconds, bytes_pushed, bytes_pulled and their split by server
                 bytes_pushed_per_server, bytes_pulled_per_server (cumulative), loss_scale
                 (the newest), overflows (pushes the loss scaler skipped: sync, async),
                 local_steps (esync), staleness and staleness_max (async), over one print
                 interval
  kind="worker_lost"  worker, step, reason, live_workers
Records that TensorBoard shows also carry `samples_seen`: training samples of the whole run
so far (all processes), whatever the world size or batch.

TensorBoard (the same run dir), written from these records by `RunLog.write`:
  scalars  x-axis = samples_seen, so runs of any world size overlay. Tags (TB_SCALARS below):
           eval/loss, eval/top1, eval/top5, eval/img_s (validation; sorts first),
           eval_ema/loss, eval_ema/top1, eval_ema/top5 (the --model-ema average),
           train/... (each print interval, plus train/step, the optimizer step),
           train_epoch/... (each epoch), final/best_top1 (at the end), worker<N>/... (PS)
  text     run/config (listed as run/config/text_summary): the run record, config included,
           as JSON
  hparams  the resolved config (one session per run), with eval/top1, eval/loss and
           final/best_top1 as its metrics
"""
from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .machine import cpu_model, git_commit

# Which JSONL fields become TensorBoard scalars, per record kind, and under which tag prefix.
# TensorBoard sorts groups by name: validation is "eval" so that it comes first.
TB_SCALARS = {
    "val": ("eval", ("loss", "top1", "top5", "img_s")),
    "val_ema": ("eval_ema", ("loss", "top1", "top5")),
    "train": ("train", ("loss", "top1", "top5", "lr", "img_s", "img_s_per_proc", "data_time",
                        "step_time", "loss_scale", "step", "cpu_decoded")),
    "train_epoch": ("train_epoch", ("loss", "top1", "top5", "img_s", "epoch_time")),
    "end": ("final", ("best_top1",)),
    # parameter server: one tag prefix per worker (worker1/compute_time, ...)
    "worker": ("worker{worker}", ("compute_time", "comm_time", "wait_time", "bytes_pushed",
                                  "bytes_pulled", "local_steps", "staleness", "loss_scale")),
}


def environment_info() -> Dict[str, Any]:
    import torchvision

    info = {
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "torchvision": torchvision.__version__,
                     "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()},
        "hardware": {"host": platform.node(), "cpu": cpu_model(),
                     "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                     "gpus": [torch.cuda.get_device_name(i)
                              for i in range(torch.cuda.device_count())]},
        "argv": sys.argv,
        "commit": git_commit(),
    }
    return info


class RunLog:
    """Writes records on the main rank only; other ranks get a RunLog that does nothing."""

    def __init__(self, run_dir: Optional[Path], enabled: bool):
        self.enabled = enabled and run_dir is not None
        self.t0 = time.time()
        self._jsonl = None
        self._tb = None
        self._lock = threading.Lock()  # the parameter server logs from several threads
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(run_dir / "log.jsonl", "a", buffering=1)
            self._tb = SummaryWriter(log_dir=str(run_dir))

    def write(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            now = time.time()
            record = {"kind": kind, "time": now, "elapsed": now - self.t0, **fields}
            self._jsonl.write(json.dumps(record, default=str) + "\n")
            if kind == "run":
                self._describe_run(record)
            if kind in TB_SCALARS:
                prefix, names = TB_SCALARS[kind]
                prefix = prefix.format(**fields)
                for name in names:
                    if fields.get(name) is not None:
                        self._tb.add_scalar(f"{prefix}/{name}", fields[name],
                                            fields["samples_seen"], walltime=now)
            if kind == "end":
                self._tb.flush()

    def _describe_run(self, record: dict) -> None:
        """The run's config in TensorBoard: as text, and as an hparams session whose metrics
        are the eval and final scalars (the HPARAMS tab then compares runs side by side)."""
        from torch.utils.tensorboard.summary import hparams

        self._tb.add_text("run/config", "```\n" + json.dumps(record, indent=2, default=str)
                          + "\n```")
        config = {**record["config"], "entry": record["entry"],
                  "world_size": record.get("world_size"),
                  "global_batch": record.get("global_batch"),
                  **{f"precision.{k}": v for k, v in (record.get("precision") or {}).items()}}
        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                  for k, v in config.items()}
        metrics = dict.fromkeys(("eval/top1", "eval/loss", "final/best_top1"), 0.0)
        for summary in hparams(values, metrics):
            self._tb.file_writer.add_summary(summary)

    def restart_clock(self) -> None:
        """Count `elapsed` from now (the parameter server: from the moment all workers are in)."""
        self.t0 = time.time()

    def print(self, message: str) -> None:
        """A progress line on the main rank, timestamped (see `console`)."""
        if self.enabled:
            console(message)

    def close(self) -> None:
        with self._lock:
            if self.enabled:
                self._tb.close()
                self._jsonl.close()
                self.enabled = False


def console(message: str) -> None:
    """A line of the run's own output, timestamped: batch-system logs have no clock, and every
    line a run prints (progress, notes, the summary) reads the same way."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {message}", flush=True)
