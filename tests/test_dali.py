"""The DALI backend on CPU (DALI's CPU-only mode): real pipelines, real multi-process runs."""
from __future__ import annotations

import os
import shutil
import sys
import threading
from collections import Counter

import pytest
import torch

from conftest import (TINY, add_damaged_files, assert_resume_is_exact, loaders_for, records,
                      run_forked)

pytest.importorskip("nvidia.dali", reason="DALI is in requirements.txt; this env lacks it")

from imagenet_recipes.config import UsageError, parse_args  # noqa: E402
from imagenet_recipes.data import Shard  # noqa: E402

CPU = torch.device("cpu")


def _rank(rank: int, world: int) -> Shard:
    """One rank of a world, as the loaders see it (no collectives: gathering the damaged-file
    lists is the only one, and this test data has no damaged file)."""
    return Shard(rank=rank, world_size=world, is_main=rank == 0)


def _cfg(data, backend="dali-cpu", *extra):
    return parse_args(["-b", "6", "--image-size", "32", "-j", "1", "--data-backend", backend,
                       *map(str, extra), str(data)])


@pytest.fixture
def loaders():
    """build_loaders for one test, whose loaders are closed when it ends, failed or not:
    DALI's pipelines live for the whole run, and a later test forking DataLoader workers
    while DALI's threads hold locks can hang the child."""
    built = []

    def build(cfg, shard):
        train, val, classes = loaders_for(cfg, shard, CPU)
        built.extend((train, val))
        return train, val, classes
    yield build
    for loader in built:
        loader.close()


@pytest.mark.slow
def test_dali_cpu_ddp_trains_for_real(tiny_imagefolder, tmp_path):
    run_forked("ddp.py", TINY + ["-b", "8", "--epochs", "3", "--lr", "0.4", "--data-backend",
                                 "dali-cpu", "--logdir", tmp_path, "--run-name", "dali",
                                 tiny_imagefolder], nproc=2)
    epochs = records(tmp_path / "dali", "train_epoch")
    assert [e["count"] for e in epochs] == [64, 64, 64]  # 2 ranks x 4 steps x 8, every epoch
    assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"]  # it learns
    assert [v["count"] for v in records(tmp_path / "dali", "val")] == [20, 20, 20]
    run = records(tmp_path / "dali", "run")[0]
    assert run["config"]["data_backend"] == "dali-cpu" and run["world_size"] == 2


def test_dali_shards_are_disjoint_and_cover_the_train_set(tiny_imagefolder, loaders):
    """Each rank's DALI pipeline reads its own files (global rank), the shards partition the
    train set, every listed file comes out of DALI, and labels match the ImageFolder's."""
    shards, delivered = [], []
    for rank in range(2):
        train, _, _ = loaders(_cfg(tiny_imagefolder, "dali-cpu", "-b", 8), _rank(rank, 2))
        train.set_epoch(1)
        files, labels = train.files_for_pass()
        shards.append(files)
        batches = list(train)
        assert len(batches) == len(train) == 4
        delivered.append(Counter(t for _, targets in batches for t in targets.tolist()))
        assert delivered[-1] == Counter(labels)  # what DALI read is what this rank was given
    assert not set(shards[0]) & set(shards[1])
    all_files = {str(p) for p in (tiny_imagefolder / "train").rglob("*.JPEG")}
    assert set(shards[0]) | set(shards[1]) == all_files
    # labels follow ImageFolder's sorted class folders: class i has 16 images
    assert delivered[0] + delivered[1] == Counter({c: 16 for c in range(4)})


def test_dali_by_class_split_reads_only_the_workers_classes(tiny_imagefolder, loaders):
    """A parameter-server worker with --split by-class: DALI reads its classes, all of them."""
    from imagenet_recipes.ps.worker import worker_shard
    for index in range(2):
        train, _, _ = loaders(_cfg(tiny_imagefolder, "dali-cpu", "-b", 8),
                              worker_shard(index, 2, "by-class"))
        train.set_epoch(0)
        _, labels = train.files_for_pass()
        assert Counter(labels) == Counter({c: 16 for c in range(4) if c % 2 == index})
        delivered = Counter(t for _, targets in train for t in targets.tolist())
        assert delivered == Counter(labels)  # 32 images: 4 full batches of 8


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True])
def test_dali_and_pytorch_batches_match(tiny_imagefolder, channels_last, loaders):
    """Same contract from both backends: float32 NCHW normalised on the device (channels_last
    when asked), int64 targets, the same images in the same order."""
    extra = ["--channels-last" if channels_last else "--no-channels-last"]
    out = {}
    for backend in ("pytorch", "dali-cpu"):
        _, val, _ = loaders(_cfg(tiny_imagefolder, backend, *extra), _rank(0, 1))
        out[backend] = list(val)
    assert [len(b[1]) for b in out["pytorch"]] == [len(b[1]) for b in out["dali-cpu"]]
    for (img_pt, tgt_pt), (img_dali, tgt_dali) in zip(out["pytorch"], out["dali-cpu"]):
        assert img_dali.dtype == img_pt.dtype == torch.float32
        assert img_dali.shape == img_pt.shape == (len(tgt_pt), 3, 32, 32)
        assert img_dali.device == img_pt.device
        assert img_dali.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert tgt_dali.dtype == torch.int64 and torch.equal(tgt_dali, tgt_pt)
        assert -2.2 < img_dali.min() and img_dali.max() < 2.7  # ImageNet-normalised range
        # The two resize implementations differ pixel by pixel on these tiny noisy images, but
        # each image's channel means agree within ~0.05 (a swapped channel order or a missing
        # normalisation would be off by 1.5-2), and the pixels correlate.
        means_pt, means_dali = img_pt.mean((2, 3)), img_dali.mean((2, 3))
        assert (means_dali - means_pt).abs().max() < 0.15
        assert torch.corrcoef(torch.stack([img_dali.flatten(), img_pt.flatten()]))[0, 1] > 0.7


