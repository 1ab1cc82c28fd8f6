"""End to end against pytorch/examples, timm and torchvision's reference: the whole training
process, start to exit, on the same data, model, batch, loader workers and epochs; where its wall
time goes, and the training rate once it runs (the steady state that decides a long run's
GPU-hours).

    # The peers' scripts are fetched by you; they are never kept in this repository:
    curl -LO https://raw.githubusercontent.com/pytorch/examples/main/imagenet/main.py
    curl -LO https://raw.githubusercontent.com/huggingface/pytorch-image-models/main/train.py
    git clone --depth 1 https://github.com/pytorch/vision   # references/classification/train.py
    python -m imagenet_recipes.bench.e2e --peer main.py --timm train.py       # generated JPEGs
    python -m imagenet_recipes.bench.e2e --timm train.py \
        --torchvision vision/references/classification/train.py
    python -m imagenet_recipes.bench.e2e --peer main.py --timm train.py /data/imagenet-subset \
        --repeats 5
    python -m imagenet_recipes.bench.e2e --peer main.py --timm train.py \
        --json results/e2e/bench_e2e.json
    # the same CPU as one without native bf16 (as tools/bench_cpu.sh holds it):
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m imagenet_recipes.bench.e2e \
        --peer main.py --timm train.py --json results/e2e/bench_e2e_avx2.json

(in the project's environment, as every tool: through `launch/env.sh`, or one of your own with
the clone installed, `pip install -e .`).

Contenders, run in turns (repeat 1 of each, repeat 2 of each, ...) so that a drift in a shared
machine's speed hits all of them alike. Each is started exactly as a user types it: a
PYTHONPATH of the tool's caller is taken out of their environment.

  pytorch/examples   python main.py -a ARCH -b B -j J --epochs E -p 1 DATA (--no-accel without a
                     GPU); its checkpoints go to a scratch folder
  timm defaults      python train.py --data-dir DATA --model ARCH -b B -j J --epochs E, fp32,
                     with what would otherwise make its work differ from the others' turned
                     off: colour jitter, label smoothing, Nesterov (plain momentum SGD instead)
                     and bicubic resizing (bilinear, and torchvision's 0.875 centre crop)
  timm fast          the same plus --channels-last and, where the fast settings use autocast,
                     --amp --amp-dtype (float16 on a GPU, bfloat16 on a CPU)
  torchvision reference
                     python train.py --model ARCH -b B -j J --epochs E --print-freq 1
                     --device cuda|cpu --data-path DATA (references/classification, with the
                     modules beside it), plus --amp on a GPU where the fast settings use
                     autocast (its --amp is CUDA's float16); its checkpoints go to a scratch
                     folder
  nd defaults        python train/nd.py with the same options: fp32, the pytorch backend (and
                     channels_last on a CPU at 224 px, which is the default there)
  nd fast            the same plus --channels-last and, without a GPU, dali-cpu; and O1
                     autocast: float16 on a GPU; bfloat16 on a CPU where a short
                     probe (a few training steps of the model each way) finds it faster than
                     fp32, else fp32: emulated bf16 (no AVX512-BF16) is ~25x slower, and even
                     AVX512-BF16 without AMX can lose to fp32; the record keeps the probe
  nd gpu decode      (with a GPU, where torchcodec is installed) nd fast with
                     --data-backend gpu: nvJPEG decoding and the crops on the GPU
  nd dali-gpu        (with a GPU, where nvidia.dali is installed) nd fast with
                     --data-backend dali-gpu
  nd fast compiled   (--compile) the same plus --compile: what torch.compile costs at start-up
                     and gains per epoch, so from how many epochs it pays
  nd fast, ...       (--threads) the same under the thread settings a user might try on a CPU,
                     each compared with the fast settings as they are: OpenMP's idle threads
                     sleeping at once instead of spinning (OMP_WAIT_POLICY=PASSIVE), OpenMP's
                     threads pinned to cores, one compute thread (the other core left to the
                     loader), and half or twice the loader threads (-j)

A contender's command may start with environment settings (NAME=value words), which it is
started with, as a shell would.

Wall time is the whole process, imports and exit included. Every contender prints a line per
training step (-p 1, --log-interval 1) and one at the end of each validation pass; the tool
stamps each line as it arrives and splits the wall time into: start-up and first step
(imports, model, loaders, the first batch), training (the remaining steps), validation, and the
end (checkpoint, logs, process exit). Data wait is what each script reports itself waiting for
its loader (torchvision's reference prints a running median instead, so its column is empty).
The steady state is the training rate of epochs 2 and later (from the end of the
previous validation to the last step of the epoch: the loader's restart counts, as it does
every epoch of a long run): run with --epochs 3 or more for it.

A ratio is the slower contender's time over the faster's in the same repeat: wall time for end
to end, training seconds per image for the steady state; each comparison's table gives the
median with the lowest and highest repeat. This is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench.common import (REPO, emulated_bf16, git_commit, installed, machine,
                                           shown_command, spread, shown_commit)
from imagenet_recipes.bench.jobs import dataset_command, make_dataset
from imagenet_recipes.bench.render import render

PEER = "pytorch/examples"
TIMM = "timm"
TORCHVISION = "torchvision reference"
PHASES = ("start-up and first step", "training", "validation", "end")
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
SETTING = "nd fast, "  # --threads: "nd fast, <setting>", each compared with "nd fast"
# ours with a GPU: the fast settings on each data backend that decodes JPEGs on it too
GPU_DECODING = {"nd gpu decode": ("gpu", "torchcodec"), "nd dali-gpu": ("dali-gpu", "nvidia.dali")}
# (ours, theirs): the comparisons the tables report, where both ran (and comparisons() adds
# torchvision's reference)
COMPARISONS = [("nd defaults", PEER), ("nd defaults", "timm defaults"),
               ("nd fast", "timm fast"), ("nd fast", PEER), ("nd fast compiled", "nd fast")]
COMPARISONS += [(ours, "timm fast") for ours in GPU_DECODING]


def thread_settings(workers: int) -> Dict[str, tuple]:
    """--threads: setting -> (environment words, loader workers). PyTorch's CPU ops run on
    OpenMP threads (one per core by default) beside the loader's: DALI's threads (-j of
    them) or the pytorch backend's worker processes."""
    half = max(1, workers // 2)
    return {"OMP passive": (["OMP_WAIT_POLICY=PASSIVE"], workers),
            "OMP pinned": (["OMP_PROC_BIND=close", "OMP_PLACES=cores"], workers),
            "1 compute thread": (["OMP_NUM_THREADS=1"], workers),
            f"-j {half}": ([], half),
            f"-j {2 * workers}": ([], 2 * workers)}


@dataclass(frozen=True)
class Output:
    """How a contender's printed lines say what it is doing."""
    train_step: str   # a line printed after each training step (-p 1); group `epoch`
    val_end: str      # the line printed when a validation pass is complete
    data_wait: Optional[str]  # group 1: this step's data wait in seconds, on a train_step
    #                           line (None: the script does not print it per step)


OUTPUTS = {
    # "Epoch: [0][ 3/13]\tTime  1.825 ( 2.340)\tData  0.007 ( 0.065)\tLoss ..."; " *   Acc@1 ..."
    PEER: Output(r"^Epoch: \[(?P<epoch>\d+)\]\[\s*\d+/\d+\]", r"^ \*\s+Acc@1",
                 r"\tData\s+([\d.]+)"),
    # "Train: 0 [   3/20 ( 20%)]  Loss: ...  Data: 0.004 (0.031)"; "Test: [   4/4]  Time: ..."
    # (timm numbers the steps from 0, so the last validation batch is "[ N/N]")
    TIMM: Output(r"^Train: (?P<epoch>\d+) \[\s*\d+/\d+", r"^Test: \[\s*(\d+)/\1\]",
                 r"  Data: ([\d.]+) \("),
    # "Epoch: [0]  [ 3/13]  eta: 0:00:09  lr: 0.1  img/s: 61.2  loss: 6.9 (6.9)  ...  data:
    # 0.0012 (0.0345)" (the median of the last 20 steps); "Test:  Acc@1 0.000 Acc@5 50.000"
    TORCHVISION: Output(r"^Epoch: \[(?P<epoch>\d+)\]\s+\[\s*\d+/\d+\]", r"^Test:\s+Acc@1", None),
    # "... Epoch [0][ 3/12]  loss ... data 0.017s  step 2.040s ..."; "... * Val epoch 0: ..."
    "ours": Output(r"  Epoch \[(?P<epoch>\d+)\]\[\s*\d+/\d+\]", r" \* Val epoch \d+:",
                   r" data ([\d.]+)s "),
}


def output_of(contender: str) -> Output:
    if contender in (PEER, TORCHVISION):
        return OUTPUTS[contender]
    return OUTPUTS[TIMM] if contender.startswith(TIMM) else OUTPUTS["ours"]


def phases(stamped: Sequence[tuple], wall: float, output: Output) -> Dict[str, object]:
    """Split a run's wall time by its stamped lines [(seconds since start, line)].

    start-up and first step: until the first training-step line; validation: from the last
    training step before a validation pass to that pass's end line; end: from the last
    validation to exit; training: the rest. The four add up to `wall`. Also "epoch training":
    for each epoch after the first, the seconds from the previous validation's end to its last
    training step."""
    train = re.compile(output.train_step)
    val = re.compile(output.val_end)
    data = re.compile(output.data_wait) if output.data_wait else None
    first_step = last_step = None
    steps, validation, data_wait, last_val = 0, 0.0, 0.0, None
    last_step_of: Dict[int, float] = {}  # epoch -> its last training step's time
    val_end_after: Dict[int, float] = {}  # epoch -> when the validation after it ended
    for t, line in stamped:
        found = train.search(line)
        if found:
            steps += 1
            first_step = t if first_step is None else first_step
            last_step = last_step_of[int(found.group("epoch"))] = t
            wait = data.search(line) if data else None
            data_wait += float(wait.group(1)) if wait else 0.0
        elif val.search(line) and last_step is not None:
            validation += t - max(last_step, last_val or 0.0)
            last_val = t
            val_end_after[max(last_step_of)] = t
    if first_step is None or last_val is None:
        raise ValueError("no training step or no validation line found in the output")
    end = wall - last_val
    epoch_training = [last_step_of[e] - val_end_after[e - 1] for e in sorted(last_step_of)
                      if e - 1 in val_end_after]
    return {"wall": wall, "start-up and first step": first_step,
            "training": wall - first_step - validation - end, "validation": validation,
            "end": end, "steps": steps, "data wait": data_wait if data else None,
            "epoch training": epoch_training}


def run_stamped(command: List[str], cwd: Path) -> tuple:
    """-> (wall seconds, [(seconds since start, line)]): the command's output, each line
    stamped when it arrives (unbuffered, so the stamp is when it was printed). The command gets
    this process's environment without its PYTHONPATH: a user runs `python train/nd.py` with
    none (the package is installed), and the caller's must not change how the peers start."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    while "=" in command[0]:  # NAME=value words before the program, as a shell reads them
        name, value = command[0].split("=", 1)
        env[name], command = value, command[1:]
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    stamped = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stdout]
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(line for _, line in stamped[-20:])
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}:\n{tail}")
    return wall, stamped


def bf16_probe(arch: str, batch: int, steps: int = 3) -> tuple:
    """-> (whether bf16 autocast trains `arch` faster than fp32 on this CPU, what was measured):
    the best of `steps` training steps each way, channels_last, as the fast settings run."""
    import torch
    import torchvision

    def step_time(bf16: bool) -> float:
        torch.manual_seed(0)
        model = torchvision.models.get_model(arch).to(memory_format=torch.channels_last)
        images = torch.randn(batch, 3, 224, 224).contiguous(memory_format=torch.channels_last)
        targets = torch.randint(0, 1000, (batch,))
        times = []
        for _ in range(steps + 1):  # the first step builds oneDNN's kernels: not counted
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.cross_entropy(model(images), targets)
            loss.backward()
            times.append(time.perf_counter() - start)
        return min(times[1:])

    fp32, bf16 = step_time(False), step_time(True)
    faster = bf16 < fp32
    return faster, (f"probe: bf16 autocast step {bf16:.2f} s vs fp32 {fp32:.2f} s, so "
                    f"{'O1 bfloat16' if faster else 'fp32'} (oneDNN bf16: "
                    f"{'emulated' if emulated_bf16() else 'native'})")


# --- the contenders ------------------------------------------------------------------------------
def contenders(args, gpu: bool, fast_amp: bool) -> Dict[str, List[str]]:
    common = ["-a", args.arch, "-b", str(args.batch_size), "-j", str(args.workers),
              "--epochs", str(args.epochs), "-p", "1"]
    nd = [sys.executable, str(REPO / "train/nd.py"), *common]
    # on a GPU the fast settings keep the default loader; its GPU-decoding backends are
    # contenders of their own (GPU_DECODING)
    fast = ["--channels-last"] + ([] if gpu else ["--data-backend", "dali-cpu"])
    amp_dtype = "float16" if gpu else "bfloat16"
    if fast_amp:
        fast += ["--opt-level", "O1", "--amp-dtype", amp_dtype]
    named = {}
    if args.peer:
        named[PEER] = ([sys.executable, str(args.peer.resolve()), *common]
                       + ([] if gpu else ["--no-accel"]))
    if args.timm:
        timm = [sys.executable, str(args.timm.resolve()), "--model", args.arch,
                "-b", str(args.batch_size), "-j", str(args.workers), "--epochs", str(args.epochs),
                "--log-interval", "1", "--device", "cuda" if gpu else "cpu",
                "--train-split", "train", "--val-split", "val",
                "--color-jitter", "0", "--smoothing", "0", "--opt", "momentum",
                "--train-interpolation", "bilinear", "--interpolation", "bilinear",
                "--crop-pct", "0.875", "--output", "output"]
        named["timm defaults"] = timm
        named["timm fast"] = timm + ["--channels-last"] + (
            ["--amp", "--amp-dtype", amp_dtype] if fast_amp else [])
    if args.torchvision:
        named[TORCHVISION] = [
            sys.executable, str(args.torchvision.resolve()), "--model", args.arch,
            "-b", str(args.batch_size), "-j", str(args.workers), "--epochs", str(args.epochs),
            "--print-freq", "1", "--device", "cuda" if gpu else "cpu"] + (
            ["--amp"] if gpu and fast_amp else [])
    named["nd defaults"] = nd
    named["nd fast"] = nd + fast
    if gpu:
        for name, (backend, package) in GPU_DECODING.items():
            if installed(package):
                named[name] = nd + fast + ["--data-backend", backend]
    if args.compile:
        named["nd fast compiled"] = nd + fast + ["--compile"]
    if args.threads:
        j = nd.index("-j") + 1
        for setting, (env, workers) in thread_settings(args.workers).items():
            named[SETTING + setting] = env + nd[:j] + [str(workers)] + nd[j + 1:] + fast
    return {name: cmd for name, cmd in named.items()
            if not args.only or any(name.startswith(prefix) for prefix in args.only)}


def data_arguments(name: str, data: Path, scratch: Path) -> List[str]:
    """Where each contender is told its data (and ours, its run folder)."""
    if name == PEER:
        return [str(data)]
    if name.startswith(TIMM):
        return ["--data-dir", str(data)]
    if name == TORCHVISION:
        return ["--data-path", str(data)]
    return ["--logdir", str(scratch / "runs"), str(data)]


def measure(commands: Dict[str, List[str]], data: Path, repeats: int, scratch: Path) -> list:
    runs = []
    for repeat in range(repeats):
        for name, command in commands.items():
            cwd = scratch / f"{name.replace('/', '-').replace(' ', '-')}-{repeat}"
            cwd.mkdir(parents=True)
            wall, stamped = run_stamped(command + data_arguments(name, data, cwd), cwd)
            split = phases(stamped, wall, output_of(name))
            runs.append({"contender": name, "repeat": repeat,
                         **{k: [round(x, 3) for x in v] if isinstance(v, list) else
                            None if v is None else round(v, 3) for k, v in split.items()}})
            print(f"{name:18s} repeat {repeat}: {wall:6.1f} s  ("
                  + ", ".join(f"{p} {split[p]:.1f}" for p in PHASES)
                  + (f"; epochs 2+: {sum(split['epoch training']):.1f}"
                     if split["epoch training"] else "") + ")", flush=True)
    return runs


# --- report --------------------------------------------------------------------------------------
def steady_img_s(run: dict, train_images: int) -> Optional[float]:
    """Training images per second over epochs 2 and later; None for a 1-epoch run."""
    spans = run.get("epoch training") or []
    return train_images * len(spans) / sum(spans) if spans else None


def comparisons(record: dict) -> List[tuple]:
    """(ours, theirs) pairs of the record: COMPARISONS, the thread settings against the fast
    settings as they are, and torchvision's reference against ours in its own precision (with
    --amp: the fast settings and each GPU-decoding backend; without: the defaults)."""
    settings = dict.fromkeys(r["contender"] for r in record["runs"]  # in the order they ran
                             if r["contender"].startswith(SETTING))
    pairs = COMPARISONS + [(name, "nd fast") for name in settings]
    if " --amp" in record.get("commands", {}).get(TORCHVISION, ""):
        pairs += [(ours, TORCHVISION) for ours in ("nd fast", *GPU_DECODING)]
    else:
        pairs.append(("nd defaults", TORCHVISION))
    return pairs


def ratios(record: dict, steady: bool = False) -> Dict[tuple, List[float]]:
    """(ours, theirs) -> theirs' time over ours, repeat by repeat (above 1: ours is faster):
    wall time, or with `steady` the inverse ratio of the steady-state training rates."""
    def value(run: dict) -> Optional[float]:
        if steady:
            rate = steady_img_s(run, record["images"]["train"])
            return 1 / rate if rate else None
        return run["wall"]

    by = {(r["contender"], r["repeat"]): value(r) for r in record["runs"]}
    out: Dict[tuple, List[float]] = {}
    for ours, theirs in comparisons(record):
        for repeat in sorted({r["repeat"] for r in record["runs"]}):
            a, b = by.get((ours, repeat)), by.get((theirs, repeat))
            if a and b:
                out.setdefault((ours, theirs), []).append(b / a)
    return out


def table(record: dict, source: str = "results/e2e/bench_e2e.json") -> str:
    cfg = record["config"]
    train_images = record["images"]["train"]
    by_name: Dict[str, List[dict]] = {}
    for r in record["runs"]:
        by_name.setdefault(r["contender"], []).append(r)
    rows = []
    for name, runs in by_name.items():
        col = lambda key: [r[key] for r in runs]  # noqa: E731
        rates = [rate for rate in (steady_img_s(r, train_images) for r in runs) if rate]
        waits = [wait for wait in col("data wait") if wait is not None]
        rows.append([name, spread(col("wall"), ".1f"), spread(rates, ".1f"),
                     *[spread(col(p), ".1f") for p in PHASES],
                     spread(waits, ".1f") if waits else "-",
                     f"{statistics.median(col('steps')):.0f}"])
    wall, steady = ratios(record), ratios(record, steady=True)
    comparisons = [[ours, theirs, f"**{spread(wall[(ours, theirs)], '.2f')}x**",
                    f"**{spread(steady[(ours, theirs)], '.2f')}x**"
                    if (ours, theirs) in steady else "-"]
                   for ours, theirs in wall]
    return render("e2e", record=record, cfg=cfg, commit=shown_commit(record["commit"]),
                  train_images=train_images, source=source, rows=rows, phases=PHASES,
                  comparisons=comparisons)


def block(folder: Path, figures: Path) -> str:
    """bench.regenerate's section: a table per record in results/e2e/ (bench_e2e.json, then
    the others by name, e.g. bench_e2e_avx2.json from the same CPU held to AVX2)."""
    records = sorted(folder.glob("bench_e2e*.json"), key=lambda p: (p.name != "bench_e2e.json",
                                                                     p.name))
    return "\n".join(table(json.loads(path.read_text()), f"results/e2e/{path.name}")
                     for path in records)


def isa_limit() -> str:
    """The CPU features this run was held to, as the environment variables that hold it
    (tools/bench_cpu.sh's way of showing a CPU without native bf16 on one with it), or ''."""
    return " ".join(f"{name}={os.environ[name]}" for name in ISA_VARIABLES if name in os.environ)


def shown_script(path: Path) -> str:
    """A peer's script as its project names it: its file name, with torchvision's reference
    folder (timm's script has the same name)."""
    folder = ("references", "classification")
    return "/".join(path.parts[-3:]) if path.parts[-3:-1] == folder else path.name


def _shown(command: List[str], scripts: Dict[str, Path]) -> str:
    """A contender's command as a user types it (repository-relative, the peers' scripts by
    their file name, no interpreter path)."""
    named = {str(path.resolve()): shown_script(path) for path in scripts.values()}
    python = command.index(sys.executable)
    words = [named.get(w) or (os.path.relpath(w, REPO) if w.startswith(str(REPO)) else w)
             for w in command[python + 1:]]
    return " ".join(command[:python] + ["python"] + words)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", type=Path,
                        help="ImageFolder root with train/ and val/ (default: generate 10 "
                             "classes x (--train-per-class + --val-per-class) JPEGs, 350-500 px)")
    parser.add_argument("--peer", type=Path,
                        help="pytorch/examples' imagenet/main.py, fetched by you")
    parser.add_argument("--timm", type=Path,
                        help="timm's train.py (pytorch-image-models), fetched by you, for the "
                             "timm contenders; it needs the timm package (requirements.txt)")
    parser.add_argument("--torchvision", type=Path,
                        help="torchvision's references/classification/train.py, fetched by you "
                             "with the modules beside it (a clone of pytorch/vision)")
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3,
                        help="3 or more gives the steady state (epochs 2 and later)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-per-class", type=int, default=64)
    parser.add_argument("--val-per-class", type=int, default=16)
    parser.add_argument("--fast-amp", choices=("auto", "on", "off"), default="auto",
                        help="O1 autocast in the fast settings: auto = on a GPU, and on a CPU "
                             "where the probe finds bf16 faster than fp32")
    parser.add_argument("--compile", action="store_true",
                        help="also run the fast settings with --compile")
    parser.add_argument("--threads", action="store_true",
                        help="also run the fast settings under each thread setting (OpenMP's "
                             "waiting and pinning, one compute thread, -j halved and doubled)")
    parser.add_argument("--only", nargs="*", help="run only these contenders (name prefixes)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the measurement's record here (for results/e2e/)")
    args = parser.parse_args(argv)
    fetched = {"peer": "pytorch/examples' imagenet/main.py", "timm": "timm's train.py",
               "torchvision": "torchvision's references/classification/train.py"}
    if not any(getattr(args, name) for name in fetched):
        parser.error("no peer to compare with: give --peer, --timm or --torchvision (the peers' "
                     "scripts, fetched by you; see this tool's --help)")
    for name, what in fetched.items():
        path = getattr(args, name)
        if path and not path.is_file():
            parser.error(f"--{name} {path}: no such file (fetch {what} first; see this tool's "
                         "--help)")

    import torch  # after the argument check: a usage error should not wait for torch
    gpu = torch.cuda.is_available()
    if args.fast_amp == "auto" and not gpu:
        fast_amp, probe = bf16_probe(args.arch, args.batch_size)
        print(f"fast settings: {probe}", flush=True)
    else:
        fast_amp, probe = args.fast_amp != "off", f"--fast-amp {args.fast_amp}"
    scripts = {name: path for name, path in ((PEER, args.peer), (TIMM, args.timm),
                                             (TORCHVISION, args.torchvision)) if path}
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        scratch = Path(tmp)
        if args.data:
            data, description = args.data.resolve(), str(args.data)
        else:
            data, description = scratch / "data", "generated, 350-500 px, quality 90"
            make_dataset(dataset_command(data, 10, args.train_per_class, args.val_per_class,
                                         350, 500, workers=None))
        images = {split: sum(1 for p in (data / split).rglob("*") if p.is_file())
                  for split in ("train", "val")}
        commands = contenders(args, gpu, fast_amp)
        runs = measure(commands, data, args.repeats, scratch / "runs")

    given = argv if argv is not None else sys.argv[1:]
    # the peers' scripts as the file names a user fetches, not where this machine keeps them
    shown = {str(path): shown_script(path) for path in scripts.values()}
    given = [shown.get(arg, arg) for arg in map(str, given)]
    held = isa_limit()
    record = {"command": " ".join(filter(None, [held, "launch/env.sh",
                                                shown_command("e2e", given)])),
              "commit": git_commit(),
              "hardware": machine(gpu=gpu) + (f" held to {held}" if held else ""),
              "images": images,
              "data_description": description,
              "sha256": {name: hashlib.sha256(path.read_bytes()).hexdigest()
                         for name, path in scripts.items()},
              "config": {k: getattr(args, k) for k in ("arch", "batch_size", "workers", "epochs",
                                                       "repeats")},
              "fast_amp": (("O1 float16" if gpu else "O1 bfloat16") if fast_amp else "fp32")
              + f" ({probe})",
              "commands": {name: _shown(cmd, scripts) for name, cmd in commands.items()},
              "runs": runs}
    text = table(record, f"results/e2e/{args.json.name}" if args.json else "not kept")
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
