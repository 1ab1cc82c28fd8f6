"""The lab's page (lab/README.md) is what its kept records give, byte for byte, in the whole
suite (a second and a half): `python lab/page.py --check`, as docs/testing.md says. The studies
themselves run in the study tier (tests/lab/test_studies.py)."""
from __future__ import annotations

import json

import pytest

from conftest import LAB, run_lab


@pytest.mark.slow
def test_the_studies_page_is_regenerated_byte_for_byte_from_its_records():
    kept = {p.name for p in (LAB / "records").iterdir() if p.is_dir()}
    assert kept == {"loop", "layout", "hvd", "ddp_cost"}
    proc = run_lab("page", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


@pytest.mark.slow
def test_a_changed_record_is_noticed(tmp_path):
    """Sensitivity: the loop record's median changed -> the page would change."""
    import shutil

    records_dir = tmp_path / "records"
    shutil.copytree(LAB / "records", records_dir)
    path = records_dir / "loop" / "bench_loop.json"
    record = json.loads(path.read_text())
    record["median"]["ratio"] += 0.5
    path.write_text(json.dumps(record))
    proc = run_lab("page", "--check", "--results-dir", records_dir)
    assert proc.returncode == 1 and f"would change: {LAB / 'README.md'}" in proc.stdout
