"""train/ps.py: roles, RPC start-up and shutdown, and how a run ends (exit codes as the engine's:
0 done, 1 failed, 2 bad input)."""
from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.distributed.rpc as rpc

from .. import checkpoint, lifecycle
from ..config import exit_on_usage_error, parse_args
from ..data import Shard, build_loaders
from ..errors import UsageError
from ..models import arch_slug, build_model
from ..options import LoaderOptions, PlanOptions
from ..precision import Precision
from ..registry import ENTRIES
from ..run_plan import plan_as_given
from ..strategies.base import pick_device
from . import evaluator, server as srv, shards, wire
from .config import PSConfig
from .options import RuleOptions, ServerOptions, WorkerOptions
from .worker import Worker, WorkerStopped

def rank_and_world() -> tuple:
    """From torchrun (RANK, WORLD_SIZE) or from srun (SLURM_PROCID, SLURM_NTASKS)."""
    for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if os.environ.get(rank_var) and os.environ.get(world_var):
            return int(os.environ[rank_var]), int(os.environ[world_var])
    return 0, 1


# RPC's start-up calls a deprecated torch API internally; nothing for users to act on.
warnings.filterwarnings("ignore", message="You are using a Backend")


def _rpc_options(cfg: PSConfig) -> rpc.TensorPipeRpcBackendOptions:
    # env:// joins torchrun's rendezvous store (or starts one at MASTER_ADDR:MASTER_PORT).
    # A round may legitimately wait for the slowest worker, so calls may take --dist-timeout.
    # TensorPipe's shared-memory transport polls: an idle process spends a whole core on it
    # (`python lab/rpc_transport.py`), which servers and waiting workers cannot afford
    # on the cores the workers compute on.
    transports = ["uv"] if cfg.rpc_transport == "uv" else None
    return rpc.TensorPipeRpcBackendOptions(rpc_timeout=cfg.dist_timeout, init_method="env://",
                                           _transports=transports)


def run_evaluator(cfg: PSConfig) -> None:
    """`train/ps.py --evaluator RUN_DIR DATA`: score the checkpoints of that run (any strategy's)
    as they come (evaluator.watch), with records in the evaluator's own run dir."""
    watched = Path(cfg.evaluator)
    if not watched.is_dir():
        raise UsageError(f"--evaluator {watched}: no such run dir")
    device = pick_device(cfg.device)
    plan = plan_as_given(PlanOptions.of(cfg), 1, device.type)
    cfg = lifecycle.planned_config(cfg, plan)  # its records: the config as planned
    _, val_loader, num_classes = build_loaders(LoaderOptions.of(cfg), Shard(), device, plan)
    out_dir = Path(cfg.logdir) / (cfg.run_name or f"{watched.name}-eval")
    log = lifecycle.open_log(out_dir, cfg, is_main=True)
    lifecycle.write_run_record(log, cfg, "ps-evaluator", None, strategy="evaluator",
                               watched=str(watched), world_size=1, device=str(device))
    log.print(f"=> evaluator: watching {watched / checkpoint.LATEST}; logging to {out_dir}")
    try:
        evaluator.watch(watched, val_loader, num_classes, device, log,
                        cfg.evaluator_idle_timeout)
    finally:
        val_loader.close()
        log.close()


def run_server(cfg: PSConfig, workers: int, entry: str) -> int:
    device = pick_device(cfg.device)
    plan = plan_as_given(PlanOptions.of(cfg), workers, device.type)
    # the server, its records and checkpoints: the config as planned
    cfg = lifecycle.planned_config(cfg, plan)
    torch.manual_seed(cfg.seed or 0)  # the same initial weights as DDP's rank 0
    _, val_loader, num_classes = build_loaders(LoaderOptions.of(cfg), Shard(), device, plan)
    # The model stays on the CPU, in float32 whatever the workers compute in (their O2 masters
    # live here), or float64 with --float64.
    model = Precision(float64=cfg.float64).convert_module(
        build_model(cfg.arch, num_classes, cfg.pretrained, cfg.zero_init_residual))
    precision = Precision.from_config(cfg)  # the workers', as the run record describes it
    precision.bind(device, notice=lambda message: None)
    prefix = f"{entry}-{cfg.mode}-{arch_slug(cfg.arch)}-"
    resume_state = lifecycle.find_resume_state(cfg, prefix)
    if resume_state is not None:
        lifecycle.check_resume_matches(resume_state, arch=cfg.arch, num_classes=num_classes,
                                       mode=cfg.mode)
    run_dir = lifecycle.run_directory(cfg, prefix, resume_state)
    log = lifecycle.open_log(run_dir, cfg, is_main=True)
    server = srv.ParameterServer(ServerOptions.of(cfg), cfg.to_dict(), model, num_classes,
                                 workers, val_loader, device, log, run_dir)
    if resume_state:
        server.restore(resume_state)
    srv._SERVER = server  # before RPC starts: workers call in as soon as it has
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, lambda num, frame: _stop_on_signal(server, num))
    world = cfg.num_servers + workers
    rpc.init_rpc(wire.SERVER, rank=0, world_size=world, rpc_backend_options=_rpc_options(cfg))
    lifecycle.write_run_record(
        log, cfg, entry, resume_state, strategy=ENTRIES[entry].strategy, mode=cfg.mode,
        world_size=world, workers=workers, servers=cfg.num_servers,
        shard_sizes=[sum(server.params[i].numel() for i in s) for s in server.shards],
        push_dtype=cfg.push_dtype, backend="tensorpipe", devices_per_process=1,
        split=cfg.split,
        precision=precision.describe(), global_batch=cfg.batch_size * workers, lr=server.base_lr,
        num_classes=num_classes, device=str(device))
    servers = "server" if cfg.num_servers == 1 else f"{cfg.num_servers} servers"
    log.print(f"=> ps ({cfg.mode}): {cfg.arch}, {servers} + {workers} workers (split "
              f"{cfg.split}), batch {cfg.batch_size} per worker, seed {cfg.seed}; logging to "
              f"{run_dir}")
    server.failure_monitor().start()
    server.finished.wait()
    failed = server.failure is not None
    # After a failure the other workers are being told; let them hear it before leaving.
    server.departed.wait(timeout=10.0)
    preempted = server.stop_signal is not None and not failed
    try:
        if not failed:
            server.jobs.close()  # the last evaluation and checkpoint
        if preempted:
            server.write_final_checkpoint()
        reason = f"failed: {server.failure}" if failed else server.stop_reason
        lifecycle.write_end_record(log, server.epoch, server.step, server.best_top1, reason,
                                   samples_seen=server.samples, lost_workers=server.lost)
        if failed:
            print(f"error: parameter server: {server.failure}", file=sys.stderr, flush=True)
    finally:
        server.end_shards()
        log.close()
        val_loader.close()
        # Graceful shutdown waits for every process; a lost worker never arrives.
        _shutdown(graceful=not server.lost)
    if preempted:
        print(lifecycle.preempted_message(entry, server.stop_signal), flush=True)
        return lifecycle.PREEMPTED_EXIT_CODE
    return lifecycle.EXIT_FAILED if failed else 0


