"""This machine: its measured runs (JSONL logs) and its loopback link, compared with the model.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from imagenet_recipes.bench.common import Log, read_log, run_dirs, steady
from imagenet_recipes.bench.kept import KEPT
from imagenet_recipes.bench.scaling.model import MIB, Hardware, Link, Workload, predict
from imagenet_recipes.registry import BASELINE, runs_servers


# --------------------------------------------------------------------------------------------
# Measured runs (JSONL logs) vs the model.
@dataclass
class RunInfo:
    path: Path
    entry: str
    world_size: int
    threads: int
    key: Tuple
    img_s: float
    grad_dtype: str
    host: str
    start: float
    end: float
    workers: int = 0           # devices that train (a PS run's world size counts its servers)
    mode: str = ""             # parameter server: sync / async / esync
    servers: int = 1           # parameter server: --num-servers
    beside_twin: bool = False  # an nd run that ran while another nd run ran on the same host


def _median_img_s(logs: Log) -> Optional[float]:
    """Median img/s of the intervals after the first (warm-up); a run with a single interval
    by that one, a run without interval records by its epochs."""
    train = logs.get("train", [])
    rates = (steady(train, "img_s") or [r["img_s"] for r in train if r.get("img_s")]
             or [r["img_s"] for r in logs.get("train_epoch", []) if r.get("img_s")])
    return statistics.median(rates) if rates else None


def read_run(run, path: Path) -> Optional[RunInfo]:
    """One run (a run dir, or a run kept in a results/ folder's runs.jsonl, found at `path`) ->
    RunInfo, or None when it is unreadable or has no throughput."""
    try:
        logs = read_log(run)
    except OSError:
        return None
    img_s = _median_img_s(logs)
    if "run" not in logs or img_s is None:
        return None
    run = logs["run"][-1]
    cfg = run.get("config") or {}
    prec = run.get("precision") or {}
    hook = cfg.get("ddp_comm_hook", "none")
    if hook == "powersgd":
        return None  # low-rank compression is outside this model
    grad_dtype = {"fp16": "fp16", "bf16": "bf16"}.get(hook, "fp32")
    if cfg.get("fp16_allreduce"):
        grad_dtype = "fp16"
    hw = run.get("hardware") or {}
    threads = int(hw.get("torch_threads") or 0)
    key = (cfg.get("arch"), cfg.get("image_size"), cfg.get("batch_size"),
           f"{prec.get('opt_level')} {prec.get('dtype')}",
           "synthetic" if cfg.get("dummy") or cfg.get("data_backend") == "synthetic" else "data",
           int(cfg.get("grad_accum") or 1))
    # Wall-clock span of the run (every record has `elapsed`; a val record's `time` is a
    # duration, so only the run record's `time` is used as a clock reading).
    start = float(run.get("time", 0.0)) - float(run.get("elapsed", 0.0))
    end = start + max(float(r.get("elapsed", 0.0)) for kind in logs.values() for r in kind)
    world = int(run.get("world_size") or 1)
    return RunInfo(path, str(run.get("entry") or run.get("strategy")), world, threads,
                   key, img_s, grad_dtype, str(hw.get("host", "?")), start, end,
                   workers=int(run.get("workers") or world), mode=str(run.get("mode") or ""),
                   servers=int(run.get("servers") or 1))


def collect_runs(dirs: Sequence[Path]) -> List[RunInfo]:
    found = []
    for d in dirs:
        if (d / "log.jsonl").is_file():
            runs = [(d, d)]
        elif (d / KEPT).is_file():
            runs = [(r, d / r.name) for r in run_dirs(d)]
        else:
            runs = [(log.parent, log.parent) for log in sorted(d.rglob("log.jsonl"))]
        for run, path in runs:
            info = read_run(run, path)
            if info is not None and info.path not in {f.path for f in found}:
                found.append(info)
    # On a CPU the "devices" share memory bandwidth and caches: a single-process run made
    # while a twin ran beside it measures the per-core speed that DDP's processes really get.
    solo = [r for r in found if r.entry == BASELINE and r.world_size == 1]
    for r in solo:
        r.beside_twin = any(o is not r and o.host == r.host and o.start < r.end
                            and r.start < o.end for o in solo)
    return found


# entry script -> (algorithm, bucket bytes). DDP: 25 MiB buckets; Horovod: 64 MB fusion
# buffer; train/ps.py: ranks 0..K-1 are server processes beside the workers, each worker pushes
# every gradient tensor to the server of its shard (sync mode only: async/esync do not wait for
# each other).
MODELLED_ENTRIES = {"ddp": ("ring", 25 * MIB), "ddp_apex": ("ring", 25 * MIB),
                    "hvd": ("ring", 64 * MIB), "ps": ("ps", None)}


def cpu_comparison(runs: List[RunInfo], hw: Hardware) -> List[dict]:
    """Group runs by (entry, world size, threads, comparable config); predict each multi-process
    group from the single-process (nd) runs with the same config and threads per process:
    runs made alone, and, when present, runs made beside a twin (see collect_runs). The PS
    talks tensorpipe RPC, not gloo; the gloo loopback figures stand in for it."""
    groups: Dict[Tuple, List[RunInfo]] = {}
    for r in runs:
        groups.setdefault((r.entry, r.mode, r.servers, r.world_size, r.workers, r.threads,
                           r.key, r.grad_dtype), []).append(r)
    out = []
    for (entry, mode, servers, world, workers, threads, key, gdt), members in sorted(
            groups.items(), key=str):
        if world < 2:
            continue
        measured = statistics.median(m.img_s for m in members)
        label = entry + (f" {mode}" if mode else "") + (
            f", {servers} servers" if runs_servers(entry) and servers > 1 else "")
        row = {"entry": label, "procs": world, "workers": workers, "servers": servers,
               "threads": threads, "config": key, "grad_dtype": gdt, "runs": len(members),
               "measured": measured,
               "note": "", "predicted": {}, "baseline": {}}
        nd = [r for r in runs if r.entry == BASELINE and r.world_size == 1 and r.threads == threads
              and r.key == key]
        modelled = entry in MODELLED_ENTRIES and (not runs_servers(entry) or mode == "sync")
        if not modelled:
            row["note"] = f"{row['entry']}: not modelled"
        elif not nd:
            row["note"] = f"no single-process nd run with {threads} thread(s) and this config"
        algo, bucket = MODELLED_ENTRIES.get(entry, ("ring", None))
        for label, base in (("alone", [r.img_s for r in nd if not r.beside_twin]),
                            ("twin", [r.img_s for r in nd if r.beside_twin])):
            if not modelled or not base:
                continue
            arch, _, batch, *_ = key
            wl = Workload(arch, int(batch), statistics.median(base), gdt, bucket_bytes=bucket,
                          accum=key[5])
            # one host: every process is on the same "node"; a PS server is a process of its
            # own that receives every worker's gradient shard
            p = predict(wl, replace(hw, devices_per_node=workers), workers, algo,
                        ps_servers=servers, ps_colocated=False, ps_local_aggregation=False)
            row["baseline"][label] = wl.img_s_1
            row["predicted"][label] = p.img_s
            row["t_comm"] = p.t_comm
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------
# The loopback link (gloo, 2 processes on this host).
def _loopback_worker(rank: int, world: int, port: int, plan: List[Tuple[int, int]],
                     out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    times = {}
    for size, repeats in plan:
        t = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(t)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - t0)
        times[size] = statistics.median(samples)
    if rank == 0:
        Path(out_path).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_loopback(small: int = 4096, large: int = 32 * MIB, repeats: int = 9) -> Link:
    """Fit alpha and beta of a 2-process gloo all-reduce: t(S) = 2*alpha + S/B (the ring
    formula for p = 2), from the medians of a tiny and a large message (~10 s)."""
    import tempfile

    import torch.multiprocessing as mp

    from imagenet_recipes.strategies import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.json")
        plan = [(small, 20 * repeats), (large, repeats)]
        mp.spawn(_loopback_worker, args=(2, free_port(), plan, out), nprocs=2, join=True)
        times = {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
    latency = times[small] / 2
    bandwidth = (large - small) / max(times[large] - times[small], 1e-9)
    return Link(bandwidth, latency)
