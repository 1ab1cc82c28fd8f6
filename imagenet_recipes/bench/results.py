"""RESULTS.md's blocks of the strategy sweep, the parameter-server benchmark and its server
count, from run logs; printed here, written into RESULTS.md by bench.regenerate (from results/).

    launch/env.sh python -m imagenet_recipes.bench.results --sweep runs/sweep-20261122-140000
    launch/env.sh python -m imagenet_recipes.bench.results --bench-ps runs/bench_ps-20261122-150000 \\
        --target 80          # default: auto

Every number comes from the runs' log.jsonl files (through bench.sweep_stats and
bench.ps_stats); the hardware from the logs' run records; the prose from imagenet_recipes/bench/templates/.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Optional

from imagenet_recipes.bench import ps_stats, sweep_stats
from imagenet_recipes.bench.common import read_meta, repo_relative, shown_commit
from imagenet_recipes.bench.render import render
from imagenet_recipes.registry import runs_servers


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _commit(runs) -> str:
    """The commit the runs were made at, as their logs recorded it (several: all of them)."""
    commits = sorted({shown_commit(r.run.get("commit")) for r in runs})
    return " / ".join(commits)


def _when(run: dict) -> str:
    moment = datetime.datetime.fromtimestamp(run["time"], tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _other(meta: dict, name: str) -> str:
    share = meta.get(name, {}).get("other_cpu")
    return "-" if share is None else f"{share:.0%}"


def _other_of_repeats(meta: dict, combo: str) -> str:
    """`other CPU` of a combination: the highest of its repeats (the most disturbed one)."""
    shares = [m["other_cpu"] for name, m in meta.items() if name != "_replaced"
              and m.get("other_cpu") is not None
              and sweep_stats.combination(name) == combo]
    return f"{max(shares):.0%}" if shares else "-"


def load_note(meta: dict, meta_name: str) -> str:
    """How long the runs took and whether other processes shared the machine meanwhile."""
    runs = {k: v for k, v in meta.items() if k != "_replaced"}
    if not runs:
        return ""
    secs = sum(m["seconds"] for m in runs.values())
    other = {k: m["other_cpu"] for k, m in runs.items() if m.get("other_cpu") is not None}
    note = f" The runs took {secs / 60:.1f} min in all."
    if other:
        busy = sorted((k for k, v in other.items() if v >= 0.10), key=lambda k: -other[k])
        note += (f" While they ran, processes other than the run itself used "
                 f"{min(other.values()):.0%}-{max(other.values()):.0%} of the CPUs (`other "
                 f"CPU`, from /proc/stat and the runs' own CPU time, in `{meta_name}`)"
                 + (f"; 10 % or more during {', '.join(f'`{k}`' for k in busy)}: this "
                    "machine was shared, those numbers are disturbed." if busy else
                    ": the machine was otherwise quiet."))
    replaced = meta.get("_replaced", {})
    if replaced:
        note += " Runs repeated with `--redo` (the first attempts were moved to the measurement " \
            "folder's `_replaced/`, whose logs results/ does not keep): " \
            + ", ".join(f"`{k}` (other CPU {_fmt(m.get('other_cpu'), '.0%')})"
                        for k, m in replaced.items()) + "."
    return note


# --- the sweep ------------------------------------------------------------------------------------
def sweep_block(sweep_dir: Path) -> str:
    runs = sweep_stats.load_sweep(sweep_dir)
    if not runs:
        raise SystemExit(f"error: no run with a log.jsonl under {sweep_dir}")
    rows = sweep_stats.analyze(runs)
    meta = read_meta(sweep_dir / "sweep.json")
    tput = [r for r in runs if r.stage == "throughput"]
    curves = [r for r in runs if r.stage == "curves"]
    first = (tput or runs)[0]
    cfg = first.run["config"]
    steps = sorted({r.run["config"]["steps_per_epoch"] for r in tput
                    if not r.precision.startswith("O1")})
    # bench.sweep shortens the O1 runs only where bf16 is emulated
    slow = sorted({(r.run["config"]["steps_per_epoch"], r.run["config"]["print_freq"])
                   for r in tput if r.precision.startswith("O1")
                   and r.run["config"]["steps_per_epoch"] not in steps})
    top = max((r["workers"] for r in rows), default=1)
    head = [r for r in rows if r["workers"] == top and top > 1]
    efficiency = []
    for r in head:
        base = next((b for b in rows if b["family"] == r["family"] and b["workers"] == 1
                     and not b["variant"]), None)
        efficiency.append([r["label"], _fmt(base["img_s"] if base else None),
                           _fmt(r["img_s"]), f"**{_fmt(r['efficiency'], '.2f')}**",
                           _fmt(r["efficiency_nd"], ".2f"), _fmt(r["overhead"], ".2f"),
                           (f"{r['ps_comm_share']:.2f} / {r['ps_wait_share']:.2f}"
                            if r["ps_comm_share"] is not None else "-")])
    throughput = [
        [f"`{r['run']}`" + (f" x{r['repeats']}" if r["repeats"] > 1 else ""), r["label"],
         str(r["workers"]), str(r["processes"]), _fmt(r["img_s"]),
         f"{_fmt(r['img_s_low'])}-{_fmt(r['img_s_high'])}",
         _fmt(r["img_s"] / r["workers"] if r["img_s"] else None),
         _fmt(r["step_time"], ".3f"), _fmt(r["efficiency"], ".2f"), _fmt(r["epoch_hours"]),
         str(r["intervals"]), _other_of_repeats(meta, r["run"])] for r in rows]
    learning = []
    for r in curves:
        pts = sweep_stats.curve_points(r.logs)
        train, val = pts["train"], pts["val"]
        last = val[-1] if val else None
        learning.append([f"`{r.name}`", r.label, str(r.workers), str(len(train)),
                         _fmt(last.top1 if last else None), _fmt(last.top5 if last else None),
                         _fmt(max((v.top1 for v in val), default=None)),
                         _fmt(train[-1].top1 if train else None),
                         _fmt(last.seconds if last else None, ".0f"), _other(meta, r.name)])
    return render("sweep", logs=repo_relative(sweep_dir), runs=len(runs), when=_when(first.run),
                  commit=_commit(runs), hardware=sweep_stats.describe_hardware(runs),
                  threads=first.run["hardware"].get("torch_threads"),
                  note=load_note(meta, "sweep.json"), cfg=cfg,
                  synthetic=bool(cfg.get("dummy") or cfg.get("data_backend") == "synthetic"),
                  steps=steps, slow=slow[0] if slow else None, top=top, efficiency=efficiency,
                  ddp=next((r for r in head if r["entry"] == "ddp" and not r["variant"]
                            and r["efficiency"] is not None), None),
                  throughput=throughput, learning=learning,
                  curves=curves[0].run["config"] if curves else None,
                  curves_data=(repo_relative(Path(curves[0].run["config"]["data"] or "."))
                               if curves else None))


# --- the parameter-server benchmark ---------------------------------------------------------------
def bench_ps_block(bench_dir: Path, target: Optional[float]) -> str:
    contenders = ps_stats.load(bench_dir)
    if not contenders:
        raise SystemExit(f"error: no run with a log.jsonl under {bench_dir}")
    target, auto = ps_stats.resolve_target(contenders, target)
    rows = [ps_stats.summarize(c, target) for c in contenders]
    meta = read_meta(bench_dir / "bench_ps.json")
    first = contenders[0]
    by_key = {r["key"]: r for r in rows}
    table = []
    for r in rows:
        mbs = r["traffic_mb_s"][0] if r["traffic"] == "computed" else (
            sum(x for x in r["traffic_mb_s"] if x) / len(r["traffic_mb_s"]))
        bps = [x for x in r["bytes_per_sample"] if x is not None]
        comm = [x for x in r["comm_ratio"] if x is not None]
        wait = [x for x in r["wait_ratio"] if x is not None]
        table.append([
            r["label"], _fmt(r["time_to_target"], ".0f", "not reached"),
            _fmt(r["epoch_to_target"], "d", "-"), _fmt(r["final_top1"]), _fmt(r["best_top1"]),
            _fmt(r["samples_s"], ".0f"),
            " / ".join(_fmt(x, ".0f") for x in r["per_worker_samples_s"]),
            _fmt(mbs, ".0f") + (" (computed)" if r["traffic"] == "computed" else ""),
            _fmt(sum(bps) / len(bps) / 1e6 if bps else None, ".2f"),
            " / ".join(_fmt(x, ".2f") for x in comm) if comm else "not measured",
            " / ".join(_fmt(x, ".2f") for x in wait) if wait else "-", _other(meta, r["run"])])
    speedups = []  # (faster, slower, ratio of their times to the target)
    for base in ("sync", "ddp"):
        b = by_key.get(base)
        for other in ("esync", "async") if base == "sync" else ("esync", "async", "sync"):
            o = by_key.get(other)
            if b and o and b["time_to_target"] and o["time_to_target"]:
                speedups.append((o["label"], b["label"],
                                 b["time_to_target"] / o["time_to_target"]))
    esync = next((c.run["config"] for c in contenders if c.key == "esync"), None)
    return render("bench_ps", logs=repo_relative(bench_dir), when=_when(first.run),
                  commit=_commit(contenders), hardware=ps_stats.hardware(contenders),
                  run=first.run, cfg=first.run["config"],
                  data=repo_relative(Path(first.run["config"]["data"] or ".")),
                  note=load_note(meta, "bench_ps.json"), workers=first.workers,
                  slowdowns=first.slowdowns, target=target, auto=auto,
                  missed=[r["label"] for r in rows if r["time_to_target"] is None],
                  esync=esync, rows=table, speedups=speedups,
                  local_steps=(by_key.get("esync") or {}).get("local_steps"),
                  staleness=(by_key.get("async") or {}).get("staleness"))


# --- the parameter server's server count ---------------------------------------------------------
def _bytes_per_step(run: sweep_stats.Run) -> Optional[list]:
    """Worker 1's bytes sent to each server per step (its last record holds running totals)."""
    mine = [r for r in run.logs.get("worker", []) if r["worker"] == 1]
    steps = sum(r["steps"] for r in mine)
    if not mine or not steps or not mine[-1].get("bytes_pushed_per_server"):
        return None
    return [b / steps for b in mine[-1]["bytes_pushed_per_server"]]


