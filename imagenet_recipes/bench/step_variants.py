"""One training step with one thing changed, timed in turns: where a gap between two training
loops goes. bench.gpu's `causes` group runs these on the GPU (ResNet-50 O1, batch 256).

Every variant is bench.bare_loop's hand-written step (the engine's math: autocast, a GradScaler
for float16, momentum SGD with the recipe's weight decay) on its own copy of the same model,
fed the same batches already on the device, and differs from `step-plain` (or, compiled, from
`step-compiled`) in one thing:

  step-no-scaler         no loss scaler: no scaled backward, no unscale pass over the
                         gradients, no overflow check read on the host before each update
  step-timm-work         no loss scaler and no weight decay: the work timm's benchmark.py
                         --bench train --amp times (autocast, momentum SGD, weight decay 0)
  step-ddp               torch's DistributedDataParallel in a world of one, its defaults: what
                         DDP itself costs in a step, with no peer (no launcher, no loader)
  step-ddp-bucket-view   DDP with gradient_as_bucket_view=True (what train/ddp.py uses)
  step-ddp-no-broadcast  DDP without the buffer broadcast before each forward
                         (broadcast_buffers=False; forward_sync_buffers=False in torch 2.15+)
  step-compiled*         the first two, torch.compile'd (step-compiled is the engine's
                         compiled math, as bench.gpu's bare-compile)

Not a variant: SGD(fused=True), whose kernel would take the unscale and the overflow skip off
the host. With a GradScaler it corrupts training: on a step the scaler skips (float16's first
steps usually overflow) it leaves the momentum buffers it has just allocated uninitialised,
and the next step uses them (torch 2.11-2.15; docs/precision.md).

Rounds go through every variant in turn, after a warm-up of each, so a drift in the machine's
speed hits all alike; img/s is the median over rounds. Variants doing the same math as their
reference report the largest weight difference from it at the end (0: the change is free of
math); those doing other work report none.
"""
from __future__ import annotations

import contextlib
import datetime
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional

# torch is imported where it is used: bench.gpu reads the variants' names before it imports it.


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    options: dict = field(default_factory=dict)  # BareLoop's keyword arguments
    same_math: bool = True  # its weights must match its reference's


NO_SCALER = {"loss_scaling": False}
TIMM_WORK = {"loss_scaling": False, "weight_decay": 0.0}
EAGER = (
    Variant("step-plain", "the engine's math, hand-written (reference)"),
    Variant("step-no-scaler", "no loss scaler", NO_SCALER, same_math=False),
    Variant("step-timm-work", "no loss scaler, no weight decay (timm's benchmark.py work)",
            TIMM_WORK, same_math=False),
    Variant("step-ddp", "torch DDP, world of one, its defaults", {"ddp": {}}),
    Variant("step-ddp-bucket-view", "DDP, gradient_as_bucket_view=True",
            {"ddp": {"gradient_as_bucket_view": True}}),
    Variant("step-ddp-no-broadcast", "DDP, no buffer broadcast before each forward",
            {"ddp": {"forward_sync_buffers": False}}),
)
COMPILED = (
    Variant("step-compiled", "the engine's math, torch.compile'd (reference)"),
    Variant("step-compiled-no-scaler", "compiled, no loss scaler", NO_SCALER,
            same_math=False),
    Variant("step-compiled-timm-work", "compiled, no loss scaler, no weight decay",
            TIMM_WORK, same_math=False),
)
SETS = {"eager": EAGER, "compiled": COMPILED}


@contextlib.contextmanager
def world_of_one(device):
    """A process group of this process alone (NCCL on a GPU, gloo on a CPU), for DDP."""
    import torch.distributed as dist

    from imagenet_recipes.strategies import free_port

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(minutes=5),
                            device_id=device if backend == "nccl" else None)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def measure(largs, trainer, variants, batches: list) -> List[dict]:
    """Each variant's img/s per round and its weight difference from the first variant (the
    reference) after the same steps. `largs`: bench.bare_loop's arguments (steps, warm-up,
    repeats); `trainer`: the Trainer whose model and precision the variants copy."""
    with contextlib.ExitStack() as stack:
        if any("ddp" in v.options for v in variants):
            stack.enter_context(world_of_one(trainer.device))
        return _measure(largs, trainer, variants, batches)


def _for_this_torch(options: dict) -> dict:
    """torch 2.15 renamed DDP's broadcast_buffers to forward_sync_buffers (the old name
    still works there, with a warning); torch before it knows only the old one."""
    import inspect

    import torch.nn as nn

    ddp = options.get("ddp")
    if ddp is None or "forward_sync_buffers" not in ddp or "forward_sync_buffers" in (
            inspect.signature(nn.parallel.DistributedDataParallel).parameters):
        return options
    ddp = dict(ddp, broadcast_buffers=ddp["forward_sync_buffers"])
    del ddp["forward_sync_buffers"]
    return dict(options, ddp=ddp)


def _measure(largs, trainer, variants, batches: list) -> List[dict]:
    from imagenet_recipes.bench import bare_loop as loop

    device = trainer.device
    # compiled when the trainer was set up with --compile (BareLoop follows its config)
    sides = {v.name: loop.BareLoop(trainer, **_for_this_torch(v.options)) for v in variants}
    if largs.warmup:
        for side in sides.values():
            side.train(batches[:largs.warmup])
    images = largs.steps * largs.batch_size
    rates: Dict[str, List[float]] = {name: [] for name in sides}
    print("round " + " ".join(f"{name:>24}" for name in sides), flush=True)
    for i in range(1, largs.repeats + 1):
        for name, side in sides.items():
            seconds = loop.timed(lambda: side.train(batches[:largs.steps]), device)
            rates[name].append(images / seconds)
        print(f"{i:>5} " + " ".join(f"{rates[n][-1]:>24.1f}" for n in sides), flush=True)
    reference = sides[variants[0].name].model
    results = []
    for v in variants:
        diff: Optional[float] = None
        if v.same_math and v is not variants[0]:
            diff = loop.max_weight_difference(reference, sides[v.name].model)
        results.append({"name": v.name, "what": v.what, "reference": variants[0].name
                        if v is not variants[0] else None,
                        "img_s": statistics.median(rates[v.name]), "repeats": rates[v.name],
                        "max_weight_diff": diff})
    return results
