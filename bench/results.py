"""RESULTS.md tables from run logs: the strategy sweep and the parameter-server benchmark.

    launch/env.sh python -m bench.results --sweep runs/sweep-20261122-140000
    launch/env.sh python -m bench.results --bench-ps runs/bench_ps-20261122-150000 \\
        --target 80          # default: auto
    launch/env.sh python -m bench.results --sweep DIR --print     # print, change nothing

Each block goes between its markers (`<!-- sweep:start -->` ... `<!-- sweep:end -->`,
`<!-- bench_ps:start -->` ... `<!-- bench_ps:end -->`); when the markers are missing the block is
appended under its own heading. Nothing outside the markers changes, and writing the same block
twice leaves the file as it was. Every number comes from the runs' log.jsonl files (through
bench.sweep_stats and bench.ps_stats); the hardware from the logs' run records.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Optional

from bench import ps_stats, sweep_stats
from bench.common import (REPO, markdown_table, read_meta, repo_relative, shown_commit,
                          write_block)

HEADINGS = {"sweep": "## Strategy sweep", "bench_ps": "## Parameter server vs DDP with a slow "
                                                      "worker"}

# The claim the PS benchmark is compared against, as far as it could be checked (see RESULTS.md).
ESYNC_CLAIM = (
    "**The claim compared against.** ESync (Z. Li, H. Zhou, T. Zhou, H. Yu, Z. Xu, G. Sun, "
    "\"ESync: Accelerating Intra-Domain Federated Learning in Heterogeneous Data Centers\", IEEE "
    "Trans. Services Computing, doi:10.1109/TSC.2020.3044043; earlier title \"ESync: An Efficient "
    "Synchronous Parallel Algorithm for Distributed ML in Heterogeneous Clusters\") lets faster "
    "workers take as many local steps as fit into the slowest worker's step, coordinated by a "
    "State Server, then averages the model updates. Its abstract says only that ESync \"achieves "
    "great speed up without loss of accuracy\" against SSGD, ASGD, DC-ASGD, FedAvg, FedAsync, "
    "TiFL and FedDrop \"under strong computational heterogeneity\"; the authors' MXNet code "
    "(github.com/Lizonghang/ESync) runs 6 workers (2 GPUs and the CPU of each of 2 servers) on "
    "Fashion-MNIST. **No speed-up factor could be verified**: the paper's full text could not "
    "be obtained, and neither its abstract nor the repository's README gives a number; so no "
    "multiplier is quoted here.")


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
    data = ("synthetic data (`--dummy`: compute and communication only)" if cfg.get("dummy")
            or cfg.get("data_backend") == "synthetic" else f"data `{cfg['data']}`")
    threads = first.run["hardware"].get("torch_threads")
    steps = sorted({r.run["config"]["steps_per_epoch"] for r in tput
                    if not r.precision.startswith("O1")})
    # bench.sweep shortens the O1 runs only where bf16 is emulated
    slow = sorted({(r.run["config"]["steps_per_epoch"], r.run["config"]["print_freq"])
                   for r in tput if r.precision.startswith("O1")
                   and r.run["config"]["steps_per_epoch"] not in steps})
    text = [
        f"Measured by `launch/env.sh python -m bench.sweep` (`{repo_relative(sweep_dir)}`, "
        f"{len(runs)} runs, {_when(first.run)}) at commit {_commit(runs)} on "
        f"{sweep_stats.describe_hardware(runs)}, {threads} thread(s) per process. Tables: "
        "`bench/results.py`; figures: `bench/plot_scaling.py`; both read only the "
        "runs' `log.jsonl` (kept in `results/sweep/`: `python -m bench.regenerate` redraws "
        "this section from them)." + load_note(meta, "sweep.json"),
        "",
        f"Setup: {cfg['arch']}, {cfg['image_size']} px, `-b {cfg['batch_size']}` per worker "
        f"(weak scaling), {data}, {'/'.join(map(str, steps)) or '-'} steps per run"
        + (f" (O1: {slow[0][0]} steps, `-p {slow[0][1]}`: bf16 is emulated on this CPU, ~24x "
           "slower)" if slow else "")
        + "; img/s = median of the logged intervals after the first (start-up and warm-up); "
        "a combination run several times (`xN`) shows the median of its runs and their "
        "lowest-highest. "
        "**Workers N** = processes that compute; a parameter server with N workers runs N + 1 "
        "processes (rank 0 serves and never runs the forward pass), so `PS sync` at N = 2 is 3 "
        "processes on these cores. Efficiency = img/s(N) / (N x img/s(1)) against the **same "
        "strategy and precision at 1 worker** (a hook/compression variant against its plain "
        "strategy); `vs nd` against nd's 1-process img/s (fp32 only). Overhead vs 1 worker = "
        "1 - step_time(1)/step_time(N): the part of a step that a single worker does not have "
        "(communication and contention for the cores together). PS comm share = "
        "comm/(comm + compute + wait) measured by its workers; wait share = wait/(same): the "
        "time the server held a worker's push until the round was complete and applied.",
    ]
    top = max((r["workers"] for r in rows), default=1)
    head = [r for r in rows if r["workers"] == top and top > 1]
    if head:
        text += ["", f"**{top}-worker weak-scaling efficiency** (target for DDP: >= 0.90):", ""]
        table = []
        for r in head:
            base = next((b for b in rows if b["family"] == r["family"] and b["workers"] == 1
                         and not b["variant"]), None)
            table.append([r["label"], _fmt(base["img_s"] if base else None),
                          _fmt(r["img_s"]), f"**{_fmt(r['efficiency'], '.2f')}**",
                          _fmt(r["efficiency_nd"], ".2f"), _fmt(r["overhead"], ".2f"),
                          (f"{r['ps_comm_share']:.2f} / {r['ps_wait_share']:.2f}"
                           if r["ps_comm_share"] is not None else "-")])
        text.append(markdown_table(["strategy", "img/s, 1 worker", f"img/s, {top} workers",
                                    "efficiency", "vs nd", "overhead vs 1 worker",
                                    "PS comm / wait share"],
                                   table))
        ddp = next((r for r in head if r["entry"] == "ddp" and not r["variant"]
                    and r["efficiency"] is not None), None)
        if ddp:
            verdict = "met" if ddp["efficiency"] >= 0.90 else "**not met**"
            text += ["", f"DDP ({ddp['precision']}) at {top} workers: efficiency "
                     f"{ddp['efficiency']:.2f}, target 0.90 {verdict} in this sweep."]
    text += ["", "All throughput runs (epoch time EXTRAPOLATED to 1,281,167 images, the "
             "ImageNet-1k train set, at this model and image size; not measured):", ""]
    text.append(markdown_table(
        ["run", "strategy", "workers", "processes", "img/s", "lowest-highest", "img/s per worker",
         "step s", "efficiency", "epoch h (extrap.)", "intervals", "other CPU"],
        [[f"`{r['run']}`" + (f" x{r['repeats']}" if r["repeats"] > 1 else ""), r["label"],
          str(r["workers"]), str(r["processes"]), _fmt(r["img_s"]),
          f"{_fmt(r['img_s_low'])}-{_fmt(r['img_s_high'])}",
          _fmt(r["img_s"] / r["workers"] if r["img_s"] else None),
          _fmt(r["step_time"], ".3f"), _fmt(r["efficiency"], ".2f"), _fmt(r["epoch_hours"]),
          str(r["intervals"]), _other_of_repeats(meta, r["run"])] for r in rows], right_from=2))
    if curves:
        ccfg = curves[0].run["config"]
        text += ["", f"Learning curves (`curves-*`: {ccfg['arch']}, {ccfg['image_size']} px, "
                 f"`-b {ccfg['batch_size']}` per worker, lr {ccfg['lr']} per 256 scaled by the "
                 f"global batch, cosine, on `{repo_relative(Path(ccfg['data'] or '.'))}` = data "
                 "generated by `data/make_synthetic.py`; training time = sum of epoch times, "
                 "validation excluded; PS: train_elapsed of its last evaluation):", ""]
        table = []
        for r in curves:
            pts = sweep_stats.curve_points(r.logs)
            train, val = pts["train"], pts["val"]
            last = val[-1] if val else None
            table.append([f"`{r.name}`", r.label, str(r.workers), str(len(train)),
                          _fmt(last.top1 if last else None), _fmt(last.top5 if last else None),
                          _fmt(max((v.top1 for v in val), default=None)),
                          _fmt(train[-1].top1 if train else None),
                          _fmt(last.seconds if last else None, ".0f"),
                          _other(meta, r.name)])
        text.append(markdown_table(["run", "strategy", "workers", "epochs", "final val top-1",
                                    "final val top-5", "best val top-1", "last train top-1",
                                    "training s", "other CPU"], table, right_from=2))
    text += ["", "![validation top-1 vs training time](figures/scaling_top1_vs_time.png)",
             "![throughput](figures/scaling_throughput.png)",
             "![efficiency](figures/scaling_efficiency.png)",
             "![communication share](figures/scaling_comm_share.png)",
             "![epoch time](figures/scaling_epoch_time.png)",
             "![learning curves](figures/scaling_curves.png)"]
    return "\n".join(text) + "\n"


# --- the parameter-server benchmark ---------------------------------------------------------------
def _esync_settings(contenders) -> str:
    """How the ESync contender decided its local steps, as its log records it."""
    esync = next((c for c in contenders if c.key == "esync"), None)
    if esync is None:
        return ""
    cfg = esync.run["config"]
    if "esync_rule" not in cfg:
        return " ESync's local steps: moving averages of the step times, timed by the workers."
    rule = f"`--esync-rule {cfg['esync_rule']}`"
    if cfg["esync_rule"] == "reference":
        rule += f" with `--esync-epsilon {cfg['esync_epsilon']:g}`"
    momentum = cfg["momentum"] if cfg.get("local_momentum") is None else cfg["local_momentum"]
    return f" ESync's local steps: {rule}, local SGD with momentum {momentum:g}."


def bench_ps_block(bench_dir: Path, target: Optional[float]) -> str:
    contenders = ps_stats.load(bench_dir)
    if not contenders:
        raise SystemExit(f"error: no run with a log.jsonl under {bench_dir}")
    target, auto = ps_stats.resolve_target(contenders, target)
    rows = [ps_stats.summarize(c, target) for c in contenders]
    meta = read_meta(bench_dir / "bench_ps.json")
    first = contenders[0]
    cfg = first.run["config"]
    slow = ",".join(f"{f:g}" for f in first.slowdowns)
    n = first.workers
    by_key = {r["key"]: r for r in rows}
    missed = [r["label"] for r in rows if r["time_to_target"] is None]
    reached = ("reached by every contender" if not missed else
               f"not reached by {', '.join(missed)}")
    if auto:
        reached = ("chosen automatically: the highest multiple of 5 % that every contender "
                   "reached in these runs")
    text = [
        f"Measured by `launch/env.sh python -m bench.ps` (`{repo_relative(bench_dir)}`, "
        f"{_when(first.run)}) at commit {_commit(contenders)} on {ps_stats.hardware(contenders)}, "
        f"{first.run['hardware'].get('torch_threads')} thread(s) per process. Tables: "
        "`bench/results.py`; figures: `bench/plot_ps.py`; both read only the runs' "
        "`log.jsonl`." + load_note(meta, "bench_ps.json"),
        "",
        f"Setup: {n} workers with `--worker-slowdown {slow}` (worker {n} sleeps "
        f"{first.slowdowns[-1] - 1:g}x its compute time after each step: an emulated slower "
        f"device, which takes no CPU), {cfg['arch']} at {cfg['image_size']} px, `-b "
        f"{cfg['batch_size']}` per worker, {cfg['epochs']} epochs for everyone, lr {cfg['lr']} "
        "per 256 scaled by each mode's batch per update (DDP and PS sync: the global batch; "
        "async and ESync's local steps: one worker's batch), cosine with warm-up, validation "
        f"every epoch, on `{repo_relative(Path(cfg['data'] or '.'))}` generated by "
        "`data/make_synthetic.py`. DDP runs "
        f"{n} processes, the PS {n + 1} (rank 0 = server, which also evaluates in the "
        "background). Training wall-clock: DDP = sum of epoch times (its validation pauses "
        "training and is excluded); PS = train_elapsed of the evaluated snapshot. Time to target "
        f"= wall-clock of the first evaluation with val top-1 >= **{_fmt(target, 'g')} %** "
        f"({reached}).{_esync_settings(contenders)} Traffic per "
        "worker: PS measured (bytes pushed + pulled: gradients or deltas, weights, BatchNorm "
        "buffers); DDP **computed**, not measured: ring all-reduce, 2(N-1)/N x fp32 gradient "
        "bytes sent and the same received per step. Comm ratio: a push's round trip less the "
        "time the server held it waiting for the round's other workers (`wait`); async has no "
        "rounds, so there the time a push queues behind other workers' updates at the server "
        "counts as comm.",
        "",
    ]
    table = []
    for r in rows:
        per_w = " / ".join(_fmt(x, ".0f") for x in r["per_worker_samples_s"])
        mbs = r["traffic_mb_s"][0] if r["traffic"] == "computed" else (
            sum(x for x in r["traffic_mb_s"] if x) / len(r["traffic_mb_s"]))
        bps = [x for x in r["bytes_per_sample"] if x is not None]
        comm = [x for x in r["comm_ratio"] if x is not None]
        wait = [x for x in r["wait_ratio"] if x is not None]
        table.append([
            r["label"], _fmt(r["time_to_target"], ".0f", "not reached"),
            _fmt(r["epoch_to_target"], "d", "-"), _fmt(r["final_top1"]), _fmt(r["best_top1"]),
            _fmt(r["samples_s"], ".0f"), per_w,
            _fmt(mbs, ".0f") + (" (computed)" if r["traffic"] == "computed" else ""),
            _fmt(sum(bps) / len(bps) / 1e6 if bps else None, ".2f"),
            " / ".join(_fmt(x, ".2f") for x in comm) if comm else "not measured",
            " / ".join(_fmt(x, ".2f") for x in wait) if wait else "-", _other(meta, r["run"])])
    text.append(markdown_table(
        ["contender", f"s to {_fmt(target, 'g')} %", "epoch", "final val top-1",
         "best val top-1", "samples/s", "per worker", "MB/s per worker",
         "MB per sample per worker", "comm ratio per worker", "wait ratio per worker",
         "other CPU"], table))
    extra = []
    if by_key.get("esync") and by_key["esync"].get("local_steps"):
        extra.append("ESync local steps per round, per worker: " + " / ".join(
            _fmt(x) for x in by_key["esync"]["local_steps"]))
    if by_key.get("async") and by_key["async"].get("staleness"):
        extra.append("async mean staleness (server updates between pull and push), per worker: "
                     + " / ".join(_fmt(x) for x in by_key["async"]["staleness"]))
    speedups = []
    for base in ("sync", "ddp"):
        b = by_key.get(base)
        for other in ("esync", "async") if base == "sync" else ("esync", "async", "sync"):
            o = by_key.get(other)
            if b and o and b["time_to_target"] and o["time_to_target"]:
                speedups.append(f"{o['label']} vs {b['label']}: "
                                f"{b['time_to_target'] / o['time_to_target']:.2f}x")
    if speedups:
        extra.append("time-to-target speed-up " + "; ".join(speedups))
    if extra:
        text += ["", "; ".join(extra) + "."]
    text += ["", f"**What this is, honestly.** On this machine the {n} workers share "
             f"{first.run['hardware']['cpu_count']} cores with each other (and, for the PS, with "
             "the server and its background evaluation), so a fast worker's compute is itself "
             "slowed by the others; the straggler is emulated by sleeping, which frees its core "
             "for the others (a really slower device would not). The emulation is not identical "
             "either: DDP's slow rank sleeps (f-1)x its whole step as the engine times it (data "
             "wait, forward/backward and the all-reduce; `train/recipe/engine.py`), a PS worker "
             "(f-1)x its forward/backward only (`train/recipe/ps/worker.py`), which costs DDP "
             "about (f-1)x its all-reduce time more per step. So this compares how the "
             "algorithms cope with a straggler at equal epochs, not the speed of a cluster."]
    text += ["", ESYNC_CLAIM, "",
             "![accuracy vs time](figures/ps_accuracy_time.png)",
             "![samples/s](figures/ps_throughput.png)",
             "![traffic](figures/ps_traffic.png)",
             "![communication ratio](figures/ps_comm_ratio.png)"]
    return "\n".join(text) + "\n"


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
    from bench.scaling.cases import PRESETS
    from bench.scaling.measured import collect_runs, cpu_comparison

    runs = sweep_stats.load_sweep(folder)
    ps = [r for r in runs if r.entry == "ps" and r.stage == "throughput"]
    if not ps:
        raise SystemExit(f"error: no parameter-server run under {folder}")
    rows = [r for r in sweep_stats.analyze(runs) if r["entry"] == "ps"]
    model = {(m["workers"], m["servers"]): m for m in cpu_comparison(
        collect_runs([folder]), PRESETS["cpu-loopback"]) if m["entry"].startswith("ps sync")}
    cfg = ps[0].run["config"]
    repeats = max(r["repeats"] for r in rows)
    text = [
        f"Measured by `launch/env.sh python -m bench.sweep --strategies nd,ps --ps-servers 1,2 "
        f"--no-curves --repeats {repeats}` (`{repo_relative(folder)}`, {len(runs)} runs, {_when(ps[0].run)}) at commit "
        f"{_commit(runs)} on {sweep_stats.describe_hardware(runs)}, "
        f"{ps[0].run['hardware'].get('torch_threads')} thread(s) per process."
        + load_note(read_meta(folder / "sweep.json"), "sweep.json"),
        "",
        f"Setup: `--mode sync`, {cfg['arch']}, {cfg['image_size']} px, `-b "
        f"{cfg['batch_size']}` per worker, synthetic data, {cfg['steps_per_epoch']} steps; "
        "K servers + N workers = K + N processes on these cores. img/s = median of the logged "
        "intervals after the first (xN: median of N runs, lowest-highest beside it). Bytes per "
        "step = what worker 1 sent each server per step (server 0 also gets the BatchNorm "
        "buffers). Model = `bench/scaling/model.py`'s synchronous PS sharded over K dedicated "
        "servers on one host, from this folder's 1-process nd run and the `cpu-loopback` link "
        "preset (as in the scaling model section): every worker's gradient leaves through one "
        "host link whatever K is, so it predicts no gain from a second server here.",
        "",
    ]
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
    text.append(markdown_table(["workers", "servers", "processes", "img/s", "lowest-highest",
                                "comm / wait share", "MiB per step to each server",
                                "model img/s (error)"], table, right_from=0))
    by_k = {(r["workers"], next(x for x in ps if x.combo == r["run"]).run.get("servers", 1)):
            r["img_s"] for r in rows}
    ratios = [f"{n} worker{'s' if n > 1 else ''}: {by_k[(n, 2)] / by_k[(n, 1)]:.2f}x"
              for n in sorted({n for n, _ in by_k}) if by_k.get((n, 1)) and by_k.get((n, 2))]
    if ratios:
        text += ["", "2 servers vs 1, img/s: " + ", ".join(ratios) + "."]
    return "\n".join(text) + "\n"


def update(results: Path, sweep: Optional[Path] = None, bench_ps: Optional[Path] = None,
           target: Optional[float] = None) -> None:
    if sweep is not None:
        write_block(results, "sweep", sweep_block(sweep), HEADINGS["sweep"])
    if bench_ps is not None:
        write_block(results, "bench_ps", bench_ps_block(bench_ps, target), HEADINGS["bench_ps"])
    print(f"updated {results}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, help="a bench.sweep output folder")
    parser.add_argument("--bench-ps", type=Path, help="a bench.ps output folder")
    parser.add_argument("--target", type=ps_stats.parse_target, default=None,
                        help="val top-1 %% for the PS time-to-target column, or auto "
                             "(default): the highest multiple of 5 %% every contender reached")
    parser.add_argument("--results", type=Path, default=REPO / "RESULTS.md")
    parser.add_argument("--print", action="store_true", help="print the blocks, write nothing")
    args = parser.parse_args(argv)
    if not (args.sweep or args.bench_ps):
        parser.error("give --sweep DIR and/or --bench-ps DIR")
    if args.print:
        if args.sweep:
            print(sweep_block(args.sweep))
        if args.bench_ps:
            print(bench_ps_block(args.bench_ps, args.target))
        return 0
    update(args.results, args.sweep, args.bench_ps, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
