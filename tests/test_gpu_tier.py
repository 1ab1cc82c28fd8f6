"""The GPU tier (tests/gpu/, launch/gpu_check.sh) on a machine without a GPU, CI's: it skips
every check and says why; it refuses to start without CUDA unless asked to simulate; and the
simulation (every check on the CPU, over gloo) runs each group end to end and writes the record,
a line per finished check (assert_tier_record; run from a fresh clone by
tests/tools/test_fresh_machine.py, through gpu_session.sh). A group stopped by its time limit records
the check it was in and leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, proc_stat
from step_hold import held, plant_env, wait_for

GROUPS = ["entries", "precision", "ranks", "resume", "layout", "recipes", "dali", "decode",
          "nccl"]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one


def gpu_check_env(env=None) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_TIER_")}
    return {**base, **NO_GPU, "OMP_NUM_THREADS": "1", **(env or {})}


def gpu_check(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "launch/gpu_check.sh", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout, env=gpu_check_env(env))


def checks(out: Path) -> list:
    return [json.loads(line) for line in (out / "checks.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_without_a_gpu_pytest_skips_every_check_and_says_why():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_TIER_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/gpu"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**env, **NO_GPU})
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "failed" not in summary, summary
    assert "no CUDA GPU is visible" in proc.stdout and "gpu_check.sh --cpu" in proc.stdout


@pytest.mark.slow
def test_without_a_gpu_gpu_check_exits_2_and_says_why(tmp_path):
    proc = gpu_check("--out", tmp_path / "record", "entries")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA GPU is visible" in proc.stderr
    assert not (tmp_path / "record").exists()  # nothing ran, nothing written


@pytest.mark.slow
def test_the_fast_tier_holds_no_gpu_check():
    """Every GPU check starts runs or a device's decoder, so the tier is of the integration
    tier: `-m "not slow"` collects none of it, and the process rule (tests/process_tier.py)
    never fails a simulated check for the processes it starts (a DataLoader's workers)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "-m", "not slow", "tests/gpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, **NO_GPU, "GPU_TIER_DEVICE": "cpu"})
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "no tests collected" in proc.stdout and " deselected" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_tier_lists_its_groups_and_refuses_an_unknown_one():
    """(--probe, what the machine has and each decoder's verdict: tests/tools/test_gpu_session.py)"""
    assert gpu_check("--list").stdout.split() == GROUPS
    bad = gpu_check("--cpu", "entries", "warp-drive")
    assert bad.returncode == 2 and "unknown group warp-drive" in bad.stderr


@pytest.mark.slow
def test_a_fork_server_that_does_not_start_leaves_each_run_its_own_interpreter(tmp_path):
    """The simulation's fork server not ready within GPU_CHECK_START_LIMIT (0 here: never in
    time): gpu_check says so in one line, the group runs its checks each in interpreters of
    their own, and the server it gave up on is gone once gpu_check has ended."""
    out = tmp_path / "record"
    proc = gpu_check("--cpu", "--first-of-each", "--out", out, "layout",
                     env={"GPU_CHECK_START_LIMIT": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "gpu_check: the fork server did not start, each run starts its own interpreter" \
        in proc.stdout, proc.stdout
    assert "runs forked from one interpreter" not in proc.stdout
    assert [r["status"] for r in checks(out)[1:]] == ["passed"], checks(out)
    deadline = time.monotonic() + 120  # it notices its closed stdin once its imports are done
    while tier_processes(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tier_processes(out), tier_processes(out)


def assert_tier_record(out: Path, groups, output: str = "") -> None:
    """A CPU simulation's record (`gpu_check.sh --cpu --first-of-each --out OUT GROUPS`): each
    group's session describes the machine, then its checks; every check passed or skipped, at
    least one passed per group, each check function exactly once (its first parameter set);
    the small logs come back, the checkpoints do not. The simulation itself runs in
    tests/tools/test_fresh_machine.py (gpu_session.sh --cpu from a fresh clone: every group, two side
    by side)."""
    for group in groups:
        assert f"gpu_check: group {group}: exit 0 after" in output, output[-3000:]
    lines = checks(out)
    assert lines[0]["kind"] == "environment" and lines[0]["device"] == "cpu"
    results = [r for r in lines if r["kind"] == "check"]
    assert len(lines) - len(results) == len(groups)
    assert {r["group"] for r in results} == set(groups)
    assert all(r["status"] in ("passed", "skipped") for r in results), results
    for group in groups:
        passed = [r for r in results if r["status"] == "passed" and r["group"] == group]
        assert passed, f"every check of {group} was skipped: {results}"
        assert all(r["detail"] and r["seconds"] > 0 for r in passed), passed
    families = [r["check"].split("[")[0] for r in results]
    assert len(families) == len(set(families)), families
    assert sorted(families) == sorted(tier_checks(groups)), families
    assert (out / "output.log").stat().st_size > 0 and (out / "runs.jsonl").stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == ["checks.jsonl", "output.log", "runs.jsonl"]


def tier_processes(out: Path) -> list:
    """(pid, argv as bytes) of each live process of a tier run with --out OUT: every process
    the tier starts inherits its GPU_TIER_OUT."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if f"GPU_TIER_OUT={out}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append((int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return found


def tier_checks(groups) -> list:
    """The names of the test functions in those groups' files."""
    import ast

    return [node.name for group in groups
            for node in ast.parse((REPO / f"tests/gpu/test_gpu_{group}.py").read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


@pytest.mark.slow
@pytest.mark.parametrize("forked", ["1", "0"], ids=["forked", "torchrun"])
def test_a_group_stopped_by_its_time_limit_records_it_and_leaves_no_process(tmp_path, forked):
    """The ranks group, its first check's two ranks held after their first step
    (tests/plants/step_hold, never released), and its time limit run out while they are held:
    the limit lands inside that check however fast or loaded the machine, with its launcher and
    ranks (each in a session of its own) alive: the simulation's forked ranks and its fork
    server, or torchrun's ranks as on a GPU (GPU_CHECK_FORKED=0). The test makes the
    limit run out then, not after a fixed wait: GNU timeout takes a SIGALRM as the end of its
    own limit (its timer is SIGALRM), so gpu_check's `timeout` then does what it does at
    GPU_CHECK_GROUP_LIMIT (SIGTERM to pytest, exit 124), however long the limit."""
    out, hold = tmp_path / "record", tmp_path / "hold"
    log = tmp_path / "gpu_check.log"
    env = gpu_check_env({"GPU_CHECK_GROUP_LIMIT": "600", "GPU_CHECK_FORKED": forked,
                         **plant_env(1, hold)})
    with open(log, "w") as sink:
        proc = subprocess.Popen(["bash", "launch/gpu_check.sh", "--cpu", "--out", str(out),
                                 "ranks"], stdout=sink, stderr=subprocess.STDOUT, text=True,
                                cwd=REPO, env=env)
    try:
        wait_for(held(hold, 2), "both ranks of the first check held", proc, timeout=300,
                 output=log.read_text)
        limit = [pid for pid, argv in tier_processes(out) if argv[0] == b"timeout"]
        assert len(limit) == 1, tier_processes(out)
        # the fork server, the group's pytest and its two ranks forked from it are among what
        # must not be left (a fork keeps its server's command line and environment)
        forks = [pid for pid, argv in tier_processes(out) if argv[1:3] == [
            str(REPO / "tests/forked_ranks.py").encode(), b"server"]]
        assert len(forks) == (4 if forked == "1" else 0), tier_processes(out)
        os.kill(limit[0], signal.SIGALRM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 1, output[-3000:]
    # timeout's status: the limit's SIGTERM ended pytest (its SIGKILL, 20 s later, would be 137)
    assert "gpu_check: group ranks: exit 124 after" in output, output[-3000:]
    assert ("gpu_check: runs forked from one interpreter" in output) == (forked == "1"), output
    lines = checks(out)
    stopped = [r for r in lines[1:] if r["status"] == "stopped"]
    assert [r["check"] for r in lines[1:]] == [
        "test_validation_during_training_scores_what_the_checkpoint_holds"], lines
    assert len(stopped) == 1 and "SIGTERM" in stopped[0]["detail"], lines

    def left() -> list:
        found = []
        for pid, _ in tier_processes(out):
            try:
                found.append((pid, proc_stat(pid)[0]))
            except OSError:
                continue
        return found

    # the kills are sent before pytest ends; a process may take a moment to go
    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), f"processes of the stopped group still running: {left()}"


def test_a_record_brought_back_becomes_the_results_block(tmp_path):
    from imagenet_recipes.bench import gpu_tier, regenerate

    record = tmp_path / "gpu-record"
    record.mkdir()
    lines = [{"kind": "environment", "device": "cuda", "python": "3.12.3", "torch": "2.11.0",
              "cuda": "13.0", "cpu_cores": 16, "missing": {"nvidia.dali": "DALI",
                                                            "horovod": "Horovod"},
              "gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "driver": "580.65"},
             {"kind": "check", "check": "test_entry[nd]", "group": "entries", "status": "passed",
              "seconds": 9.4, "detail": "6 steps, loss 2.1 -> 1.9", "numbers": {}},
             {"kind": "check", "check": "test_entry[hvd]", "group": "entries",
              "status": "skipped", "seconds": 0.0, "detail": "horovod is not installed",
              "numbers": {}},
             {"kind": "check", "check": "test_o2_resume", "group": "resume", "status": "stopped",
              "seconds": 410.0, "detail": "stopped by SIGTERM before it finished", "numbers": {}}]
    (record / "checks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (record / "output.log").write_text("not kept\n")
    assert gpu_tier.block(tmp_path / "nothing").startswith("The GPU tier has not run on a GPU")

    kept = regenerate.archive(record, "gpu-tier", tmp_path / "results")
    assert sorted(p.name for p in kept.iterdir()) == ["checks.jsonl"]
    text = gpu_tier.block(kept)
    assert "1 passed, 0 failed, 1 skipped, 1 stopped" in text
    assert ("* on NVIDIA H100 80GB HBM3 x1 (driver 580.65), 16 CPU cores, Python 3.12.3, torch "
            "2.11.0 (CUDA 13.0), missing: horovod, nvidia.dali") in text
    assert "| entries | test_entry[nd] | passed | 6 steps, loss 2.1 -> 1.9 | 9 |" in text
    assert "| resume | test_o2_resume | stopped | stopped by SIGTERM before it finished | 410 |" \
        in text

    # a later machine's record, in a folder of its own, is rendered after it with its own counts
    (kept / "h200").mkdir()
    later = [{**lines[0], "gpu": "NVIDIA H200"}, {**lines[1], "status": "failed"}, lines[2]]
    (kept / "h200" / "checks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    text = gpu_tier.block(kept)
    first = text.index("(record: `results/gpu-tier/checks.jsonl`): 1 passed, 0 failed, 1 skipped,"
                       " 1 stopped")
    second = text.index("(record: `results/gpu-tier/h200/checks.jsonl`): 0 passed, 1 failed, "
                        "1 skipped, 0 stopped")
    assert first < text.index("* on NVIDIA H100") < second < text.index("* on NVIDIA H200")
