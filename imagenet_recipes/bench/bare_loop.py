"""The engine's training step (Trainer.train_step) against a hand-written one, on the same
batches: what bench.gpu's `loop` and `compile` rows measure and the engine-overhead study
(lab/loop.py) records.

Both sides train the same model from identical weights on the same pre-built batches already on
the device, so the input pipeline is excluded from both and only the steps differ:

  engine  `Trainer.train_step`, the step the entry scripts run (Trainer built through
          parse_args + setup): the strategy's micro-step and backward, the precision plugin,
          `strategy.optimizer_step`, the LR scheduler and the metric sums (read once per round,
          as the epoch loop reads them once per print interval).
  bare    out = model(x); loss = F.cross_entropy(out, y); loss.backward(); opt.step();
          opt.zero_grad(set_to_none=True), with an SGD of the same hyper-parameters. For O1-O3
          it adds only what the same math needs: autocast (O1), half input (O2/O3), fp32 master
          weights (O2), and a GradScaler where the engine scales the loss (float16 O1/O2).

Rounds alternate bare, engine, bare, engine, ... after a warm-up of both, so slow drifts (other
jobs, clocks) hit both sides alike; the result is the median over rounds.

On CUDA each round also records each side's peak memory as if it ran alone: the most
`torch.cuda.max_memory_allocated` rose during the side's steps, plus what the side keeps between
steps (weights, buffers, fp32 masters, optimizer state) and one input batch. Both sides live in
one process, so the process-wide peak would count the other side's weights too.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from imagenet_recipes.bench.common import cpu_cores, cpu_name, gpu_name

from imagenet_recipes.config import parse_args
from imagenet_recipes.data import IMAGENET_MEAN, IMAGENET_STD
from imagenet_recipes.engine import Trainer
from imagenet_recipes.metrics import SumMeter
from imagenet_recipes.options import StrategyOptions
from imagenet_recipes.registry import OPT_LEVELS
from imagenet_recipes.strategies import Strategy


def parse_cli(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-a", "--arch", default="resnet18",
                   help="torchvision model (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=64,
                   help="square input size (default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=32,
                   help="batch size (default: %(default)s)")
    p.add_argument("--steps", type=int, default=20,
                   help="optimizer steps per side per round (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps per side before the first round (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=9,
                   help="timed rounds; the median over them is reported (default: %(default)s)")
    p.add_argument("--opt-level", default="O0", choices=OPT_LEVELS,
                   help="engine precision, mirrored by the bare loop (default: %(default)s)")
    p.add_argument("--amp-dtype", default="auto", choices=("auto", "float16", "bfloat16"),
                   help="half type of O1-O3, as the trainers take it (default: %(default)s)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: CUDA if present (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's own choice)")
    p.add_argument("--channels-last", action="store_true", help="channels_last model and batches")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both sides: the engine through its --compile flag, the "
                        "bare loop's copy of the model with torch.compile(model)")
    p.add_argument("--target", type=float, default=0.97,
                   help="ratio engine/bare the engine should reach (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    check_sizes(p, args)
    if args.threads is not None and args.threads <= 0:
        p.error("--threads must be positive")
    return args


def check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The measurement's sizes, as this tool and bench.gpu take them: positive, warm-up >= 0."""
    for name in ("image_size", "batch_size", "steps", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")


# --- the shared input ----------------------------------------------------------------------------
def make_batches(count: int, batch_size: int, image_size: int, num_classes: int,
                 device: torch.device, channels_last: bool) -> list:
    """`count` (images, targets) pairs on the device, shaped and normalised like the engine's
    loaders yield them (uint8 pixels -> ImageNet-normalised float32 NCHW, int64 targets)."""
    g = torch.Generator().manual_seed(1234)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    batches = []
    for _ in range(count):
        pixels = torch.randint(0, 256, (batch_size, 3, image_size, image_size),
                               dtype=torch.uint8, generator=g)
        images = ((pixels.float() - mean) / std).to(device).contiguous(memory_format=memory_format)
        targets = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
        batches.append((images, targets))
    return batches


# --- the two sides -------------------------------------------------------------------------------
def build_trainer(args: argparse.Namespace, logdir: str) -> Trainer:
    """A Trainer set up exactly as the entry scripts do it, on the synthetic backend."""
    argv = ["--dummy", "-a", args.arch, "--image-size", str(args.image_size),
            "-b", str(args.batch_size), "--opt-level", args.opt_level, "--device", args.device,
            "--amp-dtype", args.amp_dtype,
            "--logdir", logdir, "--run-name", "bench",
            # one epoch of this size is one timed round, so the scheduler sees the real length
            "--synthetic-train-size", str(args.batch_size * args.steps),
            "--synthetic-val-size", str(args.batch_size)]
    # explicit either way: unset, the engine picks channels_last on a CPU, the bare loop would not
    argv.append("--channels-last" if args.channels_last else "--no-channels-last")
    if getattr(args, "compile", False):
        argv.append("--compile")
    cfg = parse_args(argv)
    trainer = Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "bench")
    trainer.setup()
    return trainer


