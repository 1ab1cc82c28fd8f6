"""Data loaders behind one factory: `build_loaders(options, shard, device, plan)`.

    sampling.py   Shard (what a loader knows of its process) and ShardedSampler (which samples,
                  in which order: the same global order for any number of processes)
    folders.py    the train/ and val/ ImageFolder trees, read as uint8
    augment.py    the pytorch backend's transforms (crop, flip, auto-augment, erasing) and the
                  crop sizes every backend shares
    pytorch.py    --data-backend pytorch: torchvision decoding in DataLoader workers
    gpu_decode.py --data-backend gpu: DataLoader workers read the files' bytes; TorchCodec
                  decodes each batch in the training process (nvJPEG on a GPU), one roi_align
                  crops and resizes it on the device
    loading.py    what those two share: the workers' guard and count, normalisation
    loader_server.py, worker_server.py
                  the fork server their workers start from (started by the CLI, early)
    synthetic.py  --data-backend synthetic / --dummy: one random batch on the device
    dali.py       --data-backend dali-cpu | dali-gpu: NVIDIA DALI pipelines

Every backend yields the same thing to the engine: `(images, targets)` already on the device,
images as normalised float32 NCHW (channels_last when asked), targets as int64; and every loader
has `set_epoch(epoch, start_sample)` (start_sample: global samples of the epoch already done),
`len()`, `num_samples` (this rank's share), `skipped` (unreadable files met in the last pass),
`fallbacks` (where a backend decodes on the device: a Counter of this pass's images decoded on
the CPU instead, by reason; absent elsewhere),
`workers` (what -j gave it: loader processes, DALI threads; 0 for synthetic data),
`state_dict()` / `load_state_dict()` (this rank's augmentation random state where the sampler's
position alone does not restore it, else None; the engine keeps one per rank in the
checkpoint) and `close()`. Which module builds which backend, and what each one does (where it
decodes, whether it starts worker processes), is declared once, in
`imagenet_recipes.registry.DATA_BACKENDS`.
"""
from __future__ import annotations

import importlib

from ..options import LoaderOptions
from ..registry import DATA_BACKENDS

# Names the package offers, from the module that defines them. They are imported on first use
# (PEP 562), so that importing `data.loader_server` from the CLI does not import torch.
_EXPORTS = {
    "IMAGENET_MEAN": "augment", "IMAGENET_STD": "augment", "val_resize_size": "augment",
    "read_image_uint8": "folders",
    "Shard": "sampling", "ShardedSampler": "sampling", "sample_seed": "sampling",
}
__all__ = sorted(_EXPORTS) + ["build_loaders"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def build_loaders(options: LoaderOptions, shard, device, plan):
    """-> (train_loader, val_loader, num_classes); loaders yield (images, targets) on device.
    `options`: what the backends read of the run's options (`LoaderOptions.of(cfg)`); `plan`:
    the run's run_plan.RunPlan, whose images per forward pass, micro-batches per step and memory
    layout the loaders follow.

    A backend's module is imported only when chosen (DALI is an optional dependency)."""
    backend = importlib.import_module(DATA_BACKENDS[options.backend].path)
    return backend.build(options, shard, device, plan)
