"""Smoke tests of the benchmark scripts: they must keep running as the engine evolves (their
numbers are measured by hand and go to RESULTS.md; nothing here is timed)."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO, _env


def test_bench_loop_runs_and_checks_same_math():
    proc = subprocess.run(
        [sys.executable, str(REPO / "launch/bench_loop.py"), "-a", "resnet18", "--image-size",
         "32", "-b", "4", "--steps", "2", "--warmup", "1", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine/bare img/s ratio:" in proc.stdout
    check = next(l for l in proc.stdout.splitlines() if l.startswith("same math check:"))
    assert check.endswith("steps each = 0"), check  # bit-identical weights after both loops


def test_bench_io_runs_every_loader_and_draws(tmp_path, tiny_imagefolder):
    figure = tmp_path / "io.png"
    proc = subprocess.run(
        [sys.executable, str(REPO / "launch/bench_io.py"), str(tiny_imagefolder), "--images",
         "32", "--image-size", "32", "-b", "8", "--passes", "1", "--workers", "1",
         "--figure", str(figure)],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and "img/s" not in line]
    assert rows[:4] == ["decode PIL", "decode torchvision", "classic ImageFolder",
                        "pytorch backend"]
    assert any(row.startswith("DALI") for row in rows)
    assert figure.stat().st_size > 10_000
