"""GPU acceptance in one command: every entry script, opt level, multi-process path and loader on
CUDA, then ResNet-50 throughput, on a machine with at least one CUDA GPU.

    launch/gpu_check.sh                          # all checks (sized for under 9 minutes on one H100)
    launch/gpu_check.sh --list                   # the checks, by group
    launch/gpu_check.sh --only entries,dali      # some groups (or single checks by name)
    launch/gpu_check.sh --record                 # also keep the record in results/gpu/ and
                                                 # rewrite RESULTS.md's `gpu_check` block

Each check prints one line: PASS, FAIL or SKIP (what is not installed, e.g. Horovod or DALI), its
name, what it saw and its seconds. Throughput checks pass when they run; their line says whether
the target was met. Everything a check ran keeps its output and run log under --out.

Exit status: 0 when nothing failed, 1 when a check failed, 2 without a CUDA GPU or on bad
arguments. Several ranks on the one GPU run with DDP's --share-gpus (gloo carries the CUDA
tensors: NCCL refuses two ranks on one GPU).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from bench.common import REPO, git_commit, markdown_table, read_log
from bench.jobs import dataset_command, make_dataset

TRAIN = REPO / "train"
TARGET_IMG_S = 3000  # ResNet-50 AMP fp16, synthetic, channels_last, one H100
TARGET_ENGINE_RATIO = 0.97
TARGET_DALI_GAP = 0.15  # DALI GPU decode within 15 % of the synthetic number


class Failed(Exception):
    """The check ran and what it saw is wrong."""


class Skipped(Exception):
    """The check cannot run here (an optional package is missing)."""


@dataclass
class Result:
    name: str
    group: str
    status: str  # PASS | FAIL | SKIP
    detail: str
    seconds: float
    numbers: dict = field(default_factory=dict)


@dataclass
class Context:
    out: Path
    small: Path  # a few hundred small JPEGs: the functional checks
    large: Path  # a few thousand ImageNet-sized JPEGs: the input-pipeline throughput
    numbers: Dict[str, dict] = field(default_factory=dict)  # earlier checks' numbers, by name

    @property
    def runs(self) -> Path:
        return self.out / "runs"


def require(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


# --- running the entry scripts -------------------------------------------------------------------
SMALL = ["-a", "resnet18", "--image-size", "64", "-b", "32", "-j", "4", "-p", "1",
         "--epochs", "1", "--steps-per-epoch", "6", "--device", "cuda"]


def command(script: str, args: List, nproc: int = 0) -> List[str]:
    # torchrun passes SIGUSR1 (the preemption warning) on to the ranks, as
    # launch/torchrun_single.sh has it do
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={nproc}",
                 "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
                if nproc else [sys.executable])
    return launcher + [str(TRAIN / script)] + [str(a) for a in args]


def start(ctx: Context, name: str, script: str, args: List, nproc: int = 0,
          env: Optional[dict] = None) -> subprocess.Popen:
    """A run in the background, in a process group of its own (a signal reaches every rank)."""
    cmd = command(script, [*args, "--logdir", ctx.runs, "--run-name", name], nproc)
    output = ctx.out / "output" / f"{name}.txt"
    output.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, **(env or {})},
                            start_new_session=True)


def finish(ctx: Context, name: str, proc: subprocess.Popen, timeout: float,
           expect: Optional[int] = 0) -> str:
    """Wait for a started run (`expect`: its exit status, None for any); its output goes to
    out/output/NAME.txt (appended)."""
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        _keep_output(ctx, name, text)
        raise Failed(f"still running after {timeout:.0f} s")
    _keep_output(ctx, name, text)
    if expect is not None and proc.returncode != expect:
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise Failed(f"exit {proc.returncode} (expected {expect}): {last[0][:200]}")
    return text


def _keep_output(ctx: Context, name: str, text: str) -> None:
    with open(ctx.out / "output" / f"{name}.txt", "a") as out:
        out.write(text)


def train(ctx: Context, name: str, script: str, args: List, nproc: int = 0,
          timeout: float = 240, env: Optional[dict] = None) -> dict:
    """Run an entry script to its end; -> its log records by kind."""
    finish(ctx, name, start(ctx, name, script, args, nproc, env), timeout)
    return read_log(ctx.runs / name)


def finite_losses(log: dict) -> List[float]:
    losses = [r["loss"] for r in log.get("train", [])]
    require(bool(losses), "no training step was logged")
    require(all(math.isfinite(x) for x in losses), f"non-finite loss: {losses}")
    return losses


def on_cuda(log: dict) -> str:
    device = log["run"][0].get("device", "")
    require(device.startswith("cuda"), f"ran on {device!r}, not the GPU")
    return device


# --- checks: entry scripts -----------------------------------------------------------------------
def entry_check(script: str, nproc: int = 0, extra: tuple = (), backend: Optional[str] = None,
                needs: Optional[str] = None) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        if needs and importlib.util.find_spec(needs) is None:
            raise Skipped(f"{needs} is not installed (launch/install_horovod.sh builds it)")
        log = train(ctx, f"entry-{script[:-3]}", script, [*SMALL, *extra, ctx.small], nproc)
        losses = finite_losses(log)
        run = log["run"][0]
        if backend:
            require(run.get("backend") == backend, f"backend {run.get('backend')}, not {backend}")
        if script != "ps.py":
            on_cuda(log)
        return f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}" + (
            f", {backend}" if backend else "")
    return check


# --- checks: precision ---------------------------------------------------------------------------
def precision_check(level: str, dtype: str) -> Callable[[Context], str]:
    scaled = dtype == "float16" and level in ("O1", "O2")

    def check(ctx: Context) -> str:
        extra = ["--opt-level", level] + (["--amp-dtype", dtype] if level != "O0" else [])
        log = train(ctx, f"precision-{level}-{dtype}", "nd.py", [*SMALL, *extra, ctx.small])
        losses = finite_losses(log)
        run = log["run"][0]
        require(run["precision"]["dtype"] == dtype,
                f"ran in {run['precision']['dtype']}, not {dtype}")
        scales = [r.get("loss_scale") for r in log["train"]]
        if scaled:
            require(all(s is not None and s > 0 for s in scales),
                    f"float16 {level} needs a positive dynamic loss scale, logged {scales}")
            text = f", loss scale {scales[0]:g} -> {scales[-1]:g}"
        else:
            require(all(s is None for s in scales), f"no loss scaling expected, logged {scales}")
            text = ", no loss scaling"
        return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}{text}"
    return check


def o2_layout(ctx: Context) -> str:
    """In this process: O2 keeps half weights in the model, BatchNorm in fp32, fp32 masters in
    the optimizer, and after steps the model's weights are the masters rounded to half."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    from recipe.config import parse_args
    from recipe.engine import Trainer
    from recipe.metrics import SumMeter
    from recipe.strategies import Strategy

    with tempfile.TemporaryDirectory() as logdir:
        cfg = parse_args(["--dummy", "-a", "resnet18", "--image-size", "64", "-b", "16",
                          "--opt-level", "O2", "--amp-dtype", "float16", "--device", "cuda",
                          "--logdir", logdir, "--run-name", "o2", "--synthetic-train-size", "64",
                          "--synthetic-val-size", "16"])
        trainer = Trainer(cfg, Strategy.from_config(cfg), "nd")
        trainer.setup()
        try:
            model = trainer.strategy.module
            bn = {id(p) for m in model.modules() if isinstance(m, _BatchNorm)
                  for p in m.parameters()}
            half = {p.dtype for p in model.parameters() if id(p) not in bn}
            kept = {p.dtype for p in model.parameters() if id(p) in bn}
            stats = {b.dtype for m in model.modules() if isinstance(m, _BatchNorm)
                     for b in (m.running_mean, m.running_var)}
            masters = dict(trainer.strategy.named_optimizer_params())
            require(half == {torch.float16}, f"model weights {half}, not float16")
            require(kept == stats == {torch.float32}, f"BatchNorm {kept} / stats {stats}")
            require({p.dtype for p in masters.values()} == {torch.float32},
                    "the optimizer's parameters are not all fp32 masters")
            batches = iter(trainer.train_loader)
            for _ in range(3):
                trainer.train_step(batches, SumMeter(("loss", "correct1", "correct5"),
                                                     trainer.device))
            named = dict(model.named_parameters())
            drift = [name for name, m in masters.items()
                     if not torch.equal(named[name], m.to(named[name].dtype))]
            require(not drift, f"model weights differ from their rounded masters: {drift[:3]}")
        finally:
            trainer.close()
    return (f"model float16, BatchNorm float32, the optimizer's {len(masters)} parameters "
            "fp32; after 3 steps the model is its masters in half")


