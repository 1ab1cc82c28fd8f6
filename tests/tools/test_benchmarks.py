"""Smoke tests of the benchmark scripts: they must keep running as the engine evolves (their
numbers are measured by hand and go to RESULTS.md; nothing here is timed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, TINY, read_jsonl, run_tool



@pytest.mark.slow
def test_bench_loader_threads_measures_processes_threads_and_a_step_beside(
        tmp_path, tiny_imagefolder):
    record_path = tmp_path / "io" / "loader_threads.json"
    proc = run_tool("loader_threads", tiny_imagefolder, "--image-size", "32", "-b", "8",
                    "--passes", "1", "--workers", "2", "--step-seconds", "0.5",
                    "--gil-seconds", "2", "--json", record_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert list(record["alone"]) == ["processes, 1", "threads, 1", "processes, 2", "threads, 2"]
    assert all(r["img_s"] > 0 for r in record["alone"].values())
    # py-spy saw the sample loop in both its runs (every sample, then only those holding the
    # GIL), and the share is the ratio of their counts. The counts come from two runs whose pace
    # the machine's load sets: that the loop holds the GIL for part of a sample only is shown
    # from single looks (test_the_sample_loop_holds_the_gil_for_part_of_a_sample_only), what
    # each run asks py-spy for with a stand-in (test_gil_share_counts_every_sample_then_...).
    gil = record["gil"]
    assert gil["samples"] > 0 and gil["samples_holding"] > 0
    assert gil["share"] == gil["samples_holding"] / gil["samples"]
    assert gil["sample_us"] > 0
    # beside the step: the backend's default workers on 2 cores, one
    beside = record["beside_step"]
    assert list(beside) == ["step alone", "processes, 1", "threads, 1"]
    assert all(r["step_s"] > 0 for r in beside.values())
    assert beside["step alone"]["img_s"] is None
    assert beside["processes, 1"]["img_s"] > 0 and beside["threads, 1"]["img_s"] > 0
    from imagenet_recipes.bench import loader_threads, regenerate

    block = loader_threads.block(record)
    assert block.strip() in proc.stdout
    # RESULTS.md's input-pipeline block ends with it where the record is kept
    assert regenerate.io_block(record_path.parent, tmp_path).endswith(block)
    alone = record["alone"]
    ratio = alone["threads, 2"]["img_s"] / alone["processes, 2"]["img_s"]
    assert f"| 2 | {alone['processes, 2']['img_s']:.0f} |" in block and f"{ratio:.2f}x" in block


def test_loader_threads_counts_py_spys_samples_inside_the_sample_loop_only():
    from imagenet_recipes.bench.loader_threads import _spied_samples

    stacks = ("<module> (x.py:1);main (loader_threads.py:300) 40\n"
              "<module> (x.py:1);sample_loop (loader_threads.py:140);decode (j.py:3) 7\n"
              "<module> (x.py:1);sample_loop (loader_threads.py:141) 5\n")
    assert _spied_samples(stacks) == 12


def stand_in_py_spy(folder: Path) -> Path:
    """py-spy record as gil_share calls it, standing in: it writes raw stacks to -o, 10 samples
    inside sample_loop (4 with --gil) and 50 outside it, and prints the sample_us line of the
    process it was to watch (30.0, 40.0 with --gil); each call's arguments go to calls.jsonl."""
    spy = folder / "py-spy"
    spy.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
with open({str(folder / "calls.jsonl")!r}, "a") as calls:
    calls.write(json.dumps(args) + "\\n")
gil = "--gil" in args
loop = "<module> (x.py:1);sample_loop (loader_threads.py:140);decode (j.py:3)"
with open(args[args.index("-o") + 1], "w") as out:
    out.write(f"<module> (x.py:1);main (loader_threads.py:300) 50\\n"
              f"{{loop}} {{1 if gil else 7}}\\n<module> (x.py:1);sample_loop (l.py:141) 3\\n")
