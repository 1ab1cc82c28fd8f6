"""Unit tests of imagenet_recipes/bench/common.py, what every tool shares: the run-log reader, what a run record
and its learning curve say, and the writer of RESULTS.md's generated blocks; and the run summary
built on them. Pure Python: no torch import, no training run."""
from __future__ import annotations

import json

import pytest

from imagenet_recipes.bench import summarize
from imagenet_recipes.bench.common import logged_precision, read_log, replace_block, run_dirs, shown_command, \
    steady, val_points, write_block


def test_replace_block_is_idempotent_and_touches_nothing_else():
    text = "# Results\n\nintro\n\n## Other\n\nkeep me\n"
    once = replace_block(text, "sweep", "table 1\n", "## Strategy sweep")
    assert once.startswith(text.rstrip("\n")) and "## Strategy sweep" in once
    assert replace_block(once, "sweep", "table 1\n", "## Strategy sweep") == once
    twice = replace_block(once + "\nafter\n", "sweep", "table 2", "## Strategy sweep")
    assert "table 2" in twice and "table 1" not in twice and twice.endswith("\nafter\n")
    assert twice.count("<!-- sweep:start -->") == 1 == twice.count("## Strategy sweep")
    # another tool's block beside it is left alone
    both = replace_block(twice, "scaling_model", "model v1", "## Scaling model")
    assert replace_block(both, "sweep", "table 2", "## Strategy sweep") == both
    assert "model v1" in replace_block(both, "sweep", "table 3", "## Strategy sweep")


def test_write_block_starts_a_missing_results_page(tmp_path):
    results = tmp_path / "RESULTS.md"
    write_block(results, "bench_io", "| loader |\n", "## Input pipelines")
    assert results.read_text() == ("# Results\n\n## Input pipelines\n\n<!-- bench_io:start -->\n"
                                   "| loader |\n<!-- bench_io:end -->\n")


def test_read_log_groups_by_kind_and_survives_a_partial_last_line(tmp_path):
    run = tmp_path / "run-a"
    run.mkdir()
    records = [{"kind": "run", "world_size": 2}, {"kind": "train", "img_s": 10.0},
               {"kind": "train", "img_s": 30.0}, {"kind": "train", "img_s": None},
               {"kind": "train", "img_s": 50.0}]
    (run / "log.jsonl").write_text("\n".join(map(json.dumps, records)) + '\n{"kind": "tr')
    (tmp_path / "no-log").mkdir()
    logs = read_log(run)
    assert sorted(logs) == ["run", "train"] and len(logs["train"]) == 4
    assert steady(logs["train"], "img_s") == [30.0, 50.0]  # the warm-up interval dropped
    assert run_dirs(tmp_path) == [run]


