"""Training runs started the way a user starts them, one after another, with a record of what
else kept the machine busy meanwhile. Shared by the sweep and the benchmarks.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from imagenet_recipes.bench.common import REPO, registry

# train/ddp.py and train/ps.py with --worker-slowdown: the emulated straggler of the
# benchmarks that compare synchronous and asynchronous training (bench.slow_workers).
SLOW_DDP = "imagenet_recipes.bench.slow_workers.ddp"
SLOW_PS = "imagenet_recipes.bench.slow_workers.ps"


def launcher(entry: str, processes: int, module: Optional[str] = None) -> List[str]:
    """The command that starts an entry script on `processes` processes, as its docstring says
    (the registry names the script and its launcher); `module`: a module run with `-m` instead
    of the script, one built on that entry (bench.slow_workers' ddp on ddp, say)."""
    e = registry().ENTRIES[entry]
    program = ["-m", module] if module else [str(REPO / e.script)]
    if e.launcher == "python":
        return [sys.executable, *program]
    if e.launcher == "horovodrun":  # the invocation known to work here: gloo, this venv's python
        return [str(Path(sys.executable).parent / "horovodrun"), "-np", str(processes),
                "--gloo", sys.executable, *program]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={processes}", *program]


def dataset_command(root: Path, classes: int, train: int, val: int, min_size: int,
                    max_size: int, workers: Optional[int] = 2) -> List[str]:
    """data/make_synthetic.py as a user runs it (it skips a complete identical dataset);
    workers None: its default, every CPU."""
    cmd = [sys.executable, str(REPO / "data/make_synthetic.py"), str(root), "--classes",
           str(classes), "--train-per-class", str(train), "--val-per-class", str(val),
           "--min-size", str(min_size), "--max-size", str(max_size)]
    return cmd + (["--workers", str(workers)] if workers is not None else [])


def make_dataset(command: List[str]) -> None:
    """Run a dataset_command; its progress lines would only clutter the tool's own output."""
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


# --- what else the machine did -------------------------------------------------------------------
def loadavg() -> Optional[float]:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def busy_cpu_seconds() -> Optional[float]:
    """CPU seconds the whole machine has spent busy since boot (all cores, /proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds of this process's finished descendants (the runs, their launchers, their
    loader workers: each is waited for by its parent, or, orphaned, by this process: see
    adopt_orphans)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def adopt_orphans() -> None:
    """Become the reaper of descendants whose parent exits without waiting for them (Linux's
    child subreaper), so their CPU time counts as the run's. The loader workers' fork server
    is one: the trainer never waits for it, and without this its workers' CPU time would show
    up as other processes' load."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init, as before
        pass


def reap_orphans(wait_s: float = 10.0) -> None:
    """Wait (up to `wait_s`) for the adopted descendants of the run that just ended."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def finished(run_dir: Path) -> bool:
    log = run_dir / "log.jsonl"
    return log.is_file() and '"kind": "end"' in log.read_text()


# --- running -------------------------------------------------------------------------------------
def run_all(jobs: Sequence[tuple], out: Path, threads: int, timeout: float, meta_name: str,
            redo: Optional[str] = None) -> Dict[str, dict]:
    """Run (name, command) pairs one after another; each one's console output goes to
    <out>/<name>/console.log. A failed run is reported and the others still run. A run that
    already finished in <out> is kept unless its name matches `redo`; a run done again (or an
    unfinished one) is moved to <out>/_replaced/ first, so a sweep can be resumed or one run
    repeated.

    Writes <out>/<meta_name>: per run the command, exit code, seconds, the 1-min load average
    before and after, and `other_cpu`: the share of all cores that processes OTHER than the run
    kept busy while it ran ((machine busy CPU - the run's CPU) / (wall x cores)), which says
    whether a shared machine disturbed it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    meta_path = out / meta_name
    meta: Dict[str, dict] = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    cores = os.cpu_count() or 1
    adopt_orphans()
    for i, (name, cmd) in enumerate(jobs, 1):
        run_dir = out / name
        if run_dir.exists():
            if finished(run_dir) and not (redo and re.search(redo, name)):
                print(f"[{i}/{len(jobs)}] {name}: already done (--redo REGEX repeats it)")
                continue
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            (out / "_replaced").mkdir(exist_ok=True)
            run_dir.rename(out / "_replaced" / f"{name}-{stamp}")
            if name in meta:
                meta.setdefault("_replaced", {})[f"{name}-{stamp}"] = meta.pop(name)
        run_dir.mkdir(parents=True)
        load = loadavg()
        print(f"[{i}/{len(jobs)}] {name} (load {load})", end=" ", flush=True)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        busy0, mine0, start = busy_cpu_seconds(), children_cpu_seconds(), time.perf_counter()
        with open(run_dir / "console.log", "w") as console:
            # A session of its own, so a timeout ends the launcher and every rank it started.
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=console,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = "timeout"
        reap_orphans()
        seconds = time.perf_counter() - start
        busy1, mine1 = busy_cpu_seconds(), children_cpu_seconds()
        other = None
        if busy0 is not None and busy1 is not None:
            other = max(0.0, (busy1 - busy0) - (mine1 - mine0)) / (seconds * cores)
        print(f"-> {'ok' if code == 0 else f'FAILED ({code})'} in {seconds:.0f} s"
              + (f", other processes used {other:.0%} of the CPUs" if other is not None else ""),
              flush=True)
        if code != 0:
            tail = (run_dir / "console.log").read_text(errors="replace").splitlines()[-15:]
            print("    " + "\n    ".join(tail), file=sys.stderr)
        meta[name] = {"command": shlex.join(cmd), "returncode": code, "seconds": seconds,
                      "started": started, "loadavg_before": load, "loadavg_after": loadavg(),
                      "other_cpu": other}
        meta_path.write_text(json.dumps(meta, indent=2))
    return meta


def quick_defaults(args, argv: Optional[Sequence[str]], defaults: Dict[str, tuple]) -> None:
    """--quick: set each {flag: (dest, value)} the command line did not give itself."""
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    for flag, (dest, value) in defaults.items():
        if flag not in given:
            setattr(args, dest, value)


def stamped_out(prefix: str) -> Path:
    """runs/<prefix>-<date>-<time>: a fresh folder per invocation."""
    return REPO / "runs" / f"{prefix}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def redraw(folder: Path, draw: Callable[[Path], int]) -> int:
    """--plot-only: the figures and tables of an earlier invocation's folder, from its logs."""
    if not folder.is_dir():
        print(f"error: --plot-only {folder}: no such folder", file=sys.stderr)
        return 2
    return draw(folder)


# --quick for the studies on generated data (bench.esync, bench.hetero)
STUDY_QUICK = {"--epochs": ("epochs", 2), "-b": ("batch_size", 8),
               "--warmup-epochs": ("warmup_epochs", 0), "--repeats": ("repeats", 1),
               "--train-per-class": ("train_per_class", 12)}


def study_arguments(parser, prefix: str, repeats: int, esync_epsilon_help: str) -> None:
    """The options every study on generated data takes (bench.esync, bench.hetero): where the
    runs go, how many, and the model, data and schedule of each run."""
    add = parser.add_argument
    add("--out", type=Path, help=f"folder of the runs (default runs/{prefix}-<stamp>); runs "
        "already finished there are kept")
    add("--report", type=Path, metavar="DIR",
        help="run nothing: draw and print the block of an earlier --out")
    add("--quick", action="store_true", help="smoke run: tiny data, 2 epochs")
    add("--dry-run", action="store_true")
    add("--redo", metavar="REGEX", help="repeat the finished runs matching REGEX")
    add("--repeats", type=int, default=repeats, help="seeds per combination")
    add("-a", "--arch", default="resnet18")
    add("--image-size", type=int, default=32)
    add("-b", "--batch-size", type=int, default=16, help="per worker")
    add("--epochs", type=int, default=6)
    add("--lr", type=float, default=0.4, help="for a batch of 256, scaled per method")
    add("--warmup-epochs", type=float, default=1)
    add("-p", "--print-freq", type=int, default=5)
    add("--train-per-class", type=int, default=64)
    add("-j", "--loader-workers", type=int, default=1,
        help="loader processes per worker (0: each worker loads its own batches)")
    add("--esync-epsilon", type=float, default=0.05, help=esync_epsilon_help)
    add("--threads", type=int, default=1, help="OMP threads per process")
    add("--timeout", type=float, default=1200, help="seconds per run")
    add("--figures", type=Path,
        help="where the figure goes (default: the runs' folder's figures/)")


def run_study(parser, args, prefix: str, meta_name: str,
              list_jobs: Callable[..., Sequence[tuple]], finish: Callable[[Path], int]) -> int:
    """The main of a study on generated data (bench.esync, bench.hetero): --report DIR only
    redraws an earlier folder; otherwise the data set (10 classes of 40-56 px images; --quick:
    6 classes, 24-32 px) and the runs go to --out (default runs/<prefix>-<stamp>), then
    `finish` reads them."""
    if args.report:
        if not args.report.is_dir():
            parser.error(f"--report {args.report}: no such folder")
        return finish(args.report)
    out = args.out or stamped_out(prefix)
    data = out / "_data"
    size = (24, 32) if args.quick else (40, 56)
    dataset = dataset_command(data, 6 if args.quick else 10, args.train_per_class,
                              6 if args.quick else 20, *size)
    return run_batch(list_jobs(args, out, data), out, args, meta_name, dataset, finish)


def run_batch(jobs: Sequence[tuple], out: Path, args, meta_name: str,
              dataset: Optional[List[str]], draw: Callable[[Path], int]) -> int:
    """What the sweep and the PS benchmark do once their runs are listed: print the commands
    (--dry-run), or generate the dataset, run the jobs one after another (run_all) and draw the
    figures and RESULTS.md tables from their logs. Exit status 1 when a run failed."""
    if args.dry_run:
        if dataset:
            print(shlex.join(dataset))
        for _, cmd in jobs:
            print(f"OMP_NUM_THREADS={args.threads} {shlex.join(cmd)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if dataset:
        make_dataset(dataset)
    meta = run_all(jobs, out, args.threads, args.timeout, meta_name, args.redo)
    print(f"# {Path(meta_name).stem} took {time.perf_counter() - started:.0f} s; logs in {out}")
    code = draw(out)
    failed = [n for n, _ in jobs if meta.get(n, {}).get("returncode") not in (0, None)]
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (see their "
              "console.log)", file=sys.stderr)
        return 1
    return code
