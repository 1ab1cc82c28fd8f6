"""Where DDP's weak-scaling efficiency goes on one machine: sharing the cores, DDP's own work
in each step, and the gradient all-reduce, measured in one run.

    launch/env.sh python lab/ddp_cost.py        # 2 processes x 1 thread, CPU, ~6 min
    launch/env.sh python lab/ddp_cost.py --image-size 224 --steps 20   # ~20 min
    launch/env.sh python lab/ddp_cost.py --report runs/bench_ddp_cost-20261124-080000

Contenders, run in turns (--rounds; a drift in a shared machine's speed hits all alike), every
one the real entry script on synthetic data (compute and communication only):

  nd            one `train/nd.py` process
  nd xN         N `train/nd.py` processes at once, independent of each other: what sharing the
                machine (cores, memory bandwidth, caches) costs with no communication at all
  DDP 1         `torchrun --nproc_per_node=1 train/ddp.py`: DDP's own work in a step (autograd
                hooks, copies into and out of the gradient buckets, averaging) with no peer
  DDP N         `torchrun --nproc_per_node=N train/ddp.py`

  bare xN       N processes of a hand-written loop (forward, loss, backward, SGD step) at
                once, each on one fixed batch of its own: the same model, layout and threads,
                no engine
  bare DDP N    that loop in N processes under torch's DistributedDataParallel (its defaults):
                what DDP costs torch itself, against which the engine's DDP N / nd xN compares
                (fp32 only: left out when --extra is given)

and, after them, gloo all-reducing one float32 tensor of the model's parameter count between N
processes of --threads threads each (what DDP sends every step, in one piece): wall and CPU time
per call. Each bare process ends by summing its weights (bench_ddp_cost.json's `bare_weights`):
equal across the processes of bare DDP N, whose all-reduce averages their different batches'
gradients, and different across the independent ones. img/s = median of the logged intervals
after the first (warm-up), all rounds pooled; for the bare loop, of its steps after the first
two, each step's rate summed over the processes.
The runs' logs and bench_ddp_cost.json stay in --out, from which `--report` (and
bench.regenerate, once archived with `--archive DIR ddp_cost/<label>`) writes the RESULTS.md
block. A benchmark, not a test.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from imagenet_recipes.bench.common import (REPO, interval_img_s, logged_hardware,
                          measure_or_report, read_log, shown_command, shown_commit,
                          turns_parser)
from imagenet_recipes.bench.jobs import launcher, stamped_out
from imagenet_recipes.bench.render import render

TEMPLATES = Path(__file__).resolve().parent / "templates"  # this page's prose

RECORD = "bench_ddp_cost.json"
CLASSES = 10  # the synthetic data's classes: the model's last layer, so its gradient size


def contenders(nproc: int) -> dict:
    """name -> (entry script, processes per launch, launches at once)"""
    return {"nd": ("nd", 1, 1), f"nd x{nproc}": ("nd", 1, nproc),
            "DDP 1": ("ddp", 1, 1), f"DDP {nproc}": ("ddp", nproc, 1)}


def run_name(name: str, round_: int, copy: int = 0) -> str:
    return f"{name.replace(' ', '')}-r{round_}" + (f"-p{copy}" if copy else "")


def measure(args) -> Path:
    out = args.out or stamped_out("bench_ddp_cost")
    out.mkdir(parents=True, exist_ok=True)
    common = ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
              "--dummy", "--synthetic-classes", str(CLASSES), "--synthetic-val-size", "64",
              "--epochs", "1", "--steps-per-epoch", str(args.steps), "-p", "5", "-j", "1",
              "--logdir", str(out), *args.extra.split()]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    order, bare, bare_weights = [], {}, {}
    for round_ in range(args.rounds):
        for name, (entry, processes, at_once) in contenders(args.nproc).items():
            names = [run_name(name, round_, copy) for copy in range(at_once)]
            started = [subprocess.Popen(launcher(entry, processes) + common + ["--run-name", n],
                                        env=env, stdout=subprocess.DEVNULL, cwd=REPO)
                       for n in names]
            if any([p.wait() for p in started]):  # every one waited for, failed or not
                raise SystemExit(f"{name}: a run failed (its log: {out / names[0]})")
            order.append([name, names])
            rate = sum(statistics.median(interval_img_s(out / n)) for n in names)
            print(f"round {round_}: {name}: {rate:.1f} img/s", flush=True)
        for name, ddp in bare_contenders(args.nproc, args.extra).items():
            rates, weights = bare_loop(args, ddp)
            bare.setdefault(name, []).append(rates)
            bare_weights.setdefault(name, []).append(weights)
            print(f"round {round_}: {name}: {statistics.median(rates):.1f} img/s", flush=True)
    record = {"command": shown_command("lab/ddp_cost.py", args.argv), "rounds": args.rounds,
              "steps": args.steps, "threads": args.threads, "nproc": args.nproc,
              "order": order, "bare": bare, "bare_weights": bare_weights,
              "allreduce": allreduce_cost(args)}
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return out


# --- the hand-written loop ----------------------------------------------------------------------
BARE_WARMUP = 2  # untimed steps: allocations, DDP's first bucket rebuild


def bare_contenders(nproc: int, extra: str) -> dict:
    """name -> under DDP or not; none when --extra changes the trainers' settings (the bare
    loop is fp32 with the entry scripts' defaults only)."""
    return {} if extra.strip() else {f"bare x{nproc}": False, f"bare DDP {nproc}": True}


