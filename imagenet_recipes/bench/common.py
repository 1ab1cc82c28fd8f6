"""What every tool shares: the run-log reader (and what a run record and its learning curve
say), the RESULTS.md block and table writers, this machine's description and the commit the
numbers were measured at.

Plain Python only (no torch, no matplotlib), so importing it costs nothing.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence
from imagenet_recipes.registry import runs_servers

REPO = Path(__file__).resolve().parents[2]


# --- the engine package --------------------------------------------------------------------------
def registry():
    """The engine's registry of entry scripts, opt levels and data backends."""
    return importlib.import_module("imagenet_recipes.registry")


# The parameter server's option that picks a mode's rule, and the rule its logs ran before the
# option existed.
PS_RULE_OPTIONS = {"async": ("async_rule", "plain"), "esync": ("esync_average", "mean")}


def ps_rule(run: dict) -> Optional[str]:
    """The rule a parameter-server run's mode ran with (async: plain or staleness; esync: mean or
    normalized); None for sync and for other strategies."""
    option = PS_RULE_OPTIONS.get(run.get("mode"))
    if option is None:
        return None
    name, before_it_existed = option
    return run["config"].get(name, before_it_existed)


def strategy_label(run: dict) -> str:
    """How tables and figures name the strategy of a run record: the registry's label, followed
    by the parameter server's mode and its rule ("PS sync", "PS async (staleness)")."""
    entry = logged_entry(run)
    known = registry().ENTRIES.get(entry)
    label = known.label if known else str(entry)
    if not run.get("mode"):
        return label
    rule = ps_rule(run)
    return f"{label} {run['mode']}" + (f" ({rule})" if rule else "")


def entry_order(entry: str) -> int:
    """Where an entry script comes in tables: the registry's order, unknown ones last."""
    names = list(registry().ENTRIES)
    return names.index(entry) if entry in names else len(names)



def repo_relative(path: Path) -> str:
    """A folder as the reader should find it: relative to the repository when inside (a
    relative path, as logs record them, is taken as relative to the repository)."""
    if not path.is_absolute():
        return str(path)
    path = path.resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def read_meta(meta_path: Path) -> dict:
    """What a measuring tool recorded per run (sweep.json, bench_ps.json, esync.json), if
    present."""
    return json.loads(meta_path.read_text()) if meta_path.is_file() else {}

# --- run logs ------------------------------------------------------------------------------------
Log = Dict[str, List[dict]]  # record kind ("run", "train", "val", ...) -> records in file order


class KeptRun(NamedTuple):
    """A run kept in a results/ folder's runs.jsonl (imagenet_recipes.bench.kept): its name and
    its log, compacted. run_dirs gives these where a folder has one, and read_log reads them as
    it reads a run folder."""
    name: str
    log: Log


