"""Smoke tests of the benchmark scripts: they must keep running as the engine evolves (their
numbers are measured by hand and go to RESULTS.md; nothing here is timed)."""
from __future__ import annotations

from conftest import REPO, run_tool


def test_bench_loop_runs_and_checks_same_math():
    proc = run_tool("loop", "-a", "resnet18", "--image-size", "32", "-b", "4", "--steps", "2",
                    "--warmup", "1", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine/bare img/s ratio:" in proc.stdout
    check = next(l for l in proc.stdout.splitlines() if l.startswith("same math check:"))
    assert check.endswith("steps each = 0"), check  # bit-identical weights after both loops


def test_bench_io_runs_every_loader_and_draws(tmp_path, tiny_imagefolder):
    figure = tmp_path / "io.png"
    proc = run_tool("io", tiny_imagefolder, "--images", "32", "--image-size", "32", "-b", "8",
                    "--passes", "1", "--workers", "1", "--figure", figure)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and "img/s" not in line]
    assert rows[:4] == ["decode PIL", "decode torchvision", "classic ImageFolder",
                        "pytorch backend"]
    assert any(row.startswith("DALI") for row in rows)
    assert figure.stat().st_size > 10_000


def test_a_tool_without_the_engine_on_the_path_says_how_to_run_it():
    # PYTHONPATH without train/: the tool must not fail with a traceback, but name the fix.
    proc = run_tool("sweep", "--dry-run", env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "launch/env.sh" in proc.stderr and "PYTHONPATH=train" in proc.stderr
    assert "Traceback" not in proc.stderr
