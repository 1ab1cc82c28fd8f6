"""Strategy sweep: strategies x worker counts x precision (x DDP comm hook, x Horovod fp16
compression), every combination a real run, then figures and RESULTS.md tables drawn from the
runs' JSONL logs only.

    launch/env.sh python launch/sweep.py                     # the full sweep, ~10-15 min on 2 cores
    launch/env.sh python launch/sweep.py --dry-run           # print the commands, run nothing
    launch/env.sh python launch/sweep.py --only 'ddp|nd'     # the combinations whose name matches
    launch/env.sh python launch/sweep.py --quick             # tiny smoke sweep (~1-2 min)
    launch/env.sh python launch/sweep.py --plot-only runs/sweep-20261122-140000   # redraw

Each combination runs alone (sequentially), OMP_NUM_THREADS=--threads per process, into
`<out>/<name>/` (default out: runs/sweep-<stamp>), its console output in `<name>/console.log`.
Given the --out of an earlier sweep, finished runs are kept (a sweep resumes); `--redo REGEX`
repeats the matching ones (the old runs go to `<out>/_replaced/`). `<out>/sweep.json` records
per run how much CPU other processes used meanwhile (a shared machine shows there).
Names encode the combination: `<strategy>-w<workers>-<opt level>[-hook_<h>][-fp16_compress]`,
e.g. `ddp-w2-O0-hook_fp16`, `ps_sync-w2-O0`; `curves-*` are the learning-curve runs.

Workers, not processes, are counted: N workers = N processes for nd/DDP/Horovod, and N + 1
processes for the parameter server (rank 0 serves: it applies updates and never runs the training
forward pass). `ps_sync-w2` is 3 processes on this 2-core box.

Two stages:
  throughput  weak scaling (-b per worker fixed), --steps optimizer steps on synthetic data
              (--data DIR: on a real ImageFolder), img/s = median of the logged intervals after
              the first (which holds start-up and warm-up). Defaults match RESULTS.md's CPU
              section: resnet18, 64 px, -b 32, 25 steps, -p 5, 1 thread per process.
              O1 (bf16) on a CPU without native bf16 is ~24x slower (emulated): those runs take
              --slow-steps steps, -p 1, so the sweep stays within minutes.
  curves      learning curves on a generated learnable dataset (data/make_synthetic.py, 10
              classes, 32 px): nd and every distributed strategy at the largest worker count,
              --curves-epochs epochs, validation every epoch. --no-curves skips them.

Then figures/plot_scaling.py draws figures/scaling_*.png and launch/results_tables.py writes the
`<!-- sweep:start -->` block of RESULTS.md (--no-results: not).
"""
from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "train"
STRATEGIES = ("nd", "ddp", "ddp_apex", "hvd", "ps")
SCRIPTS = {"nd": "nd.py", "ddp": "ddp.py", "ddp_apex": "ddp_apex.py", "hvd": "hvd.py",
           "ps": "ps.py"}


# --- the combinations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Combo:
    strategy: str            # nd | ddp | ddp_apex | hvd | ps
    workers: int             # processes that compute (the PS adds one server process)
    opt_level: str = "O0"
    hook: str = "none"       # DDP comm hook
    compression: str = "none"  # Horovod gradient compression: none | fp16
    mode: str = "sync"       # parameter server mode
    stage: str = "throughput"  # throughput | curves

    @property
    def processes(self) -> int:
        return self.workers + 1 if self.strategy == "ps" else self.workers

    @property
    def name(self) -> str:
        parts = [f"ps_{self.mode}" if self.strategy == "ps" else self.strategy,
                 f"w{self.workers}", self.opt_level]
        if self.hook != "none":
            parts.append(f"hook_{self.hook}")
        if self.compression != "none":
            parts.append(f"{self.compression}_compress")
        name = "-".join(parts)
        return f"curves-{name}" if self.stage == "curves" else name


