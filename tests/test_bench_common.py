"""Unit tests of bench/common.py, what every tool shares: the run-log reader and the writer of
RESULTS.md's generated blocks. Pure Python: no torch import, no training run."""
from __future__ import annotations

import json

from bench.common import read_log, replace_block, run_dirs, steady, write_block


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
