"""Fault tolerance on CPU with the real scripts: crashes, preemption, dead and hung peers,
damaged checkpoints and damaged data. Runs are killed and signalled for real, as real processes
(torchrun and fresh interpreters); the runs around them that nothing interrupts (a reference to
match, a resume, a run over damaged data) are forked from an interpreter that has imported
everything already (conftest.run_forked), which computes the same."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import (LOADER_WORKERS, REPO, TINY, TRAIN, add_damaged_files, children,
                      jpeg_bytes, proc_stat, read_jsonl, records, run_forked, run_script,
                      start_forked, start_script, unused_port)
from step_hold import held, hold_env, release, wait_for


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _assert_same_weights(a, b):
    a, b = _weights(a), _weights(b)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _read_until(proc, prefix: str) -> str:
    """Consume the run's output up to the first line containing `prefix`."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if prefix in line:
            return "".join(seen)
    proc.wait()
    raise AssertionError(f"the run ended before printing {prefix!r}:\n{''.join(seen)[-3000:]}")


def _start_held(script: str, args, hold_dir: Path, after: int, nproc: int = 0,
                torchrun_args=(), forked: bool = False):
    """train/<script> started as start_script does (forked: one process, as start_forked
    does), each process held after its step `after` until release(hold_dir)
    (tests/step_hold.py): the test signals or kills it at that step, however fast the run or
    slow this test's process."""
    program, env = [TRAIN / script, *args], hold_env(after, hold_dir)
    if forked:
        assert nproc == 0 and not torchrun_args
        return start_forked("tests/step_hold.py", program, env=env)
    return start_script("tests/step_hold.py", program, nproc, torchrun_args, env=env)


def _read_until_all(proc, texts) -> str:
    """Consume the run's output until each of `texts` has appeared (in any order)."""
    output = ""
    while not all(text in output for text in texts):
        output += _read_until(proc, "\n")
    return output


def _runs_after(log, start: int):
    """Records of the `start`-th process start (0 = first) of a run dir's log."""
    starts = [i for i, r in enumerate(log) if r["kind"] == "run"] + [len(log)]
    return log[starts[start]:starts[start + 1]]


# --- crashes and preemption under torchrun -------------------------------------------------------
# With loader workers: what a signal or a killed rank does to them is part of the check.
DDP_RUN = TINY + LOADER_WORKERS + ["-b", "4", "--epochs", "2", "--lr-steps", "1",
                                   "--checkpoint-every", "3", "--seed", "5"]


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def uninterrupted_ddp(tiny_imagefolder, tmp_path_factory):
    """The 2-rank run the interrupted ones must reproduce bit for bit (2 epochs x 8 steps)."""
    logdir = tmp_path_factory.mktemp("uninterrupted")
    run_forked("ddp.py", DDP_RUN + ["--logdir", logdir, "--run-name", "ref", tiny_imagefolder],
               nproc=2)
    return logdir / "ref/checkpoint.pth"


def _rank_pid(torchrun_pid: int, rank: int) -> int:
    """The pid of one rank among torchrun's children (each worker's environment names it)."""
    ranks = children(torchrun_pid)
    for pid in ranks:
        if f"RANK={rank}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
            return int(pid)
    raise AssertionError(f"no rank {rank} among torchrun's children {ranks}")


