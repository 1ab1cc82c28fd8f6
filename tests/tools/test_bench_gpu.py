"""bench.gpu, the GPU throughput benchmark, on a CPU: the real tool with a tiny configuration
(the numbers mean nothing here; the record's structure and arithmetic do), its exit statuses,
its clean-up of the processes it starts, and the RESULTS.md block it renders."""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, proc_stat, run_tool
from step_hold import plant_env

from imagenet_recipes.bench import gpu
from imagenet_recipes.bench.gpu import cli, loaders, peers, report, scripts, units

TINY = ["--device", "cpu", "-a", "timm/test_resnet", "--image-size", "32", "-b", "4",
        "--steps", "2", "--warmup", "1", "--repeats", "2", "--amp-dtype", "bfloat16", "-j", "1"]


@pytest.mark.slow
def test_on_a_cpu_it_measures_the_pair_ddp_and_the_loader_and_keeps_a_record(tmp_path):
    record_path = tmp_path / "gpu" / "cpu.json"
    # engine_bare=0: a loaded 2-core machine may time the engine below the bare loop, and
    # --strict must then still pass: every target here is met by construction (the gpu
    # backend decodes on the CPU here, in the training process).
    proc = run_tool("gpu", *TINY, "--only", "O1-bf16,ddp-1rank,pytorch-loader,gpu-decode",
                    "--strict", "--target", "engine_bare=0", "--target",
                    "gpu_decode_synthetic=0", "--json", record_path,
                    "--out", tmp_path / "out", "--data", tmp_path / "jpegs",
                    "--commit", "abc1234", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert record["tool"] == "bench.gpu" and record["complete"] is True
    assert record["command"].startswith("python -m imagenet_recipes.bench.gpu --device cpu")
    # where the record went, and the commit named for a copied tree, say nothing of the run
    assert "--json" not in record["command"] and "--commit" not in record["command"]
    assert record["commit"] == "abc1234" and record["date"]
    env = record["environment"]
    assert env["device"] == "cpu" and env["gpu"] is None and env["cpu_cores"] >= 1
    assert env["torch"] == torch.__version__
    # ddp-1rank and the loaders bring their reference, nd-synthetic
    assert record["units"] == ["O1-bf16", "nd-synthetic", "ddp-1rank", "pytorch-loader",
                               "gpu-decode"]
    rows = {r["name"]: r for r in record["rows"]}
    assert list(rows) == ["bare-O1-bf16", "engine-O1-bf16", "nd-synthetic", "ddp-1rank",
                          "pytorch-loader", "gpu-decode"]
    assert rows["gpu-decode"]["targets"][0]["name"] == "gpu_decode_synthetic"
    assert "--data-backend gpu," in rows["gpu-decode"]["config"]
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["img_s"] > 0 and all(x > 0 for x in row["repeats"])
        assert row["peak_bytes"] is None  # CUDA only
        ref = row["reference"]
        if ref is None:
            assert row["ratio"] is None
        else:
            assert row["ratio"] == pytest.approx(row["img_s"] / rows[ref]["img_s"])
    for name in ("bare-O1-bf16", "engine-O1-bf16", "nd-synthetic", "ddp-1rank"):
        assert len(rows[name]["repeats"]) == 2
        assert rows[name]["img_s"] == pytest.approx(statistics.median(rows[name]["repeats"]))
    engine = rows["engine-O1-bf16"]
    assert engine["reference"] == "bare-O1-bf16"
    assert engine["detail"]["max_weight_diff"] == 0  # the same math on both sides
    assert engine["targets"] == [{"name": "engine_bare", "text": "engine/bare >= 0", "min": 0.0,
                                  "value": engine["ratio"], "met": True}]
    assert rows["ddp-1rank"]["detail"]["backend"] == "gloo"
    assert rows["ddp-1rank"]["reference"] == "nd-synthetic"
    loader = rows["pytorch-loader"]["detail"]
    window = 10 * loader["workers"] * loader["prefetch_factor"]
    assert loader["workers"] == 1 and loader["window_batches"] >= window
    assert len(rows["pytorch-loader"]["repeats"]) == 10  # intervals of workers x prefetch
    # img/s over the window: its images over its seconds, not a mean of interval rates
    logged = [json.loads(line) for line in
              (tmp_path / "out/runs/pytorch-loader/log.jsonl").read_text().splitlines()]
    warm_up, *train = [r for r in logged if r["kind"] == "train"]
    assert train[-1]["epoch_step"] - warm_up["epoch_step"] == window
    seconds = sum(r["count"] / r["img_s"] for r in train)
    assert rows["pytorch-loader"]["img_s"] == pytest.approx(sum(r["count"] for r in train)
                                                            / seconds)
    ddp_run = [json.loads(line) for line in
               (tmp_path / "out/runs/ddp-1rank/log.jsonl").read_text().splitlines()][0]
    assert ddp_run["world_size"] == 1 and ddp_run["entry"] == "ddp"

    # the RESULTS.md block from this record
    text = report.block(record_path.parent)
    assert "No GPU record" not in text and "no GPU (a CPU check of the tool)" in text
    assert "`step-*` rows" not in text  # no causes row here
    for name in rows:
        assert f"| {name} [1] |" in text


STAND_IN_TIMM_BENCHMARK = r"""
import argparse, json
p = argparse.ArgumentParser()
for flag in ("--bench", "--model", "--amp-dtype", "-b", "--img-size", "--num-classes",
             "--device", "--num-warm-iter", "--num-bench-iter"):
    p.add_argument(flag)
for flag in ("--amp", "--channels-last", "--no-retry"):
    p.add_argument(flag, action="store_true")
p.add_argument("--torchcompile", nargs="?", const="inductor")
a = p.parse_args()
assert a.bench == "train" and a.amp and a.channels_last and a.num_bench_iter == "4"
print("Running train benchmark on", a.model)
print("--result\n" + json.dumps({"model": a.model, "train_samples_per_sec":
                                 234.5 if a.torchcompile else 123.4}, indent=4))
"""


@pytest.mark.slow
def test_on_a_cpu_the_causes_group_changes_one_thing_per_row(tmp_path):
    """What DDP's cost on one GPU and the gap to timm's benchmark are made of: the step with
    one thing changed (DDP in a world of one with each option, no loss scaler, timm's work),
    and nd.py under torchrun; the DDP variants do the same math as the plain step."""
    record_path = tmp_path / "causes.json"
    tiny = [*TINY, "--amp-dtype", "float16"]  # the loss scaler runs: what two rows remove
    proc = run_tool("gpu", *tiny, "--only", "step-eager,nd-torchrun", "--json", record_path,
                    "--out", tmp_path / "out", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(record_path.read_text())["rows"]}
    assert list(rows) == ["nd-synthetic", "step-plain", "step-no-scaler", "step-timm-work",
                          "step-ddp", "step-ddp-bucket-view", "step-ddp-no-broadcast",
                          "nd-torchrun"]
    for name, row in rows.items():
        assert row["status"] == "ok" and row["img_s"] > 0, row
        if name != "step-plain" and name.startswith("step-"):
            assert row["reference"] == "step-plain"
            assert row["ratio"] == pytest.approx(row["img_s"] / rows["step-plain"]["img_s"])
    for name in ("step-ddp", "step-ddp-bucket-view", "step-ddp-no-broadcast"):
        assert rows[name]["detail"]["max_weight_diff"] == 0, name  # DDP adds no math
    for name in ("step-no-scaler", "step-timm-work"):  # other work: no parity claimed
        assert rows[name]["detail"]["max_weight_diff"] is None
    assert rows["nd-torchrun"]["reference"] == "nd-synthetic"
    assert rows["nd-torchrun"]["config"].startswith("torchrun --nproc_per_node=1 train/nd.py")
    run = [json.loads(line) for line in
           (tmp_path / "out/runs/nd-torchrun/log.jsonl").read_text().splitlines()][0]
    assert run["entry"] == "nd" and run["world_size"] == 1
    # RESULTS.md's block says how these rows are measured (only where it shows them)
    assert "the `step-*` rows (`--group causes`)" in report.block(record_path.parent)


@pytest.mark.slow
def test_timms_benchmark_runs_eager_then_compiled_beside_the_step_doing_its_work(tmp_path):
    script = tmp_path / "benchmark.py"
    script.write_text(STAND_IN_TIMM_BENCHMARK)
    args = cli.parse_cli([*TINY, "--timm-benchmark", str(script)])
    unit = units.UNITS["timm-benchmark"]
    assert unit.needs == ("step-eager", "step-compiled")
    rows = peers.measure_timm_benchmark(scripts.Context(args, tmp_path / "out"), unit)
    assert [(r["name"], r["img_s"], r["reference"]) for r in rows] == [
        ("timm-benchmark", 123.4, "step-timm-work"),
        ("timm-benchmark-compiled", 234.5, "step-compiled-timm-work")]
    assert rows[0]["config"].startswith("timm benchmark.py --bench train --model timm/test_resnet")
    assert "--torchcompile" in rows[1]["config"] and "--torchcompile" not in rows[0]["config"]
    assert "Running train benchmark" in (tmp_path / "out/timm-benchmark.console.txt").read_text()
    # not given: the unit is skipped, saying so
    with pytest.raises(units.Skip, match="--timm-benchmark"):
        peers.measure_timm_benchmark(scripts.Context(cli.parse_cli(TINY), tmp_path), unit)
    with pytest.raises(units.Failure, match="no --result"):
        peers.timm_benchmark_rate("Running train benchmark\n")


@pytest.mark.slow
def test_strict_exits_1_when_a_target_is_missed(tmp_path):
    record_path = tmp_path / "r.json"
    proc = run_tool("gpu", "--device", "cpu", "-a", "timm/test_resnet", "--image-size", "32",
                    "-b", "4", "--steps", "1", "--warmup", "0", "--repeats", "1", "--amp-dtype",
                    "bfloat16", "--only", "O1-bf16", "--strict",
                    "--target", "engine_bare=1e9", "--json", record_path, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "TARGET MISSED  engine-O1-bf16: engine/bare >= 1e+09" in proc.stdout
    engine = json.loads(record_path.read_text())["rows"][1]
    assert engine["targets"][0]["met"] is False
    assert "**MISSED**" in report.block(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_device_cuda_without_a_gpu_exits_2_with_one_line():
    proc = run_tool("gpu", "--only", "O1-fp16")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no CUDA GPU" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--only", "warp-drive"], "--only: unknown warp-drive"),
    (["--group", "everything"], "--group: unknown everything"),
    (["--target", "speed=3"], "unknown target 'speed'"),
])
def test_bad_arguments_exit_2_naming_them(args, message, capsys):
    """In the process: the tool's own exit status is the test above's."""
    with pytest.raises(SystemExit) as exit_:
        gpu.main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_package_offers_main_block_and_records_and_its_docstring_as_help(tmp_path, capsys):
    """`from imagenet_recipes.bench import gpu`: what bench.regenerate and a caller use, whichever
    module of the package defines it; --help is the package's docstring."""
    assert gpu.main(["--list"]) == 0
    assert capsys.readouterr().out.startswith("loop:\n  O1-fp16 ")
    assert gpu.records(tmp_path) == []
    assert gpu.block(tmp_path).startswith("**No GPU record exists yet.**")
    with pytest.raises(SystemExit):
        cli.parse_cli(["--help"])
    shown = capsys.readouterr().out
    assert gpu.__doc__.split("\n")[0] in shown and "--group" in shown and "Exit status" in shown


