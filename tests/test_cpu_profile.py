"""tests/cpu_profile.py, the per-test CPU record (RECIPES_CPU_PROFILE), on its hook alone."""
from __future__ import annotations

import json
import os
import time
import types

import pytest

import cpu_profile


def test_the_cpu_profile_records_each_tests_cpu_seconds_and_hides_itself_from_it(
        monkeypatch, tmp_path):
    """RECIPES_CPU_PROFILE=FILE: a test that computes 0.3 s of this process's CPU gets a line
    that says so; while it runs the variable is unset (a pytest it starts records nothing), and
    afterwards it is back. Without the variable nothing is written."""
    out = tmp_path / "cpu.jsonl"
    item = types.SimpleNamespace(nodeid="tests/test_x.py::test_y")
    monkeypatch.delenv(cpu_profile.ENV, raising=False)
    hook = cpu_profile.pytest_runtest_protocol(item, None)
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(None)
    assert not out.exists()

    monkeypatch.setenv(cpu_profile.ENV, str(out))
    hook = cpu_profile.pytest_runtest_protocol(item, None)
    next(hook)
    seen_inside = cpu_profile.ENV in os.environ
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    with pytest.raises(StopIteration):
        hook.send(None)
    assert not seen_inside and os.environ[cpu_profile.ENV] == str(out)
    record = json.loads(out.read_text())
    assert record["test"] == item.nodeid
    assert 0.25 <= record["own"] and record["wall"] > 0
    assert record["children"] == record["forked"] == 0  # (forked runs: test_forked_ranks.py)
    assert cpu_profile.by_file([record, {**record, "test": "tests/test_x.py::test_z"}]) == [
        ("tests/test_x.py", 2 * record["own"], 2 * record["wall"])]