class BareLoop:
    """The training step a user writes by hand, on its own copy of the Trainer's model.

    By default it does the engine's math. bench.step_variants changes one thing at a time:
    `loss_scaling=False` drops the GradScaler, `weight_decay` replaces the recipe's, `ddp`
    wraps the model in torch's DistributedDataParallel with these options (a process group
    must exist). It is compiled when the trainer's config says --compile."""

    def __init__(self, trainer: Trainer, *, loss_scaling: bool = True,
                 weight_decay: Optional[float] = None, ddp: Optional[dict] = None):
        # Copied before the engine trains, so both sides start from identical weights.
        self.model = copy.deepcopy(trainer.strategy.module)
        precision, cfg = trainer.precision, trainer.cfg
        self.opt_level, self.half = precision.opt_level, precision.half
        params = list(self.model.parameters())
        self.master_pairs = []
        if self.opt_level == "O2":
            # fp32 masters of the half weights: what the optimizer updates (BatchNorm is fp32).
            self.master_pairs = [(p, p.detach().float().clone().requires_grad_(True))
                                 for p in params if p.dtype != torch.float32]
            master = {id(p): m for p, m in self.master_pairs}
            params = [master.get(id(p), p) for p in params]
        self.optimizer = torch.optim.SGD(
            params, lr=trainer.plan.lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay if weight_decay is None else weight_decay)
        scaled = (loss_scaling and self.half is torch.float16
                  and self.opt_level in ("O1", "O2"))
        self.scaler = torch.amp.GradScaler(trainer.device.type, enabled=scaled)
        self.device_type = trainer.device.type
        # What a user compiles: the module (inside DDP, as torch's DDP + compile guide has
        # it), after the masters above took its parameters (the compiled wrapper shares them).
        # `self.model` stays the plain module, as the engine's strategy.module does, so
        # weights compare module to module.
        self.forward = self.model
        if ddp is not None:
            device = trainer.device
            self.forward = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None,
                **ddp)
        if cfg.compile:
            self.forward = torch.compile(self.forward)

    def train(self, batches) -> None:
        self.model.train()
        step = self._plain_step if self.opt_level == "O0" else self._amp_step
        for x, y in batches:
            step(x, y)

    def _plain_step(self, x, y) -> None:
        out = self.forward(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _amp_step(self, x, y) -> None:
        autocast = (torch.autocast(self.device_type, dtype=self.half) if self.opt_level == "O1"
                    else contextlib.nullcontext())
        with autocast:
            out = self.forward(x.to(self.half) if self.opt_level in ("O2", "O3") else x)
        loss = F.cross_entropy(out.float(), y)
        self.scaler.scale(loss).backward()
        for p, m in self.master_pairs:
            m.grad, p.grad = p.grad.float(), None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.master_pairs:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in self.master_pairs],
                                     [m for _, m in self.master_pairs])
        self.optimizer.zero_grad(set_to_none=True)