# --- checks: several ranks on one GPU ------------------------------------------------------------
SHARED = ["--share-gpus", "-b", "16"]


def shared_validation(ctx: Context) -> str:
    """2 DDP ranks without --sync-bn: in-training validation scores exactly what the checkpoint
    holds (nd.py -e of it gives the same top-1 and image count)."""
    args = [*SMALL[:4], "-j", "2", "-p", "1", "--epochs", "1", "--device", "cuda", *SHARED]
    log = train(ctx, "ranks2-train", "ddp.py", [*args, ctx.small], nproc=2)
    require(log["run"][0]["world_size"] == 2, "not 2 ranks")
    require(log["run"][0]["backend"] == "gloo", "--share-gpus should run over gloo")
    evaluated = train(ctx, "ranks2-eval", "nd.py", [*SMALL[:4], "--device", "cuda", "-e",
                                                    "--resume",
                                                    ctx.runs / "ranks2-train/checkpoint.pth",
                                                    ctx.small])
    during, after = log["val"][-1], evaluated["val"][-1]
    require(during["count"] == after["count"], f"{during['count']} vs {after['count']} images")
    require(during["top1"] == after["top1"], f"top-1 {during['top1']} vs {after['top1']}")
    return (f"2 ranks on one GPU (gloo): validation of {during['count']} images, top-1 "
            f"{during['top1']:.2f} = the checkpoint's")


