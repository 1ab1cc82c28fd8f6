"""RESULTS.md's measured sections and their figures are what the logs in results/ give:
`python -m imagenet_recipes.bench.regenerate` rebuilds them byte for byte, and notices any difference."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

from imagenet_recipes.bench import regenerate


def _regenerate(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "imagenet_recipes.bench.regenerate",
                           *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_results_md_and_figures_are_regenerated_byte_for_byte_from_results(tmp_path):
    kept = {p.name for p in (REPO / "results").iterdir() if p.is_dir()}
    assert kept <= set(regenerate.FOLDERS)
    assert set(regenerate.FOLDERS) - kept <= set(regenerate.GPU_FOLDERS)
    # From another folder: the logs' relative paths (data sets under runs/) lead nowhere, as
    # on a fresh clone, where none of the measured runs' data exists.
    proc = _regenerate("--check", "--results-dir", REPO / "results", "--results",
                       REPO / "RESULTS.md", "--figures", REPO / "figures", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_changed_log_is_noticed(tmp_path):
    """Sensitivity: one run's numbers changed -> its block and figures would change."""
    results = tmp_path / "results"
    shutil.copytree(REPO / "results", results)
    log = sorted((results / "quickstart").rglob("log.jsonl"))[0]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    for r in records:
        if r["kind"] == "val":
            r["top1"] = 12.5
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _regenerate("--check", "--results-dir", results)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    changed = sorted(line.rsplit("/", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("would change: "))
    assert changed == ["RESULTS.md", "quickstart_curves.png"]  # the sweep's logs did not change


def test_archive_keeps_only_the_logs(tmp_path):
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "log.jsonl").write_text('{"kind": "run"}\n')
    (runs / "a" / "checkpoint.pth").write_bytes(b"x" * 1000)
    (runs / "a" / "events.out.tfevents.1").write_bytes(b"x")
    (runs / "sweep.json").write_text("{}")
    target = regenerate.archive(runs, "sweep", tmp_path / "results")
    kept = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert kept == ["a/log.jsonl", "sweep.json"]
