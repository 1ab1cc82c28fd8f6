"""The distribution options: the device and the process group, and the options of the strategies
that only they read (DDP's communication hooks, Horovod's compression)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError
from ..registry import COLLECTIVE_TIMEOUT, DDP_COMM_HOOKS, HOROVOD_COMPRESSION, SHARE_GPUS, SYNC_BN
from .fields import DISTRIBUTION, POSITIVE, Section, opt

COMM_HOOK_CHOICES = ("none", "fp16", "bf16", "powersgd")


@dataclass(frozen=True)
class DistributionOptions(Section):
    """The device, and what every multi-process strategy shares."""
    device: str = field(default="auto", metadata=opt(
        DISTRIBUTION, "--device", help="auto (CUDA if present), cpu or cuda",
        choices=("auto", "cpu", "cuda")))
    share_gpus: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--share-gpus",
        help="let more processes than GPUs run on one node, local rank r on GPU r mod the GPU "
             "count, communicating over gloo (NCCL refuses two ranks on one GPU): for trying "
             "the multi-process paths on a one-GPU machine, not for speed",
        needs=SHARE_GPUS, elsewhere="one process per node has nothing to share"))
    sync_bn: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--sync-bn", help="synchronise BatchNorm statistics across processes",
        needs=SYNC_BN, elsewhere="one process has nothing to synchronise"))
    dist_timeout: float = field(default=600.0, metadata=opt(
        DISTRIBUTION, "--dist-timeout",
        help="seconds a collective (or the process-group start) may wait for a peer before "
             "the run fails with an error naming the cause", needs=COLLECTIVE_TIMEOUT,
        bound=POSITIVE))


@dataclass(frozen=True)
class DdpOptions(Section):
    """DDP's gradient communication hooks."""
    ddp_comm_hook: str = field(default="none", metadata=opt(
        DISTRIBUTION, "--ddp-comm-hook",
        help="gradient communication hook (PyTorch built-ins): fp16 / bf16 compress gradients "
             "to half for the all-reduce, powersgd sends low-rank approximations with error "
             "feedback", choices=COMM_HOOK_CHOICES, needs=DDP_COMM_HOOKS,
        elsewhere="Horovod's counterpart is --fp16-allreduce"))
    powersgd_rank: int = field(default=1, metadata=opt(
        DISTRIBUTION, "--powersgd-rank", help="PowerSGD matrix approximation rank",
        needs=DDP_COMM_HOOKS))
    powersgd_start_step: int = field(default=10, metadata=opt(
        DISTRIBUTION, "--powersgd-start-step",
        help="PowerSGD: plain all-reduce for this many steps first (PyTorch suggests about "
             "10%% of training, at least 2)", needs=DDP_COMM_HOOKS))

    @classmethod
    def rules(cls, values) -> None:
        if values.ddp_comm_hook == "powersgd" and (values.powersgd_rank < 1
                                                   or values.powersgd_start_step < 2):
            raise UsageError("PowerSGD needs --powersgd-rank >= 1 and --powersgd-start-step >= 2 "
                             "(error feedback needs one uncompressed step)")


@dataclass(frozen=True)
class HorovodOptions(Section):
    """Horovod's gradient compression."""
    fp16_allreduce: bool = field(default=False, metadata=opt(
        DISTRIBUTION, "--fp16-allreduce", help="compress gradients to fp16 for the all-reduce",
        needs=HOROVOD_COMPRESSION, elsewhere="DDP's counterpart is --ddp-comm-hook fp16"))