def test_a_unit_brings_the_units_its_targets_compare_with():
    assert units.select(None, "O2-fp16") == ["O1-fp16", "O2-fp16"]
    assert units.select(None, "dali-gpu") == ["nd-synthetic", "dali-gpu"]
    assert units.select("loop", None) == ["O1-fp16", "O2-fp16", "O1-bf16", "O2-bf16"]
    assert units.select(None, None) == list(units.UNITS)


def _peers_record(walls: dict, spans: dict) -> dict:
    """A bench.e2e record of 2 repeats: contender -> (wall of repeat 0, of repeat 1) and
    contender -> seconds of epoch 2's training (200 images)."""
    commands = {"timm fast": "python train.py --model resnet50 --amp",
                "torchvision reference": "python references/classification/train.py --amp",
                "nd fast": "python train/nd.py -a resnet50 --opt-level O1"}
    return {"images": {"train": 200, "val": 20}, "commands": commands,
            "config": {"arch": "resnet50", "batch_size": 256, "workers": 15, "epochs": 2,
                       "repeats": 2},
            "runs": [{"contender": name, "repeat": repeat, "wall": wall[repeat],
                      "epoch training": [spans[name]]}
                     for repeat in (0, 1) for name, wall in walls.items()]}


def test_the_peers_rows_judge_ours_end_to_end_against_each_peer():
    record = _peers_record({"timm fast": (33.0, 36.0), "torchvision reference": (30.0, 30.0),
                            "nd fast": (30.0, 30.0)},
                           {"timm fast": 2.0, "torchvision reference": 2.5, "nd fast": 1.0})
    rows = peers.peer_rows(record, units.UNITS["peers"])
    units.assess(rows, units.TARGETS)
    by = {r["name"]: r for r in rows}
    ours = by["peers-nd-fast"]
    assert ours["status"] == "ok" and ours["img_s"] == pytest.approx(200.0)
    assert ours["reference"] == "peers-timm" and ours["ratio"] == pytest.approx(2.0)
    # timm took 1.10x and 1.20x our time: median 1.15, met; torchvision 1.0x: missed
    assert ours["detail"]["end_to_end"] == pytest.approx({"timm fast": 1.15,
                                                          "torchvision reference": 1.0})
    assert [(t["name"], t["met"]) for t in ours["targets"]] == [("vs_timm", True),
                                                                ("vs_torchvision", False)]
    assert by["peers-torchvision"]["img_s"] == pytest.approx(80.0)
    assert by["peers-torchvision"]["targets"] == []
    # what did not run here says why, and judges nothing
    assert by["peers-nd-gpu-decode"]["status"] == "skipped"
    assert "data backend is not installed" in by["peers-nd-gpu-decode"]["note"]
    assert units.missed(rows) == [
        "peers-nd-fast: torchvision reference's time/ours end to end >= 1.1 (1.000)"]


