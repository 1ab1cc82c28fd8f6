"""Smoke tests of the benchmark scripts: they must keep running as the engine evolves (their
numbers are measured by hand and go to RESULTS.md; nothing here is timed)."""
from __future__ import annotations

import json

import pytest

from conftest import REPO, read_jsonl, run_tool


def test_bench_loop_runs_and_checks_same_math():
    proc = run_tool("loop", "-a", "resnet18", "--image-size", "32", "-b", "4", "--steps", "2",
                    "--warmup", "1", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine/bare img/s ratio:" in proc.stdout
    check = next(l for l in proc.stdout.splitlines() if l.startswith("same math check:"))
    assert check.endswith("steps each = 0"), check  # bit-identical weights after both loops


def test_bench_io_runs_every_loader_and_draws(tmp_path, tiny_imagefolder):
    figure, record = tmp_path / "io.png", tmp_path / "io" / "bench_io.json"
    proc = run_tool("io", tiny_imagefolder, "--images", "32", "--image-size", "32", "-b", "8",
                    "--passes", "2", "--workers", "1", "--figure", figure, "--json", record)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and "img/s" not in line]
    assert rows[:4] == ["decode PIL", "decode torchvision", "classic ImageFolder",
                        "pytorch backend"]
    assert any(row.startswith("DALI") for row in rows)
    assert figure.stat().st_size > 10_000
    # the record alone gives RESULTS.md the same table and the same figure
    saved = json.loads(record.read_text())
    assert list(saved["results"]) == rows
    assert all(len(r["runs"]) == 2 for r in saved["results"].values())
    from bench import regenerate

    figures = tmp_path / "figures"
    figures.mkdir()
    block = regenerate.io_block(record.parent, figures)
    assert block.strip() in proc.stdout
    assert (figures / "io.png").read_bytes() == figure.read_bytes()


def test_a_tool_without_the_engine_on_the_path_says_how_to_run_it():
    # PYTHONPATH without train/: the tool must not fail with a traceback, but name the fix.
    proc = run_tool("sweep", "--dry-run", env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "launch/env.sh" in proc.stderr and "PYTHONPATH=train" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_recipes_scales_each_preset_to_the_budget_and_runs_it(tmp_path):
    out, data = tmp_path / "study", tmp_path / "data"
    proc = run_tool("recipes", "--epochs", "2", "--classes", "4", "--train-per-class", "8",
                    "--val-per-class", "3", "--image-size", "32", "-b", "8", "--data", data,
                    "--out", out)
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
