"""End to end against pytorch/examples: the whole training process, start to exit, on the same
data, model, batch, loader workers and epochs, and where its wall time goes.

    # pytorch/examples' ImageNet script is fetched by you; it is never kept in this repository:
    curl -LO https://raw.githubusercontent.com/pytorch/examples/main/imagenet/main.py
    launch/env.sh python -m bench.e2e --peer main.py                   # generated JPEGs
    launch/env.sh python -m bench.e2e --peer main.py /data/imagenet-subset --repeats 5
    launch/env.sh python -m bench.e2e --peer main.py --json results/e2e/bench_e2e.json

Contenders, run in turns (repeat 1 of each, repeat 2 of each, ...) so that a drift in a shared
machine's speed hits all of them alike:

  pytorch/examples   python main.py -a ARCH -b B -j J --epochs E -p 1 DATA (--no-accel without a
                     GPU); its checkpoints go to a scratch folder
  nd defaults        python train/nd.py with the same options: fp32, the pytorch backend (and
                     channels_last on a CPU at 224 px, which is the default there)
  nd fast            the same plus --channels-last, DALI (dali-cpu without a GPU, dali-gpu with
                     one) and O1 autocast: float16 on a GPU; bfloat16 on a CPU where a short
                     probe (a few training steps of the model each way) finds it faster than
                     fp32, else fp32: emulated bf16 (no AVX512-BF16) is ~25x slower, and even
                     AVX512-BF16 without AMX can lose to fp32; the record keeps the probe

Wall time is the whole process, imports and exit included. Every contender prints a line per
training step (-p 1 for all) and one at the end of validation; the tool stamps each line as it
arrives and splits the wall time into: start-up and first step (imports, model, loaders, the
first batch), training (the remaining steps), validation, and the end (checkpoint, logs,
process exit). Data wait is what each script reports itself waiting for its loader.
A ratio is pytorch/examples' wall time over ours in the same repeat (above 1: ours is faster);
the table gives the median with the lowest and highest repeat. This is a benchmark, not a test.
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
from typing import Dict, List, Sequence

from bench.common import (REPO, emulated_bf16, git_commit, machine, markdown_table, shown_command,
                          write_block)
from bench.jobs import dataset_command, make_dataset

RESULTS_HEADING = "## End to end vs pytorch/examples (`bench/e2e.py`)"
PEER = "pytorch/examples"
PHASES = ("start-up and first step", "training", "validation", "end")


@dataclass(frozen=True)
class Output:
    """How a contender's printed lines say what it is doing."""
    train_step: str   # a line printed after each training step (-p 1)
    val_end: str      # the line printed when a validation pass is complete
    data_wait: str    # group 1: this step's data wait in seconds, on a train_step line


OUTPUTS = {
    # "Epoch: [0][ 3/13]\tTime  1.825 ( 2.340)\tData  0.007 ( 0.065)\tLoss ..."; " *   Acc@1 ..."
    PEER: Output(r"^Epoch: \[\d+\]\[\s*\d+/\d+\]", r"^ \*\s+Acc@1", r"\tData\s+([\d.]+)"),
    # "... Epoch [0][ 3/12]  loss ... data 0.017s  step 2.040s ..."; "... * Val epoch 0: ..."
    "ours": Output(r"  Epoch \[\d+\]\[\s*\d+/\d+\]", r" \* Val epoch \d+:", r" data ([\d.]+)s "),
}


def phases(stamped: Sequence[tuple], wall: float, output: Output) -> Dict[str, float]:
    """Split a run's wall time by its stamped lines [(seconds since start, line)].

    start-up and first step: until the first training-step line; validation: from the last
    training step before a validation pass to that pass's end line; end: from the last
    validation to exit; training: the rest. The four add up to `wall`."""
    train = re.compile(output.train_step)
    val = re.compile(output.val_end)
    data = re.compile(output.data_wait)
    first_step = last_step = None
    steps, validation, data_wait, last_val = 0, 0.0, 0.0, None
    for t, line in stamped:
        if train.search(line):
            steps += 1
            first_step = t if first_step is None else first_step
            last_step = t
            found = data.search(line)
            data_wait += float(found.group(1)) if found else 0.0
        elif val.search(line) and last_step is not None:
            validation += t - max(last_step, last_val or 0.0)
            last_val = t
    if first_step is None or last_val is None:
        raise ValueError("no training step or no validation line found in the output")
    end = wall - last_val
    return {"wall": wall, "start-up and first step": first_step,
            "training": wall - first_step - validation - end, "validation": validation,
            "end": end, "steps": steps, "data wait": data_wait}


def run_stamped(command: List[str], cwd: Path) -> tuple:
    """-> (wall seconds, [(seconds since start, line)]): the command's output, each line
    stamped when it arrives (unbuffered, so the stamp is when it was printed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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
    fast = ["--channels-last", "--data-backend", "dali-gpu" if gpu else "dali-cpu"]
    if fast_amp:
        fast += ["--opt-level", "O1", "--amp-dtype", "float16" if gpu else "bfloat16"]
    named = {PEER: [sys.executable, str(args.peer.resolve()), *common]
             + ([] if gpu else ["--no-accel"]),
             "nd defaults": nd, "nd fast": nd + fast}
    return {name: cmd for name, cmd in named.items()
            if not args.only or any(name.startswith(prefix) for prefix in args.only)}


def measure(commands: Dict[str, List[str]], data: Path, repeats: int, scratch: Path) -> list:
    runs = []
    for repeat in range(repeats):
        for name, command in commands.items():
            cwd = scratch / f"{name.replace('/', '-').replace(' ', '-')}-{repeat}"
            cwd.mkdir(parents=True)
            ours = name != PEER
            full = command + (["--logdir", str(cwd / "runs")] if ours else []) + [str(data)]
            wall, stamped = run_stamped(full, cwd)
            split = phases(stamped, wall, OUTPUTS["ours" if ours else PEER])
            runs.append({"contender": name, "repeat": repeat,
                         **{k: round(v, 3) for k, v in split.items()}})
            print(f"{name:18s} repeat {repeat}: {wall:6.1f} s  ("
                  + ", ".join(f"{p} {split[p]:.1f}" for p in PHASES) + ")", flush=True)
    return runs


# --- report --------------------------------------------------------------------------------------
def _spread(values: List[float], fmt: str = "{:.1f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-" \
           f"{fmt.format(max(values))})"


def ratios(record: dict) -> Dict[str, List[float]]:
    """Per contender: the peer's wall time over its own, repeat by repeat."""
    peer = {r["repeat"]: r["wall"] for r in record["runs"] if r["contender"] == PEER}
    out: Dict[str, List[float]] = {}
    for r in record["runs"]:
        if r["contender"] != PEER and r["repeat"] in peer:
            out.setdefault(r["contender"], []).append(peer[r["repeat"]] / r["wall"])
    return out


