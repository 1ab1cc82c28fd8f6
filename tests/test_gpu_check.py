"""launch/gpu_check.sh on a machine without a GPU (CI's): it refuses with exit 2 and says why,
and its argument handling and RESULTS block work. The checks themselves need a CUDA GPU."""
import json
import os
import subprocess

from conftest import REPO, run_tool

from bench import gpu_check


def test_without_a_gpu_it_exits_2_and_says_why():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even where there is one
    before = set((REPO / "runs").glob("gpu-check-*"))
    proc = subprocess.run(["bash", "launch/gpu_check.sh"], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA GPU is visible" in proc.stderr
    assert set((REPO / "runs").glob("gpu-check-*")) == before  # nothing was run or written


def test_list_and_only_select_checks_by_group_or_name():
    listed = run_tool("gpu_check", "--list")
    assert listed.returncode == 0
    groups = dict(line.split(": ", 1) for line in listed.stdout.splitlines())
    assert list(groups) == gpu_check.GROUPS
    assert set(" ".join(groups.values()).split()) == set(gpu_check.CHECKS)
    assert "precision-O2-bfloat16" in groups["precision"]

    some = run_tool("gpu_check", "--list", "--only", "entries,dali-batches")
    chosen = " ".join(line.split(": ", 1)[1] for line in some.stdout.splitlines()).split()
    assert chosen == ["entry-nd", "entry-dp", "entry-ddp", "entry-ddp_apex", "entry-hvd",
                      "entry-ps", "dali-batches"]

    bad = run_tool("gpu_check", "--only", "entries,warp-drive")
    assert bad.returncode == 2 and "unknown check or group: warp-drive" in bad.stderr


def test_results_block_shows_the_machine_and_every_check(tmp_path):
    record = {"command": "launch/gpu_check.sh --record", "commit": "abc1234",
              "date": "2026-11-23", "seconds": 480.0,
              "environment": {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "driver": "580.1",
                              "cpu_cores": 16,
                              "versions": {"torch": "2.15.0", "nvidia-dali": None}},
              "results": [{"name": "entry-nd", "group": "entries", "status": "PASS",
                           "detail": "6 steps", "seconds": 9.2, "numbers": {}},
                          {"name": "entry-hvd", "group": "entries", "status": "SKIP",
                           "detail": "horovod is not installed", "seconds": 0.0,
                           "numbers": {}},
                          {"name": "throughput-float16", "group": "throughput",
                           "status": "PASS", "detail": "3,210 img/s | target met",
                           "seconds": 40.0, "numbers": {"engine_img_s": 3210.0}}]}
    (tmp_path / "gpu_check.json").write_text(json.dumps(record))
    text = gpu_check.block(tmp_path)
    assert "NVIDIA H100 80GB HBM3 (1 GPU, driver 580.1, 16 CPU cores)" in text
    assert "2 passed, 0 failed, 1 skipped in 8.0 min" in text
    assert "torch 2.15.0" in text and "nvidia-dali" not in text  # not installed: not shown
    assert "| throughput-float16 | PASS | 3,210 img/s / target met | 40 |" in text