def _csv(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def combos(args) -> List[Combo]:
    """The sweep's combinations, in the order they run."""
    strategies = _csv(args.strategies)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise SystemExit(f"error: unknown strategy {unknown}; choose from {','.join(STRATEGIES)}")
    workers = sorted({int(w) for w in _csv(args.workers)})
    out: List[Combo] = []
    # Strategy by strategy, so a strategy's 1-worker baseline runs right before its N-worker
    # runs (a shared machine's drifts then hit both alike).
    for s in strategies:
        for n in workers:
            if s == "nd":
                if n == 1:
                    out.append(Combo("nd", 1))
            elif s == "ddp":
                for hook in _csv(args.ddp_hooks):
                    if hook == "none" or n > 1:  # one process has nothing to compress
                        out.append(Combo("ddp", n, hook=hook))
            elif s == "ddp_apex":
                out += [Combo("ddp_apex", n, opt_level=lvl) for lvl in _csv(args.apex_levels)]
            elif s == "hvd":
                for comp in _csv(args.hvd_compression):
                    if comp == "none" or n > 1:
                        out.append(Combo("hvd", n, compression=comp))
            elif s == "ps":
                out += [Combo("ps", n, mode=m) for m in _csv(args.ps_modes)]
    if args.curves:
        top = max(workers)
        for s in strategies:
            if s == "nd":
                out.append(Combo("nd", 1, stage="curves"))
            elif s in ("ddp", "hvd"):
                out.append(Combo(s, top, stage="curves"))
            elif s == "ddp_apex" and not args.emulated_bf16:
                out += [Combo(s, top, opt_level=lvl, stage="curves")
                        for lvl in _csv(args.apex_levels)]
            elif s == "ps":
                out += [Combo("ps", top, mode=m, stage="curves") for m in _csv(args.ps_modes)]
    if args.only:
        pattern = re.compile(args.only)
        out = [c for c in out if pattern.search(c.name)]
    return out


# --- commands -------------------------------------------------------------------------------------
def launcher(strategy: str, processes: int) -> List[str]:
    """How each strategy is started, as a user would (see the entry scripts' docstrings)."""
    script = str(TRAIN / SCRIPTS[strategy])
    if strategy == "nd":
        return [sys.executable, script]
    if strategy == "hvd":  # as launch/bench_hvd.py, the invocation known to work here
        return [str(Path(sys.executable).parent / "horovodrun"), "-np", str(processes),
                "--gloo", sys.executable, script]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={processes}", script]


def strategy_args(c: Combo) -> List[str]:
    args = ["--opt-level", c.opt_level]
    if c.hook != "none":
        args += ["--ddp-comm-hook", c.hook]
    if c.compression == "fp16":
        args += ["--fp16-allreduce"]
    if c.strategy == "ps":
        args += ["--mode", c.mode]
    return args


def trainer_args(c: Combo, args, out: Path) -> List[str]:
    common = ["-a", args.arch, "-j", str(args.loader_workers), "--seed", "0",
              "--logdir", str(out), "--run-name", c.name]
    if c.stage == "curves":
        return common + [
            "--image-size", str(args.curves_image_size), "-b", str(args.curves_batch),
            "--epochs", str(args.curves_epochs), "--lr", str(args.curves_lr),
            "--warmup-epochs", "1", "--lr-schedule", "cosine", "-p", str(args.curves_print_freq),
            str(curves_data_dir(args, out))]
    slow = c.opt_level != "O0" and args.emulated_bf16
    steps, freq = (args.slow_steps, 1) if slow else (args.steps, args.print_freq)
    data = ([args.data] if args.data else
            ["--dummy", "--synthetic-classes", "10", "--synthetic-val-size", "64"])
    return common + ["--image-size", str(args.image_size), "-b", str(args.batch_size),
                     "--epochs", "1", "--steps-per-epoch", str(steps), "-p", str(freq), *data]


def command(c: Combo, args, out: Path) -> List[str]:
    return launcher(c.strategy, c.processes) + trainer_args(c, args, out) + strategy_args(c)


def curves_data_dir(args, out: Path) -> Path:
    return Path(args.curves_data) if args.curves_data else out / "_data"


def make_dataset(root: Path, classes: int, train: int, val: int, min_size: int, max_size: int,
                 dry_run: bool = False) -> List[str]:
    """data/make_synthetic.py as a user runs it (it skips a complete identical dataset)."""
    cmd = [sys.executable, str(REPO / "data/make_synthetic.py"), str(root), "--classes",
           str(classes), "--train-per-class", str(train), "--val-per-class", str(val),
           "--min-size", str(min_size), "--max-size", str(max_size), "--workers", "2"]
    if not dry_run:
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return cmd


def emulated_bf16() -> bool:
    """True on a CPU-only machine without native bf16 (AVX512-BF16 / AMX).
    RECIPES_CPU_BF16=native|emulated overrides the probe (tests force each case)."""
    forced = os.environ.get("RECIPES_CPU_BF16")
    if forced in ("native", "emulated"):
        return forced == "emulated"
    import torch
    return not torch.cuda.is_available() and not torch.ops.mkldnn._is_mkldnn_bf16_supported()


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
    loader workers: each is waited for by its parent)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def finished(run_dir: Path) -> bool:
    log = run_dir / "log.jsonl"
    return log.is_file() and '"kind": "end"' in log.read_text()


# --- running --------------------------------------------------------------------------------------
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