print("py-spy> Sampling process 200 times a second.")
print("sample_us", 40.0 if gil else 30.0)
""")
    spy.chmod(0o755)
    return spy


@pytest.mark.slow
def test_gil_share_counts_every_sample_then_those_holding_the_gil_inside_the_loop(tmp_path):
    """gil_share's two py-spy runs, with a stand-in py-spy: both at 200 Hz with idle stacks, the
    second with --gil only, each of the sample loop's process; the share is the second's count
    inside sample_loop over the first's, whatever the stacks outside it."""
    from imagenet_recipes.bench.loader_threads import gil_share

    spy = stand_in_py_spy(tmp_path)
    gil = gil_share(str(spy), tmp_path / "data", 8, 32, 2.0)
    assert gil == {"share": 4 / 10, "samples": 10, "samples_holding": 4, "sample_us": 35.0}
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    child = [sys.executable, "-m", "imagenet_recipes.bench.loader_threads",
             str(tmp_path / "data"), "-b", "8", "--image-size", "32", "--sample-loop", "2.0"]
    for call, only_gil in zip(calls, ([], ["--gil"])):
        out = call[call.index("-o") + 1]
        assert call == ["record", "--rate", "200", "--format", "raw", "--idle", *only_gil, "-o",
                        out, "--", *child]
    assert len(calls) == 2


def main_thread_look(spy: str, pid: int) -> tuple:
    """One look by `py-spy dump` at the process's main thread -> (its stack as py-spy's raw
    format writes it, a count of 1; whether it held the GIL), or None where the look failed
    (py-spy may catch the process between frames)."""
    look = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                          timeout=60)
    lines = look.stdout.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("Thread ") and '"MainThread"' in line), None)
    if look.returncode != 0 or start is None:
        return None
    frames = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        frames.append(line.strip())
    # dump lists the innermost frame first, raw the outermost
    return ";".join(reversed(frames)) + " 1", "+gil)" in lines[start]


