"""launch/gpu_session.sh: which commands it runs, in what order, and how it keeps to its time
budget. A stand-in Python ($PYTHON) records every command it is given, so the composition is
checked exactly and in seconds; the commands themselves are the GPU tier's and bench.gpu's,
tested on their own (test_gpu_tier.py, test_bench_gpu.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Records its arguments (and the tier's --first-of-each and group limit); sleeps where
# FAKE_SLOW names the group. Asked where it imports imagenet_recipes from (outside the clone,
# launch/install_clone.sh), it names the clone: installed.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* | first=${GPU_TIER_FIRST_OF_EACH:-0} limit=${GPU_CHECK_GROUP_LIMIT:-unset}" \
    >> "$FAKE_LOG"
case "$*" in "-P -c import pathlib, imagenet_recipes"*) echo "$FAKE_CLONE" ;; esac
case "$*" in *"--group ${FAKE_SLOW:-none} "*) exec sleep 60 ;; esac
exit 0
"""


def session(tmp_path: Path, *args: str, slow: str = "none") -> tuple:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(calls), "FAKE_SLOW": slow,
           "FAKE_CLONE": str(REPO.resolve())}
    env.pop("GPU_CHECK_GROUP_LIMIT", None)
    proc = subprocess.run(["bash", "launch/gpu_session.sh", "--out", str(tmp_path / "out"),
                           *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, lines


@pytest.mark.slow
def test_it_runs_the_tier_then_the_groups_with_the_peers_scripts_found(tmp_path):
    peers = tmp_path / "peers"
    (peers / "vision/references/classification").mkdir(parents=True)
    for name in ("benchmark.py", "train.py", "vision/references/classification/train.py"):
        (peers / name).write_text("")
    proc, calls = session(tmp_path, "--peers", str(peers))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    # the machine check first (its Python reads the probe from stdin) and where the package
    # imports from (launch/install_clone.sh), then the same in the tier, then the tier's groups
    # (side by side, so in any order), one parameter set of each check
    checks = [c[:6] for c in calls if "bench.gpu" not in c][:4]
    assert checks == ["- cuda", "-P -c ", "- cuda", "-P -c "], calls
    tier = [c for c in calls if "-m pytest" in c]
    assert sorted(c.split("tests/gpu/test_gpu_")[1].split(".py")[0] for c in tier) == sorted([
        "entries", "precision", "ranks", "resume", "layout", "recipes", "dali", "decode", "nccl"])
    assert all(" first=1 " in c for c in tier)
    # each group stops itself within what is left of the 540 s budget
    assert all(0 < int(c.rsplit("limit=", 1)[1]) <= 420 for c in tier)
    bench = [c.split(" | ")[0] for c in calls if "imagenet_recipes.bench.gpu" in c]
    # the JPEG set first, in the background beside the tier, at the size of the scripts' rows
    assert bench[0] == f"-m imagenet_recipes.bench.gpu --prepare-data --data {out}/jpegs"
    assert calls.index(tier[-1]) < calls.index(next(c for c in calls if "--group" in c))
    assert bench[1:] == [
        f"-m imagenet_recipes.bench.gpu --out {out}/bench/scripts --group scripts "
        f"--data {out}/jpegs --json {out}/gpu_scripts.json",
        f"-m imagenet_recipes.bench.gpu --out {out}/bench/decode --group decode "
        f"--data {out}/jpegs --json {out}/gpu_decode.json",
        f"-m imagenet_recipes.bench.gpu --out {out}/bench/peers --group peers "
        f"--timm {peers}/train.py --peers-data {out}/jpegs --peers-only nd fast "
        f"--peers-repeats 1 --json {out}/gpu_peers.json",
        f"-m imagenet_recipes.bench.gpu --out {out}/bench/causes --group causes "
        f"--timm-benchmark {peers}/benchmark.py --json {out}/gpu_causes.json",
        f"-m imagenet_recipes.bench.gpu --out {out}/bench/loop --group loop,compile "
        f"--json {out}/gpu_loop.json"]
    log = (out / "session.log").read_text()
    assert "steps tier scripts decode peers causes loop" in log and log.rstrip().endswith("done")
    assert "JPEG set ready" in log

    # the same command again: every step finished, none runs again
    proc, again = session(tmp_path, "--peers", str(peers))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [c for c in again[len(calls):] if "-m pytest" in c or "bench.gpu" in c]
    assert proc.stdout.count("finished in an earlier call with this --out") == 6


@pytest.mark.slow
def test_a_step_past_the_budget_is_cut_and_the_next_not_started(tmp_path):
    proc, calls = session(tmp_path, "--budget", "14", "--steps", "peers,causes,loop",
                          "--cpu", slow="causes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (tmp_path / "out/session.log").read_text()
    assert "causes: exit 124" in log and "cut at the budget" in log
    assert "loop: not run, the budget is spent" in log
    assert "peers: skipped (no peer script in --peers)" in log
    assert "steps that did not exit 0: causes" in log
    # in the order --steps names them
    assert log.index("peers: skipped") < log.index("causes: exit") < log.index("loop: not run")
    # --cpu: the tiny configuration, no timm benchmark without --peers
    causes = [c for c in calls if "--group causes" in c]
    assert len(causes) == 1 and "--device cpu" in causes[0]
    assert "--timm-benchmark" not in causes[0]
    assert not [c for c in calls if "--group loop" in c]


def test_bad_arguments_exit_2_naming_them(tmp_path):
    for args, message in ((["--steps", "tier,bogus"], "unknown step bogus"),
                          (["--budget", "ten"], "--budget takes whole seconds"),
                          (["--peers", str(tmp_path / "none")], "is not a folder")):
        proc = subprocess.run(["bash", "launch/gpu_session.sh", "--out", str(tmp_path / "o"),
                               *args], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