def table(record: dict) -> str:
    cfg = record["config"]
    by_name: Dict[str, List[dict]] = {}
    for r in record["runs"]:
        by_name.setdefault(r["contender"], []).append(r)
    vs_peer = ratios(record)
    rows = []
    for name, runs in by_name.items():
        col = lambda key: [r[key] for r in runs]  # noqa: E731
        rows.append([f"`{record['commands'][name]}`" if name == PEER else name,
                     _spread(col("wall")),
                     f"**{_spread(vs_peer[name], '{:.2f}')}x**" if name in vs_peer else "-",
                     *[_spread(col(p)) for p in PHASES], _spread(col("data wait")),
                     f"{statistics.median(col('steps')):.0f}"])
    return "\n".join([
        f"`launch/env.sh {record['command']}` on {record['hardware']}, commit "
        f"{record['commit']}: {cfg['arch']}, batch {cfg['batch_size']}, {cfg['workers']} loader "
        f"workers, {cfg['epochs']} epoch(s) of {record['images']['train']} training and "
        f"{record['images']['val']} validation JPEGs ({record['data_description']}), "
        f"{cfg['repeats']} repeats taking turns; {PEER}'s script: sha256 "
        f"{record['peer_sha256'][:12]}. Seconds; median (lowest-highest repeat); vs "
        f"{PEER} = its wall time / ours, repeat by repeat (record: `results/e2e/bench_e2e.json`):",
        "",
        markdown_table(["contender", "wall s", f"vs {PEER}", *PHASES, "data wait", "steps"],
                       rows),
        "",
        *[f"* {name}: `{command}`" for name, command in record["commands"].items()
          if name != PEER],
        f"* fast settings' autocast: {record['fast_amp']}",
    ]) + "\n"


def block(folder: Path, figures: Path) -> str:
    """bench.regenerate's section, from results/e2e/bench_e2e.json."""
    return table(json.loads((folder / "bench_e2e.json").read_text()))


def _shown(command: List[str], peer: Path) -> str:
    """A contender's command as a user types it (repository-relative, no interpreter path)."""
    words = [peer.name if w == str(peer.resolve()) else
             os.path.relpath(w, REPO) if w.startswith(str(REPO)) else w for w in command[1:]]
    return "python " + " ".join(words)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", type=Path,
                        help="ImageFolder root with train/ and val/ (default: generate 10 "
                             "classes x (--train-per-class + --val-per-class) JPEGs, 350-500 px)")
    parser.add_argument("--peer", type=Path, required=True,
                        help="pytorch/examples' imagenet/main.py, fetched by you")
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-per-class", type=int, default=40)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--fast-amp", choices=("auto", "on", "off"), default="auto",
                        help="O1 autocast in the fast settings: auto = on a GPU, and on a CPU "
                             "where the probe finds bf16 faster than fp32")
    parser.add_argument("--only", nargs="*", help="run only these contenders (name prefixes)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the measurement's record here (for results/e2e/)")
    parser.add_argument("--update-results", action="store_true",
                        help="write the table into RESULTS.md")
    args = parser.parse_args(argv)
    if not args.peer.is_file():
        parser.error(f"--peer {args.peer}: no such file (fetch pytorch/examples' "
                     "imagenet/main.py first; see this tool's --help)")

    import torch  # after the argument check: a usage error should not wait for torch
    gpu = torch.cuda.is_available()
    if args.fast_amp == "auto" and not gpu:
        fast_amp, probe = bf16_probe(args.arch, args.batch_size)
        print(f"fast settings: {probe}", flush=True)
    else:
        fast_amp, probe = args.fast_amp != "off", f"--fast-amp {args.fast_amp}"
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
    # the peer's script as the file name a user fetches, not where this machine keeps it
    given = [args.peer.name if arg == str(args.peer) else arg for arg in map(str, given)]
    record = {"command": shown_command("e2e", given),
              "commit": git_commit(), "hardware": machine(gpu=gpu), "images": images,
              "data_description": description,
              "peer_sha256": hashlib.sha256(args.peer.read_bytes()).hexdigest(),
              "config": {k: getattr(args, k) for k in ("arch", "batch_size", "workers", "epochs",
                                                       "repeats")},
              "fast_amp": (("O1 float16" if gpu else "O1 bfloat16") if fast_amp else "fp32")
              + f" ({probe})",
              "commands": {name: _shown(cmd, args.peer) for name, cmd in commands.items()},
              "runs": runs}
    text = table(record)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.update_results:
        write_block(REPO / "RESULTS.md", "bench_e2e", text, RESULTS_HEADING)


if __name__ == "__main__":
    main()