@pytest.mark.slow
def test_the_sample_loop_holds_the_gil_for_part_of_a_sample_only(tiny_imagefolder):
    """What gil_share measures, from single looks (py-spy dump) at the process it watches: the
    stack and whether the main thread holds the GIL come from the same instant, so the share
    does not depend on py-spy's pace. Of 40 looks inside sample_loop (as _spied_samples counts
    a sample), some hold the GIL and some do not: decoding and resizing release it. The looks
    are taken until there are 40, or 300 s have passed."""
    from imagenet_recipes.bench.loader_threads import _spied_samples, py_spy

    spy = py_spy()
    # the loop's process lets any process of its user trace it (Yama's ptrace_scope 1 lets
    # only a parent: py-spy dump is this test's child, not the loop's parent)
    child = ("import ctypes, runpy, sys; ctypes.CDLL(None).prctl(0x59616d61, ctypes.c_ulong(-1),"
             " 0, 0, 0); sys.argv[0] = 'loader_threads'; "
             "runpy.run_module('imagenet_recipes.bench.loader_threads', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", child, str(tiny_imagefolder), "-b", "8",
                             "--image-size", "32", "--sample-loop", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    inside = holding = looks = 0
    try:
        deadline = time.monotonic() + 300
        while inside < 40 and time.monotonic() < deadline and proc.poll() is None:
            look = main_thread_look(spy, proc.pid)
            looks += 1
            if look is not None and _spied_samples(look[0]):
                inside += 1
                holding += look[1]
            time.sleep(0.05)
    finally:
        proc.kill()
        output = proc.communicate()[0]
    assert inside == 40, f"{inside} looks inside sample_loop of {looks}: {output[-2000:]}"
    assert 0 < holding < inside, f"{holding} of {inside} looks held the GIL"


def test_loader_threads_without_py_spy_stops_before_measuring_and_says_how_to_get_it(
        tmp_path, monkeypatch):
    from imagenet_recipes.bench import loader_threads

    def generated(*_):
        raise AssertionError("data generated before py-spy was found")

    # no py-spy beside this python, none on the PATH
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(loader_threads, "make_dataset", generated)
    with pytest.raises(SystemExit, match="py-spy is not installed.*pip install py-spy"):
        loader_threads.main(["--json", str(tmp_path / "record.json")])
    assert not (tmp_path / "record.json").exists()


@pytest.mark.slow
def test_loader_threads_make_the_loader_workers_batches(tiny_imagefolder):
    """One thread makes the very batches of the backend's worker process (each sample's crop
    and flip come from its key); two threads keep the sampler's order."""
    import torch

    from imagenet_recipes.bench.io import recipe_train_loader
    from imagenet_recipes.bench.loader_threads import ThreadBatches

    loader = recipe_train_loader(tiny_imagefolder, "pytorch", 8, 32, 1, torch.device("cpu"))
    loader.set_epoch(1)
    by_process = [(b.images.clone(), b.targets.clone()) for b in loader.loader]
    one, two = ThreadBatches(loader, 1), ThreadBatches(loader, 2)
    by_one_thread = list(one.epoch(1))
    by_two_threads = list(two.epoch(1))
    one.pool.shutdown()
    two.pool.shutdown()
    assert len(by_process) == len(by_one_thread) == len(by_two_threads) == 64 // 8
    for (images, targets), a, b in zip(by_process, by_one_thread, by_two_threads):
        assert torch.equal(a.targets, targets) and torch.equal(b.targets, targets)
        assert torch.equal(a.images, images)
        assert b.images.shape == images.shape and b.images.dtype == torch.uint8


@pytest.mark.slow
def test_bench_io_runs_every_loader_and_draws(tmp_path, tiny_imagefolder):
    figure, record = tmp_path / "io.png", tmp_path / "io" / "bench_io_per_core.json"
    proc = run_tool("io", tiny_imagefolder, "--images", "32", "--image-size", "32", "-b", "8",
                    "--passes", "2", "--workers", "1", "--figure", figure, "--json", record)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and "img/s" not in line]
    assert rows[:5] == ["decode PIL", "decode torchvision", "classic ImageFolder", "timm loader",
                        "pytorch backend"]
    import torch

    # with a GPU, "DALI cpu" and a "DALI gpu" row after the stage rows
    assert rows[5:8] == ["DALI cpu" if torch.cuda.is_available() else "DALI CPU-only",
                         "DALI CPU stage: random-crop decode", "DALI CPU stage: + resize to 32"]
    assert figure.stat().st_size > 10_000
    # the record alone gives RESULTS.md the same table and the same figure
    saved = json.loads(record.read_text())
    assert list(saved["results"]) == rows
    assert all(len(r["runs"]) == 2 for r in saved["results"].values())
    # /proc/stat counts in clock ticks: a pass this short may see none
    cpu = [r["cpu_ms_per_image"] for r in saved["results"].values()]
    assert all(ms is not None and ms >= 0 for ms in cpu) and sum(cpu) > 0
    from imagenet_recipes.bench import io, regenerate

    figures = tmp_path / "figures"
    figures.mkdir()
    block = regenerate.io_block(record.parent, figures)
    assert block.strip() in proc.stdout
    assert (figures / "io_per_core.png").read_bytes() == figure.read_bytes()
    assert "What the `pytorch` backend feeds one GPU" not in block  # no H200 record here
    # with the H200's record beside it, the estimate from the one-worker rate
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "h200_scripts.json").write_text(json.dumps({"rows": [
        {"name": "nd-synthetic", "img_s": 5000.0},
        {"name": "pytorch-loader", "img_s": 3000.0, "detail": {"workers": 15}}]}))
    block = regenerate.io_block(record.parent, figures)
    rate = saved["results"]["pytorch backend"]["img_s"]
    assert f"| 16 | {15 * rate:,.0f} ({15 * rate / 5000:.2f}x) | 3,000 (0.60x) |" in block
    assert io.gpu_feed_estimate(saved, None) is None


