"""End-to-end training tests on CPU: the real entry scripts, real processes, real gloo."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from conftest import (LOADER_WORKERS, NO_NATIVE_BF16, RESNET18, TESTS, TINY, read_jsonl, records,
                      run_forked, run_script)


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.mark.slow
def test_resume_continues_exactly(tiny_imagefolder, tmp_path):
    """2 epochs straight == 1 epoch, then --resume for the second: identical weights, bit for
    bit, with an lr drop at epoch 1 so the scheduler position must be restored too."""
    common = TINY + ["-b", "16", "--lr-steps", "1", "--logdir", tmp_path, "--seed", "1"]
    run_forked("nd.py", common + ["--epochs", "2", "--run-name", "straight", tiny_imagefolder])
    run_forked("nd.py", common + ["--epochs", "1", "--run-name", "first", tiny_imagefolder])
    run_forked("nd.py", common + ["--epochs", "2", "--run-name", "resumed",
                                  "--resume", tmp_path / "first/checkpoint.pth", tiny_imagefolder])
    straight = _weights(tmp_path / "straight/checkpoint.pth")
    resumed = _weights(tmp_path / "resumed/checkpoint.pth")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    # and the resumed run really started at epoch 1 with the decayed lr
    resumed_train = records(tmp_path / "resumed", "train")
    assert {r["epoch"] for r in resumed_train} == {1}
    straight_lrs = [r["lr"] for r in records(tmp_path / "straight", "train") if r["epoch"] == 1]
    assert [r["lr"] for r in resumed_train] == straight_lrs
    assert straight_lrs[0] == pytest.approx(0.1 * 0.1 * 16 / 256)


@pytest.mark.slow
def test_a_checkpoint_written_before_the_option_sections_resumes_exactly(tmp_path):
    """tests/checkpoints/838b197-epoch0.pth: the epoch-0 checkpoint of a run made by the code of
    838b197, before the options were split into sections (the run's command and what it logged
    after that checkpoint, straight through, in 838b197.json). Resumed by today's code with the
    same command, the second epoch logs what the old code logged: the same losses (momentum
    restored), learning rates (the schedule's position), validation and EMA losses (the
    average and its update count), step counters and bests. Losses within 1e-4 of the old
    ones, for other CPUs' kernels; without the momentum buffers a loss moves by 7 %, without
    the EMA's update count the EMA's by 2 % (measured)."""
    made = json.loads((TESTS / "checkpoints/838b197.json").read_text())
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(TESTS / "checkpoints/838b197-epoch0.pth", run / "checkpoint.pth")
    proc = run_forked("nd.py", [*made["args"], "--logdir", tmp_path, "--run-name", "old",
                                "--resume", "auto"])
    assert "checkpoint.pth" in proc.stdout
    logged = [r for r in read_jsonl(run) if r["kind"] in ("train", "val", "val_ema", "end")]
    expected = made["records_after"]
    assert [r["kind"] for r in logged] == [r["kind"] for r in expected]
    for now, then in zip(logged, expected):
        for key, value in then.items():
            if key == "loss":
                assert now[key] == pytest.approx(value, rel=1e-4), (now, then)
            else:
                assert now[key] == value, (key, now, then)


@pytest.mark.slow
def test_resume_auto_picks_the_latest_checkpoint(tiny_imagefolder, tmp_path):
    common = TINY + ["-b", "16", "--logdir", tmp_path, "--run-name", "job"]
    run_forked("nd.py", common + ["--epochs", "1", tiny_imagefolder])
    proc = run_forked("nd.py", common + ["--epochs", "2", "--resume", "auto", tiny_imagefolder])
    assert "checkpoint.pth" in proc.stdout
    epochs = [r["epoch"] for r in records(tmp_path / "job", "train_epoch")]
    assert epochs == [0, 1]  # epoch 0 from the first run, epoch 1 from the resumed one
    # The schedule follows the CURRENT command (a new --lr), not the checkpoint's.
    run_forked("nd.py", common + ["--epochs", "3", "--lr", "0.2", "--resume", "auto",
                                  tiny_imagefolder])
    last = [r for r in records(tmp_path / "job", "train") if r["epoch"] == 2]
    assert last and all(r["lr"] == pytest.approx(0.2 * 16 / 256) for r in last)
    # Another --run-name never continues this run: it starts from scratch.
    proc = run_forked("nd.py", TINY + ["-b", "16", "--logdir", tmp_path, "--run-name", "other",
                                       "--epochs", "1", "--resume", "auto", tiny_imagefolder])
    assert "starting from scratch" in proc.stdout
    assert [r["epoch"] for r in records(tmp_path / "other", "train_epoch")] == [0]
    # Reusing a run's name without --resume would overwrite its checkpoints: refused.
    proc = run_forked("nd.py", common + ["--epochs", "4", tiny_imagefolder], check=False)
    assert proc.returncode == 2 and "already holds a run's checkpoint" in proc.stderr


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def validated_on_one(tiny_imagefolder, tmp_path_factory):
    """validated_on_one(backend) -> (evaluation arguments, the `val` record of one process):
    one trained checkpoint (2 epochs of 1 step: validate.logdir / "trained"), validated once
    per backend by one process (made once, shared)."""
    logdir = tmp_path_factory.mktemp("validated_on_one")
    run_forked("nd.py", TINY + ["-b", "16", "--steps-per-epoch", "1", "--epochs", "2",
                                "--logdir", logdir, "--run-name", "trained", tiny_imagefolder])
    done = {}

    def validate(backend: str):
        if backend not in done:
            evaluate = TINY + LOADER_WORKERS + ["-e", "--resume", logdir / "trained/checkpoint.pth",
                                                "-b", "6", "--data-backend", backend]
            run_forked("nd.py", evaluate + ["--logdir", logdir, "--run-name", f"val1-{backend}",
                                            tiny_imagefolder])
            done[backend] = evaluate, records(logdir / f"val1-{backend}", "val")[0]
        return done[backend]
    validate.logdir = logdir
    return validate


@pytest.mark.slow
@pytest.mark.xdist_group("validated-on-one")  # one worker: the checkpoint is trained once
@pytest.mark.parametrize("backend,nproc", [("pytorch", 3), ("dali-cpu", 3)])
def test_distributed_validation_is_exact(validated_on_one, tiny_imagefolder, tmp_path, backend,
                                         nproc):
    """Validating one checkpoint on N ranks gives the same count and accuracy as on one. With
    3 ranks the 20 images split unevenly (7, 7, 6: validation shards are not padded, so the
    ranks run different numbers of batches) and, at batch 6, every shard ends in a partial
    batch: the even split of 2 ranks has nothing these lack."""
    evaluate, single = validated_on_one(backend)
    run_forked("ddp.py", evaluate + ["--logdir", tmp_path, "--run-name", "valN",
                                     tiny_imagefolder], nproc=nproc)
    multi = records(tmp_path / "valN", "val")[0]
    assert single["count"] == multi["count"] == 20  # every val image exactly once
    assert multi["top1"] == single["top1"] and multi["top5"] == single["top5"]
    assert multi["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert records(tmp_path / "valN", "run")[0]["world_size"] == nproc


@pytest.mark.slow
@pytest.mark.xdist_group("validated-on-one")  # the fixture's run, trained once
def test_evaluating_a_run_dir_names_the_epoch_of_its_weights(validated_on_one, tiny_imagefolder,
                                                            tmp_path):
    """`-e --resume RUN_DIR` evaluates that run's newest checkpoint, says which epoch's weights
    they are (the training run's numbering), and measures what the run measured then."""
    run = validated_on_one.logdir / "trained"
    proc = run_forked("nd.py", TINY + ["-b", "16", "-e", "--resume", run, "--logdir", tmp_path,
                                       "--run-name", "eval", tiny_imagefolder])
    assert f"evaluating {run / 'checkpoint.pth'}: the weights of epoch 1 " \
           "(step 2)" in proc.stdout, proc.stdout
    trained, evaluated = records(run, "val")[-1], records(tmp_path / "eval", "val")[0]
    assert (evaluated["epoch"], evaluated["step"]) == (trained["epoch"], trained["step"]) == (1, 2)
    assert evaluated["top1"] == trained["top1"] and evaluated["count"] == 20
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-5)


