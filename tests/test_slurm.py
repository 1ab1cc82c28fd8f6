"""SLURM for real: a two-node cluster on this machine (munged, slurmctld and one slurmd per node,
started by launch/slurm/local_cluster.sh) runs the repository's batch scripts through `sbatch`,
as a user would submit them. Needs root and `apt-get install slurm-wlm munge` (CI installs them);
skipped, with the reason shown, without them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

from conftest import REPO, TESTS, TINY, read_jsonl, records, unused_port
from step_hold import held, hold_env, release

# Every test here starts real processes; all of them share one local cluster (the module's
# fixture), so under launch/test.sh's two workers they run on the same one.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

CLUSTER = REPO / "launch" / "slurm" / "local_cluster.sh"
SINGLE_NODE = REPO / "launch" / "slurm" / "ddp_amp_single_node.sbatch"
MULTI_NODE = REPO / "launch" / "slurm" / "ddp_amp_multi_node.sbatch"
JOB_TIMEOUT = 300  # seconds; a tiny job takes 30-80 s on 2 busy cores


class Cluster:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.env = {**os.environ, "LOCAL_SLURM_DIR": str(state_dir),
                    "LOCAL_SLURM_PORT": str(unused_port(3)),
                    "LOCAL_SLURM_NODES": "2",  # node1 and node2, two slurmds
                    "LOCAL_SLURM_CPUS": "2",  # per node: the scripts' default is 2 processes
                    "SLURM_CONF": str(state_dir / "slurm.conf"),
                    "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

    def run(self, *cmd, timeout: float = 60, check: bool = True,
            env: Optional[dict] = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, cwd=REPO, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}\n{self.logs()}")
        return proc

    def logs(self) -> str:
        out = []
        for path in [self.state_dir / "slurmctld.log", *sorted(self.state_dir.glob("slurmd-*.log"))]:
            if path.is_file():
                lines = path.read_text().splitlines()[-15:]
                out.append(f"--- {path.name} (tail)\n" + "\n".join(lines))
        return "\n".join(out)

    def job(self, job_id: str) -> dict:
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def wait_for_end(self, job_id: str, output: Path) -> dict:
        deadline = time.monotonic() + JOB_TIMEOUT
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
                return info
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {info['JobState']} after {JOB_TIMEOUT} s:\n"
                             f"{_text(output)}\n{self.logs()}")


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else f"({path} not written)"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (slurmd starts jobs as their user)")
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
               if shutil.which(b) is None]
    if missing:
        pytest.skip(f"SLURM not installed ({', '.join(missing)} missing): "
                    "apt-get install -y slurm-wlm munge")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    cluster.run(CLUSTER, "start", timeout=120)  # a failure here fails the tests, with the logs
    yield cluster
    cluster.run(CLUSTER, "stop", timeout=120, check=False)


def _submit(slurm, tmp_path, script: Path, args, wait: bool, sbatch_args=(),
            env: Optional[dict] = None) -> tuple:
    output = tmp_path / "job-%j.out"
    sbatch = ["sbatch", "--parsable", f"--output={output}", *sbatch_args]
    sbatch += ["--wait"] if wait else []
    proc = slurm.run(*sbatch, script, *args, timeout=JOB_TIMEOUT + 60, check=False, env=env)
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch did not submit:\n{proc.stdout}\n{proc.stderr}"
    return proc, job_id, tmp_path / f"job-{job_id}.out"


def _held_env(hold_dir: Path) -> dict:
    """A job whose trainer runs through tests/step_hold.py (torchrun takes the first word after
    its options for the script, the rest for its arguments), each rank waiting after its step 2
    until release(hold_dir); the requeued run finds it released."""
    return {**hold_env(2, hold_dir), "TORCHRUN_ARGS": str(TESTS / "step_hold.py")}


def _wait_until(slurm, job_id: str, output: Path, condition, what: str,
                states=("PENDING", "RUNNING")) -> None:
    """Poll `condition` while the job is in one of `states`."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {JOB_TIMEOUT} s:\n{_text(output)}"
        assert slurm.job(job_id)["JobState"] in states, _text(output)
        time.sleep(0.2)