@pytest.mark.slow
def test_a_tool_runs_from_any_folder_with_no_pythonpath(tmp_path):
    """The installed package, as a user with their own environment runs it: from another
    folder, nothing on PYTHONPATH. The commands it prints are the entry scripts' paths."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "imagenet_recipes.bench.sweep", "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(REPO / "train" / "ddp.py") in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_bench_recipes_scales_each_preset_to_the_budget_and_runs_it(tmp_path):
    out, data = tmp_path / "study", tmp_path / "data"
    # the tiny model, loading in the trainer: what is checked is how each preset is scaled
    proc = run_tool("recipes", "--epochs", "2", "--classes", "4", "--train-per-class", "8",
                    "--val-per-class", "3", "--image-size", "32", "-b", "8", "-a", TINY[1],
                    "-j", "0", "--data", data, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "val top-1 final" in line]
    assert [line.split(":")[0] for line in lines] == ["torchvision_v1-s0", "torchvision_v2-s0"]
    assert "EMA final" in lines[1]
    v2 = read_jsonl(out / "torchvision_v2-s0")[0]["config"]
    # epoch counts and sizes in proportion: 5 of 600 warm-up epochs, 176/232/224 px of 224
    assert (v2["epochs"], v2["image_size"], v2["val_resize_size"], v2["val_crop_size"]) == (
        2, 25, 33, 32)
    assert v2["warmup_epochs"] == pytest.approx(5 / 300, rel=1e-3)
    # the EMA keeps its share of the run: 1 - 2e-5 x 1,281,167 / 32 images, every step
    assert v2["model_ema_steps"] == 1
    assert v2["model_ema_decay"] == pytest.approx(1 - 2e-5 * 1281167 / 32, rel=1e-5)


# pytorch/examples' imagenet/main.py prints these (its format, as of 2025); ours prints the others.
PEER_LINES = [
    (2.9, "Using device: cpu"),
    (5.8, "Epoch: [0][ 1/3]\tTime  2.607 ( 2.607)\tData  0.183 ( 0.183)\tLoss 7.0e+00 (7.0e+00)"),
    (8.4, "Epoch: [0][ 2/3]\tTime  2.588 ( 2.597)\tData  0.005 ( 0.094)\tLoss 6.9e+00 (6.9e+00)"),
    (9.2, "Epoch: [0][ 3/3]\tTime  0.848 ( 2.014)\tData  0.004 ( 0.064)\tLoss 6.8e+00 (6.8e+00)"),
    (11.1, "Test: [1/2]\tTime  1.886 ( 1.886)\tLoss 5.9e+05 (5.9e+05)\tAcc@1  0.00 (  0.00)"),
    (11.6, "Test: [2/2]\tTime  0.500 ( 1.193)\tLoss 3.6e+05 (4.7e+05)\tAcc@1 25.00 ( 12.50)"),
    (11.7, " *   Acc@1 11.000 Acc@5 50.000"),
]
OUR_LINES = [
    (3.2, "2026-11-23 16:44:20  => nd: resnet18 on 1 process(es), device cpu, O0 float32"),
    (5.7, "2026-11-23 16:44:23  Epoch [0][1/2]  loss 2.3084  top1  21.88  top5  53.12  "
          "lr 0.0125  img/s 12.5 (12.5/proc)  data 0.162s  step 2.500s  ETA epoch 0:00:02"),
    (7.8, "2026-11-23 16:44:25  Epoch [0][2/2]  loss 2.3658  top1  21.88  top5  53.12  "
          "lr 0.0125  img/s 15.8 (15.8/proc)  data 0.024s  step 2.100s  ETA epoch 0:00:00"),
    (7.8, "2026-11-23 16:44:25   * Train epoch 0: loss 2.3  top1 21.9  top5 53.1  14 img/s"),
    (10.8, "2026-11-23 16:44:28   * Val epoch 0: loss 3.7004  top1 31.000  top5 81.000  "
           "(100 images, 3.0s)  best top1 31.000"),
]


# timm's train.py prints these (its format, as of timm 1.0), steps numbered from 0.
TIMM_LINES = [
    (1.0, "Training with a single process on 1 device (cpu)."),
    (4.0, "Train: 0 [   0/2 ( 50%)]  Loss: 6.89 (6.89)  Time: 2.910s,    2.75/s  (2.910s,    "
          "2.75/s)  LR: 1.000e-05  Data: 0.215 (0.215)"),
    (5.0, "Train: 0 [   1/2 (100%)]  Loss: 7.05 (6.97)  Time: 0.991s,    8.07/s  (1.950s,    "
          "4.10/s)  LR: 1.000e-05  Data: 0.056 (0.136)"),
    (6.0, "Test: [   0/1]  Time: 1.555 (1.555)  Loss:   6.902 ( 6.902)  Acc@1:   0.000"),
    (6.5, "Test: [   1/1]  Time: 0.068 (0.812)  Loss:   6.968 ( 6.935)  Acc@1:   0.000"),
    (6.7, "Current checkpoints:"),
    (8.0, "Train: 1 [   0/2 ( 50%)]  Loss: 6.96 (6.96)  Time: 0.593s,   13.49/s  (0.593s,   "
          "13.49/s)  LR: 6.330e-04  Data: 0.074 (0.074)"),
    (9.5, "Train: 1 [   1/2 (100%)]  Loss: 6.83 (6.89)  Time: 0.061s,  131.10/s  (0.327s,   "
          "24.47/s)  LR: 6.330e-04  Data: 0.002 (0.038)"),
    (10.0, "Test: [   0/1]  Time: 0.028 (0.028)  Loss:   6.810 ( 6.810)  Acc@1:   0.000"),
    (10.5, "Test: [   1/1]  Time: 0.017 (0.023)  Loss:   6.945 ( 6.878)  Acc@1:   0.000"),
]


# torchvision's references/classification/train.py prints these (its MetricLogger's format):
# the data column is the median of its last 20 steps, so no data wait is read from it.
TORCHVISION_LINES = [
    (2.0, "Creating model"),
    (5.0, "Epoch: [0]  [0/2]  eta: 0:00:05  lr: 0.1  img/s: 3.1  loss: 6.9 (6.9)  "
          "acc1: 0.0 (0.0)  acc5: 0.0 (0.0)  time: 2.5  data: 0.2000 (0.2000)"),
    (6.0, "Epoch: [0]  [1/2]  eta: 0:00:00  lr: 0.1  img/s: 9.2  loss: 6.8 (6.9)  "
          "acc1: 0.0 (0.0)  acc5: 0.0 (0.0)  time: 1.0  data: 0.1000 (0.1500)"),
    (6.1, "Epoch: [0] Total time: 0:00:03"),
    (7.0, "Test:   [0/1]  eta: 0:00:00  loss: 6.9 (6.9)  acc1: 0.0 (0.0)  acc5: 50.0 (50.0)"),
    (7.1, "Test:  Total time: 0:00:00"),
    (7.5, "Test:  Acc@1 0.000 Acc@5 50.000"),
    (8.5, "Epoch: [1]  [0/2]  eta: 0:00:01  lr: 0.1  img/s: 8.0  loss: 6.8 (6.8)  "
          "acc1: 0.0 (0.0)  acc5: 0.0 (0.0)  time: 1.0  data: 0.1000 (0.1000)"),
    (9.5, "Epoch: [1]  [1/2]  eta: 0:00:00  lr: 0.1  img/s: 8.0  loss: 6.8 (6.8)  "
          "acc1: 0.0 (0.0)  acc5: 0.0 (0.0)  time: 1.0  data: 0.1000 (0.1000)"),
    (10.5, "Test:  Acc@1 0.000 Acc@5 50.000"),
    (11.0, "Training time 0:00:09"),
]


@pytest.mark.parametrize("name,lines,expected", [
    ("pytorch/examples", PEER_LINES, {"start-up and first step": 5.8, "training": 3.4,
                                      "validation": 2.5, "end": 1.3, "steps": 3,
                                      "data wait": 0.192, "epoch training": []}),
    ("ours", OUR_LINES, {"start-up and first step": 5.7, "training": 2.1, "validation": 3.0,
                         "end": 2.2, "steps": 2, "data wait": 0.186, "epoch training": []}),
    # epoch 1's training runs from the end of epoch 0's validation (6.5, checkpoint included)
    # to its last step (9.5)
    ("timm defaults", TIMM_LINES, {"start-up and first step": 4.0, "training": 1.0 + 3.0,
                                   "validation": 1.5 + 1.0, "end": 2.5, "steps": 4,
                                   "data wait": 0.347, "epoch training": [3.0]}),
    # epoch 1 from the end of epoch 0's validation (7.5) to its last step (9.5)
    ("torchvision reference", TORCHVISION_LINES, {
        "start-up and first step": 5.0, "training": 1.0 + 2.0, "validation": 1.5 + 1.0,
        "end": 2.5, "steps": 4, "data wait": None, "epoch training": [2.0]}),
])
def test_bench_e2e_splits_the_wall_time_by_each_scripts_own_lines(name, lines, expected):
    from imagenet_recipes.bench import e2e

    split = e2e.phases(lines, 13.0, e2e.output_of(name))
    spans = split.pop("epoch training")
    assert spans == pytest.approx(expected.pop("epoch training"))
    assert split.pop("data wait") == pytest.approx(expected.pop("data wait"))
    assert split == pytest.approx({"wall": 13.0, **expected})
    assert sum(split[p] for p in e2e.PHASES) == pytest.approx(13.0)


def test_bench_e2e_steady_state_is_the_training_rate_of_epochs_after_the_first():
    from imagenet_recipes.bench import e2e

    runs = [{"contender": c, "repeat": 0, "wall": w, "epoch training": spans}
            for c, w, spans in (("nd defaults", 20.0, [4.0, 4.0]),
                                ("pytorch/examples", 30.0, [6.0, 10.0]),
                                ("timm defaults", 25.0, [5.0, 5.0]))]
    record = {"images": {"train": 100}, "runs": runs}
    assert e2e.steady_img_s(runs[0], 100) == pytest.approx(25.0)
    wall, steady = e2e.ratios(record), e2e.ratios(record, steady=True)
    versus = ("nd defaults", "pytorch/examples"), ("nd defaults", "timm defaults")
    assert set(wall) == set(steady) == set(versus)
    assert [wall[pair] for pair in versus] == [pytest.approx([1.5]), pytest.approx([1.25])]
    assert [steady[pair] for pair in versus] == [pytest.approx([2.0]), pytest.approx([1.25])]


def test_bench_e2e_thread_settings_are_the_fast_command_under_each_setting():
    from argparse import Namespace
    from imagenet_recipes.bench import e2e

    args = Namespace(arch="resnet18", batch_size=32, workers=2, epochs=3, peer=REPO / "main.py",
                     timm=None, torchvision=None, compile=False, threads=True, only=["nd fast"])
    named = e2e.contenders(args, gpu=False, fast_amp=True)
    fast = named["nd fast"]
    assert named["nd fast, OMP passive"] == ["OMP_WAIT_POLICY=PASSIVE", *fast]
    assert named["nd fast, OMP pinned"] == ["OMP_PROC_BIND=close", "OMP_PLACES=cores", *fast]
    assert named["nd fast, 1 compute thread"] == ["OMP_NUM_THREADS=1", *fast]
    j = fast.index("-j")
    assert named["nd fast, -j 1"] == fast[:j + 1] + ["1"] + fast[j + 2:]
    assert named["nd fast, -j 4"] == fast[:j + 1] + ["4"] + fast[j + 2:]
    assert e2e._shown(named["nd fast, OMP pinned"], {}).startswith(
        "OMP_PROC_BIND=close OMP_PLACES=cores python train/nd.py -a resnet18")
    # each setting is compared with the fast settings as they are, repeat by repeat
    runs = [{"contender": name, "repeat": 0, "wall": 10.0 + i, "epoch training": [5.0 + i]}
            for i, name in enumerate(named)]
    steady = e2e.ratios({"images": {"train": 100}, "runs": runs}, steady=True)
    assert set(steady) == {(name, "nd fast") for name in named if name != "nd fast"}
    assert steady[("nd fast, OMP passive", "nd fast")] == pytest.approx([5.0 / 6.0])
    # without --threads, none of them
    args.threads = False
    assert list(e2e.contenders(args, gpu=False, fast_amp=True)) == ["nd fast"]


def test_bench_e2e_with_a_gpu_runs_each_gpu_decoding_backend_and_torchvision_with_amp(
        monkeypatch):
    from argparse import Namespace
    from imagenet_recipes.bench import e2e

    args = Namespace(arch="resnet50", batch_size=256, workers=15, epochs=3, peer=None,
                     timm=REPO / "train.py", torchvision=REPO / "tv" / "train.py",
                     compile=False, threads=False, only=None)
    monkeypatch.setattr(e2e, "installed", lambda package: package == "torchcodec")
    named = e2e.contenders(args, gpu=True, fast_amp=True)
    assert list(named) == ["timm defaults", "timm fast", "torchvision reference",
                           "nd defaults", "nd fast", "nd gpu decode"]  # no DALI here
    fast = named["nd fast"]
    assert "--data-backend" not in fast  # on a GPU the fast settings keep the default loader
    assert fast[-4:] == ["--opt-level", "O1", "--amp-dtype", "float16"]
    assert named["nd gpu decode"] == fast + ["--data-backend", "gpu"]
    assert named["torchvision reference"][-5:] == ["--print-freq", "1", "--device", "cuda",
                                                   "--amp"]
    # torchvision with --amp is compared with ours in half precision; without, with fp32
    runs = [{"contender": name, "repeat": 0, "wall": 10.0 + i, "epoch training": [4.0]}
            for i, name in enumerate(named)]
    commands = {name: e2e._shown(cmd, {"timm": args.timm, e2e.TORCHVISION: args.torchvision})
                for name, cmd in named.items()}
    wall = e2e.ratios({"images": {"train": 100}, "runs": runs, "commands": commands})
    assert wall[("nd fast", e2e.TORCHVISION)] == pytest.approx([12.0 / 14.0])
    assert wall[("nd gpu decode", e2e.TORCHVISION)] == pytest.approx([12.0 / 15.0])
    assert wall[("nd gpu decode", "timm fast")] == pytest.approx([11.0 / 15.0])
    assert ("nd defaults", e2e.TORCHVISION) not in wall
    without_amp = {**commands, e2e.TORCHVISION: "python train.py --model resnet50"}
    wall = e2e.ratios({"images": {"train": 100}, "runs": runs, "commands": without_amp})
    assert ("nd fast", e2e.TORCHVISION) not in wall
    assert wall[("nd defaults", e2e.TORCHVISION)] == pytest.approx([12.0 / 13.0])


def test_bench_e2e_without_any_peer_script_says_what_to_give(capsys):
    from imagenet_recipes.bench import e2e

    with pytest.raises(SystemExit) as end:
        e2e.main(["--epochs", "1"])
    assert end.value.code == 2
    assert "give --peer, --timm or --torchvision" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_e2e_starts_a_command_with_its_environment_words(tmp_path, monkeypatch):
    import sys

    from imagenet_recipes.bench import e2e

    monkeypatch.setenv("PYTHONPATH", "somewhere")
    _, lines = e2e.run_stamped(["E2E_SETTING=on", sys.executable, "-c",
                                "import os; print(os.environ.get('E2E_SETTING'), "
                                "os.environ.get('PYTHONPATH'))"], tmp_path)
    assert lines[-1][1] == "on None"

# Stand-ins for the peers' scripts (which are never kept in this repository): the same options,
# the same kind of output lines, a little work per step. Started as a user starts them, they
# see no PYTHONPATH (their caller's is not theirs).
STAND_IN_PEER = r"""
import argparse, os, time
assert "PYTHONPATH" not in os.environ, os.environ["PYTHONPATH"]
p = argparse.ArgumentParser()
for flag in ("-a", "-b", "-j", "--epochs", "-p"):
    p.add_argument(flag)