@pytest.mark.slow
def test_ddp_apex_on_two_cpu_processes_runs_bf16_and_logs_jsonl_and_tensorboard(
        tiny_imagefolder, tmp_path):
    """torchrun ddp_apex.py on generated data (O1 = bf16 autocast on CPU, gloo): the run record,
    finite losses, throughput per process, exact validation counts and TensorBoard events.
    (Whether training learns is checked in float64 by tests/test_parity.py.) On a CPU without
    native bf16, forced here whatever the CPU, the run's first line is a note saying so."""
    proc = run_script("ddp_apex.py", TINY + LOADER_WORKERS + [
        "-b", "8", "--epochs", "2", "--steps-per-epoch", "3", "--logdir", tmp_path,
        "--run-name", "amp", tiny_imagefolder], nproc=2, env=NO_NATIVE_BF16)
    _assert_progress_lines(proc.stdout, epochs=2, steps=3)
    notes = [line for line in proc.stdout.splitlines() if "no native bfloat16" in line]
    assert len(notes) == 1 and "  note: this CPU has no native bfloat16" in notes[0], proc.stdout
    run = records(tmp_path / "amp", "run")[0]
    assert run["versions"]["torch"] == torch.__version__ and run["hardware"]["cpu_count"] >= 1
    assert run["config"]["opt_level"] == "O1"
    assert run["precision"] == {"opt_level": "O1", "dtype": "bfloat16", "loss_scaling": "none"}
    assert run["backend"] == "gloo" and run["world_size"] == 2
    train = records(tmp_path / "amp", "train")
    assert len(train) == 6 and all(math.isfinite(r["loss"]) for r in train)
    assert all(r["img_s"] > 0 and r["img_s_per_proc"] == pytest.approx(r["img_s"] / 2)
               for r in train)
    assert [r["count"] for r in records(tmp_path / "amp", "val")] == [20, 20]
    _assert_tensorboard_events(tmp_path / "amp", train, records(tmp_path / "amp", "val"))