def _signal_at_step_2(slurm, job_id: str, output: Path, hold_dir: Path, signal_name: str,
                      *scancel_args) -> None:
    """Once both ranks of a _held_env job wait after step 2, `scancel SCANCEL_ARGS JOB`; once
    both have said they got `signal_name`, let them go on: they stop at step 2, however fast
    the steps or slow this test's polling."""
    _wait_until(slurm, job_id, output, held(hold_dir, 2), "held after step 2")
    slurm.run("scancel", *scancel_args, job_id)
    # a cancelled job's processes go on until they end or KillWait has passed
    _wait_until(slurm, job_id, output,
                lambda: all(f"=> rank {r}: {signal_name} received" in _text(output)
                            for r in (0, 1)),
                f"{signal_name} received by both ranks",
                states=("RUNNING", "CANCELLED", "COMPLETING"))
    release(hold_dir)


def _users_env(tmp_path: Path, extra_env: Optional[dict] = None) -> tuple:
    """(the environment, a job's environment): submitted from an activated environment that has
    torch (not this clone: the job installs it there), with pip pointed at nothing and an empty
    cache."""
    from fresh_python import bare_python

    venv = tmp_path / "users-env"
    env = bare_python(venv, with_packages=True)
    (venv / "bin" / "horovodrun").write_text(  # the console script Horovod's package brings
        f"#!/bin/sh\nexec {venv}/bin/python -c 'from horovod.runner.launch import "
        "run_commandline; run_commandline()' \"$@\"\n")
    (venv / "bin" / "horovodrun").chmod(0o755)
    return venv, {**env, **(extra_env or {}), "VIRTUAL_ENV": str(venv),
                  "XDG_CACHE_HOME": str(tmp_path / "cache"), "PIP_CONFIG_FILE": os.devnull,
                  "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": ""}


def _assert_trained_in(venv: Path, text: str, tmp_path: Path) -> None:
    """The job trained in the environment active at submit time, said so in one line, and
    built no environment of its own."""
    assert f"launch/env.sh: the active environment {venv} (its torch; nothing built)" in text
    assert "creating" not in text
    assert not list((tmp_path / "cache").glob("imagenet-recipes/venv-*"))


