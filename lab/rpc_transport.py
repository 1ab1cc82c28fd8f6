"""What the parameter server's RPC transport costs on this host: the CPU an idle process spends
and the round trip of a gradient-sized message, for each `--rpc-transport` of train/ps.py.

    launch/env.sh python lab/rpc_transport.py            # ~30 s
    launch/env.sh python lab/rpc_transport.py --mb 45    # resnet18's fp32 gradients

Two processes start RPC with the transport; one sends a tensor of --mb MiB to the other and gets
it back, --repeats times (median and fastest: the times are spread, with stalls of ~40 ms), then
both sleep --idle seconds while their CPU time is read. A process that waits should spend about
none: TensorPipe's shared-memory transport polls.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path



_TIMED = None  # set in the echoing process once the other one has finished timing


def _echo(tensor):
    return tensor


def _timing_done() -> None:
    _TIMED.set()


def _process(rank: int, transport: str, port: int, args, out: str) -> None:
    import threading

    import torch
    import torch.distributed.rpc as rpc

    from imagenet_recipes.ps.config import PSConfig
    from imagenet_recipes.ps.main import _rpc_options

    global _TIMED
    _TIMED = threading.Event()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = PSConfig(rpc_transport=transport)
    rpc.init_rpc(f"p{rank}", rank=rank, world_size=2, rpc_backend_options=_rpc_options(cfg))
    result = {}
    if rank == 1:
        payload = torch.ones(int(args.mb * 2 ** 20) // 4)
        for _ in range(3):
            rpc.rpc_sync("p0", _echo, args=(payload,))
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            rpc.rpc_sync("p0", _echo, args=(payload,))
            times.append(time.perf_counter() - start)
        result["round_trip_ms"] = statistics.median(times) * 1e3
        result["fastest_ms"] = min(times) * 1e3
        rpc.rpc_sync("p0", _timing_done)
    else:
        _TIMED.wait()  # idle from now on: no more messages to answer
    cpu = time.process_time()
    time.sleep(args.idle)
    result["idle_cpu_share"] = (time.process_time() - cpu) / args.idle
    Path(out, f"{transport}-{rank}.json").write_text(json.dumps(result))
    rpc.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--mb", type=float, default=12.0, help="message size in MB (MiB)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds both processes wait")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    from imagenet_recipes.ps.options import RPC_TRANSPORTS
    from imagenet_recipes.strategies import free_port
    print(f"| --rpc-transport | {args.mb:g} MiB round trip, median ms | fastest ms | "
          "idle CPU, sender | idle CPU, receiver |\n|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as out:
        for transport in RPC_TRANSPORTS:
            mp.spawn(_process, args=(transport, free_port(), args, out), nprocs=2, join=True)
            r0, r1 = (json.loads(Path(out, f"{transport}-{r}.json").read_text())
                      for r in (0, 1))
            print(f"| {transport} | {r1['round_trip_ms']:.1f} | {r1['fastest_ms']:.1f} | "
                  f"{r1['idle_cpu_share']:.0%} | {r0['idle_cpu_share']:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
