"""A run of bench.gpu: each selected unit measured in its canonical order by the module that
measures it, its rows judged against the targets, printed and kept in the record after every unit
(so a run stopped at a time limit keeps the rows it finished); then the summary and the exit
status."""
from __future__ import annotations

import atexit
import datetime
import json
import signal
import sys
import time
from typing import List, Optional, Sequence

from imagenet_recipes.bench.common import REPO, device_environment, shown_command
from imagenet_recipes.bench.gpu.cli import parse_cli
from imagenet_recipes.bench.gpu.loaders import jpeg_set, measure_decode, measure_loader
from imagenet_recipes.bench.gpu.pairs import measure_pair, measure_variants
from imagenet_recipes.bench.gpu.peers import measure_peers, measure_timm_benchmark
from imagenet_recipes.bench.gpu.report import print_row, write_record
from imagenet_recipes.bench.gpu.scripts import (CHILDREN, Context, measure_synthetic,
                                                stop_on_signal)
from imagenet_recipes.bench.gpu.units import (DTYPE, LOADER_FLAGS, RECORD_TOOL, UNITS, Failure,
                                              Skip, Unit, assess, list_units, missed, new_row)


def measure(ctx: Context, unit: Unit) -> List[dict]:
    """The unit's rows, from the module that measures its kind."""
    args = ctx.args
    if unit.group == "loop":
        level, short = unit.name.split("-")
        return measure_pair(args, unit, level, DTYPE[short], compile_=False)
    if unit.name == "compile":
        return measure_pair(args, unit, "O1", args.amp_dtype, compile_=True)
    if unit.name == "nd-synthetic":
        return measure_synthetic(ctx, unit, "nd")
    if unit.name == "ddp-1rank":
        return measure_synthetic(ctx, unit, "ddp")
    if unit.name == "peers":
        return measure_peers(ctx, unit)
    if unit.name == "decode-only":
        return measure_decode(ctx, unit)
    if unit.group == "causes":
        if unit.name == "nd-torchrun":
            return measure_synthetic(ctx, unit, "nd", launcher="torchrun")
        if unit.name == "timm-benchmark":
            return measure_timm_benchmark(ctx, unit)
        return measure_variants(args, unit)
    return measure_loader(ctx, unit, LOADER_FLAGS[unit.name])


def run_unit(ctx: Context, unit: Unit) -> List[dict]:
    """The unit's rows; a unit that fails or cannot run here gives rows saying so, and the
    others still run."""
    print(f"\n== {unit.name}: {unit.what}", flush=True)
    started = time.perf_counter()
    try:
        rows = measure(ctx, unit)
    except Skip as why:
        rows = [dict(new_row(r, unit.name, unit.what), status="skipped", note=str(why))
                for r in unit.rows]
    except Failure as why:
        rows = [dict(new_row(r, unit.name, unit.what), status="failed", note=str(why))
                for r in unit.rows]
    except Exception as err:  # a unit that breaks is a failed unit; the next may still run
        note = f"{type(err).__name__}: {err}"
        rows = [dict(new_row(r, unit.name, unit.what), status="failed", note=note[:500])
                for r in unit.rows]
    seconds = time.perf_counter() - started
    for row in rows:
        row["seconds"] = seconds
    return rows


def reused(args, unit: Unit, config: dict) -> Optional[List[dict]]:
    """A unit this run only brings along as a reference, copied from the first --reuse record
    of the same configuration that holds every row of it measured; None: measure it."""
    if unit.name in args.named_units:
        return None
    for path in args.reuse:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("tool") != RECORD_TOOL or record.get("config") != config:
            continue
        rows = {r["name"]: r for r in record.get("rows", []) if r.get("unit") == unit.name
                and r.get("status") == "ok"}
        if set(rows) >= set(unit.rows):
            print(f"\n== {unit.name}: its rows from {path} (--reuse)", flush=True)
            return [dict(rows[name], detail={**rows[name]["detail"], "reused_from": str(path)})
                    for name in unit.rows]
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m imagenet_recipes.bench.gpu ARGS` (`argv`: ARGS; None: sys.argv's) -> the exit
    status."""
    args = parse_cli(argv)
    if args.list:
        list_units()
        return 0
    if args.prepare_data:
        jpeg_set(args)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu: no CUDA GPU is visible (torch.cuda.is_available() is False); "
              "--device cpu checks the tool itself", file=sys.stderr)
        return 2
    from imagenet_recipes.bench.common import git_commit

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop_on_signal)
    atexit.register(CHILDREN.stop_all)

    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or REPO / "runs" / f"bench_gpu-{stamp:%Y%m%d-%H%M%S}"
    ctx = Context(args, out)
    given = list(sys.argv[1:] if argv is None else argv)
    # --commit only names what a copied tree cannot tell: not part of the measurement
    shown = [a for i, a in enumerate(given) if not (a.startswith("--commit") or (
        i and given[i - 1] == "--commit"))]
    record = {"tool": RECORD_TOOL, "command": shown_command("gpu", shown),
              "commit": args.commit or git_commit(),
              "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
              "environment": device_environment(args.device),
              "config": {k: getattr(args, k) for k in (
                  "device", "arch", "image_size", "batch_size", "steps", "warmup", "repeats",
                  "amp_dtype", "workers", "loader_window")},
              "targets": args.targets, "units": args.units, "complete": False, "seconds": 0.0,
              "rows": []}
    env = record["environment"]
    print(f"bench.gpu: {env['gpu'] or 'CPU'} | cpu {env['cpu']} ({env['cpu_cores']} cores) | "
          f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}; units: "
          f"{', '.join(args.units)}; output in {out}", flush=True)
    rows: List[dict] = []
    try:
        for name in args.units:
            rows += reused(args, UNITS[name], record["config"]) or run_unit(ctx, UNITS[name])
            assess(rows, args.targets)
            for row in rows:
                if row["unit"] == name:
                    print_row(row)
            record.update(rows=rows, seconds=time.perf_counter() - started)
            if args.json:
                write_record(args.json, record)
        record["complete"] = True
    finally:
        record.update(rows=rows, seconds=time.perf_counter() - started)
        if args.json:
            write_record(args.json, record)
        CHILDREN.stop_all()

    failed = [r["name"] for r in rows if r["status"] == "failed"]
    misses = missed(rows)
    print(f"\nbench.gpu: {len(rows)} rows in {record['seconds'] / 60:.1f} min; "
          f"{len(failed)} failed; {len(misses)} target(s) missed"
          + (f" (record: {args.json})" if args.json else ""))
    for text in misses:
        print(f"  TARGET MISSED  {text}")
    if failed:
        return 1
    return 1 if misses and args.strict else 0