# --- measuring -----------------------------------------------------------------------------------
def timed(fn, device: torch.device) -> float:
    """Seconds fn takes, with queued GPU work drained before and after (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def resident_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes a training loop keeps between steps: the module's parameters and buffers, the
    optimizer's parameters (fp32 masters under O2) and its state (momentum), each storage
    counted once."""
    tensors = [*module.parameters(), *module.buffers()]
    for group in optimizer.param_groups:
        tensors += group["params"]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    storages = {}
    for t in tensors:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def timed_side(fn, device: torch.device, keeps: int) -> tuple:
    """(seconds, peak bytes) of one side's round. The peak, on CUDA only (None elsewhere), is
    what the side would need alone: how far allocated memory rose above where it stood when the
    round began (activations, gradients, workspaces), plus `keeps`: the bytes the side holds
    between steps and one input batch."""
    if device.type != "cuda":
        return timed(fn, device), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    seconds = timed(fn, device)
    return seconds, torch.cuda.max_memory_allocated(device) - before + keeps


def run_engine_steps(trainer: Trainer, batches: list, steps: int) -> None:
    """`steps` engine train steps on `batches` (cycled), then the metric sums read once."""
    trainer.model.train()
    meter = SumMeter(("loss", "correct1", "correct5"), trainer.device)
    feed = itertools.cycle(batches)
    for _ in range(steps):
        trainer.train_step(feed, meter)
    meter.reduce(trainer.strategy.all_reduce_sum)


def max_weight_difference(a: nn.Module, b: nn.Module) -> float:
    """Largest |a - b| over parameters and buffers: ~0 when both sides did the same math."""
    diffs = [(x.double() - y.double()).abs().max().item()
             for x, y in zip(a.state_dict().values(), b.state_dict().values())
             if x.is_floating_point()]
    return max(diffs, default=0.0)


# --- reporting -----------------------------------------------------------------------------------
def hardware(device: torch.device) -> dict:
    return {"device": str(device), "gpu": gpu_name() if device.type == "cuda" else None,
            "cpu": cpu_name(), "cpu_cores": cpu_cores(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def print_header(args: argparse.Namespace, command: str, device: torch.device) -> dict:
    hw = hardware(device)
    print(f"hardware: {hw['gpu'] or 'CPU'} | cpu {hw['cpu']} ({hw['cpu_cores']} cores) | "
          f"torch {hw['torch']} ({hw['torch_threads']} threads)")
    print(f"command:  {command}")
    print(f"workload: {args.arch} {args.image_size}px, batch {args.batch_size}, "
          f"{args.opt_level} {args.amp_dtype}{', compiled' if args.compile else ''}, "
          f"{args.steps} steps/side/round, warm-up {args.warmup}")
    print(f"{'round':>6} {'engine img/s':>13} {'bare img/s':>11} {'engine/bare':>12}", flush=True)
    return hw


def print_row(label, r: dict) -> None:
    print(f"{label:>6} {r['engine_img_s']:>13.1f} {r['bare_img_s']:>11.1f} {r['ratio']:>11.3f}x",
          flush=True)


def measure(args: argparse.Namespace, trainer: Trainer, bare: BareLoop, batches: list) -> list:
    """Warm up both sides, then time `--repeats` rounds of bare then engine on the same batches."""
    device = trainer.device
    # Warm-up: allocator, cuDNN autotuning, oneDNN primitives, optimizer state.
    if args.warmup:
        bare.train(batches[:args.warmup])
        run_engine_steps(trainer, batches[:args.warmup], args.warmup)
    images = args.steps * args.batch_size
    # Measured after the warm-up, when the optimizers have made their state.
    batch_bytes = sum(t.untyped_storage().nbytes() for t in batches[0])
    engine_keeps = resident_bytes(trainer.strategy.module, trainer.optimizer) + batch_bytes
    bare_keeps = resident_bytes(bare.model, bare.optimizer) + batch_bytes
    rounds = []
    for i in range(1, args.repeats + 1):
        bare_s, bare_peak = timed_side(lambda: bare.train(batches[:args.steps]), device,
                                       bare_keeps)
        engine_s, engine_peak = timed_side(
            lambda: run_engine_steps(trainer, batches[:args.steps], args.steps), device,
            engine_keeps)
        rounds.append({"engine_img_s": images / engine_s, "bare_img_s": images / bare_s,
                       "ratio": bare_s / engine_s})
        if device.type == "cuda":
            rounds[-1].update(engine_peak_bytes=engine_peak, bare_peak_bytes=bare_peak)
        print_row(i, rounds[-1])
    return rounds
