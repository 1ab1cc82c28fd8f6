"""The parameter server's own options (--mode, --num-servers, --split, ...), one frozen section
beside the engine's (options/), and the bundles an update rule, a worker and the server read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..options import (BatchOptions, DistributionOptions, LoaderOptions, LossOptions, ModelOptions,
                       OptimizerOptions, PlanOptions, RunOptions, ScheduleOptions, Section,
                       StrategyOptions, opt)
from ..options.fields import POSITIVE, Bound
from .state_service import RULES as ESYNC_RULES

MODES = ("sync", "async", "esync")
SPLITS = ("iid", "by-class")
PUSH_DTYPES = ("auto", "float32", "float16", "bfloat16")
RPC_TRANSPORTS = ("uv", "tensorpipe")
# The update rules' names: update_rules.py registers one class under each (ASYNC_RULES,
# ESYNC_AVERAGES; tests/test_ps_rules.py holds the two lists equal).
ASYNC_RULE_NAMES = ("plain", "staleness")
ESYNC_AVERAGE_NAMES = ("mean", "normalized")
PARAMETER_SERVER = "parameter server"  # the help group of the options below


@dataclass(frozen=True)
class ParameterServerOptions(Section):
    mode: str = field(default="sync", metadata=opt(
        PARAMETER_SERVER, "--mode",
        help="sync: one update from all workers' mean gradient per step (same as DDP); async: "
             "apply each worker's gradient on arrival; esync: faster workers take local steps "
             "while the slowest takes one, then model deltas are averaged", choices=MODES))
    num_servers: int = field(default=1, metadata=opt(
        PARAMETER_SERVER, "--num-servers",
        help="server processes (ranks 0..K-1) holding the parameters in K shards balanced by "
             "size; rank 0 also keeps the counters, BatchNorm buffers, logs, evaluations and "
             "checkpoints. The other ranks are workers", bound=Bound(low=1)))
    rpc_transport: str = field(default="uv", metadata=opt(
        PARAMETER_SERVER, "--rpc-transport", choices=RPC_TRANSPORTS,
        help="uv: TCP through libuv, idle while it waits; tensorpipe: TensorPipe's own choice, "
             "shared memory between the processes of one host (lower latency, but each process "
             "keeps a core busy polling it, the whole run long) and InfiniBand where built in"))
    push_dtype: str = field(default="auto", metadata=opt(
        PARAMETER_SERVER, "--push-dtype", choices=PUSH_DTYPES,
        help="dtype of the gradients (sync, async) or model deltas (esync) the workers send. "
             "auto: as computed, float32 at O0-O2 (float64 with --float64), the half type at "
             "O3; float16 / bfloat16 halve the bytes (the server adds them up in float32)"))
    split: str = field(default="iid", metadata=opt(
        PARAMETER_SERVER, "--split",
        help="iid: every worker samples all classes; by-class: worker i gets classes i, i+N, "
             "... (non-IID)", choices=SPLITS))
    eval_every: int = field(default=0, metadata=opt(
        PARAMETER_SERVER, "--eval-every",
        help="validate on the server every N server updates (0: once per epoch; -1: never, "
             "leave it to `--evaluator`)", bound=Bound(low=-1)))
    global_lr: float = field(default=1.0, metadata=opt(
        PARAMETER_SERVER, "--global-lr", help="esync: scale of the averaged model delta on "
                                              "the server", bound=POSITIVE))
    local_lr: Optional[float] = field(default=None, metadata=opt(
        PARAMETER_SERVER, "--local-lr",
        help="esync: workers' local SGD lr (default: --lr scaled by -b / 256)", bound=POSITIVE))
    max_local_steps: int = field(default=32, metadata=opt(
        PARAMETER_SERVER, "--max-local-steps", help="esync: cap on a worker's local steps in "
                                                    "one round", bound=Bound(low=1)))
    esync_rule: str = field(default="reference", metadata=opt(
        PARAMETER_SERVER, "--esync-rule", choices=ESYNC_RULES,
        help="esync: when a worker stops stepping locally. reference: the ESync authors' rule, "
             "when its next step plus --esync-epsilon would end after the slowest worker's "
             "current step; estimate: when moving averages of the step times say another step "
             "no longer fits into the slowest worker's"))
    esync_epsilon: float = field(default=0.5, metadata=opt(
        PARAMETER_SERVER, "--esync-epsilon",
        help="esync, reference rule: safety margin in seconds (the authors' 0.5 s suits steps "
             "of seconds; with shorter steps use about one fast step or less, or every fast "
             "worker stops after one step)",
        bound=Bound(low=0, says="must be >= 0 (seconds)")))
    local_momentum: Optional[float] = field(default=None, metadata=opt(
        PARAMETER_SERVER, "--local-momentum",
        help="esync: momentum of the workers' local SGD (default: --momentum; the authors' "
             "code uses 0)", bound=Bound(low=0, high=1, high_open=True)))
    esync_average: str = field(default="mean", metadata=opt(
        PARAMETER_SERVER, "--esync-average", choices=ESYNC_AVERAGE_NAMES,
        help="esync: how the server averages the workers' deltas. mean: their plain mean (the "
             "authors'; a worker that took more local steps weighs more); normalized: "
             "FedNova's, each delta divided by its local step count and the mean scaled by "
             "the mean step count, so every worker counts once"))
    async_rule: str = field(default="staleness", metadata=opt(
        PARAMETER_SERVER, "--async-rule", choices=ASYNC_RULE_NAMES,
        help="async: how the server applies a gradient. staleness: at the lr divided by the "
             "gradient's staleness (updates made since its weights were pulled) and with "
             "--momentum lowered by what asynchrony adds (1 - 1/workers); plain: at the lr "
             "and --momentum, however stale"))
    evaluator: Optional[str] = field(default=None, metadata=opt(
        PARAMETER_SERVER, "--evaluator",
        help="evaluator mode: watch this run dir and validate each new checkpoint (single "
             "process, no training)"))
    evaluator_idle_timeout: float = field(default=600.0, metadata=opt(
        PARAMETER_SERVER, "--evaluator-idle-timeout",
        help="evaluator mode: stop after this many seconds without a new checkpoint"))


@dataclass(frozen=True)
class RuleOptions:
    """What an update rule (update_rules.py) reads: the parameter server's section, the
    optimizer's, and the images of one worker's push (-b as planned)."""
    ps: ParameterServerOptions
    optimizer: OptimizerOptions
    batch_size: int

    @classmethod
    def of(cls, values: Any) -> "RuleOptions":
        return cls(ParameterServerOptions.of(values), OptimizerOptions.of(values),
                   BatchOptions.of(values).batch_size)


@dataclass(frozen=True)
class WorkerOptions:
    """What a worker (worker.py) reads: its update rule's options (the parameter server's
    section among them), its device and precision, its loader's and plan's options, and the
    model, the loss and the run settings (seed, --deterministic, --steps-per-epoch)."""
    rule: RuleOptions
    strategy: StrategyOptions
    loader: LoaderOptions
    plan: PlanOptions
    model: ModelOptions
    loss: LossOptions
    run: RunOptions

    @classmethod
    def of(cls, values: Any) -> "WorkerOptions":
        return cls(RuleOptions.of(values), StrategyOptions.of(values), LoaderOptions.of(values),
                   PlanOptions.of(values), ModelOptions.of(values), LossOptions.of(values),
                   RunOptions.of(values))

    @property
    def ps(self) -> ParameterServerOptions:
        return self.rule.ps


@dataclass(frozen=True)
class ServerOptions:
    """What the server (server.py) reads: its update rule's options (the parameter server's
    section and the planned -b among them), the lr schedule and --epochs, the model's name,
    the run's intervals and stop (--print-freq, --checkpoint-every, --desired-acc) and
    --dist-timeout, after which a silent worker is probed."""
    rule: RuleOptions
    schedule: ScheduleOptions
    model: ModelOptions
    run: RunOptions
    distribution: DistributionOptions

    @classmethod
    def of(cls, values: Any) -> "ServerOptions":
        return cls(RuleOptions.of(values), ScheduleOptions.of(values), ModelOptions.of(values),
                   RunOptions.of(values), DistributionOptions.of(values))

    @property
    def ps(self) -> ParameterServerOptions:
        return self.rule.ps

    @property
    def batch_size(self) -> int:
        return self.rule.batch_size
