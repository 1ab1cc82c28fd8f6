"""In-process unit tests of the shared modules (config, sampling, schedule, models).
Precision has its own file, tests/test_precision.py."""
from __future__ import annotations

import os
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import torchvision

from imagenet_recipes.config import UsageError, parse_args
from imagenet_recipes.data import ShardedSampler, val_resize_size
from imagenet_recipes.data.loader_server import WORKER_BACKENDS
from imagenet_recipes.options import PlanOptions
from imagenet_recipes.run_plan import plan_run
from imagenet_recipes.schedule import LrMultiplier, scaled_lr


# --- config --------------------------------------------------------------------------------------
def test_pytorch_examples_flags_parse():
    cfg = parse_args(["-a", "resnet18", "-b", "64", "-j", "3", "--lr", "0.2", "--momentum", "0.8",
                      "--wd", "5e-5", "--epochs", "7", "--start-epoch", "2", "-p", "5", "-e",
                      "--seed", "11", "--resume", "x.pth", "/data/imagenet"])
    assert (cfg.arch, cfg.batch_size, cfg.workers, cfg.lr, cfg.momentum) == ("resnet18", 64, 3, 0.2, 0.8)
    assert (cfg.weight_decay, cfg.epochs, cfg.start_epoch, cfg.print_freq) == (5e-5, 7, 2, 5)
    assert cfg.evaluate and cfg.seed == 11 and cfg.resume == "x.pth" and cfg.data == "/data/imagenet"


def test_entry_defaults_and_torch_launch_compat():
    cfg = parse_args(["--dummy", "--local-rank=3"], defaults={"opt_level": "O1"})
    assert cfg.opt_level == "O1" and cfg.backend == "synthetic"


def test_config_saves_as_json(tmp_path):
    import json
    cfg = parse_args(["--dummy", "--lr-steps", "2", "4"])
    cfg.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["lr_steps"] == [2, 4]


@pytest.mark.parametrize("argv,device,expected", [
    ([], "cpu", True),                                   # oneDNN's faster layout at 224 px
    (["--image-size", "64"], "cpu", False),              # ... but not at small crops
    (["--image-size", "112"], "cpu", True),
    (["--image-size", "96", "--progressive-resize", "96", "160", "0", "2"], "cpu", True),
    (["--progressive-resize", "64", "96", "0", "2"], "cpu", False),  # 224 px unused then
    (["--image-size", "64", "--opt-level", "O1"], "cuda", True),   # a GPU: any size
    ([], "cuda", False),                                 # fp32 on a GPU keeps NCHW
    (["--opt-level", "O1"], "cuda", True),               # tensor cores with a half type
    (["--float64"], "cpu", False),
    (["--no-channels-last"], "cpu", False),              # an explicit choice is kept
    (["--channels-last"], "cuda", True),
])
def test_channels_last_unset_is_decided_by_the_device_and_crop(argv, device, expected):
    cfg = parse_args(["--dummy", *argv])
    as_given = cfg.channels_last
    assert plan_run(PlanOptions.of(cfg), 1, device).channels_last is expected
    assert cfg.channels_last is as_given  # planned, not written into the config


