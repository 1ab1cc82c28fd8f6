"""Run as an entry script is run, with a GPU made visible (`CUDA_VISIBLE_DEVICES=0 python
tests/worker_gpu_probe.py BACKEND DATA`): starts the loader workers' fork server as the entry
scripts do, builds BACKEND's loaders with two workers, trains on one batch, and prints, for
each live worker process, what its environment started with (`/proc/PID/environ`: what a
CUDA library reads), one line `worker PID CUDA_VISIBLE_DEVICES=VALUE TMPDIR=VALUE` (`unset`
when absent); then the trainer's own values, `trainer CUDA_VISIBLE_DEVICES=VALUE TMPDIR=VALUE`.
"""
import os
import sys
from pathlib import Path


def shown(env, name: str) -> str:
    return f"{name}={env.get(name, 'unset')}"


if __name__ == "__main__":
    import torch

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data import Shard, build_loaders
    from imagenet_recipes.options import LoaderOptions, PlanOptions
    from imagenet_recipes.run_plan import plan_run
    from imagenet_recipes.data.loader_server import start_loader_server

    backend, data = sys.argv[1], sys.argv[2]
    cfg = parse_args(["-a", "timm/test_resnet", "--image-size", "32", "-b", "4", "-j", "2",
                      "--data-backend", backend, data], entry="nd")
    start_loader_server(cfg)
    train, val, _ = build_loaders(LoaderOptions.of(cfg), Shard(), torch.device("cpu"),
                                  plan_run(PlanOptions.of(cfg), 1, "cpu"))
    train.set_epoch(0)
    batches = iter(train)
    next(batches)
    for worker in train.loader._iterator._workers:
        env = dict(entry.split("=", 1) for entry in
                   Path(f"/proc/{worker.pid}/environ").read_text().split("\0") if "=" in entry)
        print(f"worker {worker.pid} {shown(env, 'CUDA_VISIBLE_DEVICES')} {shown(env, 'TMPDIR')}",
              flush=True)
    print(f"trainer {shown(os.environ, 'CUDA_VISIBLE_DEVICES')} {shown(os.environ, 'TMPDIR')}",
          flush=True)
    del batches
    train.close()
    val.close()
