"""Which processes hold the GPU while the default command trains: train/nd.py on generated JPEGs
with the default data backend (pytorch) and -j loader workers, and, once it logs its first
training intervals, nvidia-smi's compute processes beside the trainer's own process tree. The
point: one process per rank on the GPU, none for the loader workers (which decode on the CPU).

    python -m imagenet_recipes.bench.gpu.processes --data JPEGS -j 8 --json processes.json
    python -m imagenet_recipes.bench.gpu.processes --data JPEGS --device cpu -a timm/test_resnet \\
        --image-size 32 -b 4 -j 2 --json processes.json       # the tool itself, on a CPU

The record (--json) holds the command, the trainer's pid, its descendants (pid, parent, name,
command line: the loader workers), and per sample `nvidia-smi --query-compute-apps=pid,
process_name,used_memory --format=csv` as printed, read into rows, each row marked as the
trainer, one of its descendants, or neither (another process, or a pid from another PID
namespace, as in a container). Where nvidia-smi is missing (a CPU machine), it says so. The
run is stopped after the samples (its process group: the trainer and its workers).

Exit status: 0 when the run reached its samples and the record is written; 1 when it ended
before logging an interval or was still silent at --timeout; 2 on bad arguments."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench.common import REPO

QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"]


def role(name: str, cmdline: str) -> str:
    """What a process under the trainer is, from its name and command line."""
    if name == "pt_data_worker":  # torch's DataLoader names its workers so
        return "loader worker"
    if "multiprocessing.forkserver" in cmdline:
        return "forkserver (starts the loader workers)"
    if "multiprocessing.resource_tracker" in cmdline:
        return "multiprocessing's resource tracker"
    return "other"


def descendants(root: int) -> List[dict]:
    """The processes under `root` (/proc): pid, parent pid, name and command line."""
    table: Dict[int, dict] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        # "pid (name) state ppid ...": the name may hold spaces and parentheses
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        table[int(entry.name)] = {"pid": int(entry.name), "ppid": ppid, "name": name,
                                  "role": role(name, cmdline), "cmdline": cmdline[:300]}
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = sorted((p for p in table.values() if p["ppid"] == parent),
                          key=lambda p: p["pid"])
        found += children
        frontier += [c["pid"] for c in children]
    return found


def compute_apps() -> dict:
    """nvidia-smi's compute processes: its CSV as printed and read into rows; or why not."""
    if not shutil.which("nvidia-smi"):
        return {"nvidia_smi": "missing", "csv": None, "apps": []}
    try:
        proc = subprocess.run(QUERY, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"nvidia_smi": f"failed: {err}", "csv": None, "apps": []}
    if proc.returncode != 0:
        return {"nvidia_smi": f"exit {proc.returncode}: {proc.stderr.strip()[:300]}",
                "csv": proc.stdout, "apps": []}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    apps = []
    for line in lines[1:]:  # the first line is the header
        pid, name, memory = (field.strip() for field in (line.split(",") + ["", ""])[:3])
        apps.append({"pid": int(pid) if pid.isdigit() else pid, "process_name": name,
                     "used_memory": memory})
    return {"nvidia_smi": "ok", "csv": proc.stdout, "apps": apps}


def sample(trainer: int) -> dict:
    """One look: the trainer's tree and nvidia-smi's compute processes, each marked."""
    tree = descendants(trainer)
    smi = compute_apps()
    ours = {p["pid"] for p in tree}
    for app in smi["apps"]:
        app["is"] = ("trainer" if app["pid"] == trainer else
                     "trainer's descendant" if app["pid"] in ours else "neither")
    on_gpu = {a["pid"] for a in smi["apps"]}
    return {"seconds_into_run": None, "descendants": tree, **smi,
            "trainer_on_gpu": trainer in on_gpu if smi["nvidia_smi"] == "ok" else None,
            "descendants_on_gpu": sorted(ours & on_gpu)}


def parse_cli(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m imagenet_recipes.bench.gpu.processes",
                                description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="an ImageFolder root with train/")
    p.add_argument("--json", type=Path, required=True, help="the record")
    p.add_argument("-j", "--workers", type=int, default=8, help="(default: %(default)s)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("-a", "--arch", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--amp-dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--samples", type=int, default=2,
                   help="looks, one per logged interval from the first (default: %(default)s)")
    p.add_argument("--out", type=Path, help="the run's folder (default: beside --json)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds to wait for the samples (default: %(default)s)")
    args = p.parse_args(argv)
    if not (args.data / "train").is_dir():
        p.error(f"--data {args.data} has no train/ folder")
    if args.workers <= 0 or args.samples <= 0:
        p.error("-j and --samples must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    from imagenet_recipes.bench.gpu.scripts import CHILDREN, common_flags

    args = parse_cli(argv)
    out = args.out or args.json.parent / "processes"
    out.mkdir(parents=True, exist_ok=True)
    interval = 5  # steps per logged interval: a sample each
    name = f"nd-j{args.workers}"
    shutil.rmtree(out / "runs" / name, ignore_errors=True)  # this tool's run of an earlier call
    cmd = [sys.executable, str(REPO / "train/nd.py"), *common_flags(args), "-j",
           str(args.workers), "-p", str(interval), "--steps-per-epoch",
           str(interval * (args.samples + 20)), "--logdir", str(out / "runs"), "--run-name",
           name, str(args.data)]
    console = out / "nd.console.txt"
    print(f"$ {' '.join(cmd)}", flush=True)
    record = {"tool": "bench.gpu.processes", "command": " ".join(
        ["python", "train/nd.py", *cmd[2:]]), "workers": args.workers, "samples": []}
    started = time.monotonic()
    with open(console, "w") as output:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
                                process_group=0)
        CHILDREN.live.add(proc)
        record["trainer_pid"] = proc.pid
        try:
            while len(record["samples"]) < args.samples:
                logged = console.read_text(errors="replace").count("Epoch [0][")
                last = record["samples"][-1]["seconds_into_run"] if record["samples"] else 0
                if logged > len(record["samples"]) and time.monotonic() - started > last + 0.5:
                    look = sample(proc.pid)
                    look["seconds_into_run"] = round(time.monotonic() - started, 1)
                    record["samples"].append(look)
                    continue
                if proc.poll() is not None or time.monotonic() - started > args.timeout:
                    break
                time.sleep(0.2)
            record["exit"] = proc.poll()
        finally:
            CHILDREN.stop(proc)
    record["seconds"] = round(time.monotonic() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    for look in record["samples"]:
        workers = [p for p in look["descendants"] if p["role"] == "loader worker"]
        print(f"at {look['seconds_into_run']} s: trainer {proc.pid}, {len(workers)} loader "
              f"worker(s) of {len(look['descendants'])} descendants; nvidia-smi "
              f"{look['nvidia_smi']}: "
              + ", ".join(f"{a['pid']} {a['used_memory']} ({a['is']})" for a in look["apps"]),
              flush=True)
    if len(record["samples"]) < args.samples:
        tail = console.read_text(errors="replace").splitlines()[-3:]
        print(f"bench.gpu.processes: {len(record['samples'])} of {args.samples} samples "
              f"(the run logged too few intervals): {' / '.join(tail)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