def _stop_on_signal(server, signum: int) -> None:
    # Only a flag: the server stops everyone at its next update, then checkpoints.
    server.stop_signal = signal.Signals(signum).name
    lifecycle.say_from_signal_handler(f"=> ps: {server.stop_signal} received; stopping the "
                                      "workers at the next update")


def run_shard_server(cfg: PSConfig, index: int, workers: int) -> int:
    """Server `index` >= 1 of --num-servers: one shard of the parameters (shards.py)."""
    shards._SHARD = server = shards.ShardServer(RuleOptions.of(cfg), workers)
    for signum in (signal.SIGTERM, signal.SIGUSR1):  # server 0 decides when the run stops
        signal.signal(signum, signal.SIG_IGN)
    rpc.init_rpc(wire.server_name(index), rank=index, world_size=cfg.num_servers + workers,
                 rpc_backend_options=_rpc_options(cfg))
    server.serve(shards.coordinator_alive)
    _shutdown(graceful=server.graceful)
    return lifecycle.EXIT_FAILED if server.failed else 0


def run_worker(cfg: PSConfig, rank: int, workers: int) -> int:
    worker_index = rank - cfg.num_servers + 1  # workers are numbered 1..N
    worker = Worker(WorkerOptions.of(cfg), worker_index, workers,
                    cfg.step_hooks(worker_index - 1, workers, "workers"))
    rpc.init_rpc(wire.worker_name(worker_index), rank=rank,
                 world_size=cfg.num_servers + workers, rpc_backend_options=_rpc_options(cfg))
    try:
        worker.run()
    except WorkerStopped as err:
        print(f"error: worker {worker_index}: the run stopped: {err}", file=sys.stderr,
              flush=True)
        worker.say_goodbye()
        _shutdown(graceful=False)
        return lifecycle.EXIT_FAILED
    finally:
        worker.loader.close()
    # A lost peer, or a server already gone, would never join a graceful shutdown.
    _shutdown(graceful=not (worker.lost_peers or worker.server_gone))
    return 0


# How long a graceful RPC shutdown waits for the other processes. Unbounded (torch's default), a
# worker whose peer died while the run was ending (after the server had taken note and left
# without the graceful barrier) waited for the barrier forever.
GRACEFUL_SHUTDOWN_S = 30.0


def _shutdown(graceful: bool) -> None:
    if graceful:
        try:
            rpc.shutdown(graceful=True, timeout=GRACEFUL_SHUTDOWN_S)
            return
        except Exception as err:  # a peer left early: nothing more to say to it
            print(f"note: RPC shutdown: {str(err).splitlines()[0][:200]}", flush=True)
    rpc.shutdown(graceful=False)


def main(entry: str = "ps", description: str = "", argv: Optional[list] = None,
         config_cls: type = PSConfig) -> None:
    """The whole body of an entry script of the parameter server (registry.STRATEGIES' `main`:
    train/ps.py's); an experiment built on it passes its PSConfig subclass."""
    try:
        cfg = parse_args(argv, description, ENTRIES[entry].defaults, config_cls=config_cls,
                         entry=entry)
        if cfg.evaluator:
            run_evaluator(cfg)
            return
        rank, world = rank_and_world()
        servers = cfg.num_servers
        if world <= servers:
            serving = "rank 0 serves" if servers == 1 else f"ranks 0..{servers - 1} serve"
            raise UsageError(
                f"the parameter server needs at least {servers + 1} processes ({serving}, "
                f"the others are workers), got world size {world}: e.g. torchrun "
                f"--nproc_per_node={servers + 2} train/ps.py --mode {cfg.mode} ...")
        workers = world - servers
        # Step hooks that do not fit the workers (an experiment's per-worker list of the wrong
        # length): every rank says so before any RPC starts.
        cfg.step_hooks(0, workers, f"workers (world size - {servers} server"
                                   f"{'s' if servers > 1 else ''})")
        if rank == 0:
            code = run_server(cfg, workers, entry)
        elif rank < servers:
            code = run_shard_server(cfg, rank, workers)
        else:
            code = run_worker(cfg, rank, workers)
    except UsageError as err:
        exit_on_usage_error(err)
    sys.exit(code)