@pytest.mark.slow
@pytest.mark.xdist_group("uninterrupted-ddp")  # one worker: the fixture runs once
def test_torchrun_restarts_after_kill_9_and_finishes_exactly(tiny_imagefolder, tmp_path,
                                                             uninterrupted_ddp):
    """kill -9 of rank 1 mid-epoch: the surviving rank fails fast with a clear message, torchrun
    restarts the group, --resume auto continues from the newest checkpoint, at most one
    --checkpoint-every interval is repeated, and the final weights equal an uninterrupted
    run's, bit for bit."""
    # Both ranks wait after step 13 (epoch 1, step 5; checkpoints were taken at 9 and 12) until
    # rank 1 is dead; the restarted group finds them released and does not wait.
    hold_dir = tmp_path / "hold"
    proc = _start_held("ddp.py", DDP_RUN + ["--resume", "auto", "--logdir", tmp_path,
                                            "--run-name", "job", tiny_imagefolder], hold_dir, 13,
                       nproc=2, torchrun_args=["--max-restarts=1"])
    wait_for(held(hold_dir, 2), "held after step 13", proc)
    rank1 = _rank_pid(proc.pid, 1)
    os.kill(rank1, signal.SIGKILL)
    wait_for(lambda: _gone(rank1), "rank 1 gone", proc)
    killed_at = time.monotonic()
    release(hold_dir)
    output = _read_until(proc, "=> resumed from")
    restart_seconds = time.monotonic() - killed_at
    output += proc.stdout.read()
    assert proc.wait(timeout=300) == 0, output
    assert "rank 0 of 2: communication with the other ranks failed" in output
    # Not --dist-timeout's 600 s that a rank waiting on its dead peer would take: room to
    # spare for a loaded machine, where starting the group again alone takes a minute.
    assert restart_seconds < 300, restart_seconds

    log = read_jsonl(tmp_path / "job")
    first, second = _runs_after(log, 0), _runs_after(log, 1)
    assert first[0]["resumed_from"] is None
    assert second[0]["resumed_from"].endswith("job/checkpoint.pth")
    last_done = max(r["step"] for r in first if r["kind"] == "train")
    resumed_step = second[1]["step"] - 1  # first train record after the restart
    assert 0 <= last_done - resumed_step <= 3  # at most one --checkpoint-every interval redone
    assert resumed_step == 12  # the newest checkpoint before the kill at step 13
    assert [r["epoch"] for r in second if r["kind"] == "train_epoch"] == [1]
    assert records(tmp_path / "job", "end")[-1]["reason"] == "finished"
    _assert_same_weights(uninterrupted_ddp, tmp_path / "job/checkpoint.pth")


@pytest.mark.slow
@pytest.mark.xdist_group("uninterrupted-ddp")  # one worker: the fixture runs once
def test_sigterm_under_torchrun_checkpoints_and_resume_is_exact(tiny_imagefolder, tmp_path,
                                                               uninterrupted_ddp):
    """SIGTERM to torchrun (what `scancel` or a job scheduler does): torchrun passes it to the
    ranks' process groups; the loader workers survive it, every rank stops at the same step,
    rank 0 writes a mid-epoch checkpoint and the ranks exit 75, well inside torchrun's 30 s
    grace period. Resuming reproduces the uninterrupted run exactly."""
    common = DDP_RUN + ["--logdir", tmp_path, "--run-name", "job"]
    # Both ranks wait after step 2 until the signal has reached them: they stop at step 2.
    hold_dir = tmp_path / "hold"
    proc = _start_held("ddp.py", common + [tiny_imagefolder], hold_dir, 2, nproc=2)
    wait_for(held(hold_dir, 2), "held after step 2", proc)
    proc.send_signal(signal.SIGTERM)
    output = _read_until_all(proc, [f"=> rank {r}: SIGTERM received" for r in (0, 1)])
    release(hold_dir)
    output += proc.stdout.read()
    proc.wait(timeout=120)
    # No SIGKILL after the grace period: torchrun says when it has to send one (and that it
    # sent the ranks the SIGTERM, so its warnings do reach this output).
    assert "closing signal SIGTERM" in output, output
    assert "Unable to shutdown process" not in output, output
    assert "exiting with status 75" in output, output
    assert "DataLoader worker" not in output  # workers were not killed by the signal
    cut = torch.load(tmp_path / "job/checkpoint.pth", weights_only=True)
    assert (cut["epoch"], cut["epoch_step"]) == (0, 2)
    assert records(tmp_path / "job", "end")[-1]["reason"] == "preempted by SIGTERM"

    run_forked("ddp.py", common + ["--resume", "auto", tiny_imagefolder], nproc=2)
    _assert_same_weights(uninterrupted_ddp, tmp_path / "job/checkpoint.pth")