def _write_log(run_dir, records):
    run_dir.mkdir()
    (run_dir / "log.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


def _ps_log(**run_fields):
    """A parameter-server run of 2 epochs as its log reads, with the run record of an old one
    (no `precision`) unless `run_fields` add it."""
    run = {"kind": "run", "elapsed": 0.0, "entry": "ps", "strategy": "ps", "mode": "sync",
           "world_size": 3, "workers": 2, "global_batch": 16,
           "config": {"arch": "resnet18", "image_size": 32, "batch_size": 8},
           "hardware": {"gpus": [], "cpu": "AMD EPYC", "cpu_count": 2},
           "versions": {"torch": "2.15.0"}, **run_fields}
    train = [{"kind": "train", "elapsed": t, "img_s": rate} for t, rate in
             ((2.0, 10.0), (4.0, 30.0), (6.0, 50.0))]
    epochs = [{"kind": "train_epoch", "epoch": e, "epoch_time": 3.0, "top1": 40.0 + 20 * e,
               "top5": 90.0} for e in (0, 1)]
    # evaluated in the background: the second evaluation ends after training does
    val = [{"kind": "val", "elapsed": 4.0, "epoch": 0, "train_elapsed": 2.5, "top1": 50.0,
            "top5": 95.0},
           {"kind": "val", "elapsed": 8.0, "epoch": 1, "train_elapsed": 5.5, "top1": 75.0,
            "top5": 100.0}]
    end = {"kind": "end", "elapsed": 8.5, "epoch": 1, "step": 6, "best_top1": 75.0,
           "reason": "finished"}
    return [run, *train, *epochs, *val, end]


def test_summary_of_an_old_parameter_server_run(tmp_path, capsys):
    _write_log(tmp_path / "ps-sync", _ps_log())
    assert summarize.main([str(tmp_path / "ps-sync")]) == 0
    header, rule, row = capsys.readouterr().out.strip().splitlines()
    cells = dict(zip((c.strip() for c in header.strip("|").split("|")),
                     (c.strip() for c in row.strip("|").split("|"))))
    assert rule.count("---") == len(cells)
    assert cells["script"] == "ps" and cells["strategy"] == "PS sync"
    assert cells["precision"] == "O0 float32"  # not logged then: the server trained in fp32
    assert cells["procs"] == "3" and cells["img/s"] == "40.0"  # median after the first interval
    assert cells["val top-1"] == "75.0" and cells["epochs"] == "2" and cells["wall s"] == "8"
    assert cells["device"] == "AMD EPYC (2 cores, no GPU)"


def test_logged_precision_is_read_where_logged_and_fp32_only_for_old_ps_logs():
    bf16 = {"opt_level": "O1", "dtype": "bfloat16", "loss_scaling": "none"}
    assert logged_precision(_ps_log(precision=bf16)[0]) == "O1 bfloat16"
    assert logged_precision(_ps_log()[0]) == "O0 float32"
    with pytest.raises(KeyError):  # any other run record without it is malformed
        logged_precision({"entry": "ddp", "world_size": 2})


def test_val_points_take_the_evaluated_snapshot_time_else_the_epoch_clock(tmp_path):
    _write_log(tmp_path / "ps-sync", _ps_log())
    logs = read_log(tmp_path / "ps-sync")
    assert [(p.epoch, p.seconds) for p in val_points(logs)] == [(1, 2.5), (2, 5.5)]
    for v in logs["val"]:  # as the engine logs them: validation pauses training
        del v["train_elapsed"]
    assert [(p.epoch, p.seconds, p.top1) for p in val_points(logs)] == [(1, 3.0, 50.0),
                                                                        (2, 6.0, 75.0)]


def _ddp_log(world_size: int, rates):
    run = {"kind": "run", "elapsed": 0.0, "entry": "ddp", "strategy": "ddp",
           "world_size": world_size, "global_batch": 32 * world_size,
           "precision": {"opt_level": "O0", "dtype": "float32", "loss_scaling": "none"},
           "config": {"arch": "resnet18", "image_size": 64, "batch_size": 32},
           "hardware": {"gpus": [], "cpu": "AMD EPYC", "cpu_count": 2},
           "versions": {"torch": "2.15.0"}}
    train = [{"kind": "train", "elapsed": float(i), "img_s": rate, "step_time": 32.0 / rate}
             for i, rate in enumerate([1.0, *rates])]  # the first interval is warm-up
    return [run, *train]


def test_repeats_of_a_combination_make_one_row_with_their_spread(tmp_path):
    from imagenet_recipes.bench.sweep_stats import analyze, load_sweep

    _write_log(tmp_path / "ddp-w1-O0", _ddp_log(1, [100.0, 100.0]))
    _write_log(tmp_path / "ddp-w2-O0", _ddp_log(2, [150.0, 150.0]))
    _write_log(tmp_path / "ddp-w2-O0-r2", _ddp_log(2, [190.0, 190.0]))
    _write_log(tmp_path / "ddp-w2-O0-r3", _ddp_log(2, [170.0, 170.0]))
    rows = analyze(load_sweep(tmp_path))
    assert [(r["run"], r["repeats"]) for r in rows] == [("ddp-w1-O0", 1), ("ddp-w2-O0", 3)]
    two = rows[1]
    assert (two["img_s"], two["img_s_low"], two["img_s_high"]) == (170.0, 150.0, 190.0)
    assert two["efficiency"] == pytest.approx(170.0 / (2 * 100.0))


def test_a_single_repeat_draws_no_error_bar(tmp_path):
    """One run per combination: lowest = median = highest, so the bars have length 0, even
    where rounding would make them slightly negative (matplotlib refuses those)."""
    from imagenet_recipes.bench import plot_scaling

    row = {"label": "DDP O0 float32", "family": "DDP O0 float32", "variant": "", "workers": 2,
           "processes": 2, "img_s": 161.97020320439236, "img_s_low": 161.97020320439236,
           "img_s_high": 161.97020320439236, "efficiency": 0.8864336754504867, "repeats": 1}
    assert plot_scaling._spread([row], scale=[row["efficiency"] / row["img_s"]]) == [[0.0], [0.0]]
    plot_scaling.plot_efficiency([row], "one repeat", tmp_path / "efficiency.png")
    assert (tmp_path / "efficiency.png").stat().st_size > 10_000


def test_shown_command_drops_where_the_outputs_go_and_keeps_the_measurement():
    argv = ["--out", "runs/x", "--steps", "30", "--json=r.json", "--figure", "/tmp/f.png", "-b",
            "8"]
    assert shown_command("lab/hvd.py", argv) == "python lab/hvd.py --steps 30 -b 8"
    assert shown_command("io", []) == "python -m imagenet_recipes.bench.io"
    # an argument with a space is quoted, so the shown command runs as it was run
    assert shown_command("e2e", ["--only", "nd fast"]) == "python -m imagenet_recipes.bench.e2e --only 'nd fast'"


ORPHAN = """
import os, time
if os.fork() == 0:          # a child its parent never waits for, like the loaders' fork server
    time.sleep(0.3)         # still running when the parent has exited
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    os._exit(0)
"""


@pytest.mark.slow
def test_a_runs_orphaned_descendants_count_as_the_runs_cpu_not_others(tmp_path):
    """bench.jobs.run_all adopts what a run leaves behind: an orphan's CPU second is the run's,
    not 'other processes' load' (the loaders' fork server is such an orphan)."""
    import subprocess
    import sys

    from conftest import REPO

    probe = (
        "import json, sys; from pathlib import Path\n"
        "from imagenet_recipes.bench.jobs import children_cpu_seconds, run_all\n"
        "before = children_cpu_seconds()\n"
        f"meta = run_all([('orphan', [sys.executable, '-c', {ORPHAN!r}])], Path(sys.argv[1]), "
        "1, 60, 'meta.json')\n"
        "print(json.dumps({'cpu': children_cpu_seconds() - before, **meta['orphan']}))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["returncode"] == 0
    assert result["cpu"] >= 0.9  # the orphan's busy second, reaped by run_all
    assert result["seconds"] >= 1.0  # the run lasts until what it left behind has ended
