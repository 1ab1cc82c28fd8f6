"""Strategy sweep: strategies x worker counts x precision (x DDP comm hook, x Horovod fp16
compression), every combination a real run, then figures and RESULTS.md tables drawn from the
runs' JSONL logs only.

    launch/env.sh python -m imagenet_recipes.bench.sweep                     # the full sweep, ~10-15 min on 2 cores
    launch/env.sh python -m imagenet_recipes.bench.sweep --dry-run           # print the commands, run nothing
    launch/env.sh python -m imagenet_recipes.bench.sweep --only 'ddp|nd'     # the combinations whose name matches
    launch/env.sh python -m imagenet_recipes.bench.sweep --quick             # tiny smoke sweep (~1-2 min)
    launch/env.sh python -m imagenet_recipes.bench.sweep --plot-only runs/sweep-20261122-140000   # redraw

Each combination runs alone (sequentially), OMP_NUM_THREADS=--threads per process, into
`<out>/<name>/` (default out: runs/sweep-<stamp>), its console output in `<name>/console.log`.
Given the --out of an earlier sweep, finished runs are kept (a sweep resumes); `--redo REGEX`
repeats the matching ones (the old runs go to `<out>/_replaced/`). `<out>/sweep.json` records
per run how much CPU other processes used meanwhile (a shared machine shows there).
Names encode the combination: `<strategy>-w<workers>-<opt level>[-hook_<h>][-fp16_compress]`,
e.g. `ddp-w2-O0-hook_fp16`, `ps_sync-w2-O0`; `curves-*` are the learning-curve runs; `-r2`,
`-r3`, ... the repeats of a throughput combination (--repeats).

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

Then bench.plot_scaling draws the figures (scaling_*.png, in <out>/figures unless --figures) and
the `sweep` block is printed; RESULTS.md changes only through `bench.regenerate --archive <out>
sweep`, which keeps the runs in results/sweep/ and rewrites the block from them. The strategies,
their scripts and
launchers come from the engine's registry (imagenet_recipes/registry.py).
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List

from imagenet_recipes.bench.common import emulated_bf16, registry
from imagenet_recipes.bench.jobs import dataset_command, launcher, quick_defaults, redraw, run_batch, stamped_out

REGISTRY = registry()
ENTRIES = REGISTRY.ENTRIES


def _apex_levels(entry: str) -> bool:
    """An entry whose own default is an opt level (ddp_apex) runs at each --apex-levels."""
    return "opt_level" in ENTRIES[entry].defaults

# The one-process run every efficiency is compared with, then every strategy that scales with
# the process count. (DataParallel is neither: one process over the GPUs it sees.)
BASELINE = REGISTRY.BASELINE
STRATEGIES = (BASELINE, *(name for name, e in ENTRIES.items() if e.distributed))


# --- the combinations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Combo:
    strategy: str            # an entry of the registry: nd | ddp | ddp_apex | hvd | fsdp | ps
    workers: int             # processes that compute (the PS adds its server processes)
    opt_level: str = "O0"
    hook: str = "none"       # DDP comm hook
    compression: str = "none"  # Horovod gradient compression: none | fp16
    mode: str = "sync"       # parameter server mode
    servers: int = 1         # parameter server processes (--num-servers)
    stage: str = "throughput"  # throughput | curves
    repeat: int = 1          # the k-th run of the same combination (throughput only)

    @property
    def has_servers(self) -> bool:
        """The parameter server: server processes beside the workers, and modes."""
        return ENTRIES[self.strategy].provides(REGISTRY.SERVERS)

    @property
    def processes(self) -> int:
        return self.workers + self.servers if self.has_servers else self.workers

    @property
    def name(self) -> str:
        parts = [f"{self.strategy}_{self.mode}" if self.has_servers else self.strategy,
                 f"w{self.workers}", self.opt_level]
        if self.hook != "none":
            parts.append(f"hook_{self.hook}")
        if self.compression != "none":
            parts.append(f"{self.compression}_compress")
        if self.servers > 1:
            parts.append(f"s{self.servers}")
        if self.repeat > 1:
            parts.append(f"r{self.repeat}")
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
            if not ENTRIES[s].distributed:  # one process, whatever the worker count
                if n == 1:
                    out.append(Combo(s, 1))
            elif _apex_levels(s):
                out += [Combo(s, n, opt_level=lvl) for lvl in _csv(args.apex_levels)]
            elif ENTRIES[s].provides(REGISTRY.DDP_COMM_HOOKS):
                for hook in _csv(args.ddp_hooks):
                    if hook == "none" or n > 1:  # one process has nothing to compress
                        out.append(Combo(s, n, hook=hook))
            elif ENTRIES[s].provides(REGISTRY.HOROVOD_COMPRESSION):
                for comp in _csv(args.hvd_compression):
                    if comp == "none" or n > 1:
                        out.append(Combo(s, n, compression=comp))
            elif ENTRIES[s].provides(REGISTRY.SERVERS):
                out += [Combo(s, n, mode=m, servers=int(k)) for m in _csv(args.ps_modes)
                        for k in _csv(args.ps_servers)]
            else:  # fsdp: any strategy without variants of its own
                out.append(Combo(s, n))
    # Repeats interleave (every combination once, then again), so a drift of a shared machine
    # spreads over all of them instead of hitting one combination's repeats together.
    out = [replace(c, repeat=k) for k in range(1, args.repeats + 1) for c in out]
    if args.curves:
        top = max(workers)
        for s in strategies:
            if not ENTRIES[s].distributed:
                out.append(Combo(s, 1, stage="curves"))
            elif _apex_levels(s):
                if not args.emulated_bf16:
                    out += [Combo(s, top, opt_level=lvl, stage="curves")
                            for lvl in _csv(args.apex_levels)]
            elif ENTRIES[s].provides(REGISTRY.SERVERS):
                out += [Combo(s, top, mode=m, stage="curves") for m in _csv(args.ps_modes)]
            else:  # ddp, hvd, fsdp: any strategy without variants of its own
                out.append(Combo(s, top, stage="curves"))
    if args.only:
        pattern = re.compile(args.only)
        out = [c for c in out if pattern.search(c.name)]
    return out


# --- commands -------------------------------------------------------------------------------------
def strategy_args(c: Combo) -> List[str]:
    args = ["--opt-level", c.opt_level]
    if c.hook != "none":
        args += ["--ddp-comm-hook", c.hook]
    if c.compression == "fp16":
        args += ["--fp16-allreduce"]
    if c.has_servers:
        args += ["--mode", c.mode] + (["--num-servers", str(c.servers)] if c.servers > 1
                                      else [])
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


def plot_and_tables(sweep_dir: Path, args) -> int:
    from imagenet_recipes.bench import plot_scaling, results  # matplotlib: only when there is something to draw

    plot_scaling.draw(sweep_dir, Path(args.figures) if args.figures else sweep_dir / "figures")
    print(results.sweep_block(sweep_dir))
    print(f"To keep it: launch/env.sh python -m imagenet_recipes.bench.regenerate --archive {sweep_dir} sweep "
          "(RESULTS.md's block and figures are rewritten from results/ only)")
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
    p.add_argument("--workers", default="1,2", help="worker counts (PS: + its server processes)")
    p.add_argument("--ddp-hooks", default="none,fp16", help="DDP comm hooks (none,fp16,bf16,"
                                                            "powersgd) at > 1 worker")
    p.add_argument("--hvd-compression", default="none,fp16", help="Horovod: none,fp16")
    p.add_argument("--apex-levels", default="O1", help="opt levels of ddp_apex runs")
    p.add_argument("--ps-modes", default="sync", help="parameter server modes")
    p.add_argument("--ps-servers", default="1",
                   help="parameter server process counts (--num-servers), e.g. 1,2")
    p.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    p.add_argument("-a", "--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("-b", "--batch-size", type=int, default=32, help="per worker (weak scaling)")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each throughput combination (named <combo>-r2, -r3, ...): the "
                        "tables show their median and the figures their spread")
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
    p.add_argument("--figures", help="where the PNGs go (default: <out>/figures)")
    args = p.parse_args(argv)
    if args.quick:
        quick_defaults(args, argv, {
            "--image-size": ("image_size", 32), "-b": ("batch_size", 8), "--steps": ("steps", 6),
            "-p": ("print_freq", 2), "--slow-steps": ("slow_steps", 2),
            "--strategies": ("strategies", "nd,ddp"), "--ddp-hooks": ("ddp_hooks", "none"),
            "--curves-epochs": ("curves_epochs", 2), "--curves-batch": ("curves_batch", 8),
            "--curves-print-freq": ("curves_print_freq", 2)})
    # Only asked when it matters (it imports torch: seconds on a busy box).
    args.emulated_bf16 = (not args.plot_only
                          and any(_apex_levels(s) for s in _csv(args.strategies) if s in ENTRIES)
                          and any(lvl != "O0" for lvl in _csv(args.apex_levels))
                          and emulated_bf16())
    return args


def main(argv=None) -> int:
    args = parse(argv)
    draw = functools.partial(plot_and_tables, args=args)
    if args.plot_only:
        return redraw(args.plot_only, draw)
    out = args.out or stamped_out("sweep")
    todo = combos(args)
    if not todo:
        print("error: no combination left (check --only / --strategies / --workers)",
              file=sys.stderr)
        return 2
    jobs = [(c.name, command(c, args, out)) for c in todo]
    need_data = any(c.stage == "curves" for c in todo) and not args.curves_data
    dataset = dataset_command(curves_data_dir(args, out), *curves_dataset(args)) \
        if need_data else None
    print(f"# {len(jobs)} runs into {out}; OMP_NUM_THREADS={args.threads} per process; workers "
          "counted as compute processes (PS: + its server processes)")
    if args.emulated_bf16 and any(c.opt_level != "O0" for c in todo if c.stage != "curves"):
        print(f"# bf16 is emulated on this CPU (no AVX512-BF16/AMX): O1 runs take "
              f"{args.slow_steps} steps, -p 1")
    return run_batch(jobs, out, args, "sweep.json", dataset, draw)


def curves_dataset(args) -> tuple:
    """(classes, train per class, val per class, min size, max size) of the curves data."""
    if args.quick:
        return 4, 16, 5, 40, 48
    return 10, 100, 20, 40, 64


if __name__ == "__main__":
    sys.exit(main())
