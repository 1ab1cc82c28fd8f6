"""bench.stages (where a training sample's time goes, stage by stage) runs on a tiny set."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_stages_prints_every_stage(tiny_imagefolder):
    proc = subprocess.run([sys.executable, "-m", "imagenet_recipes.bench.stages",
                           str(tiny_imagefolder), "--images", "16", "--image-size", "32", "-b",
                           "4", "--passes", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1]
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    for stage in ("read", "decode whole", "entropy (~)", "IDCT + colour (~)", "crop", "resize",
                  "flip", "sample, whole", "collate", "hand-over", "loader, 1 worker"):
        assert stage in rows, stage
    assert rows["loader, 1 worker"][1].strip() == "100%"
    assert float(rows["decode whole"][0]) > 0
