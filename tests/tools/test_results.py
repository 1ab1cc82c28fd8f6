"""RESULTS.md's measured sections and their figures are what the runs kept in results/ give:
`python -m imagenet_recipes.bench.regenerate` rebuilds the page byte for byte and the figures' data
(figures/data/) value for value, and notices any difference; results/ keeps a measurement's
runs compacted (imagenet_recipes.bench.kept) without changing what the blocks compute."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

from pathlib import Path

from imagenet_recipes.bench import kept, regenerate
from imagenet_recipes.bench.common import read_log, run_dirs


def _regenerate(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "imagenet_recipes.bench.regenerate",
                           *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_results_md_and_figures_are_regenerated_from_results(tmp_path):
    kept = {p.name for p in (REPO / "results").iterdir() if p.is_dir()}
    assert kept <= set(regenerate.FOLDERS)
    assert set(regenerate.FOLDERS) - kept <= set(regenerate.GPU_FOLDERS)
    # From another folder: the logs' relative paths (data sets under runs/) lead nowhere, as
    # on a fresh clone, where none of the measured runs' data exists.
    proc = _regenerate("--check", "--results-dir", REPO / "results", "--results",
                       REPO / "RESULTS.md", "--figures", REPO / "figures", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_changed_number_is_noticed_and_a_redrawn_png_is_not(tmp_path):
    """Sensitivity: one run's numbers changed -> its block and figure would change; a PNG whose
    bytes differ (another matplotlib build) but whose data is the same passes."""
    results, figures = tmp_path / "results", tmp_path / "figures"
    shutil.copytree(REPO / "results", results)
    shutil.copytree(REPO / "figures", figures)
    (figures / "io.png").write_bytes(b"drawn by another matplotlib")
    kept_runs = results / "quickstart" / kept.KEPT
    header, *runs = kept_runs.read_text().splitlines()
    first = json.loads(runs[0])
    for r in first["records"]:
        if r["kind"] == "val":
            r["top1"] = 12.5
    kept_runs.write_text("\n".join([header, json.dumps(first), *runs[1:]]) + "\n")
    proc = _regenerate("--check", "--results-dir", results, "--figures", figures)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    changed = sorted(line.rsplit("/", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("would change: "))
    assert changed == ["RESULTS.md", "quickstart_curves.png"]  # the sweep's logs did not change


def test_results_stay_compact():
    size = sum(p.stat().st_size for p in (REPO / "results").rglob("*") if p.is_file())
    assert size < 2_000_000, f"results/ holds {size / 1e6:.1f} MB"
    assert not list((REPO / "results").rglob("log.jsonl")), "results/ keeps runs.jsonl, not logs"


def _log(tmp_path, name: str, records: list) -> Path:
    (tmp_path / name).mkdir(parents=True)
    (tmp_path / name / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / name


def test_archive_keeps_the_runs_compacted_and_the_tools_records(tmp_path):
    runs = tmp_path / "runs"
    config = {"arch": "resnet18", "lr": 0.1, "seed": 0, "dummy": False}
    _log(runs, "a", [{"kind": "run", "time": 1795686064.5090246, "elapsed": 0.1, "config": config},
                     {"kind": "checkpoint", "elapsed": 2.0, "path": "x"},
                     {"kind": "val", "time": 0.3, "elapsed": 1.5, "epoch": 0, "top1": 1 / 3,
                      "samples_seen": 64}])
    _log(runs, "b", [{"kind": "run", "time": 1.0, "elapsed": 0.1,
                      "config": {"arch": "resnet18", "lr": 0.2, "seed": 0, "extra": [1, 2]}}])
    (runs / "a" / "checkpoint.pth").write_bytes(b"x" * 1000)
    (runs / "a" / "events.out.tfevents.1").write_bytes(b"x")
    (runs / "sweep.json").write_text("{}")
    target = regenerate.archive(runs, "sweep", tmp_path / "results")
    assert sorted(p.name for p in target.iterdir()) == [kept.KEPT, "sweep.json"]
    a, b = run_dirs(target)
    assert (a.name, b.name) == ("a", "b")
    # configs come back whole, as each run logged it (changed, added and absent options)
    assert read_log(a)["run"][0]["config"] == config
    assert read_log(b)["run"][0]["config"] == {"arch": "resnet18", "lr": 0.2, "seed": 0,
                                             "extra": [1, 2]}
    assert read_log(a)["run"][0]["time"] == 1795686064.5090246  # a clock reading, whole
    # the last record (a checkpoint) still ends the run's span; unread fields are left out
    assert read_log(a)["checkpoint"] == [{"kind": "checkpoint", "elapsed": 2.0, "path": "x"}]
    assert read_log(a)["val"] == [{"kind": "val", "elapsed": 1.5, "epoch": 0,
                                   "top1": float(f"{1 / 3:.8g}")}]
    # --add: one more run (a run's own folder), kept beside the others; same name: replaced
    _log(tmp_path / "later", "c", [{"kind": "run", "elapsed": 0.1, "config": config}])
    regenerate.archive(tmp_path / "later" / "c", "sweep", tmp_path / "results", add=True)
    regenerate.archive(runs / "b", "sweep", tmp_path / "results", add=True)
    assert [r.name for r in run_dirs(target)] == ["a", "b", "c"]
    assert read_log(run_dirs(target)[1]) == read_log(b)


def test_merged_worker_records_keep_every_total_and_mean():
    """What the blocks compute from a parameter server's worker records (ps_stats: sums,
    last running totals, means over intervals; sweep_stats: sums after the first step)."""
    workers = []
    for step in (5, 5, 6, 7, 8):
        for worker in (1, 2):
            workers.append({"kind": "worker", "worker": worker, "step": step,
                            "samples": 16 * worker + step, "steps": step - 4,
                            "comm_time": 0.1 * step, "compute_time": 0.3, "wait_time": 0.01 * step,
                            "seconds": 0.5, "bytes_pushed": 1000 * step,
                            "bytes_pushed_per_server": [500 * step, 500 * step],
                            "local_steps": (step * worker) % 3 + 1,
                            "staleness": None if step == 6 else step / worker})
    merged = kept.merged_workers(workers, first_step=5)
    assert len(merged) == 4  # per worker: the first step's intervals, the others
    for worker in (1, 2):
        mine = [w for w in workers if w["worker"] == worker]
        theirs = [m for m in merged if m["worker"] == worker]
        for key in ("samples", "steps", "comm_time", "compute_time", "wait_time", "seconds"):
            assert sum(m[key] for m in theirs) == pytest.approx(sum(w[key] for w in mine))
        assert theirs[-1]["bytes_pushed"] == mine[-1]["bytes_pushed"]
        assert theirs[-1]["bytes_pushed_per_server"] == mine[-1]["bytes_pushed_per_server"]
        later = [m for m in theirs if m["step"] != 5]
        assert sum(m["comm_time"] for m in later) == pytest.approx(
            sum(w["comm_time"] for w in mine if w["step"] != 5))
        for key in ("local_steps", "staleness"):
            values = [w[key] for w in mine if w[key] is not None]
            mean = sum(m[key] * m[f"{key}_intervals"] for m in theirs) / sum(
                m[f"{key}_intervals"] for m in theirs)
            assert mean == pytest.approx(sum(values) / len(values))