@pytest.mark.slow
def test_on_a_cpu_the_peers_group_runs_bench_e2e_with_the_peers_scripts(tmp_path,
                                                                       tiny_imagefolder):
    from test_benchmarks import stand_in_peers

    _, timm, torchvision = stand_in_peers(tmp_path)
    record_path = tmp_path / "gpu" / "peers.json"
    proc = run_tool("gpu", "--device", "cpu", "--group", "peers", "--timm", timm,
                    "--torchvision", torchvision, "-a", "mobilenet_v3_small", "-b", "8",
                    "-j", "1", "--peers-epochs", "2", "--peers-repeats", "1", "--peers-data",
                    tiny_imagefolder, "--json", record_path, "--out", tmp_path / "out",
                    timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(record_path.read_text())["rows"]}
    assert list(rows) == list(units.PEER_ROWS.values())
    for name in ("peers-nd-fast", "peers-timm", "peers-torchvision"):
        assert rows[name]["status"] == "ok" and rows[name]["img_s"] > 0, rows[name]
    # no GPU: the GPU-decoding contenders do not run
    assert rows["peers-nd-gpu-decode"]["status"] == "skipped"
    assert rows["peers-nd-dali-gpu"]["status"] == "skipped"
    ours = rows["peers-nd-fast"]
    assert "--opt-level" not in ours["config"]  # no autocast on a CPU: --fast-amp off
    # torchvision's reference ran without --amp, so it is compared with the defaults, which
    # this group does not run: not judged
    assert set(ours["detail"]["end_to_end"]) == {"timm fast"}
    assert [t["name"] for t in ours["targets"]] == ["vs_timm", "vs_torchvision"]
    assert ours["targets"][1]["met"] is None
    e2e_record = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert [r["contender"] for r in e2e_record["runs"]] == [
        "timm fast", "torchvision reference", "nd fast"]