def _assert_progress_lines(stdout: str, epochs: int, steps: int) -> None:
    """Rank 0 alone prints; every line has a timestamp; each interval line the ETA of its
    epoch and of the run, each validation line the best top-1 so far."""
    import re

    lines = [line for line in stdout.splitlines() if line.strip()]
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ")
    assert all(stamp.match(line) for line in lines), stdout
    assert sum("=> ddp_apex:" in line for line in lines) == 1  # not once per rank
    progress = [line for line in lines if "Epoch [" in line]
    assert len(progress) == epochs * steps
    assert all(re.search(r"ETA epoch \d+:\d\d:\d\d, run (\d+:\d\d:\d\d|\?)$", line)
               for line in progress), progress
    assert progress[-1].endswith("ETA epoch 0:00:00, run 0:00:00")
    val = [line for line in lines if "* Val epoch" in line]
    best = [float(line.rsplit("best top1 ", 1)[1]) for line in val]
    tops = [float(re.search(r"top1 ([\d.]+)", line).group(1)) for line in val]
    assert len(val) == epochs and best == [max(tops[:i + 1]) for i in range(epochs)]


def _assert_tensorboard_events(run_dir, train, val):
    """Read the event files back with TensorBoard's own reader: tags present, values = JSONL."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"train/loss", "train/top1", "train/top5", "train/lr", "train/img_s",
                "train/step", "eval/loss", "eval/top1", "eval/top5", "train_epoch/loss"}
    assert expected <= tags, expected - tags
    assert [e.step for e in events.Scalars("train/loss")] == [r["samples_seen"] for r in train]
    assert [e.value for e in events.Scalars("train/step")] == [r["step"] for r in train]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(
        [r["loss"] for r in train], rel=1e-6)
    assert [e.value for e in events.Scalars("eval/top1")] == pytest.approx(
        [r["top1"] for r in val], rel=1e-6)


@pytest.mark.slow
def test_dp_script_on_cpu_runs_the_plain_module_without_the_wrapper(tiny_imagefolder, tmp_path):
    """nn.DataParallel needs GPUs; on a CPU the script trains the bare module on one device and
    says so. (The wrapper's replicas are exercised on CPU by tests/test_precision.py.)"""
    proc = run_forked("dp.py", TINY + ["-b", "16", "--epochs", "1", "--steps-per-epoch", "2",
                                       "--logdir", tmp_path, "--run-name", "dp",
                                       tiny_imagefolder])
    assert "DataParallel without GPUs runs the model on the CPU as a plain module" in proc.stdout
    run = records(tmp_path / "dp", "run")[0]
    assert run["strategy"] == "dp" and run["devices_per_process"] == 1
    assert records(tmp_path / "dp", "val")[0]["count"] == 20


def _bn_free_cnn(arch, num_classes, pretrained=None, zero_init_residual=False):
    # BatchNorm makes a batch of 8 differ from two batches of 4, so this test swaps in a
    # BN-free model: then accumulation must reproduce the big batch's update exactly.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, num_classes))


def test_grad_accum_matches_a_big_batch(tiny_imagefolder, tmp_path, monkeypatch):
    """2 accumulated micro-batches of 4 == one batch of 8: same weights after 3 steps."""
    from imagenet_recipes import engine
    from imagenet_recipes.config import parse_args
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    monkeypatch.setattr(engine, "build_model", _bn_free_cnn)

    def train(*extra):
        argv = [str(a) for a in TINY + ["-j", "0", "--epochs", "1", "--steps-per-epoch", "3",
                                       "--logdir", tmp_path, *extra, tiny_imagefolder]]
        cfg = parse_args(argv)
        trainer = engine.Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
        trainer.setup()
        trainer.fit()
        weights = trainer.strategy.module.state_dict()
        trainer.close()
        return weights, records(trainer.run_dir, "train")

    big, big_log = train("-b", "8", "--run-name", "big")
    acc, acc_log = train("-b", "4", "--grad-accum", "2", "--run-name", "acc")
    assert [r["count"] for r in acc_log] == [r["count"] for r in big_log] == [8, 8, 8]
    assert [r["loss"] for r in acc_log] == pytest.approx([r["loss"] for r in big_log], rel=1e-5)
    for name in big:
        torch.testing.assert_close(acc[name], big[name], rtol=1e-5, atol=1e-6)
    assert not torch.equal(big["4.weight"], _bn_free_cnn("", 4)[4].weight)  # it did train


@pytest.mark.slow
def test_desired_acc_stops_early(tiny_imagefolder, tmp_path):
    run_forked("nd.py", TINY + ["-b", "16", "--epochs", "5", "--steps-per-epoch", "1",
                                "--desired-acc", "0", "--logdir", tmp_path, "--run-name", "stop",
                                tiny_imagefolder])
    assert len(records(tmp_path / "stop", "val")) == 1
    assert "desired-acc" in records(tmp_path / "stop", "end")[0]["reason"]


@pytest.mark.slow
def test_ddp_comm_hooks_change_the_communication_not_the_training(tiny_imagefolder, tmp_path):
    """--ddp-comm-hook registers PyTorch's hooks: fp16 compression and PowerSGD (after its
    plain all-reduce warm-up steps) give updates close to the plain all-reduce, but not
    identical, which proves the hook really sat on the gradient path. (resnet18: PowerSGD
    all-reduces the small tensors of a tiny model uncompressed, and the effect vanishes.)"""
    common = RESNET18 + ["-b", "4", "--epochs", "1", "--steps-per-epoch", "5", "--lr", "0.2",
                     "--seed", "2", "--logdir", tmp_path, tiny_imagefolder]
    runs = {"none": [], "fp16": [], "powersgd": ["--powersgd-start-step", "3"]}
    for hook, extra in runs.items():
        run_forked("ddp.py", common + ["--ddp-comm-hook", hook, "--run-name", hook, *extra],
                   nproc=2)
    losses = {hook: [r["loss"] for r in records(tmp_path / hook, "train")] for hook in runs}
    for hook in runs:
        assert records(tmp_path / hook, "run")[0]["comm_hook"] == hook
        assert len(losses[hook]) == 5

    # Tiny random ResNets are chaotic (see the parity test above): compare single steps.
    # fp16: step 1 (after one update) agrees to half-precision rounding of the averaged
    # gradients, but not exactly.
    assert losses["fp16"][1] == pytest.approx(losses["none"][1], rel=1e-3)
    assert losses["fp16"][1:] != losses["none"][1:]
    # PowerSGD: updates 0-2 are its plain all-reduce warm-up (the same losses up to summation
    # order); update 3 is low-rank, so the loss after it moves by far more than rounding.
    assert losses["powersgd"][:4] == pytest.approx(losses["none"][:4], rel=1e-5)
    assert abs(losses["powersgd"][4] - losses["none"][4]) > 1e-2 * losses["none"][4]


@pytest.mark.slow
def test_the_end_of_a_run_says_the_bests_and_how_to_evaluate_them(tiny_imagefolder, tmp_path):
    """summary.csv has a row per epoch, the end record and the closing lines name the best
    top-1 with its epoch (the EMA's too) and the best model, and the printed evaluate command
    scores that model exactly as training logged it."""
    import csv
    import shlex

    run_dir = tmp_path / "run"
    proc = run_forked("nd.py", TINY + ["-b", "16", "--epochs", "3", "--steps-per-epoch", "2",
                                       "--model-ema", "--model-ema-steps", "1", "--logdir",
                                       tmp_path, "--run-name", "run", tiny_imagefolder])
    val, ema = records(run_dir, "val"), records(run_dir, "val_ema")
    best = max(val, key=lambda r: r["top1"])  # the first of equals, as the run keeps it
    best_ema = max(ema, key=lambda r: r["top1"])
    end = records(run_dir, "end")[0]
    assert (end["best_top1"], end["best_epoch"]) == (best["top1"], best["epoch"])
    assert (end["best_ema_top1"], end["best_ema_epoch"]) == (best_ema["top1"], best_ema["epoch"])
    assert end["seconds"] > 0 and end["img_s"] > 0
    assert end["best_model"] == str(run_dir / "model_best.pth")

    rows = list(csv.DictReader((run_dir / "summary.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [float(r["val_top1"]) for r in rows] == pytest.approx([r["top1"] for r in val])
    assert [float(r["val_ema_top1"]) for r in rows] == pytest.approx([r["top1"] for r in ema])
    assert all(float(r["img_s"]) > 0 and float(r["epoch_seconds"]) > 0 for r in rows)

    lines = proc.stdout.splitlines()
    closing = next(line for line in lines if "=> finished: best top-1" in line)
    assert f"best top-1 {best['top1']:.3f} at epoch {best['epoch']}" in closing
    assert f"EMA {best_ema['top1']:.3f} at epoch {best_ema['epoch']}" in closing
    assert "3 epoch(s) in" in closing
    assert any(line.endswith(f"=> best EMA model: {run_dir / 'model_best_ema.pth'}")
               for line in lines)
    command = shlex.split(next(line for line in lines if "=> evaluate it: " in line)
                          .split("=> evaluate it: ", 1)[1])
    assert command == ["python", "train/nd.py", "-e", "--resume",
                       str(run_dir / "model_best.pth"), str(tiny_imagefolder)]
    # the printed command, run as printed (into another run dir), takes the model and its
    # sizes from the checkpoint's run (no -a) and scores what training logged
    evaluated = run_forked("nd.py", command[2:] + ["--logdir", tmp_path, "--run-name", "eval"])
    assert f"=> -e: the checkpoint's run set --train-crop-size 32, --arch {TINY[1]}" in \
        evaluated.stdout and "--model-ema" in evaluated.stdout
    again = records(tmp_path / "eval", "val")[0]
    assert (again["top1"], again["count"]) == (best["top1"], best["count"]), evaluated.stdout
    assert again["loss"] == pytest.approx(best["loss"], rel=1e-5)
    # the EMA's best file holds the average as its model: scored alone, it gives the EMA's top-1
    run_forked("nd.py", ["-e", "--resume", run_dir / "model_best_ema.pth", "--no-model-ema",
                         "--logdir", tmp_path, "--run-name", "eval-ema", tiny_imagefolder])
    assert records(tmp_path / "eval-ema", "val")[0]["top1"] == best_ema["top1"]


@pytest.mark.slow
def test_save_every_keeps_epochs_and_export_weights_loads_into_torchvision(tiny_imagefolder,
                                                                            tmp_path):
    import torchvision

    run_dir = tmp_path / "run"
    run_forked("nd.py", RESNET18 + ["-b", "16", "--epochs", "3", "--steps-per-epoch", "1",
                                    "--save-every", "2", "--export-weights", tmp_path / "best.pth",
                                "--logdir", tmp_path, "--run-name", "run", tiny_imagefolder])
    kept = sorted(p.name for p in run_dir.glob("checkpoint-epoch*.pth"))
    assert kept == ["checkpoint-epoch1.pth"]  # epochs 0, 1, 2: every 2nd
    assert torch.load(run_dir / kept[0], weights_only=True)["epoch"] == 2  # the epoch to run next
    model = torchvision.models.get_model("resnet18", num_classes=4)
    model.load_state_dict(torch.load(tmp_path / "best.pth", weights_only=True))  # strict
    best = _weights(run_dir / "model_best.pth")
    assert all(torch.equal(v, best[k]) for k, v in model.state_dict().items())
    # -e exports the weights it evaluated
    run_forked("nd.py", ["-e", "--resume", run_dir / kept[0], "--export-weights",
                         tmp_path / "epoch1.pth", "--logdir", tmp_path, "--run-name", "eval",
                         tiny_imagefolder])
    exported, saved = torch.load(tmp_path / "epoch1.pth", weights_only=True), _weights(
        run_dir / kept[0])
    assert exported.keys() == saved.keys()
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
