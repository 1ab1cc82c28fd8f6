"""Run under `horovodrun -np 2 --gloo python tests/horovod_o2_probe.py OUT_DIR` by
tests/test_horovod.py: one O2 (bfloat16) step through HorovodStrategy, recording which gradients
Horovod's hooks started reducing DURING backward, and the masters after the step."""
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn

from imagenet_recipes.precision import Precision
from imagenet_recipes.strategies import HorovodStrategy


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    strategy = HorovodStrategy(Precision("O2", "bfloat16"), device="cpu")
    strategy.setup_environment()
    forward = strategy.setup_module(model)  # in its precision; `model` stays the bare one
    masters = dict(strategy.named_optimizer_params())
    optimizer = strategy.setup_optimizer(torch.optim.SGD(list(masters.values()), lr=0.5))
    g = torch.Generator().manual_seed(strategy.rank)  # each rank its own batch
    x, y = torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 4, (4,), generator=g)
    loss = nn.functional.cross_entropy(forward(x), y)
    strategy.precision.backward(loss)
    # Horovod's DistributedOptimizer keeps one entry per gradient whose all-reduce its hook
    # has started; right after backward, before synchronize, they are the ones overlapped.
    started = strategy.reducer._handles
    name_of = {p: n for n, p in model.named_parameters()}
    reduced_in_backward = sorted(name_of[p] for p, (handle, _) in started.items()
                                 if handle is not None)
    dtypes = sorted({str(p.grad.dtype) for p in started})
    strategy._reduce_gradients()
    strategy.precision.accumulate_grads()
    before = {n: m.detach().clone() for n, m in masters.items()}
    strategy.optimizer_step(optimizer)
    result = {
        "reduced_in_backward": reduced_in_backward, "grad_dtypes": dtypes,
        "parameters": sorted(n for n, _ in model.named_parameters()),
        "half_parameters": sorted(n for n, p in model.named_parameters()
                                  if p.dtype == torch.bfloat16),
        "master_dtypes": sorted({str(m.dtype) for m in masters.values()}),
        "masters_moved": all(not torch.equal(before[n], m) for n, m in masters.items()),
        "half_is_master_rounded": all(torch.equal(p, masters[n].to(p.dtype))
                                      for n, p in model.named_parameters()),
        "masters": {n: m.detach().tolist() for n, m in masters.items()},
    }
    (out_dir / f"rank{strategy.rank}.json").write_text(json.dumps(result))
    strategy.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