def test_single_node_batch_script_trains_with_two_processes(slurm, tiny_imagefolder, tmp_path):
    """`sbatch --wait launch/slurm/ddp_amp_single_node.sbatch DATA ARGS`, from a user's
    activated environment: torchrun starts one process per allocated CPU (2), mixed precision
    on (O1, bf16 on CPU), in that environment, and the run dir is runs/slurm-<jobid> under
    --logdir."""
    args = [tiny_imagefolder, *TINY, "-b", "4", "--epochs", "1", "--steps-per-epoch", "3",
            "--logdir", tmp_path / "runs"]
    venv, env = _users_env(tmp_path)
    proc, job_id, output = _submit(slurm, tmp_path, SINGLE_NODE, args, wait=True, env=env)
    text = _text(output)
    assert proc.returncode == 0, f"{proc.stderr}\n{text}\n{slurm.logs()}"
    _assert_trained_in(venv, text, tmp_path)
    info = slurm.job(job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0")

    run_dir = tmp_path / "runs" / f"slurm-{job_id}"
    (run,) = records(run_dir, "run")
    assert (run["entry"], run["strategy"], run["world_size"]) == ("ddp_apex", "ddp", 2)
    assert run["precision"]["opt_level"] == "O1"
    assert run["config"]["resume"] == "auto" and run["resumed_from"] is None
    assert [r["epoch_step"] for r in records(run_dir, "train")] == [1, 2, 3]
    (val,) = records(run_dir, "val")
    assert val["count"] == 20  # every val image once, over both ranks
    assert records(run_dir, "end")[-1]["reason"] == "finished"
    ckpt = torch.load(run_dir / "checkpoint.pth", map_location="cpu", weights_only=True)
    assert (ckpt["epoch"], ckpt["step"], ckpt["world_size"]) == (1, 3, 2)

    assert re.search(rf"nodes: node\d; 2 process\(es\) per node; run dir {run_dir}\n", text), text
    assert f"{TINY[1]} on 2 process(es)" in text, text
    assert "run ended: finished" in text, text


def test_time_limit_warning_checkpoints_requeues_and_resumes(slurm, tiny_imagefolder, tmp_path):
    """SLURM's warning before the time limit (`--signal=B:USR1@...`, sent here at once with
    `scancel --signal=USR1 --batch`) reaches the batch shell only; it passes it to torchrun,
    torchrun to both ranks, which checkpoint mid-epoch and exit; the script requeues the job,
    which starts again, resumes from that checkpoint and finishes, with no step done twice."""
    epochs = 2  # x 8 steps; the signal comes at step 2 (_signal_at_step_2)
    args = [tiny_imagefolder, *TINY, "-b", "4", "--epochs", epochs, "--opt-level", "O0",
            "--logdir", tmp_path / "runs"]
    hold_dir = tmp_path / "hold"
    _, job_id, output = _submit(slurm, tmp_path, SINGLE_NODE, args, wait=False,
                                env=_held_env(hold_dir))
    log = tmp_path / "runs" / f"slurm-{job_id}" / "log.jsonl"
    _signal_at_step_2(slurm, job_id, output, hold_dir, "SIGUSR1", "--signal=USR1", "--batch")

    info = slurm.wait_for_end(job_id, output)
    text = _text(output)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), \
        f"{text}\n{slurm.logs()}"

    run_dir = log.parent
    log = read_jsonl(run_dir)
    starts = [i for i, r in enumerate(log) if r["kind"] == "run"]
    assert len(starts) == 2, text
    first, second = log[:starts[1]], log[starts[1]:]
    assert first[0]["resumed_from"] is None
    assert second[0]["resumed_from"] == str(run_dir / "checkpoint.pth")
    assert [r["reason"] for r in log if r["kind"] == "end"] == ["preempted by SIGUSR1", "finished"]
    # stopped inside epoch 0, continued at the next step
    cut = [r for r in first if r["kind"] == "checkpoint"][-1]
    steps_per_epoch = first[0]["steps_per_epoch"]
    assert cut["step"] == 2  # where the ranks were held when the signal came
    resumed = [r for r in second if r["kind"] == "train"][0]
    assert resumed["step"] == cut["step"] + 1
    assert resumed["epoch"] == cut["step"] // steps_per_epoch
    # each epoch trained and validated once over the two runs, every step once
    assert [r["epoch"] for r in log if r["kind"] == "train_epoch"] == list(range(epochs))
    assert [r["epoch"] for r in log if r["kind"] == "val"] == list(range(epochs))
    train_steps = [r["step"] for r in log if r["kind"] == "train"]
    assert train_steps == list(range(1, epochs * steps_per_epoch + 1))

    assert "SIGUSR1 received: passing SIGUSR1 on to the training" in text, text
    for rank in (0, 1):  # torchrun passed the signal to both ranks
        assert f"=> rank {rank}: SIGUSR1 received" in text, text
    assert re.search(rf"requeueing job {job_id}\b", text), text
    assert "restart 1; nodes: node" in text  # the requeued run appended to the same file
    assert f"resumed from {run_dir / 'checkpoint.pth'}" in text, text
    assert text.rstrip().endswith("run ended: finished"), text