@pytest.mark.slow
# The default loader without accumulation: its mid-epoch cut and exact resume are the SIGTERM
# test's above (DDP, the same loader and sampler), SIGUSR1's handling the other cases' here.
@pytest.mark.parametrize("backend,accum", [("pytorch", 2), ("dali-cpu", 1), ("gpu", 1)])
def test_preemption_signal_checkpoints_mid_epoch_and_resume_is_exact(tiny_imagefolder, tmp_path,
                                                                     backend, accum):
    """SIGUSR1 (SLURM's warning before the time limit) makes the run finish its step, write a
    mid-epoch checkpoint and exit 75; --resume auto then ends with the same weights, bit for bit,
    as a run that was never interrupted (also taking --checkpoint-every checkpoints). With DALI
    that takes its pipeline's random state, restored inside the epoch; with --grad-accum 2 the
    resumed epoch goes on at the next optimizer step's first micro-batch."""
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    if backend == "gpu":  # decodes with TorchCodec (on the CPU here)
        pytest.importorskip("torchcodec")
    common = TINY + LOADER_WORKERS + ["-b", "8", "--epochs", "2", "--lr-steps", "1", "--seed",
                                      "4", "--logdir", tmp_path, "--data-backend", backend,
                                      "--grad-accum", str(accum)]
    run_forked("nd.py", common + ["--checkpoint-every", "3", "--run-name", "straight",
                                  tiny_imagefolder])
    # The run waits after step 2 until the signal has reached it: it stops inside epoch 0, at
    # step 2, whatever the speed of the CPU and of this test's process.
    hold_dir = tmp_path / "hold"
    # forked, its SIGUSR1 passed on by the server's client (a fresh interpreter's: the SLURM
    # time-limit test's, tests/test_slurm.py)
    proc = _start_held("nd.py", common + ["--run-name", "cut", tiny_imagefolder], hold_dir, 2,
                       forked=True)
    wait_for(held(hold_dir), "held after step 2", proc)
    proc.send_signal(signal.SIGUSR1)
    output = _read_until(proc, "=> rank 0: SIGUSR1 received")
    release(hold_dir)
    output += proc.stdout.read()
    assert proc.wait(timeout=120) == 75, output
    cut = torch.load(tmp_path / "cut/checkpoint.pth", weights_only=True)
    assert (cut["epoch"], cut["epoch_step"]) == (0, 2)  # stopped inside epoch 0, where held
    assert "preempted by SIGUSR1" in records(tmp_path / "cut", "end")[0]["reason"]
    run_forked("nd.py", common + ["--run-name", "cut", "--resume", "auto", tiny_imagefolder])
    _assert_same_weights(tmp_path / "straight/checkpoint.pth", tmp_path / "cut/checkpoint.pth")
    # the resumed process started right after the checkpointed step, inside epoch 0
    resumed_train = [r for r in _runs_after(read_jsonl(tmp_path / "cut"), 1)
                     if r["kind"] == "train"]
    assert (resumed_train[0]["epoch"], resumed_train[0]["epoch_step"]) == (0, cut["epoch_step"] + 1)
    steps = len(records(tmp_path / "straight", "train"))  # 16, 8 with --grad-accum 2
    assert steps == 16 // accum
    assert len(resumed_train) == steps - cut["epoch_step"]  # no step repeated, none lost


def _gone(pid: int) -> bool:
    try:
        return proc_stat(pid)[0] in ("Z", "X")  # zombie or dead
    except OSError:
        return True


