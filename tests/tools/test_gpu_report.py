"""RESULTS.md's `gpu` block (imagenet_recipes.bench.gpu.report) and rows a record only copied:
`bench.gpu --reuse` brings a reference row (`nd-synthetic`) along from an earlier record, marked
`reused_from`; where that earlier record is kept too, the copy is its measurement, not a new one,
so the block shows it once, under the record that measured it."""
from __future__ import annotations

import json

from imagenet_recipes.bench.gpu import report, units


def _record(date: str, rows: list) -> dict:
    return {"tool": "bench.gpu", "command": "python -m imagenet_recipes.bench.gpu --group scripts",
            "commit": "abc1234", "date": date, "seconds": 60.0, "complete": True,
            "environment": {"device": "cuda", "gpu": "NVIDIA H200", "driver": "580.1",
                            "torch": "2.11.0", "cuda": "13.0", "cpu": "Intel Xeon",
                            "cpu_cores": 16},
            "rows": rows}


def _row(name: str, img_s: float, reference=None, **detail) -> dict:
    return units.new_row(name, name, f"config of {name}", img_s, [img_s * 0.99, img_s],
                         reference, peak_bytes=12 * 2**30, **detail)


def _lines(text: str) -> tuple:
    """The row names of the table and of the earlier measurements below it."""
    table, _, earlier = text.partition("Rows measured again in a later record")
    return tuple([line.split(" |")[0] for line in part.splitlines() if line.startswith("| ")
                  and not line.startswith("| row")] for part in (table, earlier))


def test_a_row_copied_from_a_kept_record_is_shown_once_under_the_record_that_measured_it(
        tmp_path):
    measured = _row("nd-synthetic", 5000.0)
    (tmp_path / "a.json").write_text(json.dumps(_record("2026-11-30 16:35 UTC", [
        measured, _row("pytorch-loader", 4900.0, "nd-synthetic")])))
    copy = dict(measured, detail={**measured["detail"], "reused_from": "/tmp/gs/a.json"})
    (tmp_path / "b.json").write_text(json.dumps(_record("2026-11-30 16:36 UTC", [
        copy, _row("gpu-decode", 4000.0, "nd-synthetic")])))
    table, earlier = _lines(report.block(tmp_path))
    assert table == ["| nd-synthetic [1]", "| pytorch-loader [1]", "| gpu-decode [2]"]
    assert earlier == []
    # a later record's own measurement is the latest; the copy is still not a row of its own
    (tmp_path / "c.json").write_text(json.dumps(_record("2026-11-30 16:49 UTC", [
        _row("nd-synthetic", 5100.0)])))
    text = report.block(tmp_path)
    table, earlier = _lines(text)
    assert table == ["| nd-synthetic [3]", "| pytorch-loader [1]", "| gpu-decode [2]"]
    assert earlier == ["| nd-synthetic [1]"]
    assert "| 5,100.0 |" in text and text.count("| 5,000.0 |") == 1


def test_a_copy_whose_record_is_not_kept_is_the_only_measurement_and_stays(tmp_path):
    copy = _row("nd-synthetic", 5000.0, reused_from="/tmp/gs/gpu_decode.json")
    (tmp_path / "b.json").write_text(json.dumps(_record("2026-11-30 16:36 UTC", [
        copy, _row("gpu-decode", 4000.0, "nd-synthetic")])))
    table, earlier = _lines(report.block(tmp_path))
    assert table == ["| nd-synthetic [1]", "| gpu-decode [1]"]
    assert earlier == []