def test_multi_node_batch_script_runs_one_torchrun_per_node(slurm, tiny_imagefolder, tmp_path):
    """`sbatch --nodes=2 launch/slurm/ddp_amp_multi_node.sbatch`: srun starts one torchrun per
    node (two slurmds here), they meet at the c10d rendezvous on the first node and, with one
    process per node (NPROC=1), form one world of 2 ranks; both in the environment active at
    submit time."""
    args = [tiny_imagefolder, *TINY, "-b", "4", "--epochs", "1", "--steps-per-epoch", "2",
            "--opt-level", "O0", "--logdir", tmp_path / "runs"]
    venv, env = _users_env(tmp_path, {"NPROC": "1"})
    _, job_id, output = _submit(slurm, tmp_path, MULTI_NODE, args, wait=False,
                                sbatch_args=["--nodes=2"], env=env)
    info = slurm.wait_for_end(job_id, output)
    text = _text(output)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{text}\n{slurm.logs()}"
    _assert_trained_in(venv, text, tmp_path)
    assert info["NodeList"] == "node[1-2]"

    run_dir = tmp_path / "runs" / f"slurm-{job_id}"
    (run,) = records(run_dir, "run")
    assert (run["strategy"], run["world_size"]) == ("ddp", 2)  # 2 nodes x 1 process
    assert [r["epoch_step"] for r in records(run_dir, "train")] == [1, 2]
    assert records(run_dir, "val")[0]["count"] == 20
    assert records(run_dir, "end")[-1]["reason"] == "finished"
    assert (run_dir / "checkpoint.pth").is_file()
    assert "nodes: node1,node2; 1 process(es) per node" in text, text
    # one torchrun per node, both pointed at the first node's address (its NodeAddr)
    assert re.search(r"running: srun --nodes=2 --ntasks-per-node=1 .*torchrun_multi\.sh 2 "
                     r"127\.0\.0\.1:\d+ train/ddp_apex\.py", text), text


def test_scancel_is_not_undone_by_a_requeue(slurm, tiny_imagefolder, tmp_path):
    """`scancel` sends SIGTERM to the batch shell and the ranks: the ranks still checkpoint, but
    the script must not requeue the job (only its own warning signal leads to a requeue)."""
    args = [tiny_imagefolder, *TINY, "-b", "4", "--epochs", "2", "--opt-level", "O0",
            "--logdir", tmp_path / "runs"]
    hold_dir = tmp_path / "hold"
    _, job_id, output = _submit(slurm, tmp_path, SINGLE_NODE, args, wait=False,
                                env=_held_env(hold_dir))
    log = tmp_path / "runs" / f"slurm-{job_id}" / "log.jsonl"
    _signal_at_step_2(slurm, job_id, output, hold_dir, "SIGTERM")

    info = slurm.wait_for_end(job_id, output)
    text = _text(output)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), text
    assert "SIGTERM received; waiting for the training to checkpoint" in text, text
    assert "run preempted by SIGTERM, stopped by SLURM: not requeued" in text, text
    assert "requeueing" not in text
    assert [r["reason"] for r in read_jsonl(log.parent) if r["kind"] == "end"] == \
        ["preempted by SIGTERM"]
    assert (log.parent / "checkpoint.pth").is_file()


@pytest.mark.parametrize("script,sbatch_args,extra_env,strategy", [
    # (the two DDP scripts: the single- and multi-node tests above)
    ("horovod", ["--nodes=1"], {"NPROC": "2"}, "hvd"),
    ("ps", [], {"WORKERS": "1"}, "ps"),
])
def test_each_batch_script_trains_in_the_environment_active_at_submit_time(
        slurm, tiny_imagefolder, tmp_path, script, sbatch_args, extra_env, strategy):
    """Submitted from an activated environment that has torch (not this clone: the job installs
    it there), with pip pointed at nothing and an empty cache: the job trains in that
    environment, says so in one line, and builds no environment of its own."""
    venv, job_env = _users_env(tmp_path, extra_env)
    args = [tiny_imagefolder, *TINY, "-b", "4", "--epochs", "1", "--steps-per-epoch", "2",
            "--opt-level", "O0", "--logdir", tmp_path / "runs"]
    _, job_id, output = _submit(slurm, tmp_path, REPO / "launch" / "slurm" / f"{script}.sbatch",
                                args, wait=False, sbatch_args=sbatch_args, env=job_env)
    info = slurm.wait_for_end(job_id, output)
    text = _text(output)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{text}\n{slurm.logs()}"
    run_dir = tmp_path / "runs" / f"slurm-{job_id}"
    assert records(run_dir, "run")[0]["strategy"].startswith(strategy), text
    assert records(run_dir, "end")[-1]["reason"] == "finished", text
    _assert_trained_in(venv, text, tmp_path)