@pytest.mark.slow
def test_a_child_and_everything_it_started_are_ended(tmp_path):
    """A run past its time is stopped with its whole process group (what torchrun or a
    trainer's loader workers would be), and so are runs still going when the tool ends."""
    pids = tmp_path / "pids"
    children = scripts.Children()
    script = f"sleep 60 & echo $! > {pids}; sleep 60"
    started = time.monotonic()
    with pytest.raises(units.Failure, match="still running after 1 s"):
        children.run(["bash", "-c", script], timeout=1)
    assert time.monotonic() - started < 30 and not children.live
    assert _gone(int(pids.read_text()))


@pytest.mark.slow
def test_the_tool_stopped_by_sigterm_leaves_no_process_behind(tmp_path):
    """SIGTERM while a run is going: the tool ends its run's group, keeps what it recorded,
    and exits 143."""
    marker = tmp_path / "started"
    code = ("import signal; from imagenet_recipes.bench.gpu import scripts\n"
            "signal.signal(signal.SIGTERM, scripts.stop_on_signal)\n"
            # the marker once the sleep is started: the group has both members by then
            f"scripts.CHILDREN.run(['bash', '-c', 'sleep 60 & echo $$ > {marker}; wait'], 120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    deadline = time.monotonic() + 60
    while not (marker.is_file() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    leader = int(marker.read_text())
    members = [pid for pid in _pids() if _group(pid) == leader]  # the bash and its sleep
    assert len(members) == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert all(_gone(pid) for pid in members)


def _pids() -> list:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _group(pid: int):
    try:
        return int(proc_stat(pid)[2])
    except (OSError, IndexError, ValueError):
        return None


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """Ended: no such process, or a zombie its new parent has not reaped yet."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if proc_stat(pid)[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def _record(date: str, rows: list, complete: bool = True) -> dict:
    return {"tool": "bench.gpu", "command": "python -m imagenet_recipes.bench.gpu --group loop",
            "commit": "abc1234", "date": date, "seconds": 150.0, "complete": complete,
            "environment": {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3",
                            "driver": "570.1", "torch": "2.15.0", "cuda": "13.2",
                            "cudnn": 92600, "nccl": "2.27.1", "nvidia-dali": "2.4.0",
                            "cpu": "AMD EPYC", "cpu_cores": 16},
            "rows": rows}


def _row(name: str, img_s: float, reference=None, **kw) -> dict:
    row = units.new_row(name, name, f"config of {name}", img_s, [img_s * 0.99, img_s, img_s],
                        reference, peak_bytes=12 * 2**30)
    row.update(kw)
    return row


def test_the_results_block_says_plainly_when_no_gpu_record_exists(tmp_path):
    assert report.block(tmp_path / "missing").startswith("**No GPU record exists yet.**")
    (tmp_path / "gpu_check.json").write_text(json.dumps({"results": []}))  # not bench.gpu's
    assert report.block(tmp_path).startswith("**No GPU record exists yet.**")


def test_the_results_block_shows_each_row_from_its_latest_record_and_keeps_the_earlier(
        tmp_path):
    old = [_row("bare-O1-fp16", 3000.0), _row("engine-O1-fp16", 2800.0, "bare-O1-fp16")]
    new = [_row("bare-O1-fp16", 3100.0), _row("engine-O1-fp16", 3050.0, "bare-O1-fp16"),
           dict(_row("dali-gpu", 0.0), status="skipped", note="nvidia.dali is not installed")]
    units.assess(old, units.TARGETS)
    units.assess(new, units.TARGETS)
    (tmp_path / "a.json").write_text(json.dumps(_record("2026-11-25 07:00 UTC", old)))
    (tmp_path / "b.json").write_text(json.dumps(_record("2026-11-25 08:00 UTC", new, False)))
    text = report.block(tmp_path)
    assert "[2] `launch/env.sh python -m imagenet_recipes.bench.gpu --group loop` on NVIDIA H100 80GB HBM3" in text
    # every row of the older record was measured again: the table shows the newer, and the
    # older measurements follow it, under their record's number
    table, earlier = text.split("Rows measured again in a later record")
    assert "[1]" not in "".join(line for line in table.splitlines() if line.startswith("| "))
    assert "[1] `launch/env.sh python -m imagenet_recipes.bench.gpu" in text
    assert [line.split(" |")[0] for line in earlier.splitlines() if line.startswith("| ")
            and not line.startswith("| row")] == ["| bare-O1-fp16 [1]", "| engine-O1-fp16 [1]"]
    assert "| 2,800.0 |" in earlier and "| 2,800.0 |" not in table
    assert "It was stopped before its end." in text
    engine = next(line for line in text.splitlines()
                  if line.startswith("| engine-O1-fp16 [2] |"))
    assert ("| img/s >= 3,000: met; engine/bare >= 0.97: met | 3,050.0 | 0.984x bare-O1-fp16 "
            "| 12.0 GiB | 3,020-3,050 |") in engine
    assert "| dali-gpu [2] | config of dali-gpu | skipped: nvidia.dali is not installed |" in text
    assert "Targets: 2 met, 0 missed." in text


PLANTS = REPO / "tests/plants/nvimgcodec"


def planted(fault: str) -> dict:
    """The environment of a run whose nvImageCodec decoder has `fault` (tests/plants)."""
    return {"PYTHONPATH": str(PLANTS), "RECIPES_PLANT_NVIMGCODEC": fault}


@pytest.mark.slow
def test_rows_decoded_on_the_cpu_are_not_shown_as_gpu_decoding(tmp_path):
    """nvImageCodec refusing every third image (a refusing stand-in, tests/plants): its decode
    row counts the images torchvision decoded on the CPU instead (a quarter of batches of 4),
    and with more than 1 % of them it is judged on that alone (share decoded on the GPU >=
    0.99: missed), never on a GPU-decoding target; the run's targets leave it out of the best
    GPU-decoding backend. TorchCodec's row, unplanted, decoded everything on its device."""
    from imagenet_recipes.bench.gpu import targets

    record_path = tmp_path / "gpu_decode.json"
    proc = run_tool("gpu", *TINY, "--group", "decode", "--decode-workers", "default", "--json",
                    record_path, "--out", tmp_path / "out", "--data", tmp_path / "jpegs",
                    env=planted("refuse-some"), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(record_path.read_text())["rows"]}
    refusing, whole = rows["decode-gpu-nvimgcodec"], rows["decode-gpu-torchcodec"]
    assert refusing["status"] == "ok", refusing
    assert refusing["detail"]["cpu_decoded_share"] == pytest.approx(0.25)
    assert [(t["name"], t["met"]) for t in refusing["targets"]] == [("gpu_decoded", False)]
    assert whole["detail"]["cpu_decoded"] == 0
    assert [t["name"] for t in whole["targets"]] == ["decode_capacity"]
    assert "25.0 % of its images decoded on the CPU by torchvision" in proc.stdout

    # the same judgement on a loader row (from its log), and by the run's targets
    gpu_row = dict(units.new_row("gpu-decode", "gpu-decode", "", 990.0, reference="nd-synthetic",
                                 cpu_decoded=0, cpu_decoded_share=0.0))
    nvimg_row = units.new_row("gpu-decode-nvimgcodec", "gpu-decode-nvimgcodec", "", 1000.0,
                              reference="nd-synthetic", cpu_decoded=5, cpu_decoded_share=0.05)
    rows = [units.new_row("nd-synthetic", "nd-synthetic", "", 1000.0), gpu_row, nvimg_row]
    units.assess(rows, units.TARGETS)
    assert [(t["name"], t["met"]) for t in nvimg_row["targets"]] == [("gpu_decoded", False)]
    assert [(t["name"], t["met"]) for t in gpu_row["targets"]] == [("gpu_decode_synthetic", True)]
    (tmp_path / "session").mkdir()
    (tmp_path / "session/gpu_scripts.json").write_text(json.dumps(
        {"environment": {"gpu": "NVIDIA H100 80GB HBM3"}, "rows": rows}))
    best = targets.judge(tmp_path / "session")[1]
    assert best["row"] == "gpu-decode" and best["value"] == pytest.approx(0.99) and best["met"]
    assert "gpu-decode-nvimgcodec: decoded on the CPU" in best["note"]
    log = {"train": [{"count": 8, "cpu_decoded": 1}, {"count": 8, "cpu_decoded": 3},
                     {"count": 8, "cpu_decoded": 4}]}
    assert loaders.decoded_on_cpu(log, warm=1) == (3, 16)


@pytest.mark.slow
def test_regions_refused_the_nvimgcodec_row_decodes_whole_images_saying_so(tmp_path):
    """--nvimgcodec-whole (gpu_session.sh's answer to a probe that finds nvImageCodec's regions
    broken and its whole images working), with every region refused: the nvImageCodec loader
    row trains on whole images, none of them decoded on the CPU, and its config and note say
    so with the cause."""
    record_path = tmp_path / "scripts.json"
    cause = "regions BROKEN: decoded nothing for 4 regions"
    proc = run_tool("gpu", *TINY, "--only", "gpu-decode-nvimgcodec", "--nvimgcodec-whole", cause,
                    "--json", record_path, "--out", tmp_path / "out", "--data",
                    tmp_path / "jpegs", env=planted("refuse-regions"), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = {r["name"]: r for r in json.loads(record_path.read_text())["rows"]}[
        "gpu-decode-nvimgcodec"]
    assert row["status"] == "ok" and row["img_s"] > 0, row
    assert "--gpu-decoder nvimgcodec-whole" in row["config"]
    assert row["note"] == f"whole images (--gpu-decoder nvimgcodec-whole), not regions: {cause}"
    assert row["detail"]["decoder"] == "nvimgcodec-whole"
    assert row["detail"]["cpu_decoded"] == 0


def test_the_decode_tool_refuses_a_folder_without_train_and_unknown_rows(tmp_path):
    from imagenet_recipes.bench import decode

    with pytest.raises(SystemExit):
        decode.parse_cli([str(tmp_path), "--device", "cpu"])
    (tmp_path / "train").mkdir()
    args = decode.parse_cli([str(tmp_path), "--device", "cpu", "--only", "pytorch,warp"])
    with pytest.raises(SystemExit, match="unknown rows"):
        decode.rows_to_run(args)
    assert decode.worker_counts(16) == [2, 4, 8, 15] and decode.worker_counts(2) == [1]


@pytest.mark.slow
def test_the_decode_group_then_a_later_call_that_reuses_its_reference_and_skips_a_decoder(
        tmp_path):
    """gpu_session.sh's calls. The decode group (bench.decode in-process over the loader rows'
    JPEG set) measures nd-synthetic and a row per backend, each against it: dali-gpu skipped
    without a GPU; the pytorch row at its best -j, with each -j's rate beside it (the loader rows'
    -j only, with --decode-workers default). The next call, given that record (--reuse), copies
    the reference instead of measuring it again and compares with it; a decoder named by
    --skip-decoder gives skipped rows carrying the cause (the decode group's skipped rows:
    tests/tools/test_gpu_session_faults.py); --loader-window sizes the loader rows' window (and
    the JPEG set)."""
    first, second = tmp_path / "decode.json", tmp_path / "scripts.json"
    window = ["--loader-window", "3"]
    proc = run_tool("gpu", *TINY, "--group", "decode", "--decode-workers", "default", *window,
                    "--json", first, "--out", tmp_path / "out1", "--data", tmp_path / "jpegs",
                    timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(first.read_text())["rows"]}
    assert list(rows) == ["nd-synthetic", *units.DECODE_ROWS.values()]
    assert rows["decode-dali-gpu"]["status"] == "skipped"
    assert "GPU" in rows["decode-dali-gpu"]["note"]
    for name in ("decode-pytorch", "decode-gpu-torchcodec", "decode-gpu-nvimgcodec",
                 "decode-dali-cpu"):
        row = rows[name]
        assert row["status"] == "ok" and row["img_s"] > 0, row
        assert row["reference"] == "nd-synthetic"
        assert row["ratio"] == pytest.approx(row["img_s"] / rows["nd-synthetic"]["img_s"])
        assert row["targets"][0]["name"] == "decode_capacity"
        # the machine's busy CPU-seconds over the window: counted in clock ticks (10 ms), so
        # over this tiny window only a number, not a measure
        assert row["detail"]["cores_busy"] >= 0
    assert rows["decode-pytorch"]["detail"]["by_workers"] == {
        "1": pytest.approx(rows["decode-pytorch"]["img_s"], abs=0.1)}
    measured = rows["nd-synthetic"]

    broken = ["--skip-decoder", "nvimgcodec=BROKEN per the probe", *window]
    proc = run_tool("gpu", *TINY, "--only", "pytorch-loader,gpu-decode-nvimgcodec", *broken,
                    "--reuse", tmp_path / "none.json", "--reuse", first, "--json", second,
                    "--out", tmp_path / "out2", "--data", tmp_path / "jpegs", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(second.read_text())
    assert record["config"]["loader_window"] == 3
    rows = {r["name"]: r for r in record["rows"]}
    assert not (tmp_path / "out2/nd-synthetic.console.txt").exists()  # not run again
    assert rows["nd-synthetic"]["detail"]["reused_from"] == str(first)
    assert rows["nd-synthetic"]["img_s"] == measured["img_s"]
    loader = rows["pytorch-loader"]
    assert loader["ratio"] == pytest.approx(loader["img_s"] / measured["img_s"])
    assert len(loader["repeats"]) == 3
    assert loader["detail"]["window_batches"] >= 3 * loader["detail"]["prefetch_factor"]
    assert rows["gpu-decode-nvimgcodec"]["status"] == "skipped"
    assert rows["gpu-decode-nvimgcodec"]["note"] == "nvimgcodec: BROKEN per the probe"


def test_reuse_takes_only_a_brought_unit_from_a_record_of_the_same_configuration(tmp_path):
    from imagenet_recipes.bench.gpu import run

    config = {"device": "cpu", "arch": "timm/test_resnet"}
    row = dict(units.new_row("nd-synthetic", "nd-synthetic", "c", 10.0, [10.0]))
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tool": "bench.gpu", "config": config, "rows": [row]}))
    unit = units.UNITS["nd-synthetic"]

    def reused(named, cfg, status="ok"):
        path.write_text(json.dumps({"tool": "bench.gpu", "config": config,
                                    "rows": [dict(row, status=status)]}))
        args = argparse.Namespace(named_units=named, reuse=[tmp_path / "none.json", path])
        return run.reused(args, unit, cfg)

    got = reused(["pytorch-loader"], config)
    assert got and got[0]["img_s"] == 10.0 and got[0]["detail"]["reused_from"] == str(path)
    assert reused(["nd-synthetic"], config) is None  # named: measured
    assert reused(["pytorch-loader"], dict(config, arch="resnet50")) is None  # other sizes
    assert reused(["pytorch-loader"], config, status="failed") is None


def stand_in_nvidia_smi(run_folder: Path) -> str:
    """nvidia-smi --query-compute-apps as a GPU machine prints it: the trainer holds the GPU.
    Only the trainer whose command line names run_folder: other tests' trainers run beside it."""
    return f"""#!/usr/bin/env bash
echo "pid, process_name, used_memory [MiB]"
for p in /proc/[0-9]*; do
  if tr '\\0' ' ' < "$p/cmdline" 2>/dev/null \\
      | grep -q "^[^ ]*python[^ ]* [^ ]*train/nd.py .*{run_folder}/"; then
    echo "${{p#/proc/}}, python, 1234 MiB"
  fi
done
"""


@pytest.mark.slow
def test_processes_tells_the_trainer_from_its_loader_workers_on_the_gpu(tmp_path):
    """bench.gpu.processes: the trainer's tree (-j loader workers under it) beside nvidia-smi's
    compute processes, each marked; a stand-in nvidia-smi lists the trainer as a GPU machine
    does; without one, the record says nvidia-smi is missing.

    The tool samples once the trainer logs step 5; the trainer is held after step 6 (the plant
    tests/plants/step_hold, step_hold.plant_env) until the tool stops it, so the sample always
    sees the training loader's workers, never validation's (which start after the epoch's 10
    steps), however slowly the loaded machine runs the tool and the trainer."""
    from imagenet_recipes.bench.jobs import dataset_command, make_dataset

    make_dataset(dataset_command(tmp_path / "jpegs", classes=2, train=20, val=4, min_size=40,
                                 max_size=60))
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(stand_in_nvidia_smi(tmp_path))
    smi.chmod(0o755)
    tiny = ["--data", tmp_path / "jpegs", "--device", "cpu", "-a", "timm/test_resnet",
            "--image-size", "32", "-b", "4", "--amp-dtype", "bfloat16", "-j", "2"]
    for path, expected in ((f"{smi.parent}:{os.environ['PATH']}", "ok"),
                           (os.path.dirname(sys.executable) + ":/usr/bin:/bin", "missing")):
        record_path = tmp_path / f"{expected}.json"
        # never released: the tool's SIGTERM ends the hold and the run
        hold = plant_env(6, tmp_path / f"hold-{expected}", stop_releases=True)
        proc = run_tool("gpu.processes", *tiny, "--json", record_path, "--samples", "1",
                        "--out", tmp_path / expected, env={"PATH": path, **hold}, timeout=200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        record = json.loads(record_path.read_text())
        assert record["command"].startswith("python train/nd.py -a timm/test_resnet")
        look, = record["samples"]
        trainer = record["trainer_pid"]
        workers = [p for p in look["descendants"] if p["role"] == "loader worker"]
        assert len(workers) == 2, look["descendants"]
        assert look["nvidia_smi"] == expected
        if expected == "ok":
            assert look["csv"].startswith("pid, process_name, used_memory")
            assert look["apps"] == [{"pid": trainer, "process_name": "python",
                                     "used_memory": "1234 MiB", "is": "trainer"}]
            assert look["trainer_on_gpu"] is True and look["descendants_on_gpu"] == []
        else:
            assert look["apps"] == [] and look["trainer_on_gpu"] is None
        assert not Path(f"/proc/{trainer}").exists()  # stopped after the sample


@pytest.mark.slow  # runs a stand-in nvidia-smi
def test_the_jpeg_engines_are_read_across_the_window_not_once(tmp_path, monkeypatch):
    """bench.decode's JpegEngineWatch: nvidia-smi's JPEG utilisation read again and again until
    the window ends, reported as mean, maximum and count (one reading can land in a pause: the
    H200's nvImageCodec row read 1 %); a reading that is not a percentage is shown as read."""
    from imagenet_recipes.bench.decode import JpegEngineWatch

    # a stand-in nvidia-smi: 10 %, 30 %, 50 %, 10 %, ... by call, as `-q -d UTILIZATION` prints
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nn=$(cat $0.calls 2>/dev/null || echo 0); echo $((n + 1)) > "
                   "$0.calls\necho \"    Utilization\"\necho \"        JPEG   : "
                   "$(( (n % 3) * 20 + 10 )) %\"\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    watch = JpegEngineWatch(delay_s=0, interval_s=0.01)
    deadline = time.monotonic() + 60
    while len(watch.readings.get("JPEG", [])) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    summary = watch.result()
    readings = [float(v.split()[0]) for v in watch.readings["JPEG"]]
    assert len(readings) >= 4 and readings[:3] == [10, 30, 50], readings
    assert summary == (f"JPEG {statistics.mean(readings):.0f} % (mean of {len(readings)} "
                       f"readings, max 50 %)")
    calls = int((tmp_path / "bin/nvidia-smi.calls").read_text())
    time.sleep(0.2)  # the watch has stopped: no reading after result()
    assert int((tmp_path / "bin/nvidia-smi.calls").read_text()) == calls == len(readings)

    smi.write_text("#!/bin/sh\necho \"        JPEG   : N/A\"\n")
    watch = JpegEngineWatch(delay_s=0, interval_s=0.01)
    while not watch.readings and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch.result() == "JPEG N/A"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert JpegEngineWatch(delay_s=0).result() is None  # no nvidia-smi: nothing read