def shared_syncbn(ctx: Context) -> str:
    log = train(ctx, "ranks2-syncbn", "ddp.py", [*SMALL, *SHARED, "--sync-bn", ctx.small],
                nproc=2)
    losses = finite_losses(log)
    return f"2 ranks, SyncBatchNorm: {len(losses)} steps, loss {losses[-1]:.3f}"


def preempt_and_resume(ctx: Context, name: str, script: str, args: List, nproc: int,
                       env: Optional[dict] = None) -> int:
    """Signal a run (SIGUSR1, as SLURM warns before its time limit; torchrun passes it on to
    the ranks) once it has made progress, expect its mid-epoch checkpoint (exit 75 without
    torchrun), then resume it to the end. -> the step it stopped after."""
    proc = start(ctx, name, script, [*args, "-p", "1"], nproc, env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Epoch [0][" in line and line.split("Epoch [0][")[1].split("/")[0].strip() == "3":
            proc.send_signal(signal.SIGUSR1)
            break
    _keep_output(ctx, name, "".join(seen))
    finish(ctx, name, proc, 240, expect=None if nproc else 75)
    log = read_log(ctx.runs / name)
    stopped = log["train"][-1]["epoch_step"]
    require("preempted" in log["end"][-1]["reason"], f"end record: {log['end'][-1]}")
    finish(ctx, name, start(ctx, name, script, [*args, "-p", "1", "--resume", "auto"], nproc,
                            env), 240)
    resumed = [r for r in read_log(ctx.runs / name)["train"]][len(log["train"]):]
    require(bool(resumed) and (resumed[0]["epoch"], resumed[0]["epoch_step"]) == (0, stopped + 1),
            f"resumed at {resumed[:1]}, expected epoch 0 step {stopped + 1}")
    return stopped


def shared_preemption(ctx: Context) -> str:
    args = [*SMALL[:4], "-j", "2", "--epochs", "1", "--steps-per-epoch", "10", "--device",
            "cuda", *SHARED, ctx.small]
    stopped = preempt_and_resume(ctx, "ranks2-preempt", "ddp.py", args, nproc=2)
    steps = len(read_log(ctx.runs / "ranks2-preempt")["train"])
    require(steps == 10, f"{steps} steps logged over both runs, expected 10 (none lost or "
                         "repeated)")
    return (f"2 ranks: SIGUSR1 -> mid-epoch checkpoint after step {stopped}; resumed there "
            "to step 10")


# --- checks: checkpoints, layouts, compilation ---------------------------------------------------
def o2_resume_exact(ctx: Context) -> str:
    """O2 float16, deterministic: a run preempted mid-epoch and resumed ends with the same
    weights, fp32 masters, optimizer and loss-scaler state, bit for bit, as one never stopped."""
    import torch

    args = [*SMALL[:4], "-b", "32", "-j", "2", "--epochs", "2", "--steps-per-epoch", "6",
            "--device", "cuda", "--opt-level", "O2", "--amp-dtype", "float16",
            "--deterministic", "--seed", "3", ctx.small]
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # deterministic cuBLAS
    train(ctx, "o2-straight", "nd.py", [*args, "-p", "1"], env=env)
    stopped = preempt_and_resume(ctx, "o2-cut", "nd.py", args, nproc=0, env=env)
    a = torch.load(ctx.runs / "o2-straight/checkpoint.pth", map_location="cpu",
                   weights_only=False)
    b = torch.load(ctx.runs / "o2-cut/checkpoint.pth", map_location="cpu", weights_only=False)
    for part in ("model", "optimizer", "precision"):
        require(_same(a[part], b[part]), f"{part} state differs after the resume")
    return f"stopped after step {stopped}, resumed: model, masters and scaler identical"


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def flag_check(name: str, *flags: str, timeout: float = 240) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        log = train(ctx, name, "nd.py", [*SMALL, *flags, ctx.small], timeout=timeout)
        losses = finite_losses(log)
        on_cuda(log)
        return f"{' '.join(flags)}: {len(losses)} steps, loss {losses[-1]:.3f}"
    return check


# --- checks: DALI --------------------------------------------------------------------------------
def need_dali() -> None:
    if importlib.util.find_spec("nvidia.dali") is None:
        raise Skipped("nvidia.dali is not installed (requirements.txt names the CUDA build)")


def dali_run(backend: str) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        need_dali()
        log = train(ctx, f"{backend}", "nd.py", [*SMALL, "--data-backend", backend, ctx.small])
        losses = finite_losses(log)
        return f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    return check


def dali_batches(ctx: Context) -> str:
    """In this process: the validation batches of dali-gpu, dali-cpu and pytorch hold the same
    images in the same order, in the same layout (decoders and resizers differ pixel by pixel,
    so images compare by their channel means and correlation)."""
    need_dali()
    import torch

    from recipe.config import parse_args
    from recipe.data import build_loaders
    from recipe.strategies import Strategy

    device = torch.device("cuda")
    batches = {}
    for backend in ("pytorch", "dali-cpu", "dali-gpu"):
        cfg = parse_args(["-a", "resnet18", "--image-size", "64", "-b", "32", "-j", "2",
                          "--data-backend", backend, "--channels-last", str(ctx.small)])
        train_loader, val_loader, _ = build_loaders(cfg, Strategy().data_shard(), device)
        try:
            batches[backend] = [(x.clone(), y.clone()) for x, y in val_loader]
        finally:
            train_loader.close()
            val_loader.close()
    worst_mean, worst_corr = 0.0, 1.0
    for backend in ("dali-cpu", "dali-gpu"):
        require(len(batches[backend]) == len(batches["pytorch"]), f"{backend}: batch count")
        for (x_pt, y_pt), (x, y) in zip(batches["pytorch"], batches[backend]):
            require(x.device.type == "cuda" and x.dtype == torch.float32, f"{backend}: {x.dtype}")
            require(x.shape == x_pt.shape, f"{backend}: shape {tuple(x.shape)}")
            require(x.is_contiguous(memory_format=torch.channels_last), f"{backend}: layout")
            require(torch.equal(y, y_pt), f"{backend}: targets differ")
            worst_mean = max(worst_mean, (x.mean((2, 3)) - x_pt.mean((2, 3))).abs().max().item())
            worst_corr = min(worst_corr, torch.corrcoef(
                torch.stack([x.flatten(), x_pt.flatten()]))[0, 1].item())
    require(worst_mean < 0.15 and worst_corr > 0.7,
            f"images differ: channel means by {worst_mean:.3f}, correlation {worst_corr:.3f}")
    images = sum(len(y) for _, y in batches["pytorch"])
    return (f"{images} validation images: same targets and layout; channel means within "
            f"{worst_mean:.3f}, correlation >= {worst_corr:.3f}")


# --- checks: throughput --------------------------------------------------------------------------
def engine_throughput(dtype: str) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        record = ctx.out / f"bench_loop_{dtype}.json"
        cmd = [sys.executable, "-m", "bench.loop", "-a", "resnet50", "--image-size", "224",
               "-b", "256", "--channels-last", "--opt-level", "O1", "--amp-dtype", dtype,
               "--device", "cuda", "--steps", "10", "--warmup", "5", "--repeats", "5",
               "--json", str(record)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=420)
        _keep_output(ctx, f"throughput-{dtype}", proc.stdout + proc.stderr)
        require(proc.returncode == 0, f"bench.loop exit {proc.returncode}")
        median = json.loads(record.read_text())["median"]
        img_s, ratio = median["engine_img_s"], median["ratio"]
        ctx.numbers[f"throughput-{dtype}"] = {"engine_img_s": img_s,
                                               "bare_img_s": median["bare_img_s"],
                                               "ratio": ratio}
        verdicts = [f"engine/bare {ratio:.3f} ({_verdict(ratio >= TARGET_ENGINE_RATIO)} "
                    f">= {TARGET_ENGINE_RATIO})"]
        if dtype == "float16":
            verdicts.insert(0, f"{_verdict(img_s >= TARGET_IMG_S)} >= {TARGET_IMG_S}")
        return (f"ResNet-50 224 px b256 channels_last O1 {dtype}, synthetic: {img_s:,.0f} img/s "
                f"({', '.join(verdicts)})")
    return check


def pipeline_throughput(backend: str) -> Callable[[Context], str]:
    def check(ctx: Context) -> str:
        if backend.startswith("dali"):
            need_dali()
        log = train(ctx, f"pipeline-{backend}", "nd.py",
                    ["-a", "resnet50", "--image-size", "224", "-b", "256", "--channels-last",
                     "--opt-level", "O1", "--amp-dtype", "float16", "--data-backend", backend,
                     "-j", str(max(1, (os.cpu_count() or 2) - 2)), "-p", "4", "--epochs", "1",
                     "--device", "cuda", ctx.large], timeout=420)
        rates = [r["img_s"] for r in log["train"]][1:]  # the first interval holds the warm-up
        require(bool(rates), "too few steps for a steady interval")
        img_s = statistics.median(rates)
        synthetic = ctx.numbers.get("throughput-float16", {}).get("engine_img_s")
        numbers = {"img_s": img_s, "synthetic_img_s": synthetic}
        ctx.numbers[f"pipeline-{backend}"] = numbers
        text = f"{img_s:,.0f} img/s from generated JPEGs"
        if synthetic:
            gap = 1 - img_s / synthetic
            numbers["gap"] = gap
            text += f", {gap:.0%} below synthetic"
            if backend == "dali-gpu":
                text += f" ({_verdict(gap <= TARGET_DALI_GAP)} <= {TARGET_DALI_GAP:.0%})"
        return text
    return check


def _verdict(met: bool) -> str:
    return "target met" if met else "TARGET MISSED"


# --- the list ------------------------------------------------------------------------------------
LEVELS = [("O0", "float32")] + [(level, dtype) for level in ("O1", "O2", "O3")
                                for dtype in ("float16", "bfloat16")]
CHECKS: Dict[str, tuple] = {
    "entry-nd": ("entries", entry_check("nd.py")),
    "entry-dp": ("entries", entry_check("dp.py")),
    "entry-ddp": ("entries", entry_check("ddp.py", nproc=1, backend="nccl")),
    "entry-ddp_apex": ("entries", entry_check("ddp_apex.py", nproc=1, backend="nccl",
                                              extra=("--opt-level", "O2"))),
    "entry-hvd": ("entries", entry_check("hvd.py", needs="horovod")),
    "entry-ps": ("entries", entry_check("ps.py", nproc=2, extra=("--mode", "sync"))),
    **{f"precision-{level}-{dtype}": ("precision", precision_check(level, dtype))
       for level, dtype in LEVELS},
    "o2-layout": ("precision", o2_layout),
    "ranks2-validation": ("ranks", shared_validation),
    "ranks2-syncbn": ("ranks", shared_syncbn),
    "ranks2-preemption": ("ranks", shared_preemption),
    "dali-gpu": ("dali", dali_run("dali-gpu")),
    "dali-cpu": ("dali", dali_run("dali-cpu")),
    "dali-batches": ("dali", dali_batches),
    "o2-resume-exact": ("resume", o2_resume_exact),
    "channels-last": ("layout", flag_check("channels-last", "--channels-last", "--opt-level",
                                           "O1")),
    "compile": ("layout", flag_check("compile", "--compile", timeout=420)),
    "throughput-float16": ("throughput", engine_throughput("float16")),
    "throughput-bfloat16": ("throughput", engine_throughput("bfloat16")),
    "pipeline-dali-gpu": ("throughput", pipeline_throughput("dali-gpu")),
    "pipeline-pytorch": ("throughput", pipeline_throughput("pytorch")),
}
GROUPS = list(dict.fromkeys(group for group, _ in CHECKS.values()))


def select(only: Optional[str]) -> List[str]:
    """Check names for --only (groups or names, comma-separated); all without it."""
    if not only:
        return list(CHECKS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in CHECKS and w not in GROUPS]
    if unknown:
        raise ValueError(f"unknown check or group: {', '.join(unknown)} (see --list)")
    return [name for name, (group, _) in CHECKS.items() if name in wanted or group in wanted]


# --- the environment -----------------------------------------------------------------------------
def environment() -> dict:
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    for package, module in (("torchvision", "torchvision"), ("nvidia-dali", "nvidia.dali"),
                            ("horovod", "horovod")):
        try:
            versions[package] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            versions[package] = None
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip().splitlines()
    return {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
            "driver": driver[0] if driver else None, "cpu_cores": os.cpu_count(),
            "versions": versions}


def make_data(ctx: Context) -> None:
    workers = os.cpu_count() or 2
    make_dataset(dataset_command(ctx.small, classes=8, train=64, val=8, min_size=80,
                                 max_size=200, workers=workers))
    make_dataset(dataset_command(ctx.large, classes=10, train=420, val=10, min_size=320,
                                 max_size=500, workers=workers))


# --- running and reporting -----------------------------------------------------------------------
def run_check(ctx: Context, name: str) -> Result:
    group, check = CHECKS[name]
    started = time.perf_counter()
    try:
        status, detail = "PASS", check(ctx)
    except Skipped as why:
        status, detail = "SKIP", str(why)
    except Failed as why:
        status, detail = "FAIL", str(why)
    except Exception as err:  # a check that breaks is a failed check, and the others go on
        status, detail = "FAIL", f"{type(err).__name__}: {err}"
    result = Result(name, group, status, detail, time.perf_counter() - started,
                    ctx.numbers.get(name, {}))
    print(f"{result.status:4}  {name:<22} {detail}  ({result.seconds:.0f} s)", flush=True)
    return result


def block(folder: Path, figures: Optional[Path] = None) -> str:
    """RESULTS.md's `gpu_check` block from results/gpu/gpu_check.json."""
    record = json.loads((folder / "gpu_check.json").read_text())
    env, versions = record["environment"], record["environment"]["versions"]
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)
    counts = {s: sum(r["status"] == s for r in record["results"]) for s in ("PASS", "FAIL", "SKIP")}
    rows = [[r["name"], r["status"], r["detail"].replace("|", "/"), f"{r['seconds']:.0f}"]
            for r in record["results"]]
    return "\n".join([
        f"`{record['command']}` on {env['gpu']} ({env['gpus']} GPU, driver {env['driver']}, "
        f"{env['cpu_cores']} CPU cores), commit `{record['commit']}`, {record['date']}: "
        f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in "
        f"{record['seconds'] / 60:.1f} min. Versions: {shown}.",
        "",
        markdown_table(["check", "result", "what it saw", "s"], rows, right_from=3),
        "",
        "Written by `launch/env.sh python -m bench.regenerate` from `results/gpu/gpu_check.json`; "
        "each run's log is beside it."])


def parse_cli(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated groups or check names (see --list)")
    parser.add_argument("--list", action="store_true", help="print the checks and exit")
    parser.add_argument("--out", type=Path, help="where runs, outputs and the record go "
                                                 "(default: runs/gpu-check-DATE-TIME)")
    parser.add_argument("--record", action="store_true",
                        help="keep the record in results/gpu/ and rewrite RESULTS.md's block")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_cli(argv)
    try:
        names = select(args.only)
    except ValueError as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    if args.list:
        for group in GROUPS:
            print(f"{group}: {' '.join(n for n in names if CHECKS[n][0] == group)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible (torch.cuda.is_available() is False): nothing "
              "to check on this machine. The CPU paths are covered by the test suite "
              "(launch/test.sh).", file=sys.stderr)
        return 2
    out = args.out or REPO / "runs" / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    ctx = Context(out=out, small=out / "data-small", large=out / "data-large")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = environment()
    shown = shlex.join(["launch/gpu_check.sh", *(sys.argv[1:] if argv is None else argv)])
    print(f"gpu_check: {env['gpu']} x{env['gpus']}, driver {env['driver']}, torch "
          f"{env['versions']['torch']}; {len(names)} checks; output in {out}", flush=True)
    make_data(ctx)
    results = [run_check(ctx, name) for name in names]
    failed = [r.name for r in results if r.status == "FAIL"]
    record = {"command": shown, "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
              "environment": env, "seconds": time.perf_counter() - started,
              "results": [asdict(r) for r in results]}
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} passed or skipped"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + f" ({record['seconds'] / 60:.1f} min)")
    if args.record:
        from bench import regenerate

        regenerate.archive(ctx.runs, "gpu")
        (regenerate.RESULTS / "gpu" / "gpu_check.json").write_text(
            json.dumps(record, indent=2) + "\n")
        regenerate.main([])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