p.add_argument("--no-accel", action="store_true")
p.add_argument("data")
args = p.parse_args()
assert args.no_accel and args.p == "1", "the tool must pass -p 1 and, without a GPU, --no-accel"
time.sleep(0.3)
for epoch in range(int(args.epochs)):
    for i in range(3):
        time.sleep(0.2)
        print(f"Epoch: [{epoch}][{i + 1}/3]\tTime  0.200 ( 0.200)\tData  0.010 ( 0.010)")
    time.sleep(0.2)
    print(" *   Acc@1 10.000 Acc@5 50.000")
"""
STAND_IN_TIMM = r"""
import argparse, os, time
assert "PYTHONPATH" not in os.environ, os.environ["PYTHONPATH"]
p = argparse.ArgumentParser()
for flag in ("--model", "-b", "-j", "--epochs", "--log-interval", "--device", "--data-dir",
             "--train-split", "--val-split", "--color-jitter", "--smoothing", "--opt",
             "--train-interpolation", "--interpolation", "--crop-pct", "--output", "--amp-dtype"):
    p.add_argument(flag)
p.add_argument("--amp", action="store_true")
p.add_argument("--channels-last", action="store_true")
args = p.parse_args()
assert args.log_interval == "1" and args.device == "cpu" and args.opt == "momentum"
assert not args.amp, "--fast-amp off: no autocast in the fast settings"
assert os.path.isdir(os.path.join(args.data_dir, args.train_split))
for epoch in range(int(args.epochs)):
    for i in range(2):
        time.sleep(0.2)
        print(f"Train: {epoch} [{i:>4d}/2 (50%)]  Loss: 6.89 (6.89)  Data: 0.010 (0.010)")
    print("Test: [   0/0]  Time: 0.068 (0.812)  Loss:   6.968 ( 6.935)")
