"""PSConfig: every engine flag, plus the parameter server's own."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..config import TrainConfig, UsageError, opt

MODES = ("sync", "async", "esync")
SPLITS = ("iid", "by-class")


@dataclass
class PSConfig(TrainConfig):
    mode: str = field(default="sync", metadata=opt(
        "--mode", help="sync: one update from all workers' mean gradient per step (same as "
                       "DDP); async: apply each worker's gradient on arrival; esync: faster "
                       "workers take local steps while the slowest takes one, then model "
                       "deltas are averaged", choices=MODES))
    num_servers: int = field(default=1, metadata=opt(
        "--num-servers", help="parameter servers (only 1 is implemented)"))
    split: str = field(default="iid", metadata=opt(
        "--split", help="iid: every worker samples all classes; by-class: worker i gets "
                        "classes i, i+N, ... (non-IID)", choices=SPLITS))
    eval_every: int = field(default=0, metadata=opt(
        "--eval-every", help="validate on the server every N server updates (0: once per "
                             "epoch; -1: never, leave it to `--evaluator`)"))
    global_lr: float = field(default=1.0, metadata=opt(
        "--global-lr", help="esync: scale of the averaged model delta on the server"))
    local_lr: Optional[float] = field(default=None, metadata=opt(
        "--local-lr", help="esync: workers' local SGD lr (default: --lr scaled by -b / 256)"))
    max_local_steps: int = field(default=32, metadata=opt(
        "--max-local-steps", help="esync: cap on a worker's local steps in one round"))
    evaluator: Optional[str] = field(default=None, metadata=opt(
        "--evaluator", help="evaluator mode: watch this run dir and validate each new "
                            "checkpoint (single process, no training)"))
    evaluator_idle_timeout: float = field(default=600.0, metadata=opt(
        "--evaluator-idle-timeout", help="evaluator mode: stop after this many seconds "
                                         "without a new checkpoint"))

    def validate_extra(self) -> None:
        if self.num_servers != 1:
            raise UsageError("--num-servers: only one parameter server is implemented (rank 0); "
                             "sharding the model over k servers is not done yet")
        if self.eval_every < -1:
            raise UsageError("--eval-every must be >= -1")
        if self.global_lr <= 0 or (self.local_lr is not None and self.local_lr <= 0):
            raise UsageError("--global-lr and --local-lr must be > 0")
        if self.max_local_steps < 1:
            raise UsageError("--max-local-steps must be >= 1")
        if self.evaluator:
            return
        unsupported = [(self.opt_level != "O0", f"--opt-level {self.opt_level}"),
                       (self.backend.startswith("dali"), f"--data-backend {self.backend}"),
                       (self.grad_accum != 1, "--grad-accum"), (self.sync_bn, "--sync-bn"),
                       (self.loss_scale is not None, "--loss-scale"),
                       (self.compile, "--compile"), (self.fp16_allreduce, "--fp16-allreduce"),
                       (self.ddp_comm_hook != "none", "--ddp-comm-hook"),
                       (self.evaluate, "--evaluate")]
        named = [flag for bad, flag in unsupported if bad]
        if named:
            raise UsageError(f"{', '.join(named)}: not supported by the parameter server yet "
                             "(it trains in fp32 with the pytorch or synthetic loader); use train/ddp.py or train/ddp_apex.py for these")
        if self.split == "by-class" and self.backend == "synthetic":
            raise UsageError("--split by-class needs a real dataset (the synthetic backend has "
                             "no classes to split)")
