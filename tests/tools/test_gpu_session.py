"""tools/gpu_session.sh: which commands it runs, in what order, how it keeps to its time
budget, what a decoder the probe finds broken skips, and the archive it writes whatever
happened. A stand-in Python ($PYTHON) records every command it is given, so the composition is
checked exactly and in seconds; the commands themselves are the GPU tier's and bench.gpu's,
tested on their own (test_gpu_tier.py, test_bench_gpu.py), and the whole run for real from a
fresh clone on the CPU (test_fresh_machine.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO

# Records its arguments (and the tier's --first-of-each, group limit and the decoders it is told
# are broken); sleeps where FAKE_SLOW names the group. Asked where it imports imagenet_recipes
# from (outside the clone, launch/install_clone.sh), it names the clone: installed. As
# gpu_check.sh --probe's decoder check (decoder_check NAME), it prints NAME's verdict from
# FAKE_DECODERS ("NAME VERDICT" lines; OK where it names none).
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* | first=${GPU_TIER_FIRST_OF_EACH:-0} limit=${GPU_CHECK_GROUP_LIMIT:-unset}" \
     "broken=$(printf '%s' "${GPU_TIER_BROKEN_DECODERS:-}" | cut -d= -f1 | paste -sd,)" \
    >> "$FAKE_LOG"
case "$*" in "-P -c import pathlib, imagenet_recipes"*) echo "$FAKE_CLONE" ;; esac
case "$*" in "-m imagenet_recipes.data.decoder_check "*)
  verdict="$(printf '%s\\n' "$FAKE_DECODERS" | sed -n "s/^$3 //p")"
  echo "${verdict:-OK: $3: decodes on cuda:0}"
  case "${verdict:-OK}" in OK*) exit 0 ;; MISSING*) exit 3 ;; *) exit 1 ;; esac ;; esac
case "$*" in *"--group ${FAKE_SLOW:-none} "*) exec sleep 60 ;; esac
exit 0
"""
DECODERS_OK = ""


def session_env(tmp_path: Path, slow: str = "none", decoders: str = DECODERS_OK) -> dict:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(tmp_path / "calls.txt"),
           "FAKE_SLOW": slow, "FAKE_CLONE": str(REPO.resolve()), "FAKE_DECODERS": decoders,
           "TMPDIR": str(tmp_path / "tmp")}
    env.pop("GPU_CHECK_GROUP_LIMIT", None)
    return env