@pytest.mark.slow
def test_the_cli_reads_the_command_line_without_importing_torch():
    """imagenet_recipes.cli starts the loader workers' fork server before torch is imported: the
    two imports overlap only while the CLI itself stays free of torch."""
    import subprocess
    import sys
    probe = ("import sys; from imagenet_recipes import cli; "
             "from imagenet_recipes.data.loader_server import uses_loader_workers; "
             "parse = lambda argv: cli.parse_args(argv, entry='nd'); "
             "print(uses_loader_workers(parse(['-j', '2', 'data'])), "
             "uses_loader_workers(parse(['--dummy'])), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out == ["True", "False", "False"]


@pytest.mark.slow
def test_loader_workers_start_with_the_engine_and_torchvision_imported_when_run_directly():
    """`python train/x.py` as the README shows it, with no PYTHONPATH: the loader workers' fork
    server still imports the engine's data modules, torch and torchvision once, so a worker
    forked from it does not import them anew at every start."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(repo / "tests/loader_server_probe.py")], env=env,
                         capture_output=True, text=True, check=True, cwd=repo, timeout=300)
    assert out.stdout.split("\n")[:3] == ["imagenet_recipes.data.pytorch yes", "torch yes",
                                          "torchvision yes"], out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(WORKER_BACKENDS))
def test_loader_workers_start_with_no_gpu_visible(backend, tiny_imagefolder):
    """Every backend whose loader runs worker processes: with a GPU visible to the trainer (as
    SLURM or torchrun leave CUDA_VISIBLE_DEVICES), its workers start with none, so no library
    they load (nvImageCodec's nvJPEG extension opens a CUDA context by itself) can take GPU
    memory in each of them; the trainer keeps its own."""
    import subprocess
    import sys

    if backend == "gpu":  # its default decoder (the oldest stack's smoke test has none)
        pytest.importorskip("torchcodec", reason="requirements.txt has it; this stack lacks it")
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(repo / "tests/worker_gpu_probe.py"), backend,
                          str(tiny_imagefolder)], env={**env, "CUDA_VISIBLE_DEVICES": "0"},
                         capture_output=True, text=True, cwd=repo, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    workers = [line.split()[2] for line in out.stdout.splitlines() if line.startswith("worker")]
    assert workers == ["CUDA_VISIBLE_DEVICES="] * 2, out.stdout
    assert "trainer CUDA_VISIBLE_DEVICES=0" in out.stdout


@pytest.mark.slow
def test_loader_workers_run_under_a_temporary_directory_too_long_for_sockets(
        tiny_imagefolder, tmp_path):
    """A socket's path holds at most 107 bytes, and multiprocessing puts its sockets (the fork
    server's, and each worker's, through which a batch's shared memory is handed over) 33 bytes
    deep in the temporary directory: a TMPDIR of 75 bytes or more (a scheduler's per-job
    folder, pytest's) failed every loader with workers ("AF_UNIX path too long"). The workers
    and their server run under a short one; the trainer keeps its own."""
    import subprocess
    import sys

    long_tmp = tmp_path / ("t" * max(1, 100 - len(str(tmp_path))))
    long_tmp.mkdir()
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(repo / "tests/worker_gpu_probe.py"), "pytorch",
                          str(tiny_imagefolder)], env={**env, "TMPDIR": str(long_tmp)},
                         capture_output=True, text=True, cwd=repo, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    workers = [line.split()[3] for line in out.stdout.splitlines() if line.startswith("worker")]
    assert len(workers) == 2 and all(len(tmp) - len("TMPDIR=") + 33 <= 107 for tmp in workers), \
        out.stdout
    assert f"TMPDIR={long_tmp}" in out.stdout.splitlines()[-1]


@pytest.mark.parametrize("argv,message", [
    (["--dummy", "--loss-scale", "abc"], "--loss-scale"),
    (["--dummy", "--warmup-epochs", "200"], "--warmup-epochs"),
    (["--dummy", "--grad-accum", "0"], "--grad-accum"),
    (["--dummy", "--start-epoch", "90"], "--start-epoch"),
    (["--dummy", "--master-weights"], "apex-only"),
    (["--dummy", "--compile", "--sync-bn"], "pytorch#107372"),
])
def test_config_rejects(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


# --- sampling ------------------------------------------------------------------------------------
def test_train_shards_rebuild_the_global_batches():
    """Union over ranks of each rank's k-th batch == the k-th batch of a 1-process run."""
    size, world, per_rank = 96, 3, 4
    single = [k for k, *_ in ShardedSampler(size, 0, 1, shuffle=True, seed=5)]
    shards = [[k for k, *_ in ShardedSampler(size, r, world, shuffle=True, seed=5)]
              for r in range(world)]
    assert sorted(single) == list(range(size))
    for step in range(size // (world * per_rank)):
        global_batch = single[step * world * per_rank:(step + 1) * world * per_rank]
        union = [i for s in shards for i in s[step * per_rank:(step + 1) * per_rank]]
        assert sorted(union) == sorted(global_batch)


def test_train_shards_pad_evenly_and_reshuffle_per_epoch():
    samplers = [ShardedSampler(10, r, 4, shuffle=True, seed=0) for r in range(4)]
    assert [len(s) for s in samplers] == [3] * 4  # 10 padded to 12
    assert {i for s in samplers for i, *_ in s} == set(range(10))
    first = list(samplers[0])
    samplers[0].set_epoch(1)
    assert list(samplers[0]) != first


def test_val_shards_are_exact():
    """No padding: each index on exactly one rank, even when shards differ in size."""
    shards = [[i for i, *_ in ShardedSampler(11, r, 3, shuffle=False, seed=0)] for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 3]
    assert sorted(i for s in shards for i in s) == list(range(11))


def test_augmentation_seed_depends_on_sample_not_rank():
    one = {k.index: k.seed for k in ShardedSampler(20, 0, 1, shuffle=True, seed=2)}
    two = {k.index: k.seed for r in range(2) for k in ShardedSampler(20, r, 2, shuffle=True,
                                                                      seed=2)}
    assert one == two


def test_val_resize_matches_the_classic_recipe():
    assert val_resize_size(224) == 256 and val_resize_size(64) == 73


# --- schedule ------------------------------------------------------------------------------------
def _cfg(**kw):
    return parse_args(["--dummy"] + [a for k, v in kw.items() for a in (f"--{k}", *map(str, v))])


def test_linear_lr_scaling():
    assert scaled_lr(_cfg(lr=[0.1]), 1024) == pytest.approx(0.4)
    assert scaled_lr(_cfg(lr=[0.1], **{"no-lr-scaling": []}), 1024) == pytest.approx(0.1)


def test_step_schedule_with_warmup():
    f = LrMultiplier(_cfg(epochs=[90], **{"warmup-epochs": [5]}), steps_per_epoch=10, peak_lr=0.1)
    assert f(0) == pytest.approx(1 / 50) and f(49) == pytest.approx(1.0)
    assert f(299) == 1.0 and f(300) == pytest.approx(0.1) and f(600) == pytest.approx(0.01)
    assert f(800) == pytest.approx(0.001)


def test_cosine_schedule():
    f = LrMultiplier(_cfg(epochs=[10], **{"lr-schedule": ["cosine"]}), steps_per_epoch=10, peak_lr=0.1)
    assert f(0) == 1.0 and f(50) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)


# --- models --------------------------------------------------------------------------------------
def test_pretrained_from_a_local_file_skips_a_mismatched_classifier(tmp_path, capsys):
    from imagenet_recipes.models import build_model

    source = torchvision.models.resnet18(num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "resnet18.pth")
    model = build_model("resnet18", num_classes=4, pretrained=str(tmp_path / "resnet18.pth"))
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert model.fc.weight.shape == (4, 512)
    assert "fc.weight" in capsys.readouterr().out


def test_pretrained_of_another_architecture_is_refused(tmp_path):
    from imagenet_recipes.models import build_model

    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    with pytest.raises(UsageError, match="does not fit"):
        build_model("resnet50", num_classes=10, pretrained=str(tmp_path / "r18.pth"))


def test_timm_architectures_by_name():
    """-a timm/NAME builds timm's architecture (random weights, the run's class count); an
    unknown name is refused with the names close to it; run dirs get no path separator."""
    import timm

    from imagenet_recipes.models import arch_slug, build_model, load_command

    model = build_model("timm/test_resnet", num_classes=4)
    assert isinstance(model, timm.models.ResNet) and model.get_classifier().out_features == 4
    with pytest.raises(UsageError, match="unknown architecture 'timm/resnet5000'.*resnet"):
        build_model("timm/resnet5000", num_classes=4)
    with pytest.raises(UsageError, match="timm/NAME"):
        build_model("resnet5000", num_classes=4)
    assert arch_slug("timm/test_resnet") == "timm-test_resnet"
    assert load_command("timm/test_resnet", 4).startswith("timm.create_model('test_resnet'")


def test_sync_bn_refuses_norm_layers_that_do_more_than_batchnorm():
    """timm's BatchNormAct2d applies the activation too: converting it to a cross-rank
    BatchNorm would drop the activation, so --sync-bn refuses such a model, and converts
    models with plain BatchNorm (torchvision's, timm's ResNets)."""
    from imagenet_recipes.models import build_model
    from imagenet_recipes.strategies.ddp import DDPStrategy

    strategy = DDPStrategy(sync_bn=True)
    strategy.backend = "gloo"
    with pytest.raises(UsageError, match="BatchNormAct2d"):
        strategy._convert_module(build_model("timm/test_efficientnet", num_classes=4))
    for arch in ("timm/test_resnet", "resnet18"):
        strategy._convert_module(build_model(arch, num_classes=4))


@pytest.mark.parametrize("argv,message", [
    (["--dummy", "--dist-url", "tcp://x:23456"], "torchrun"),
    (["--dummy", "--multiprocessing-distributed"], "torchrun"),
    (["--dummy", "--momentum", "-1"], "--momentum"),
    (["--dummy", "--wd", "-0.1"], "--wd"),
    (["--dummy", "--lr", "0"], "--lr"),
    (["--dummy", "--dist-timeout", "0"], "--dist-timeout"),
    (["--dummy", "--pretrained", "."], "weights FILE"),
])
def test_config_rejects_with_a_hint(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def _epoch(size, world, start=0, seed=3):
    """Each rank's indices of one epoch from global position `start`."""
    shards = []
    for rank in range(world):
        sampler = ShardedSampler(size, rank, world, shuffle=True, seed=seed)
        sampler.set_epoch(0, start)
        shards.append([i for i, *_ in sampler])
        assert len(sampler) == len(shards[-1])
    return shards


def _global_batches(shards, batch):
    """The union over ranks of each step's batches (drop_last, as training does)."""
    steps = min(len(s) for s in shards) // batch
    return [sorted(i for s in shards for i in s[k * batch:(k + 1) * batch]) for k in range(steps)]


@pytest.mark.parametrize("before,after", [(1, 2), (2, 1), (4, 2), (2, 3)])
def test_a_mid_epoch_position_in_global_samples_continues_on_any_world_size(before, after):
    """Stop after 3 global batches of 4 per rank on `before` ranks, continue on `after`: the
    epoch's samples are each seen once, in the single-process order's global batches."""
    size, batch = 48, 4
    done = 3 * batch * before
    first = _global_batches(_epoch(size, before), batch)[:3]
    rest = _global_batches(_epoch(size, after, start=done), batch)
    seen = [i for b in first + rest for i in b]
    assert len(seen) == len(set(seen))  # nothing twice
    single = [i for i, *_ in ShardedSampler(size, 0, 1, shuffle=True, seed=3)]
    assert sorted(seen) == sorted(single[:len(seen)])  # nothing skipped: a prefix of the order
    assert size - len(seen) < batch * after  # only drop_last's tail is left out


# --- checkpoints ---------------------------------------------------------------------------------
def _state(epoch):
    return {"model": {"w": torch.full((3,), float(epoch))}, "optimizer": {}, "epoch": epoch,
            "arch": "resnet18"}


def test_checkpoint_keeps_the_previous_one(tmp_path):
    from imagenet_recipes import checkpoint

    checkpoint.save(_state(1), tmp_path, is_best=True)
    checkpoint.save(_state(2), tmp_path, is_best=False)
    assert checkpoint.load(tmp_path / checkpoint.LATEST)["epoch"] == 2
    assert checkpoint.load(tmp_path / checkpoint.PREVIOUS)["epoch"] == 1
    assert checkpoint.load(tmp_path / checkpoint.BEST)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [checkpoint.LATEST, checkpoint.PREVIOUS, checkpoint.BEST])  # no temp files left


def test_full_disk_during_a_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    from imagenet_recipes import checkpoint

    checkpoint.save(_state(1), tmp_path, is_best=False)

    def disk_full(state, path):
        path.write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc] No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left"):
        checkpoint.save(_state(2), tmp_path, is_best=False)
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / checkpoint.LATEST)["epoch"] == 1
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    from imagenet_recipes import checkpoint

    checkpoint.save(_state(1), tmp_path, is_best=False)
    checkpoint.save(_state(2), tmp_path, is_best=False)
    latest = tmp_path / checkpoint.LATEST
    latest.write_bytes(latest.read_bytes()[:100])  # truncated, e.g. by a crash of the disk
    state = checkpoint.load_newest_valid(tmp_path)
    assert state["epoch"] == 1 and state["path"] == tmp_path / checkpoint.PREVIOUS
    assert str(latest) in capsys.readouterr().out


def test_share_gpus_wraps_local_ranks_onto_the_visible_gpus(monkeypatch):
    """--share-gpus (DDP): local ranks past the GPU count reuse the GPUs in turn; without it a
    rank with no GPU of its own is refused with a message that names the option."""
    from imagenet_recipes.strategies import pick_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [pick_device("auto", r, share_gpus=True).index for r in range(5)] == [0, 1, 0, 1, 0]
    assert pick_device("cuda", 1) == torch.device("cuda", 1)
    with pytest.raises(UsageError, match="--share-gpus"):
        pick_device("cuda", 2)
    assert pick_device("cpu", 3, share_gpus=True) == torch.device("cpu")
    assert parse_args(["--share-gpus", "x"], entry="ddp").share_gpus
    with pytest.raises(UsageError):
        parse_args(["--share-gpus", "x"], entry="nd")


def test_sync_bn_is_torchs_over_nccl_and_the_cross_rank_layer_over_gloo():
    """--sync-bn: torch's SyncBatchNorm (fused CUDA kernels) wherever NCCL carries the ranks;
    CrossRankBatchNorm over gloo, where SyncBatchNorm cannot run: CPUs, and ranks sharing a
    GPU (--share-gpus), whose CUDA tensors gloo can all-reduce but not all-gather. The run
    record says which."""
    from imagenet_recipes.strategies.ddp import DDPStrategy
    from imagenet_recipes.syncbn import CrossRankBatchNorm

    def layers(backend, sync_bn=True):
        strategy = DDPStrategy(sync_bn=sync_bn)
        strategy.backend = backend  # what setup_environment chose for the device
        model = strategy._convert_module(torchvision.models.resnet18(num_classes=4))
        kinds = {type(m) for m in model.modules()
                 if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
        return kinds, strategy.sync_bn_layer()

    assert layers("nccl") == ({torch.nn.SyncBatchNorm}, "SyncBatchNorm")
    assert layers("gloo") == ({CrossRankBatchNorm}, "CrossRankBatchNorm")
    assert layers("nccl", sync_bn=False) == ({torch.nn.BatchNorm2d}, None)


def test_deterministic_sets_what_determinism_needs_on_cuda(tmp_path, monkeypatch):
    """--deterministic: errors for nondeterministic ops (not warnings), deterministic cuDNN and
    the cuBLAS workspace setting that CUDA's deterministic matmuls need; a user's own cuBLAS
    setting is kept."""
    import os

    from imagenet_recipes.engine import Trainer
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        for given, kept in ((None, ":4096:8"), (":16:8", ":16:8")):
            if given:
                monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", given)
            cfg = parse_args(["--dummy", "-a", "resnet18", "--image-size", "32", "-b", "4",
                              "--device", "cpu", "--deterministic", "--logdir", str(tmp_path),
                              "--synthetic-train-size", "8", "--synthetic-val-size", "4"])
            trainer = Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
            trainer.setup()
            trainer.close()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == kept
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


class _Turns:
    """Stands for a PeerWatch's stop event: the watch's thread waits in it between its turns,
    and runs one turn (one heartbeat and one look at its neighbour) when the test says so."""

    def __init__(self):
        self._set, self.ended = False, False
        self.go = threading.Semaphore(0)
        self.idle = threading.Semaphore(0)  # released when a turn is over or the thread ended

    def wait(self, timeout=None) -> bool:
        self.idle.release()
        self.go.acquire()
        return self._set

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class _Lockstep:
    """PeerWatches in one process that take turns in rank order, on a clock that moves one
    `interval` a round: the outcome depends on what each thread saw in the store, never on
    how the threads were scheduled (a stalled test process once made a watch blame a neighbour
    that simply had not had its turn yet)."""

    def __init__(self, monkeypatch, watches, interval: float):
        from imagenet_recipes import peers

        self.now, self.interval, self.watches = 0.0, interval, watches
        monkeypatch.setattr(peers, "time", types.SimpleNamespace(monotonic=lambda: self.now))
        self.turns = []
        for watch in watches:
            turns = watch._stop = _Turns()
            self.turns.append(turns)
            watch._thread = threading.Thread(target=self._watch, args=(watch, turns), daemon=True)
            watch.start()
            assert turns.idle.acquire(timeout=60)  # waiting for its first turn

    @staticmethod
    def _watch(watch, turns):
        try:
            watch._watch()
        finally:
            turns.ended = True
            turns.idle.release()

    def turn(self, rank: int) -> None:
        """One turn of a watch whose thread is still running (at its end, it ends)."""
        if not self.turns[rank].ended:
            self.turns[rank].go.release()
            assert self.turns[rank].idle.acquire(timeout=60), f"rank {rank}'s turn did not end"

    def rounds(self, count: int) -> None:
        for _ in range(count):
            self.now += self.interval
            for rank in range(len(self.watches)):
                self.turn(rank)

    def finish(self, rank: int) -> None:
        """Rank `rank` ends normally: its thread stops at its next turn, then finish()."""
        self.watches[rank]._stop.set()
        self.turn(rank)
        self.watches[rank].finish()


def test_peer_watch_reports_a_silent_neighbour_once_to_every_rank_and_not_a_finished_one(
        monkeypatch):
    """Three ranks over one in-memory store: rank 2 stops beating, rank 1 (its watcher) names
    it, and ranks 0 and 1 both end with that name; a rank that finishes is not reported."""
    from torch.distributed import HashStore

    from imagenet_recipes.peers import PeerWatch

    store, reports = HashStore(), {}

    def recorder(rank):
        def on_gone(message):
            reports[rank] = message
        return on_gone

    watches = [PeerWatch(store, rank, 3, interval=0.05, timeout=0.5, on_gone=recorder(rank))
               for rank in range(3)]
    steps = _Lockstep(monkeypatch, watches, interval=0.05)
    steps.rounds(5)  # everyone beats: nobody is reported
    assert reports == {}
    watches[2]._stop.set()  # rank 2 dies: its thread stops without saying it finished
    steps.rounds(9)  # 0.45 s of silence: within the timeout
    assert reports == {}
    steps.rounds(4)  # past it: rank 1 notices, then rank 0 hears it
    assert sorted(reports) == [0, 1]
    assert "rank 1 of 3: rank 2 stopped answering (no heartbeat for 0.5 s)" in reports[1]
    assert "rank 0 of 3: rank 2 stopped answering (another rank noticed)" in reports[0]
    assert all(turns.ended for turns in steps.turns)  # each reported once, and ended

    store, reports = HashStore(), {}
    watches = [PeerWatch(store, rank, 2, interval=0.05, timeout=0.3, on_gone=recorder(rank))
               for rank in range(2)]
    steps = _Lockstep(monkeypatch, watches, interval=0.05)
    steps.rounds(2)
    steps.finish(1)  # rank 1 is done; rank 0 trains on for longer than the timeout
    steps.rounds(20)
    steps.finish(0)
    assert reports == {}


def test_peer_watch_finish_waits_for_its_thread():
    """finish() returns only once the watch's thread has ended. A thread still inside a store
    call when the interpreter exits is ended by Python in the middle of C++ code, which aborts
    the process ("terminate called without an active exception") after a run that succeeded."""
    import threading

    from torch.distributed import HashStore

    from imagenet_recipes.peers import PeerWatch

    class SlowStore:  # every call takes a while, as a loaded machine's TCP store can
        def __init__(self):
            self.inner, self.in_call = HashStore(), threading.Event()

        def __getattr__(self, name):
            def call(*args):
                self.in_call.set()
                time.sleep(0.3)
                return getattr(self.inner, name)(*args)
            return call

    store = SlowStore()
    watch = PeerWatch(store, 0, 2, interval=0.01, timeout=60).start()
    store.in_call.clear()
    assert store.in_call.wait(timeout=10)  # the thread is in a store call now
    watch.finish()
    assert not watch._thread.is_alive()


# --- what a GPU user is told ----------------------------------------------------------------------
def test_gpu_hints_name_the_command_that_uses_every_gpu_and_a_faster_level():
    from imagenet_recipes.advice import gpu_hints

    (idle, fp32) = gpu_hints("nd", "train/nd.py", False, "cuda", 8, 1, "O0", False)
    assert "8 GPUs are visible but this node runs 1 process(es) of train/nd.py: 7 stay idle" in idle
    assert "torchrun --nproc_per_node=8 train/ddp_apex.py" in idle
    assert "--opt-level O2" in fp32
    (idle,) = gpu_hints("ddp", "train/ddp.py", True, "cuda", 4, 2, "O1", False)
    assert "torchrun --nproc_per_node=4 train/ddp.py ..." in idle
    assert gpu_hints("ddp", "train/ddp.py", True, "cuda", 4, 4, "O2", False) == []
    assert gpu_hints("ddp", "train/ddp.py", True, "cuda", 1, 2, "O2", True) == []  # --share-gpus
    assert gpu_hints("dp", "train/dp.py", False, "cuda", 4, 1, "O1", False) == []  # DP uses all
    assert gpu_hints("nd", "train/nd.py", False, "cpu", 0, 1, "O0", False) == []


@pytest.mark.parametrize("batch,accum,suggested", [(256, 1, "-b 128 --grad-accum 2"),
                                                   (96, 2, "-b 48 --grad-accum 4"),
                                                   (7, 1, "-b 1 --grad-accum 7")])
def test_out_of_memory_suggests_a_smaller_batch_that_keeps_the_global_one(batch, accum,
                                                                           suggested):
    from imagenet_recipes.advice import out_of_memory

    text = out_of_memory("CUDA out of memory. Tried to allocate 2.00 GiB", batch, accum,
                         batch * accum * 8, "O2")
    assert f"at -b {batch} per process (global batch {batch * accum * 8})" in text
    assert suggested in text and "--resume auto" in text and "O0" not in text


def test_a_run_that_runs_out_of_gpu_memory_ends_with_the_advice(capsys):
    from imagenet_recipes.engine import run
    from imagenet_recipes.strategies.base import Strategy

    class OutOfMemoryAtSetup(Strategy):
        def setup_environment(self):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    with pytest.raises(SystemExit) as exit_:
        run(OutOfMemoryAtSetup, "nd", parse_args(["--dummy", "-b", "64"], entry="nd"))
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the GPU ran out of memory at -b 64 per process (global batch "
                          "64): CUDA out of memory. Tried to allocate 2.00 GiB. Lower -b")
    assert "-b 32 --grad-accum 2" in err and "O1/O2" in err


def test_the_best_score_keeps_its_epoch_and_an_old_checkpoints_best_is_not_lost():
    from imagenet_recipes.summary import Best, closing_lines

    best = Best()
    assert best.offer(0.0, 0) and (best.top1, best.epoch) == (0.0, 0)  # the first is the best
    assert not best.offer(0.0, 1) and best.offer(5.0, 2) and best.epoch == 2
    # a checkpoint from before epochs were kept: its best stands until beaten
    old = Best(50.0, None)
    assert not old.offer(40.0, 3) and (old.top1, old.epoch) == (50.0, None)
    assert "best top-1 50.000 at epoch ?" in closing_lines("finished", 1, 10.0, 100, old, None,
                                                           None, None)[0]
    assert old.offer(60.0, 4) and (old.top1, old.epoch) == (60.0, 4)
    assert "no validation" in closing_lines("finished", 0, 0.0, 0, Best(), None, None, None)[0]


def test_the_evaluate_command_names_the_script_as_the_shell_it_was_run_from_finds_it(
        tmp_path, monkeypatch):
    """From the repository root train/nd.py, as the README types it; from any other folder the
    script's absolute path (the clone found beside the script the run ran, in train/), so that
    the printed command runs where it was printed."""
    from imagenet_recipes.summary import evaluate_command

    clone = tmp_path / "clone"
    for script in ("train/nd.py", "train/ddp.py"):
        (clone / script).parent.mkdir(parents=True, exist_ok=True)
        (clone / script).write_text("")
    best = tmp_path / "run" / "model_best.pth"
    monkeypatch.delenv("RECIPES_ENV_SH", raising=False)
    monkeypatch.chdir(clone)
    assert evaluate_command("python", "train/nd.py", best, "data", "train/nd.py") == \
        f"python train/nd.py -e --resume {best} data"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert evaluate_command("torchrun", "train/ddp.py", best, None,
                            str(clone / "train/nd.py")) == \
        f"torchrun --nproc_per_node=1 {clone / 'train/ddp.py'} -e --resume {best}"
    # a process that is no entry script of a clone (a tool's, a test's): the registry's path
    assert evaluate_command("python", "train/nd.py", best, None, "/usr/lib/pytest/__main__.py") \
        == f"python train/nd.py -e --resume {best}"


def test_the_default_loader_workers_are_every_core_but_one_per_process():
    """-j -1 (the default): each process's share of the cores, one left for the process itself,
    with no fixed cap (an H100 with 16 cores was fed 0.72x its training rate by 8 workers)."""
    from imagenet_recipes.data.loading import default_workers

    assert [default_workers(1, cores=c) for c in (1, 2, 16, 64)] == [1, 1, 15, 63]
    assert [default_workers(n, cores=16) for n in (2, 4, 8, 16, 32)] == [7, 3, 1, 1, 1]
    assert default_workers(8, cores=128) == 15


def test_a_run_that_waited_for_data_says_which_flag_helps():
    """The note after the first epoch: silent under the threshold; above it, the share of the
    epoch spent waiting and the fix for the backend and device."""
    from imagenet_recipes.advice import DATA_WAIT_SHARE, data_wait_note

    assert data_wait_note(DATA_WAIT_SHARE * 0.9, "pytorch", 7, 8, "cuda") is None
    gpu = data_wait_note(0.28, "pytorch", 7, 8, "cuda")
    assert "28 % of the first epoch" in gpu and "-j 7" in gpu and "8 cores" in gpu
    assert "--data-backend dali-gpu" in gpu
    all_cores = data_wait_note(0.5, "pytorch", 15, 16, "cuda")
    assert "every core but one" in all_cores and "--data-backend dali-gpu" in all_cores
    cpu = data_wait_note(0.5, "pytorch", 1, 2, "cpu")
    assert "dali-gpu" not in cpu and "--data-backend dali-cpu" in cpu
    dali_gpu = data_wait_note(0.5, "dali-gpu", 15, 16, "cuda")
    assert "--data-backend dali-gpu" not in dali_gpu and "--dali-hw-decoder-load" in dali_gpu
    # the gpu backend's workers only read files: no -j advice (the H200's note said "raise -j"
    # at -j 15 of 16 cores), the decoder that helps instead
    for workers in (3, 15):
        gpu_backend = data_wait_note(0.62, "gpu", workers, 16, "cuda")
        assert "-j" not in gpu_backend.split("training.")[1], gpu_backend
        assert "--gpu-decoder nvimgcodec" in gpu_backend and "dali-gpu" in gpu_backend
    assert "--gpu-decoder" not in data_wait_note(0.62, "gpu", 15, 16, "cuda", "nvimgcodec")
    assert "dali-cpu" in data_wait_note(0.5, "gpu", 1, 2, "cpu")


def test_the_engine_gives_the_data_wait_note_once_after_the_first_epoch(tiny_imagefolder, tmp_path,
                                                                         monkeypatch, capsys):
    """What the engine hands the note: the first epoch's share of time spent waiting for data,
    the backend, the loader's -j, this process's cores and the --gpu-decoder; and it prints
    what comes back."""
    from imagenet_recipes import engine
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    calls = []

    def note(share, backend, workers, cores, device_type, gpu_decoder, cpu_decoded=0):
        calls.append((share, backend, workers, cores, device_type, gpu_decoder))
        return "note: waited"

    monkeypatch.setattr(engine, "data_wait_note", note)
    cfg = parse_args([str(a) for a in ["-a", "resnet18", "--image-size", "32", "-b", "8", "-j",
                                       "0", "-p", "1", "--epochs", "2", "--steps-per-epoch", "1",
                                       "--logdir", tmp_path, tiny_imagefolder]])
    trainer = engine.Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
    trainer.setup()
    trainer.fit()
    trainer.close()
    assert len(calls) == 1
    share, backend, workers, cores, device_type, gpu_decoder = calls[0]
    assert 0 < share < 1 and (backend, workers, device_type) == ("pytorch", 0, "cpu")
    assert gpu_decoder == "torchcodec"  # the --gpu-decoder default
    assert cores >= 1
    printed = [line for line in capsys.readouterr().out.splitlines() if "note: waited" in line]
    assert len(printed) == 1


def test_ddp_gradients_are_views_into_its_buckets_on_every_step(tmp_path, monkeypatch):
    """DDP keeps each gradient as a view into its all-reduce bucket (gradient_as_bucket_view):
    no copy between the buckets and .grad after each all-reduce, and one gradient-sized
    allocation less. Run in this process as a world of one (gloo); the exact parity of the
    weights with nd.py is test_parity's (float64, two ranks)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from imagenet_recipes.engine import Trainer
    from imagenet_recipes.strategies import DDPStrategy
    from imagenet_recipes.options import StrategyOptions

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    cfg = parse_args(["--dummy", "-a", "resnet18", "--image-size", "32", "-b", "4",
                      "--device", "cpu", "--logdir", str(tmp_path), "--synthetic-train-size",
                      "8", "--synthetic-val-size", "4"], entry="ddp")
    strategy = DDPStrategy.build(StrategyOptions.of(cfg, DDPStrategy.sections()))
    trainer = Trainer(cfg, strategy, "ddp")
    trainer.setup()
    try:
        strategy = trainer.strategy
        assert strategy.wrapper.gradient_as_bucket_view
        images, targets = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        for _ in range(2):  # the second backward starts from grads set to None by zero_grad
            model = strategy.train_model()
            strategy.backward(F.cross_entropy(model(images), targets))
            grads = [p.grad for p in strategy.module.parameters()]
            storages = {g.untyped_storage().data_ptr() for g in grads}
            # every parameter's gradient lives in one of a few buckets, not in its own tensor
            assert all(g is not None for g in grads) and len(storages) < len(grads) / 10
            strategy.optimizer_step(trainer.optimizer)
            trainer.optimizer.zero_grad()
    finally:
        trainer.close()
    assert not dist.is_initialized()


def test_a_stop_signal_that_lands_inside_a_print_is_announced_not_raised(tmp_path, monkeypatch):
    """A preemption signal handled while the main thread is inside a print to stdout: the
    handler's own line must not re-enter the buffered stdout (RuntimeError "reentrant call",
    which failed a run that should have checkpointed)."""
    import io
    import signal
    import sys
    from types import SimpleNamespace

    from imagenet_recipes.engine import Trainer

    target = open(tmp_path / "stdout", "wb", buffering=0)
    trainer = SimpleNamespace(strategy=SimpleNamespace(rank=3), stop_signal=None)

    class SignalMidWrite(io.RawIOBase):
        """stdout's file, where the signal arrives during the first write."""
        fired = False

        def writable(self):
            return True

        def fileno(self):
            return target.fileno()

        def write(self, data):
            if not self.fired:
                self.fired = True
                Trainer._on_stop_signal(trainer, signal.SIGTERM, None)
            return target.write(bytes(data))

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(SignalMidWrite())))
    print("Epoch: [0][10/20]", flush=True)
    sys.stdout.flush()
    assert trainer.stop_signal == "SIGTERM"
    written = (tmp_path / "stdout").read_text()
    assert "=> rank 3: SIGTERM received; checkpointing" in written
    assert "Epoch: [0][10/20]" in written