def read_log(run_dir) -> Log:
    """<run_dir>/log.jsonl grouped by record kind (a KeptRun: the log it holds). A line that is
    not JSON is skipped: a run killed mid-write leaves a partial last line, and the records
    before it are still good."""
    if isinstance(run_dir, KeptRun):
        return run_dir.log
    kinds: Log = {}
    for line in (run_dir / "log.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kinds.setdefault(record.get("kind"), []).append(record)
    return kinds


def run_dirs(folder: Path) -> list:
    """The runs of `folder` by name: the sub-folders that hold a run log, or, in a results/
    folder, the runs its runs.jsonl keeps (KeptRun)."""
    from imagenet_recipes.bench import kept

    if (folder / kept.KEPT).is_file():
        return sorted((KeptRun(name, log) for name, log in kept.load(folder / kept.KEPT)),
                      key=lambda r: r.name)
    return [d for d in sorted(folder.iterdir()) if d.is_dir() and (d / "log.jsonl").is_file()]


def steady(records: List[dict], key: str) -> List[float]:
    """The values of `key` in interval records after the first, which holds start-up and
    warm-up."""
    return [r[key] for r in records if r.get(key) is not None][1:]


def interval_img_s(run_dir: Path) -> List[float]:
    """A run's img/s, interval by interval, after the warm-up interval."""
    return steady(read_log(run_dir).get("train", []), "img_s")


def logged_entry(run: dict) -> str:
    """The entry script of a run record ("ddp", "ps", ...). Logs written before the record had
    `entry` name only their strategy, which was the entry's name then."""
    return run.get("entry", run.get("strategy"))


def logged_precision(run: dict) -> str:
    """'O1 bfloat16': the opt level and dtype of a run record."""
    if "precision" not in run and runs_servers(logged_entry(run)):
        # Parameter-server logs from before its run record carried `precision`: it trained in
        # fp32 only then. Any other run record without it is malformed, and says so (KeyError).
        return "O0 float32"
    return f"{run['precision']['opt_level']} {run['precision']['dtype']}"


def logged_device(run: dict) -> str:
    """What a run record says it ran on: its GPUs, else its CPU and core count."""
    hw = run["hardware"]
    return ", ".join(hw["gpus"]) or f"{hw['cpu']} ({hw['cpu_count']} cores, no GPU)"


def logged_hardware(run: dict) -> str:
    return f"{logged_device(run)}, torch {run['versions']['torch']}"


# --- learning curves -----------------------------------------------------------------------------
class CurvePoint(NamedTuple):
    epoch: int                  # 1-based: the epoch just finished
    seconds: Optional[float]    # training wall-clock; None where the log cannot tell
    top1: float
    top5: float


def epoch_clock(logs: Log) -> Dict[int, float]:
    """Training wall-clock at the end of each epoch (0-based, as logged): the sum of the
    `train_epoch` epoch_time so far, so validation, checkpoints and start-up do not count."""
    clock, total = {}, 0.0
    for e in logs.get("train_epoch", []):
        total += e["epoch_time"]
        clock[e["epoch"]] = total
    return clock


def val_points(logs: Log) -> List[CurvePoint]:
    """One point per `val` record, in file order. Its wall-clock is the record's own
    train_elapsed where it has one (the parameter server evaluates in the background, on weights
    taken at that moment), else the epoch clock at the end of its epoch."""
    clock = epoch_clock(logs)
    return [CurvePoint(v["epoch"] + 1, v.get("train_elapsed", clock.get(v["epoch"])),
                       v["top1"], v["top5"]) for v in logs.get("val", [])]


# --- RESULTS.md ----------------------------------------------------------------------------------
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   right_from: int = 1) -> str:
    """A Markdown table; the columns from `right_from` on are right-aligned (numbers)."""
    align = ["---"] * right_from + ["---:"] * (len(header) - right_from)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def spread(values: Sequence[float], fmt: str) -> str:
    """The median with the lowest and highest value in brackets ("-" for none; one value
    alone where they all print the same). Signed formats say "to" (-3.5 to +1.0), which a
    dash between two signed numbers would garble."""
    if not values:
        return "-"
    low, high = format(min(values), fmt), format(max(values), fmt)
    if low == high:
        return low
    return f"{format(statistics.median(values), fmt)} ({low}{' to ' if '+' in fmt else '-'}{high})"


def marker(name: str, end: bool = False) -> str:
    return f"<!-- {name}:{'end' if end else 'start'} -->"


def replace_block(text: str, name: str, block: str, heading: str) -> str:
    """`block` between the markers of `name`, or appended under `heading` when they are
    missing. Nothing outside the markers changes, and applying the same block twice gives the
    same text, so regenerating a block never disturbs what people wrote around it."""
    body = f"{marker(name)}\n{block.strip()}\n{marker(name, end=True)}"
    pattern = re.compile(re.escape(marker(name)) + ".*?" + re.escape(marker(name, end=True)),
                         re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: body, text, count=1)
    return text.rstrip("\n") + f"\n\n{heading}\n\n{body}\n"


def write_block(results: Path, name: str, block: str, heading: str) -> None:
    """replace_block on a file (a missing one starts as an empty results page)."""
    text = results.read_text() if results.is_file() else "# Results\n"
    results.write_text(replace_block(text, name, block, heading))


# --- commands -------------------------------------------------------------------------------------
OUTPUT_OPTIONS = ("--out", "--json", "--figure", "--figures", "--results")