@pytest.mark.slow
def test_dali_cpu_left_out_damaged_files_are_counted(tiny_imagefolder, tmp_path):
    """DALI cannot skip a bad file mid-pipeline, so truncated, empty and non-image files are
    left out before it starts and counted; CMYK, grayscale and PNG-named-.JPEG files train."""
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    train_damaged = add_damaged_files(sorted((data / "train").iterdir())[0])
    val_damaged = add_damaged_files(sorted((data / "val").iterdir())[3])
    proc = run_forked("ddp.py", TINY + ["-b", "6", "--epochs", "1", "--data-backend",
                                        "dali-cpu", "--logdir", tmp_path, "--run-name", "bad",
                                        data], nproc=2)
    assert "3 file(s)" in proc.stdout and "are left out" in proc.stdout
    assert sum(train_damaged.values()) == 3  # 67 readable -> 34 per rank -> 5 steps of 6
    epoch = records(tmp_path / "bad", "train_epoch")[0]
    assert epoch["skipped"] == 3 and epoch["count"] == 2 * 5 * 6
    val = records(tmp_path / "bad", "val")[0]
    assert val["count"] == 20 + sum(val_damaged.values()) and val["skipped"] == 3


def test_dali_missing_names_the_package(tiny_imagefolder, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # `import nvidia.dali` now fails
    with pytest.raises(UsageError, match="pip install nvidia-dali-cuda130"):
        loaders_for(_cfg(tiny_imagefolder), _rank(0, 1), CPU)


def test_dali_gpu_without_a_gpu_suggests_dali_cpu(tiny_imagefolder):
    with pytest.raises(UsageError, match="use --data-backend dali-cpu"):
        loaders_for(_cfg(tiny_imagefolder, "dali-gpu"), _rank(0, 1), CPU)


@pytest.fixture
def builds(monkeypatch) -> Counter:
    """DALI pipelines built during the test, counted per split ("train", "val")."""
    from imagenet_recipes.data import dali

    counted, real = Counter(), dali.DaliLoader.pipeline

    def pipeline(self):
        counted["train" if self.train else "val"] += 1
        return real(self)
    monkeypatch.setattr(dali.DaliLoader, "pipeline", pipeline)
    return counted


def _pass_labels(loader, batches=None):
    """The labels a pass delivers, in order: its first `batches` batches taken the way the
    engine takes them (exactly that many next() calls), or the whole pass in a for loop."""
    if batches is None:
        return [t for _, targets in loader for t in targets.tolist()]
    it = iter(loader)
    return [t for _ in range(batches) for t in next(it)[1].tolist()]


def test_dali_pipeline_lives_across_epochs_and_reads_each_epochs_order(tiny_imagefolder,
                                                                       builds, loaders):
    """One pipeline per split for the whole run, fed the shared sampler's order of every epoch,
    a resumed epoch's remainder, and a new pass after one left unfinished."""
    train, val, _ = loaders(_cfg(tiny_imagefolder, "dali-cpu", "-b", 8), _rank(0, 1))
    orders = []
    for epoch in range(3):
        train.set_epoch(epoch)
        expected = train.files_for_pass()[1]
        # as the engine does (8 next() calls), then as a for loop does
        orders.append(_pass_labels(train, batches=len(train) if epoch < 2 else None))
        assert orders[-1] == expected[:len(train) * 8]  # the sampler's order, full batches
        assert _pass_labels(val) == [label for label in range(4) for _ in range(5)]
    assert len({tuple(order) for order in orders}) == 3  # each epoch its own order
    assert builds == {"train": 1, "val": 1}

    train.set_epoch(1, start_sample=24)  # a resumed epoch: 3 of its 8 batches done
    assert _pass_labels(train) == orders[1][24:]
    assert builds == {"train": 1, "val": 1}

    train.set_epoch(3)
    assert len(_pass_labels(train, batches=2)) == 16  # a pass left unfinished ...
    train.set_epoch(4)
    assert _pass_labels(train) == train.files_for_pass()[1]  # ... does not leak into the next


@pytest.mark.slow
def test_dali_resume_is_bit_exact(tiny_imagefolder, tmp_path):
    """The pipeline's random state (crops, flips) goes into the checkpoint, one per rank, so a
    resumed DALI run draws the augmentations the uninterrupted one draws."""
    assert_resume_is_exact(lambda argv: run_forked("ddp.py", argv, nproc=2),
                           TINY + ["-b", "8", "--data-backend", "dali-cpu"], tiny_imagefolder,
                           tmp_path)


@pytest.mark.parametrize("extra,batches", [(["--grad-accum", "3"], 6),
                                           (["--grad-accum", "3", "--steps-per-epoch", "1"], 3),
                                           (["--steps-per-epoch", "5"], 5)])
def test_dali_training_pass_is_what_the_engines_steps_take(tiny_imagefolder, builds,
                                                           loaders, extra, batches):
    """8 full batches per epoch here; the engine takes whole --grad-accum steps, at most
    --steps-per-epoch of them: a pass is exactly that, so it ends and the pipeline lives on
    (also inside a resumed epoch)."""
    train, _, _ = loaders(_cfg(tiny_imagefolder, "dali-cpu", "-b", 8, *extra), _rank(0, 1))
    assert len(train) == batches
    for epoch in range(2):
        train.set_epoch(epoch)
        assert len(_pass_labels(train, batches=batches)) == 8 * batches
    train.set_epoch(2, start_sample=8)  # one micro-batch of it done
    assert len(train) == batches - 1
    assert _pass_labels(train, batches=batches - 1) == train.files_for_pass()[1][:8 * (batches - 1)]
    assert builds["train"] == 1


def test_dali_pipelines_build_without_dalis_external_source_checkpoint_warning(
        tiny_imagefolder, loaders):
    """DALI warns, when it builds a checkpointing pipeline, that it cannot checkpoint an
    external source; the sampler restores that position, so users must not see the warning in
    every run."""
    import warnings

    train, val, _ = loaders(_cfg(tiny_imagefolder), _rank(0, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _pass_labels(train) and _pass_labels(val)  # both pipelines built and run
    assert not [w for w in caught if "Checkpointing enabled" in str(w.message)], caught


# Python's audit hooks cannot be removed: one, installed once, records `open` events while a
# test watches (a list), and does nothing otherwise.
_opened: list = []
_watching = [False]


def _record_open(event, args):
    if _watching[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append((os.fsdecode(args[0]), threading.get_ident()))


sys.addaudithook(_record_open)


def _bytes_read_by_this_thread() -> int:
    """Bytes this thread has read with read(2)-like calls so far (Linux: /proc/thread-self/io);
    it counts reads from C code too, which no Python hook sees."""
    with open("/proc/thread-self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_dali_reads_the_files_in_its_own_threads_not_in_the_one_calling_next(tiny_imagefolder,
                                                                             loaders):
    """The engine's thread only asks for batches: the files of a pass (256 per step at batch
    256) are opened and read by DALI's worker threads, so the reads are not on the training
    step's critical path. Checked on a warm pipeline, for a training and a validation pass."""
    if not os.path.exists("/proc/thread-self/io"):
        pytest.skip("needs Linux's per-thread I/O counters")
    train, val, _ = loaders(_cfg(tiny_imagefolder, "dali-cpu", "-b", 8), _rank(0, 1))
    train.set_epoch(0)
    assert _pass_labels(train) and _pass_labels(val)  # pipelines built and warm
    root = str(tiny_imagefolder)
    for epoch, loader in ((1, train), (1, val)):
        loader.set_epoch(epoch)
        files, labels = loader.files_for_pass()
        size = sum(os.path.getsize(f) for f in files)
        _opened.clear()
        _watching[0] = True
        before = _bytes_read_by_this_thread()
        try:
            delivered = _pass_labels(loader)
        finally:
            _watching[0] = False
        read_here = _bytes_read_by_this_thread() - before
        assert delivered == labels[:len(delivered)] and len(delivered) >= 0.9 * len(labels)
        here = [path for path, thread in _opened
                if path.startswith(root) and thread == threading.get_ident()]
        assert not here, f"{len(here)} image files opened in the thread calling next(), " \
                         f"e.g. {here[0]}"
        # The pass's files hold `size` bytes; the calling thread reads (almost) none of them.
        assert read_here < 0.1 * size, (read_here, size)