def plot_and_tables(sweep_dir: Path, args) -> int:
    sys.path.insert(0, str(REPO / "figures"))
    import plot_scaling  # noqa: E402  (figures/ is not a package)
    import results_tables  # noqa: E402  (this folder is on sys.path: launch/)

    plot_scaling.draw(sweep_dir, Path(args.figures))
    if args.results:
        results_tables.update(Path(args.results), sweep=sweep_dir)
    print(results_tables.sweep_block(sweep_dir))
    return 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    p.add_argument("--out", type=Path, help="sweep folder (default runs/sweep-<stamp>)")
    p.add_argument("--data", help="ImageFolder root for the throughput runs (default synthetic "
                                  "data: compute and communication only)")
    p.add_argument("--only", help="run only the combinations whose name matches this regex")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--redo", metavar="REGEX", help="with --out of an earlier sweep: run the "
                   "finished runs matching REGEX again (the old ones go to <out>/_replaced/); "
                   "runs not yet finished there always run")
    p.add_argument("--plot-only", type=Path, metavar="DIR",
                   help="redraw the figures and tables of an existing sweep folder")
    p.add_argument("--quick", action="store_true",
                   help="smoke sweep: 32 px, -b 8, 6 steps, nd and DDP only, one tiny curves run")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--workers", default="1,2", help="worker counts (PS: + 1 server process)")
    p.add_argument("--ddp-hooks", default="none,fp16", help="DDP comm hooks (none,fp16,bf16,"
                                                            "powersgd) at > 1 worker")
    p.add_argument("--hvd-compression", default="none,fp16", help="Horovod: none,fp16")
    p.add_argument("--apex-levels", default="O1", help="opt levels of ddp_apex runs")
    p.add_argument("--ps-modes", default="sync", help="parameter server modes")
    p.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    p.add_argument("-a", "--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("-b", "--batch-size", type=int, default=32, help="per worker (weak scaling)")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("-p", "--print-freq", type=int, default=5)
    p.add_argument("--slow-steps", type=int, default=3,
                   help="steps of O1+ runs where bf16 is emulated (CPU without native bf16)")
    p.add_argument("-j", "--loader-workers", type=int, default=1)
    p.add_argument("--no-curves", dest="curves", action="store_false")
    p.add_argument("--curves-data", help="ImageFolder for the curves runs (default: generate "
                                         "one into <out>/_data)")
    p.add_argument("--curves-epochs", type=int, default=5)
    p.add_argument("--curves-image-size", type=int, default=32)
    p.add_argument("--curves-batch", type=int, default=32)
    p.add_argument("--curves-lr", type=float, default=0.4)
    p.add_argument("--curves-print-freq", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    p.add_argument("--figures", default=str(REPO / "figures"), help="where the PNGs go")
    p.add_argument("--results", default=str(REPO / "RESULTS.md"),
                   help="RESULTS.md to update between the sweep markers")
    p.add_argument("--no-results", dest="results", action="store_const", const=None)
    args = p.parse_args(argv)
    if args.quick:
        given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        quick = {"--image-size": ("image_size", 32), "-b": ("batch_size", 8),
                 "--steps": ("steps", 6), "-p": ("print_freq", 2),
                 "--slow-steps": ("slow_steps", 2), "--strategies": ("strategies", "nd,ddp"),
                 "--ddp-hooks": ("ddp_hooks", "none"), "--curves-epochs": ("curves_epochs", 2),
                 "--curves-batch": ("curves_batch", 8), "--curves-print-freq":
                 ("curves_print_freq", 2)}
        for flag, (dest, value) in quick.items():
            if flag not in given:
                setattr(args, dest, value)
    # Only asked when it matters (it imports torch: seconds on a busy box).
    args.emulated_bf16 = (not args.plot_only and "ddp_apex" in _csv(args.strategies)
                          and any(lvl != "O0" for lvl in _csv(args.apex_levels))
                          and emulated_bf16())
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.plot_only:
        if not args.plot_only.is_dir():
            print(f"error: --plot-only {args.plot_only}: no such folder", file=sys.stderr)
            return 2
        return plot_and_tables(args.plot_only, args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO / "runs" / f"sweep-{stamp}"
    todo = combos(args)
    if not todo:
        print("error: no combination left (check --only / --strategies / --workers)",
              file=sys.stderr)
        return 2
    jobs = [(c.name, command(c, args, out)) for c in todo]
    need_data = any(c.stage == "curves" for c in todo) and not args.curves_data
    data_cmd = (make_dataset(curves_data_dir(args, out), *curves_dataset(args), dry_run=True)
                if need_data else None)
    print(f"# {len(jobs)} runs into {out}; OMP_NUM_THREADS={args.threads} per process; workers "
          "counted as compute processes (PS: + 1 server process)")
    if args.emulated_bf16 and any(c.opt_level != "O0" for c in todo if c.stage != "curves"):
        print(f"# bf16 is emulated on this CPU (no AVX512-BF16/AMX): O1 runs take "
              f"{args.slow_steps} steps, -p 1")
    if args.dry_run:
        if data_cmd:
            print(shlex.join(data_cmd))
        for name, cmd in jobs:
            print(f"OMP_NUM_THREADS={args.threads} {shlex.join(cmd)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if need_data:
        make_dataset(curves_data_dir(args, out), *curves_dataset(args))
    meta = run_all(jobs, out, args.threads, args.timeout, "sweep.json", args.redo)
    failed = [n for n, _ in jobs if meta.get(n, {}).get("returncode") not in (0, None)]
    print(f"# sweep took {time.perf_counter() - started:.0f} s; logs in {out}")
    code = plot_and_tables(out, args)
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (see their "
              "console.log)", file=sys.stderr)
        return 1
    return code


def curves_dataset(args) -> tuple:
    """(classes, train per class, val per class, min size, max size) of the curves data."""
    if args.quick:
        return 4, 16, 5, 40, 48
    return 10, 100, 20, 40, 64


if __name__ == "__main__":
    sys.exit(main())