def ps_servers_block(folder: Path) -> str:
    """Synchronous PS throughput with 1 and 2 server processes, measured and as the scaling
    model predicts it from the same folder's single-process nd run."""
    from imagenet_recipes.bench.scaling.cases import PRESETS
    from imagenet_recipes.bench.scaling.measured import collect_runs, cpu_comparison

    runs = sweep_stats.load_sweep(folder)
    ps = [r for r in runs if runs_servers(r.entry) and r.stage == "throughput"]
    if not ps:
        raise SystemExit(f"error: no parameter-server run under {folder}")
    rows = [r for r in sweep_stats.analyze(runs) if runs_servers(r["entry"])]
    model = {(m["workers"], m["servers"]): m for m in cpu_comparison(
        collect_runs([folder]), PRESETS["cpu-loopback"]) if m["entry"].startswith("ps sync")}
    table = []
    for r in sorted(rows, key=lambda r: (r["workers"], r["variant"])):
        run = next(x for x in ps if x.combo == r["run"])
        servers = run.run.get("servers", 1)
        per_server = _bytes_per_step(run)
        predicted = model.get((r["workers"], servers), {}).get("predicted", {}).get("alone")
        table.append([str(r["workers"]), str(servers), str(r["processes"]),
                      _fmt(r["img_s"]) + (f" x{r['repeats']}" if r["repeats"] > 1 else ""),
                      f"{_fmt(r['img_s_low'])}-{_fmt(r['img_s_high'])}",
                      (f"{r['ps_comm_share']:.2f} / {r['ps_wait_share']:.2f}"
                       if r["ps_comm_share"] is not None else "-"),
                      " + ".join(f"{b / 2 ** 20:.1f}" for b in per_server)
                      if per_server else "-",
                      (f"{predicted:.1f} ({predicted / r['img_s'] - 1:+.0%})"
                       if predicted and r["img_s"] else "-")])
    by_k = {(r["workers"], next(x for x in ps if x.combo == r["run"]).run.get("servers", 1)):
            r["img_s"] for r in rows}
    two_vs_one = [(n, by_k[(n, 2)] / by_k[(n, 1)]) for n in sorted({n for n, _ in by_k})
                  if by_k.get((n, 1)) and by_k.get((n, 2))]
    return render("ps_servers", repeats=max(r["repeats"] for r in rows),
                  logs=repo_relative(folder), runs=len(runs), when=_when(ps[0].run),
                  commit=_commit(runs), hardware=sweep_stats.describe_hardware(runs),
                  threads=ps[0].run["hardware"].get("torch_threads"),
                  note=load_note(read_meta(folder / "sweep.json"), "sweep.json"),
                  cfg=ps[0].run["config"], rows=table, two_vs_one=two_vs_one)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, help="a bench.sweep output folder")
    parser.add_argument("--bench-ps", type=Path, help="a bench.ps output folder")
    parser.add_argument("--target", type=ps_stats.parse_target, default=None,
                        help="val top-1 %% for the PS time-to-target column, or auto "
                             "(default): the highest multiple of 5 %% every contender reached")
    args = parser.parse_args(argv)
    if not (args.sweep or args.bench_ps):
        parser.error("give --sweep DIR and/or --bench-ps DIR")
    if args.sweep:
        print(sweep_block(args.sweep))
    if args.bench_ps:
        print(bench_ps_block(args.bench_ps, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