def session(tmp_path: Path, *args: str, slow: str = "none", decoders: str = DECODERS_OK,
            out: bool = True) -> tuple:
    """gpu_session.sh ARGS (--out tmp_path/out unless `out` is False) with the stand-in
    Python -> (the process, the commands the stand-in was given)."""
    env = session_env(tmp_path, slow, decoders)
    proc = subprocess.run(["bash", "tools/gpu_session.sh",
                           *(["--out", str(tmp_path / "out")] if out else []), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    calls = tmp_path / "calls.txt"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, lines


def bench_calls(calls) -> list:
    return [c.split(" | ")[0] for c in calls if "imagenet_recipes.bench.gpu" in c
            and "bench.gpu.targets" not in c]



GPU = "-m imagenet_recipes.bench.gpu --loader-window 6"


@pytest.mark.slow
def test_the_default_run_measures_decode_first_and_archives_its_records(tmp_path):
    out = tmp_path / "out"
    # what the steps leave beside their records: checkpoints, a JPEG, a large file
    (out / "bench/decode/runs/x").mkdir(parents=True)
    (out / "bench/decode/runs/x/model_best.pth").write_bytes(b"0" * 100)
    (out / "bench/decode/runs/x/log.jsonl").write_text("{}\n")
    (out / "stray.JPEG").write_bytes(b"0")
    (out / "big.events").write_bytes(b"0" * (6 << 20))
    archive = tmp_path / "back/gpu-run.tar.gz"
    proc, calls = session(tmp_path, "--archive", str(archive))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the JPEG set outside the records, in $TMPDIR
    jpegs = tmp_path / "tmp/imagenet_recipes-jpegs/gpu"
    reuse = f"--reuse {out}/gpu_decode.json --reuse {out}/gpu_scripts.json"
    assert bench_calls(calls) == [
        f"{GPU} --prepare-data --data {jpegs}",
        f"{GPU} --out {out}/bench/decode --group decode --decode-workers default "
        f"--data {jpegs} --json {out}/gpu_decode.json",
        f"{GPU} --out {out}/bench/scripts --only "
        f"pytorch-loader,gpu-decode,gpu-decode-nvimgcodec,dali-gpu {reuse} --data {jpegs} "
        f"--json {out}/gpu_scripts.json",
        f"{GPU} --out {out}/bench/compile --only gpu-decode-nvimgcodec-compile {reuse} "
        f"--data {jpegs} --json {out}/gpu_compile.json",
        f"-m imagenet_recipes.bench.gpu.processes -j 8 --data {jpegs} --out {out}/bench/smi "
        f"--json {out}/gpu_processes.json"]
    # the tier's decode group, every parameter set, between scripts and compile (its checks
    # failed on the last GPU run: before the longest step)
    tier, = [i for i, c in enumerate(calls) if "-m pytest" in c]
    assert "tests/gpu/test_gpu_decode.py" in calls[tier] and " first=0 " in calls[tier]
    assert calls[tier].endswith(" broken=")
    scripts, = [i for i, c in enumerate(calls) if "--only pytorch-loader" in c]
    compile_, = [i for i, c in enumerate(calls) if "--only gpu-decode-nvimgcodec-compile" in c]
    assert scripts < tier < compile_
    # each decoder probed in a process of its own, at bench.gpu's batch, before any step
    probes = [c.split(" | ")[0] for c in calls if "decoder_check" in c]
    assert probes == [f"-m imagenet_recipes.data.decoder_check {name} --device cuda "
                      "--batch-size 256 --limit 45" for name in ("torchcodec", "nvimgcodec",
                                                                 "nvimgcodec-whole")]
    assert max(i for i, c in enumerate(calls) if "decoder_check" in c) < min(
        i for i, c in enumerate(calls) if "--group decode" in c)
    # the targets judged from the records, at the end
    assert calls[-1].startswith(f"-m imagenet_recipes.bench.gpu.targets {out} |")
    log = (out / "session.log").read_text()
    assert "steps decode scripts tier-decode compile smi" in log
    # the commit as bench.gpu's records give it: marked where the tree differs from it
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO).returncode != 0
    assert f"\ngpu_session: commit {head}{' (plus uncommitted changes)' * dirty}\n" in log, log
    assert log.rstrip().rsplit("\n", 1)[1].startswith("gpu_session: done in ")

    with tarfile.open(archive) as tar:
        names = sorted(n.removeprefix("./") for n in tar.getnames())
    assert {"session.log", "probe.txt", "jpegs.log", "archive-left-out.txt",
            "bench/decode/runs/x/log.jsonl"} <= set(names), names
    assert not [n for n in names if n.endswith((".pth", ".JPEG", ".events"))], names
    left_out = (out / "archive-left-out.txt").read_text()
    for name in ("model_best.pth", "stray.JPEG", "big.events"):
        assert name in left_out, left_out
    assert f"gpu_session: archive {archive} (" in proc.stdout


@pytest.mark.slow
def test_a_decoder_the_probe_finds_broken_skips_what_needs_it(tmp_path):
    cause = ("nvImageCodec cannot decode on cuda:0 (CUDA error 35): pip install "
             "'nvidia-nvimgcodec-cu13[nvjpeg]'")
    broken = f"nvimgcodec BROKEN: {cause}\nnvimgcodec-whole BROKEN: {cause}\n"
    archive = tmp_path / "gpu-run.tar.gz"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torchcodec-0.17.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    # no --out: the records in a new folder of $TMPDIR, packed into the archive
    proc, calls = session(tmp_path, "--archive", str(archive), "--wheels", str(wheels),
                          decoders=broken, out=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the wheels installed first, from the files alone, before the probe (the JPEG set is
    # being made beside them from the start)
    calls = [c for c in calls if "--prepare-data" not in c]
    assert calls[0].split(" | ")[0] == (
        "-m pip install --quiet --disable-pip-version-check --no-index --no-deps "
        f"{wheels}/torchcodec-0.17.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert calls[1].startswith("- cuda |")
    skip = ("--skip-decoder nvimgcodec=nvImageCodec cannot decode on cuda:0 (CUDA error 35): "
            "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'")
    bench = bench_calls(calls)
    assert [c for c in bench if skip in c] == [c for c in bench if "--group decode" in c
                                               or "--only pytorch-loader" in c]
    assert len([c for c in bench if skip in c]) == 2
    assert not [c for c in bench if "nvimgcodec-compile" in c]
    # TorchCodec's checks still run; nvImageCodec's skip, told why
    tier, = [c for c in calls if "test_gpu_decode.py" in c]
    assert tier.endswith(" broken=nvimgcodec")
    with tarfile.open(archive) as tar:
        log = tar.extractfile("./session.log").read().decode()
    assert ("compile: skipped (nvimgcodec BROKEN: nvImageCodec cannot decode on cuda:0 (CUDA "
            "error 35)") in log
    assert "tier-decode: exit 0" in log and "smi: exit 0" in log

    # neither decoder: the compile step and the tier's decode checks skipped, the rest runs
    missing = ("torchcodec MISSING: torchcodec is not installed\n"
               "nvimgcodec MISSING: nvidia.nvimgcodec is not installed\n"
               "nvimgcodec-whole MISSING: nvidia.nvimgcodec is not installed\n")
    proc, _ = session(tmp_path, "--archive", str(archive), decoders=missing)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "out/session.log").read_text()
    assert "compile: skipped (nvimgcodec MISSING: nvidia.nvimgcodec is not installed)" in log
    assert "tier-decode: skipped (no GPU decoder works here" in log
    assert "decode: exit 0" in log and "smi: exit 0" in log


@pytest.mark.slow
def test_stopped_from_outside_it_ends_the_step_and_still_writes_the_archive(tmp_path):
    env = session_env(tmp_path, slow="decode")
    archive = tmp_path / "gpu-run.tar.gz"
    proc = subprocess.Popen(["bash", "tools/gpu_session.sh", "--out", str(tmp_path / "out"),
                             "--archive", str(archive)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    calls = tmp_path / "calls.txt"
    deadline = time.monotonic() + 60
    while "--group decode" not in (calls.read_text() if calls.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    time.sleep(1)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=40)[0]
    assert proc.returncode == 143, output
    assert time.monotonic() - started < 15, "the step was not stopped at once"
    assert archive.is_file(), output
    with tarfile.open(archive) as tar:
        log = tar.extractfile("./session.log").read().decode()
    assert "decode: " in log and "scripts" not in log.split("decode: ", 1)[1]
    # the step's process (the stand-in's sleep) is gone
    sleeping = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and _environ_has(p, f"FAKE_LOG={calls}") and _cmdline(p) == "sleep 60"]
    assert not sleeping


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _environ_has(proc: Path, item: str) -> bool:
    try:
        return item.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


@pytest.mark.slow
def test_the_other_steps_run_as_named_with_the_peers_scripts_found(tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    for name in ("benchmark.py", "train.py"):
        (peers / name).write_text("")
    steps = "tier,peers,causes,loop"
    proc, calls = session(tmp_path, "--steps", steps, "--peers", str(peers),
                          "--data", str(tmp_path / "jpegs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out, jpegs = tmp_path / "out", tmp_path / "jpegs"
    # the machine check first (its Python reads the script from stdin), where the package
    # imports from (launch/install_clone.sh) and the three decoder checks, then the same look
    # in the tier, then the tier's groups (side by side, so in any order), one parameter set of
    # each check
    checks = [c[:6] for c in calls if "bench.gpu" not in c][:7]
    assert checks == ["- cuda", "-P -c ", *["-m ima"] * 3, "- cuda", "-P -c "], calls
    tier = [c for c in calls if "-m pytest" in c]
    assert sorted(c.split("tests/gpu/test_gpu_")[1].split(".py")[0] for c in tier) == sorted([
        "entries", "precision", "ranks", "resume", "layout", "recipes", "dali", "decode", "nccl"])
    assert all(" first=1 " in c for c in tier)
    # each group stops itself within what is left of the budget
    assert all(0 < int(re.search(r" limit=(\d+)", c)[1]) <= 420 for c in tier)
    bench = bench_calls(calls)
    # the JPEG set first, in the background beside the tier
    assert bench[0] == f"{GPU} --prepare-data --data {jpegs}"
    assert calls.index(tier[-1]) < calls.index(next(c for c in calls if "--group" in c))
    reuse = f"--reuse {out}/gpu_decode.json --reuse {out}/gpu_scripts.json"
    assert bench[1:] == [
        f"{GPU} --out {out}/bench/peers --group peers --timm {peers}/train.py "
        f"--peers-data {jpegs} --peers-only nd fast --peers-repeats 1 "
        f"--json {out}/gpu_peers.json",
        f"{GPU} --out {out}/bench/causes --group causes --only ddp-1rank {reuse} "
        f"--timm-benchmark {peers}/benchmark.py --json {out}/gpu_causes.json",
        f"{GPU} --out {out}/bench/loop --group loop,compile --json {out}/gpu_loop.json"]
    log = (out / "session.log").read_text()
    assert "steps tier peers causes loop" in log and "JPEG set ready" in log

    # the same command again: every step finished, none runs again
    proc, again = session(tmp_path, "--steps", steps, "--peers", str(peers),
                          "--data", str(tmp_path / "jpegs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    later = again[len(calls):]
    assert not bench_calls(later) and not [c for c in later if "-m pytest" in c]
    assert proc.stdout.count("finished in an earlier call with this --out") == 4


@pytest.mark.slow
def test_the_tier_after_tier_decode_in_the_same_out_leaves_the_decode_group_out(tmp_path):
    """tier-decode runs the decode group (every parameter set on a GPU); a tier step with the
    same --out (in that call, or a later one: `finished` reads session.log) runs the other groups
    only, saying so."""
    proc, calls = session(tmp_path, "--steps", "tier-decode,tier",
                          "--data", str(tmp_path / "jpegs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups = [c.split("tests/gpu/test_gpu_")[1].split(".py")[0] for c in calls
              if "-m pytest" in c]
    assert groups[0] == "decode" and sorted(groups[1:]) == sorted(
        ["entries", "precision", "ranks", "resume", "layout", "recipes", "dali", "nccl"]), groups
    assert "tier: the decode group left out: tier-decode checked it in this --out" in proc.stdout


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


@pytest.mark.slow
def test_regions_that_fail_are_measured_on_whole_images_saying_so(tmp_path):
    """nvImageCodec's regions BROKEN, its whole images OK (nvJPEG < 13.2, or region batches that
    crash): its rows of decode, scripts and compile decode whole images (bench.gpu
    --nvimgcodec-whole, with the cause), nothing of it is skipped, the log says so, and the
    tier's decode checks of nvimgcodec are told it is broken."""
    cause = "--gpu-decoder nvimgcodec decoded nothing on cuda:0 for 256 regions of a known JPEG"
    proc, calls = session(tmp_path, decoders=f"nvimgcodec BROKEN: {cause}\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    whole = f"--nvimgcodec-whole regions BROKEN: {cause}"
    bench = bench_calls(calls)
    assert [c for c in bench if whole in c] == [
        c for c in bench if "--group decode" in c or "--only pytorch-loader" in c
        or "--only gpu-decode-nvimgcodec-compile" in c]
    assert len([c for c in bench if whole in c]) == 3
    assert not [c for c in bench if "--skip-decoder" in c]
    log = (tmp_path / "out/session.log").read_text()
    assert (f"nvimgcodec: regions BROKEN: {cause}: its rows decode whole images instead "
            "(--gpu-decoder nvimgcodec-whole)") in log
    assert "compile: exit 0" in log
    tier, = [c for c in calls if "test_gpu_decode.py" in c]
    assert tier.endswith(" broken=nvimgcodec")


@pytest.mark.slow
def test_bad_arguments_exit_2_naming_them(tmp_path):
    out = str(tmp_path / "o")
    for args, message in ((["--out", out, "--steps", "tier,bogus"], "unknown step bogus"),
                          (["--out", out, "--budget", "ten"], "--budget takes whole seconds"),
                          (["--out", out, "--peers", str(tmp_path / "none")], "is not a folder"),
                          ([], "--out DIR or --archive PATH is required"),
                          (["--archive", str(tmp_path / "a.zip")], "a .tar.gz path"),
                          (["--out", out, "--data", f"{out}/jpegs"], "is inside --out"),
                          (["--out", out, "--wheels", str(tmp_path)], "holds no .whl file")):
        proc = subprocess.run(["bash", "tools/gpu_session.sh", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    # with --archive, even a bad argument leaves the archive, saying why it stopped
    archive = tmp_path / "early.tar.gz"
    proc = subprocess.run(["bash", "tools/gpu_session.sh", "--archive", str(archive), "--steps",
                           "bogus"], cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and archive.is_file(), proc.stderr
    with tarfile.open(archive) as tar:
        log = tar.extractfile("./session.log").read().decode()
    assert "stopped before any step: unknown step bogus" in log


@pytest.mark.slow
def test_the_probe_names_a_decoder_whose_library_fails_to_load(tmp_path):
    """gpu_check.sh --probe (the session's first look at the machine) with nvImageCodec present
    but its library missing, as on a machine without nvJPEG: both its modes BROKEN with the
    cause, TorchCodec OK, and the probe still exits 0 (the session skips what needs it). The
    probe of a machine where every decoder works, and its list of what the machine has: the
    fresh-clone GPU run's probe.txt (tests/tools/test_fresh_machine.py)."""
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    # a batch of 4 as gpu_session.sh --cpu probes; the timeouts only stop a probe that never
    # ends: each decoder has its own limit, and three starts of torch take minutes on a busy CPU
    probe = ["bash", "launch/gpu_check.sh", "--probe", "--cpu", "--batch-size", "4"]
    shadow = tmp_path / "shadow/nvidia/nvimgcodec"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        'raise OSError("libnvjpeg.so.13: cannot open shared object file")\n')
    # nvidia/ first on the path, the installed one's modules after it (a regular package
    # elsewhere would win over a folder without __init__.py)
    (shadow.parent / "__init__.py").write_text(
        "import pkgutil\n__path__ = pkgutil.extend_path(__path__, __name__)\n")
    proc = subprocess.run(probe, cwd=REPO, env={**env, "PYTHONPATH": str(tmp_path / "shadow")},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("gpu_check: decoder nvimgcodec")]
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert " BROKEN: " in line and "libnvjpeg.so.13" in line, line
    assert re.search(r"^gpu_check: decoder torchcodec +OK", proc.stdout, re.M)