def bare_loop(args, ddp: bool) -> tuple:
    """--nproc processes of the bare loop at once, under DDP or independent -> (per timed step,
    the images per second of all of them together; each process's sum of its weights)."""
    import torch.multiprocessing as mp

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.options import PlanOptions
    from imagenet_recipes.run_plan import channels_last_for
    from imagenet_recipes.strategies import free_port
    # the layout the entry scripts choose on a CPU at this size
    cfg = parse_args(["-a", args.arch, "--image-size", str(args.image_size), "--dummy"])
    channels_last = channels_last_for(PlanOptions.of(cfg), "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_bare_process, nprocs=args.nproc, join=True,
                 args=(args.nproc, free_port() if ddp else None, args, channels_last, tmp))
        ranks = [json.loads(Path(tmp, f"{rank}.json").read_text())
                 for rank in range(args.nproc)]
    step_s = [r["seconds"] for r in ranks]
    return ([sum(args.batch_size / t for t in step) for step in zip(*step_s)],
            [r["weights"] for r in ranks])


def _bare_process(rank: int, world: int, port, args, channels_last: bool, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = torchvision.models.get_model(args.arch, num_classes=CLASSES).to(memory_format=layout)
    torch.manual_seed(1 + rank)  # a batch of its own
    if port is not None:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size).contiguous(
        memory_format=layout)
    targets = torch.randint(0, CLASSES, (args.batch_size,))
    seconds = []
    for _ in range(BARE_WARMUP + args.steps):
        start = time.perf_counter()
        F.cross_entropy(model(images), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    with torch.no_grad():
        weights = sum(p.double().sum().item() for p in model.parameters())
    Path(out, f"{rank}.json").write_text(json.dumps({"seconds": seconds[BARE_WARMUP:],
                                                     "weights": weights}))
    if port is not None:
        dist.destroy_process_group()


# --- the all-reduce alone ------------------------------------------------------------------------
def allreduce_cost(args) -> dict:
    """gloo all-reduce of the model's parameter count in float32 between --nproc processes."""
    import torch.multiprocessing as mp
    import torchvision

    from imagenet_recipes.strategies import free_port
    model = torchvision.models.get_model(args.arch, num_classes=CLASSES)
    numel = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_allreduce_process, args=(args.nproc, free_port(), numel, args.threads, tmp),
                 nprocs=args.nproc, join=True)
        result = json.loads(Path(tmp, "0.json").read_text())
    return {"numel": numel, "mb": numel * 4 / 2**20, **result}


def _allreduce_process(rank: int, world: int, port: int, numel: int, threads: int,
                       out: str, repeats: int = 12) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    grads = torch.ones(numel)
    walls, cpus = [], []
    for _ in range(repeats + 2):  # the first two: connections and page faults
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        dist.all_reduce(grads)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    Path(out, f"{rank}.json").write_text(json.dumps(
        {"wall_ms": statistics.median(walls[2:]) * 1e3,
         "cpu_ms": statistics.median(cpus[2:]) * 1e3}))
    dist.destroy_process_group()


# --- the report ----------------------------------------------------------------------------------
def report(folder: Path, shown: Path = None) -> str:
    """The RESULTS.md text of one measurement from its folder (the logs and
    bench_ddp_cost.json); `shown`: that folder as the text names it."""
    record = json.loads((folder / RECORD).read_text())
    n = record["nproc"]
    per_round, pooled = {}, {}
    for name, names in record["order"]:
        rates = [interval_img_s(folder / r) for r in names]
        per_round.setdefault(name, []).append(sum(statistics.median(x) for x in rates))
        # the processes of one launch pooled interval by interval: their sum
        pooled.setdefault(name, []).extend(map(sum, zip(*rates)))
    img_s = {name: statistics.median(rates) for name, rates in pooled.items()}
    first = read_log(folder / record["order"][0][1][0])["run"][0]
    cfg = first["config"]
    nd, nd_n, ddp1, ddp_n = (img_s[k] for k in contenders(n))
    step_ms = 1e3 * cfg["batch_size"] * n / ddp_n
    ar = record["allreduce"]
    for name, rounds in record.get("bare", {}).items():  # per step, all processes summed
        per_round[name] = [statistics.median(steps) for steps in rounds]
        img_s[name] = statistics.median([rate for steps in rounds for rate in steps])
    rows = [[name, f"{img_s[name]:.1f}", ", ".join(f"{x:.1f}" for x in per_round[name])]
            for name in per_round]
    bare = f"bare DDP {n}" in img_s
    return render("ddp_cost", TEMPLATES, record=record, cfg=cfg, rows=rows, n=n, nd=nd, nd_n=nd_n,
                  ddp1=ddp1, ddp_n=ddp_n, ar=ar, step_ms=step_ms, bare_warmup=BARE_WARMUP,
                  bare_ratio=img_s[f"bare DDP {n}"] / img_s[f"bare x{n}"] if bare else None,
                  shown=shown or folder, hardware=logged_hardware(first),
                  commit=shown_commit(first.get("commit")))


def block(folder: Path) -> str:
    """The studies page's section: one report per measurement kept under
    lab/records/ddp_cost/ (`folder`), the smallest image size first."""
    def image_size(measurement: Path) -> int:
        first_run = json.loads((measurement / RECORD).read_text())["order"][0][1][0]
        return read_log(measurement / first_run)["run"][0]["config"]["image_size"]

    found = sorted((record.parent for record in folder.rglob(RECORD)), key=image_size)
    return "\n".join(report(d, Path("lab/records/ddp_cost") / d.relative_to(folder))
                     for d in found)


def main(argv=None) -> int:
    parser = turns_parser(__doc__, "bench_ddp_cost")
    return measure_or_report(parser, argv, RECORD, measure, report)


if __name__ == "__main__":
    sys.exit(main())
