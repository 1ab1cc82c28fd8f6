"""RESULTS.md's `gpu_tier` block: what the GPU tier (tests/gpu/, `bash launch/gpu_check.sh`)
recorded on each GPU machine, from results/gpu-tier/checks.jsonl and a later machine's
results/gpu-tier/<machine>/checks.jsonl.

    bash launch/gpu_check.sh --out gpu-record GROUPS...            # on the GPU machine
    launch/env.sh python -m imagenet_recipes.bench.regenerate --archive gpu-record gpu-tier   # here

Without a record the block says that the tier has not run on a GPU.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from imagenet_recipes.bench.render import render

STATUSES = ("passed", "failed", "skipped", "stopped")


def read(folder: Path) -> List[dict]:
    path = folder / "checks.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(folder: Path, root: Path) -> Optional[dict]:
    """One record's counts, machines and rows (None: no record there)."""
    lines = read(folder)
    machines = [r for r in lines if r["kind"] == "environment"]
    checks = [r for r in lines if r["kind"] == "check"]
    if not checks:
        return None
    counts = ", ".join(f"{sum(c['status'] == s for c in checks)} {s}" for s in STATUSES)
    seen = []
    for env in machines:
        where = (f"{env.get('gpu')} x{env.get('gpus')} (driver {env.get('driver')})"
                 if env["device"] == "cuda" else "the CPU (`--cpu`, a simulation, no GPU)")
        text = (f"{where}, {env['cpu_cores']} CPU cores, Python {env['python']}, torch "
                f"{env['torch']} (CUDA {env['cuda']}), missing: "
                f"{', '.join(sorted(env['missing'])) or 'nothing'}")
        if text not in seen:
            seen.append(text)
    rows = [[c["group"], c["check"], c["status"], c["detail"].replace("|", "/").replace(
        "\n", " ")[:300], f"{c['seconds']:.0f}"] for c in checks]
    path = (folder / "checks.jsonl").relative_to(root.parent.parent)  # results/gpu-tier/...
    return {"path": str(path), "counts": counts, "machines": seen, "rows": rows}


def block(folder: Path, figures: Path = None) -> str:
    """The record in results/gpu-tier/ first, then each later machine's in a folder of its own
    (results/gpu-tier/<machine>/), each with its counts as the record has them."""
    folders = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())] \
        if folder.is_dir() else []
    records = [summary(f, folder) for f in folders]
    return render("gpu_tier", records=[r for r in records if r])