"""
STAND_IN_TORCHVISION = r"""
import argparse, os, time
assert "PYTHONPATH" not in os.environ, os.environ["PYTHONPATH"]
p = argparse.ArgumentParser()
for flag in ("--model", "-b", "-j", "--epochs", "--print-freq", "--device", "--data-path"):
    p.add_argument(flag)
p.add_argument("--amp", action="store_true")
args = p.parse_args()
assert args.print_freq == "1" and args.device == "cpu"
assert not args.amp, "its --amp is CUDA's: never on a CPU"
assert os.path.isdir(os.path.join(args.data_path, "train"))
for epoch in range(int(args.epochs)):
    for i in range(2):
        time.sleep(0.2)
        print(f"Epoch: [{epoch}]  [{i}/2]  eta: 0:00:00  lr: 0.1  loss: 6.9 (6.9)  "
              "time: 0.2  data: 0.0100 (0.0100)")
    print("Test:  Acc@1 25.000 Acc@5 100.000")
"""


def stand_in_peers(folder):
    """The stand-ins where their projects keep the real scripts: (main.py, timm's train.py,
    torchvision's references/classification/train.py)."""
    peer, timm = folder / "main.py", folder / "train.py"
    torchvision = folder / "vision" / "references" / "classification" / "train.py"
    torchvision.parent.mkdir(parents=True)
    for path, text in ((peer, STAND_IN_PEER), (timm, STAND_IN_TIMM),
                       (torchvision, STAND_IN_TORCHVISION)):
        path.write_text(text)
    return peer, timm, torchvision


@pytest.mark.slow
def test_bench_e2e_runs_our_script_against_the_peers_in_turns(tmp_path, tiny_imagefolder):
    from imagenet_recipes.bench import e2e, regenerate

    peer, timm, torchvision = stand_in_peers(tmp_path)
    record = tmp_path / "e2e" / "bench_e2e.json"
    # a PYTHONPATH of the tool's caller, which the peers must not get (the stand-ins check)
    # torchvision's mobilenet_v3_small: the peers train at 224 px, where resnet18 spent most of
    # the test's two minutes computing; 1/30 of its operations
    proc = run_tool("e2e", tiny_imagefolder, "--peer", peer, "--timm", timm,
                    "--torchvision", torchvision, "-a", "mobilenet_v3_small", "-b", "8", "-j", "1", "--epochs", "2",
                    "--repeats", "2", "--fast-amp", "off", "--json", record, timeout=900,
                    env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads(record.read_text())
    runs = saved["runs"]
    # in turns: repeat 0 of every contender, then repeat 1
    names = ("pytorch/examples", "timm defaults", "timm fast", "torchvision reference",
             "nd defaults", "nd fast")
    assert [(r["contender"], r["repeat"]) for r in runs] == [
        (name, repeat) for repeat in (0, 1) for name in names]
    steps = {"pytorch/examples": 3, "timm defaults": 2, "timm fast": 2,
             "torchvision reference": 2}
    for r in runs:
        assert sum(r[p] for p in e2e.PHASES) == pytest.approx(r["wall"], abs=0.01)
        assert r["steps"] == 2 * steps.get(r["contender"], 64 // 8)
        assert len(r["epoch training"]) == 1 and r["epoch training"][0] > 0
    assert saved["commands"]["timm fast"].startswith("python train.py --model mobilenet_v3_small")
    assert "--channels-last" in saved["commands"]["timm fast"]
    assert "--data-backend dali-cpu" in saved["commands"]["nd fast"]
    assert "--opt-level" not in saved["commands"]["nd fast"]  # --fast-amp off
    assert saved["commands"]["torchvision reference"].startswith(
        "python references/classification/train.py --model mobilenet_v3_small")
    assert set(saved["sha256"]) == {"pytorch/examples", "timm", "torchvision reference"}
    ratios = e2e.ratios(saved)
    assert set(ratios) == {("nd defaults", "pytorch/examples"), ("nd defaults", "timm defaults"),
                           ("nd fast", "timm fast"), ("nd fast", "pytorch/examples"),
                           ("nd defaults", "torchvision reference")}
    assert all(len(v) == 2 for v in ratios.values())
    assert set(e2e.ratios(saved, steady=True)) == set(ratios)
    # the record alone gives RESULTS.md the same block
    assert regenerate.e2e_block(record.parent, tmp_path).strip() in proc.stdout


@pytest.mark.slow
def test_bench_e2e_without_the_peer_script_says_where_to_get_it(tmp_path):
    proc = run_tool("e2e", "--peer", tmp_path / "main.py")
    assert proc.returncode == 2
    assert "pytorch/examples" in proc.stderr and "Traceback" not in proc.stderr