def shown_command(tool: str, argv: Sequence[str]) -> str:
    """`python -m imagenet_recipes.bench.<tool> ARGS` (or `python <tool> ARGS` for a script
    such as lab/hvd.py) as RESULTS.md shows it: without the options that only say where the
    outputs go, which differ between machines and say nothing about the measurement."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in OUTPUT_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in OUTPUT_OPTIONS)):
            shown.append(arg)
    program = tool if tool.endswith(".py") else f"-m imagenet_recipes.bench.{tool}"
    return f"python {program} {shlex.join(shown)}".rstrip()


# --- timing entry scripts in turns on synthetic data (the lab's hvd and ddp_cost studies) ---
def turns_parser(doc: str, tool: str) -> argparse.ArgumentParser:
    """The command line of a tool that runs entry scripts in turns and reports from the kept
    logs; `doc`: the tool's docstring, its first line the description."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=doc.split("\n", 1)[1])
    parser.add_argument("--out", type=Path, help=f"folder of the runs (default "
                        f"runs/{tool}-<stamp>)")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="measure nothing: print the block of an earlier --out")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra", default="", help="more trainer options, e.g. '--opt-level O1'")
    return parser


def measure_or_report(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]],
                      record: str, measure: Callable, report: Callable[[Path], str]) -> int:
    """Parse; with --report print the block of an earlier measurement, else measure (into
    --out) and print where the logs are and the block."""
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.report:
        if not (args.report / record).is_file():
            parser.error(f"--report {args.report}: no {record} there")
        print(report(args.report))
        return 0
    out = measure(args)
    print(f"\nlogs in {out}\n\n{report(out)}")
    return 0


# --- this machine --------------------------------------------------------------------------------
def installed(package: str) -> bool:
    """Whether `package` (dotted names too, e.g. nvidia.dali) can be imported, without
    importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def cpu_name() -> str:
    return importlib.import_module("imagenet_recipes.machine").cpu_model()


def cpu_cores() -> int:
    return importlib.import_module("imagenet_recipes.machine").cpu_cores()


def emulated_bf16() -> bool:
    """True on a CPU-only machine without native bf16 (AVX512-BF16 / AMX).
    RECIPES_CPU_BF16=native|emulated overrides the probe (tests force each case)."""
    forced = os.environ.get("RECIPES_CPU_BF16")
    if forced in ("native", "emulated"):
        return forced == "emulated"
    import torch
    return not torch.cuda.is_available() and not torch.ops.mkldnn._is_mkldnn_bf16_supported()


def gpu_name() -> Optional[str]:
    """The current CUDA device's name, None without one. Imports torch: call it only from
    tools that use torch anyway."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def machine(gpu: bool = False) -> str:
    """'AMD EPYC (2 cores)', plus the GPU's name when asked for and present."""
    text = f"{cpu_name()} ({cpu_cores()} cores)"
    name = gpu_name() if gpu else None
    return f"{text}, {name}" if name else text


def shown_commit(commit: Optional[str]) -> str:
    """A record's commit as RESULTS.md shows it: the hash alone. (A record measured on a working
    tree with changes keeps saying so; that is for whoever re-measures, not for the reader.)"""
    return (commit or "unknown").split(" (plus uncommitted changes)")[0]


def git_commit() -> str:
    return importlib.import_module("imagenet_recipes.machine").git_commit()


def _version(module: str) -> Optional[str]:
    try:
        return __import__(module, fromlist=["__version__"]).__version__
    except ImportError:
        return None


def device_environment(device: str) -> dict:
    """The machine a GPU benchmark ran on: the GPU, driver, torch, CUDA, cuDNN, NCCL, DALI,
    Python and CPU (bench.gpu's and bench.decode's records)."""
    import platform
    import subprocess

    import torch

    env = {"device": device, "gpu": None, "gpus": 0, "driver": None,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "nccl": None,
           "torchvision": _version("torchvision"), "nvidia-dali": _version("nvidia.dali"),
           "python": platform.python_version(), "cpu": cpu_name(), "cpu_cores": cpu_cores()}
    if device == "cuda":
        nccl = torch.cuda.nccl.version()  # a tuple; a plain int in older torch
        env.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                   nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30).stdout.split()
            env["driver"] = smi[0] if smi else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return env