@pytest.mark.slow
def test_loader_workers_end_soon_after_a_killed_trainer(tiny_imagefolder, tmp_path):
    """Loader workers start from a fork server, so their parent is that server, not the trainer:
    when the trainer is killed outright they (and the server) still end within seconds instead
    of lingering forever."""
    hold_dir = tmp_path / "hold"
    # held after step 2, so the training loader's workers are all there is (validation's start
    # at the epoch's end, which a fast machine could otherwise reach before the count)
    proc = _start_held("nd.py", TINY[:-4] + ["-j", "2", "-p", "1", "-b", "4", "--epochs", "3",
                                             "--logdir", tmp_path, tiny_imagefolder],
                       hold_dir, after=2)
    wait_for(held(hold_dir), "held at step 2", proc)
    servers = [p for p in children(proc.pid)
               if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(servers) == 1
    workers = children(servers[0])
    assert len(workers) == 2  # the training loader's (validation's start at the epoch's end)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while not all(map(_gone, workers + servers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_gone, workers + servers))


@pytest.mark.slow
def test_the_loader_workers_fork_server_outlives_the_stop_signals():
    """torchrun passes SIGTERM to each rank's whole process group, SLURM to every process: the
    fork server the loader workers come from must survive it (killed, it would take the workers
    with it before the trainer has written its preemption checkpoint)."""
    probe = (
        "import multiprocessing, multiprocessing.forkserver as fs, os, signal, sys, time\n"
        "from imagenet_recipes.data.loader_server import loader_worker_context\n"
        "context = loader_worker_context()\n"
        "child = context.Process(target=time.sleep, args=(30,))\n"
        "child.start()  # served: the server has done its imports\n"
        "server = fs._forkserver._forkserver_pid\n"
        "for stop in (signal.SIGTERM, signal.SIGUSR1):\n"
        "    os.kill(server, stop)\n"
        "time.sleep(1)\n"
        "print('server', 'gone' if os.waitpid(server, os.WNOHANG)[0] else 'alive', flush=True)\n"
        "child.kill()\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.stdout.strip() == "server alive", proc.stderr


# --- dead, hung and missing peers ----------------------------------------------------------------
def _start_ranks(ranks, world: int, args, tmp_path):
    """Ranks of a DDP run started by hand (no torchrun, so nothing restarts or kills them)."""
    port = str(unused_port())
    return [start_script("ddp.py", args + ["--logdir", tmp_path, "--run-name", "job"],
                         env={"RANK": str(rank), "WORLD_SIZE": str(world),
                              "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": port})
            for rank in ranks]


# A hung peer is detected by the collective timeout; a dead one when its sockets close (~5 s:
# its loader workers hold them until they notice their parent is gone), not by the timeout. The
# upper bounds leave a loaded machine minutes, and stay far below the 600 s default timeout (a
# --dist-timeout not applied) and the dead peer's 600 s (noticed by the timeout after all).
@pytest.mark.slow
@pytest.mark.parametrize("fault,timeout,at_least,at_most", [("SIGSTOP", 5, 5, 200),
                                                            ("SIGKILL", 600, 0, 200)])
def test_a_hung_or_dead_peer_ends_the_run_in_bounded_time(tiny_imagefolder, tmp_path, fault,
                                                          timeout, at_least, at_most):
    """Rank 1 stops responding (SIGSTOP) or dies (SIGKILL) mid-epoch: rank 0 exits 1 with a
    message naming the cause in bounded time, instead of waiting forever."""
    args = TINY + ["-b", "4", "--epochs", "3", "--dist-timeout", timeout, tiny_imagefolder]
    rank0, rank1 = _start_ranks([0, 1], 2, args, tmp_path)
    try:
        _read_until(rank0, "Epoch [0][3/")
        rank1.send_signal(getattr(signal, fault))
        faulted = time.monotonic()
        output = rank0.stdout.read()
        assert rank0.wait(timeout=300) == 1, output
        detected = time.monotonic() - faulted
    finally:
        rank1.kill()
        rank1.wait()
    assert "error: rank 0 of 2: communication with the other ranks failed" in output
    assert f"--dist-timeout {timeout} s" in output
    assert at_least <= detected < at_most, detected


@pytest.mark.slow
def test_a_peer_that_never_starts_ends_the_run_in_bounded_time(tiny_imagefolder, tmp_path):
    (rank0,) = _start_ranks([0], 2, TINY + ["--dist-timeout", "3", tiny_imagefolder], tmp_path)
    started = time.monotonic()
    output = rank0.stdout.read()
    assert rank0.wait(timeout=60) == 1, output
    assert time.monotonic() - started < 200  # --dist-timeout's 3 s, not the default 600 s
    assert "communication with the other ranks failed" in output
    assert "1/2 clients joined" in output


@pytest.mark.slow
def test_a_failed_checkpoint_write_stops_every_rank_at_once(tiny_imagefolder, tmp_path):
    """Rank 0 cannot write its checkpoint (the name is taken by a directory, which no rename
    replaces, even for root): every rank exits 1 with the reason within seconds, instead of
    rank 1 waiting in the next epoch's collectives until --dist-timeout (1200 s here)."""
    run_dir = tmp_path / "blocked"
    (run_dir / "checkpoint.pth").mkdir(parents=True)
    (run_dir / "checkpoint.pth" / "in-the-way").write_text("")
    started = time.monotonic()
    proc = run_script("ddp.py", TINY + ["-b", "4", "--epochs", "3", "--steps-per-epoch", "2",
                                        "--dist-timeout", "1200", "--logdir", tmp_path,
                                        "--run-name", "blocked", tiny_imagefolder],
                      nproc=2, check=False, timeout=900)
    assert proc.returncode != 0
    # far below the 1200 s a waiting rank would take, with minutes to spare on a loaded machine
    assert time.monotonic() - started < 600
    output = proc.stdout + proc.stderr
    assert "error: could not write a checkpoint in" in output, output[-3000:]
    assert "error: rank 0 failed: could not write a checkpoint in" in output, output[-3000:]
    assert records(run_dir, "checkpoint") == [] and len(records(run_dir, "val")) == 1


# --- damaged checkpoints -------------------------------------------------------------------------
@pytest.mark.slow
def test_resume_auto_survives_a_damaged_newest_checkpoint(tiny_imagefolder, tmp_path):
    common = TINY + ["-b", "16", "--steps-per-epoch", "1", "--logdir", tmp_path,
                     "--run-name", "job"]
    run_forked("nd.py", common + ["--epochs", "2", tiny_imagefolder])
    latest = tmp_path / "job/checkpoint.pth"
    latest.write_bytes(latest.read_bytes()[:1000])  # truncated newest checkpoint
    proc = run_forked("nd.py", common + ["--epochs", "3", "--resume", "auto", tiny_imagefolder])
    assert f"{latest} is not a readable checkpoint" in proc.stdout
    assert "checkpoint.prev.pth at epoch 1" in proc.stdout
    second = _runs_after(read_jsonl(tmp_path / "job"), 1)
    assert [r["epoch"] for r in second if r["kind"] == "train_epoch"] == [1, 2]
    # the damaged file was set aside, so it never replaced the good previous checkpoint
    assert (tmp_path / "job/checkpoint.damaged.pth").stat().st_size == 1000
    assert torch.load(tmp_path / "job/checkpoint.prev.pth", weights_only=True)["epoch"] == 2


# --- damaged data --------------------------------------------------------------------------------
@pytest.mark.slow
def test_damaged_data_is_decoded_or_skipped_and_counted(tiny_imagefolder, tmp_path):
    """CMYK and grayscale JPEGs and a PNG named .JPEG train; a truncated JPEG, a zero-byte file
    and a non-image are skipped and counted over both ranks, and no rank waits for the other.
    Validation counts each readable image exactly once."""
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    train_damaged = add_damaged_files(sorted((data / "train").iterdir())[1])
    val_damaged = add_damaged_files(sorted((data / "val").iterdir())[2])
    undecodable = sum(not ok for ok in train_damaged.values())
    # 64 + 6 = 70 train files = 2 ranks x 5 steps x 7: each file is met once per epoch
    run_forked("ddp.py", TINY + ["-b", "7", "--epochs", "1", "--logdir", tmp_path,
                                 "--run-name", "damaged", data], nproc=2)
    epoch = records(tmp_path / "damaged", "train_epoch")[0]
    assert epoch["count"] == 70 and epoch["skipped"] == undecodable
    val = records(tmp_path / "damaged", "val")[0]
    assert val["count"] == 20 + sum(val_damaged.values())
    assert val["skipped"] == sum(not ok for ok in val_damaged.values())


def test_decodable_odd_formats_become_rgb(tmp_path):
    from imagenet_recipes.data import read_image_uint8

    made = add_damaged_files(_class_dir_with_images(tmp_path))
    for name, decodable in made.items():
        if decodable:
            image = read_image_uint8(str(tmp_path / "c" / name))
            assert image.dtype == torch.uint8 and image.shape == (3, 50, 60), name
    cmyk = read_image_uint8(str(next((tmp_path / "c").glob("*_cmyk.JPEG"))))
    # C=0 M=Y=100%: red, the colour PIL gives too (Adobe CMYK JPEGs are stored inverted)
    assert cmyk[0].float().mean() > 200 and cmyk[1].float().mean() < 40


def _class_dir_with_images(root):
    class_dir = root / "c"
    class_dir.mkdir()
    for i in range(6):
        (class_dir / f"img_{i}.JPEG").write_bytes(jpeg_bytes("RGB", (i * 40, 90, 90)))
    return class_dir


@pytest.mark.slow
def test_unreadable_images_are_skipped_and_counted(tiny_imagefolder, tmp_path):
    """A truncated JPEG and a text file named .JPEG do not stop (or hang) a 2-rank run. In
    training each is replaced by the next readable sample (batches keep their size); in
    validation it is dropped (no image counted twice). Both are counted over all ranks."""
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    first_class = sorted((data / "train").iterdir())[0]
    good = sorted(first_class.iterdir())[0]
    (first_class / "truncated.JPEG").write_bytes(good.read_bytes()[:300])
    (first_class / "notes.JPEG").write_text("not an image")
    (sorted((data / "val").iterdir())[0] / "empty.JPEG").write_bytes(b"")
    # 66 files = 2 ranks x 3 steps x 11: every file is met exactly once, nothing is dropped
    run_forked("ddp.py", TINY + ["-b", "11", "--epochs", "1", "--logdir", tmp_path,
                                 "--run-name", "skip", data], nproc=2)
    epoch = records(tmp_path / "skip", "train_epoch")[0]
    # notes.JPEG sorts right before truncated.JPEG, so the search for notes' replacement meets
    # truncated too: 3 unreadable reads for 2 unreadable files
    assert epoch["skipped"] == 3 and epoch["count"] == 66
    assert [r["count"] for r in records(tmp_path / "skip", "train")] == [22, 22, 22]
    val = records(tmp_path / "skip", "val")[0]
    assert val["skipped"] == 1 and val["count"] == 20


# The survivor below waits in C (as a rank does inside an NCCL collective or a CUDA
# synchronisation), where neither gloo's closed sockets nor a Python signal handler can reach it.
_BLOCKED_RANK = """
import os, sys, threading
from imagenet_recipes.strategies import DDPStrategy
strategy = DDPStrategy(device="cpu", dist_timeout=600)
strategy.setup_environment()
print("ready", flush=True)
if strategy.rank == 1:
    os._exit(3)  # dies without a word: killed, out of memory
threading.Event().wait()  # rank 0: blocked until its process is ended
"""


@pytest.mark.slow
def test_a_dead_peer_ends_a_rank_blocked_outside_python_within_seconds():
    port = str(unused_port())
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": port, "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", _BLOCKED_RANK], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=REPO,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in (0, 1)]
    try:
        assert ranks[1].wait(timeout=120) == 3
        died = time.monotonic()
        output = ranks[0].communicate(timeout=400)[0]
        took = time.monotonic() - died
    finally:
        for proc in ranks:
            proc.kill()
    assert ranks[0].returncode == 1, output
    assert "error: rank 0 of 2: rank 1 stopped answering (no heartbeat for 15 s)" in output
    assert "--resume auto" in output
    # the heartbeat's 15 s, not the 600 s dist_timeout: the rest is room for a loaded machine
    assert took < 300, took


# A rank that ends after a peer's failure holds a process group it cannot leave and a peer-watch
# thread that may be inside a store call. Python's own shutdown then ends that thread in the
# middle of C++ code, and that aborts the process ("terminate called without an active
# exception", exit -6) instead of the exit 1 the launcher and the user should see. Here the
# watch is held inside a call for certain (its store's host is frozen) until the host ends just
# as the rank does.
_RANK_ENDING_AFTER_A_FAILURE = """
import datetime, os, signal, subprocess, sys, time
import torch.distributed as dist
from imagenet_recipes.peers import PeerWatch
from imagenet_recipes.strategies.ddp import DDPStrategy
port = int(sys.argv[1])
host = subprocess.Popen([sys.executable, "-c",
    "import time, torch.distributed as d\\n"
    f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False)\\n"
    "print('up', flush=True)\\ntime.sleep(120)"], stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL, text=True)
print("host", host.pid, flush=True)  # the test ends it
host.stdout.readline()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
strategy = DDPStrategy()
strategy.rank, strategy.world_size = 0, 2
client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                       timeout=datetime.timedelta(seconds=5))
strategy._peer_watch = PeerWatch(client, 0, 2, interval=0.01, timeout=60).start()
os.kill(host.pid, signal.SIGSTOP)
time.sleep(0.5)  # the watch's next store call waits on the frozen host
print("ending", flush=True)
strategy.abandon()
os.kill(host.pid, signal.SIGKILL)  # the call returns, with an error, as this process ends
strategy.end_failed_process(1)
"""


@pytest.mark.slow
def test_a_rank_ending_after_a_peer_failure_exits_1_not_aborted():
    proc = subprocess.Popen([sys.executable, "-c", _RANK_ENDING_AFTER_A_FAILURE,
                             str(unused_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    first = proc.stdout.readline()
    if not first.startswith("host "):
        proc.kill()
        pytest.fail(f"the probe ended before starting the store's host:\n{proc.communicate()[1]}")
    host = int(first.split()[1])
    try:
        output, errors = proc.communicate(timeout=60)
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(host, signal.SIGKILL)
    assert "ending" in output, errors
    assert proc.returncode == 1, errors[-3000:]
    assert "terminate called" not in errors
