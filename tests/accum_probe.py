"""Runs an entry script and records, per rank, what gradient accumulation did, so that
tests/test_accumulation.py can check what numbers alone cannot show:

    python tests/accum_probe.py OUT_DIR train/ddp.py ARGS...     (or under torchrun/horovodrun)

OUT_DIR/rank<R>-pid<P>.jsonl gets one line per event, in order:
  {"sample": [epoch, index]}   each training sample the sampler hands out (use -j 0)
  {"backward": n, "after": m}  one micro-batch's backward: n gradient collectives started
                               during autograd's backward (overlapped with it), m after it, in
                               the strategy's own reduction (Horovod's synchronize under O2).
                               Counted: DDP buckets all-reduced (a counting comm hook around
                               PyTorch's own all-reduce hook), FSDP2 reduce-scatters, Horovod
                               all-reduces; 0 and 0 is a micro-batch whose reduction was skipped
  {"step": n, ...}             one optimizer step, with the collectives started in it (Horovod
                               reduces what its hooks have not started yet there)
OUT_DIR/initial.pth: the model's state before the first step (rank 0's; O2: the masters).
Under O2 each step also says whether the fp32 masters' gradients are exactly the fp32 sum of
the micro-batches' reduced half gradients ("masters_exact", "masters_max_diff"), and each
backward gives a digest of the reduced half gradients ("reduced"), equal on every rank when
every micro-batch was reduced.
"""
import hashlib
import json
import os
import runpy
import sys

import torch

from imagenet_recipes import engine
from imagenet_recipes import precision as precision_module
from imagenet_recipes.data import sampling
from imagenet_recipes.strategies import base, ddp

out_dir, script = sys.argv[1], sys.argv[2]
collectives = [0]  # gradient collectives started since the last event
_out = []


def emit(event: dict) -> None:
    if not _out:
        rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
        _out.append(open(os.path.join(out_dir, f"rank{rank}-pid{os.getpid()}.jsonl"), "a"))
    _out[0].write(json.dumps(event) + "\n")
    _out[0].flush()


# --- the samples -------------------------------------------------------------------------------
untraced_iter = sampling.ShardedSampler.__iter__


def traced_iter(self):
    for key in untraced_iter(self):
        if self.shuffle:  # the training sampler
            emit({"sample": [self.epoch, key.index]})
        yield key


sampling.ShardedSampler.__iter__ = traced_iter


# --- the collectives ---------------------------------------------------------------------------
def counted_ddp_hooks(self, model):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    assert self.comm_hook == "none", "the probe counts the plain all-reduce only"

    def counting_allreduce(state, bucket):
        collectives[0] += 1
        return default_hooks.allreduce_hook(state, bucket)  # what DDP does without a hook

    model.register_comm_hook(None, counting_allreduce)


ddp.DDPStrategy._register_comm_hook = counted_ddp_hooks

try:  # FSDP2 reduce-scatters each unit's gradients in one foreach_reduce
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    _foreach_reduce = _fsdp_param_group.foreach_reduce

    def counted_foreach_reduce(*args, **kwargs):
        collectives[0] += 1
        return _foreach_reduce(*args, **kwargs)

    _fsdp_param_group.foreach_reduce = counted_foreach_reduce
except ImportError:
    pass

if os.path.basename(script) == "hvd.py":  # one all-reduce per parameter
    from horovod.torch import optimizer as hvd_optimizer

    _allreduce_grad_async = hvd_optimizer._DistributedOptimizer._allreduce_grad_async

    def counted_allreduce_grad_async(self, p):
        collectives[0] += 1
        return _allreduce_grad_async(self, p)

    hvd_optimizer._DistributedOptimizer._allreduce_grad_async = counted_allreduce_grad_async


# --- micro-batches and steps -------------------------------------------------------------------
_backward, _optimizer_step = base.Strategy.backward, base.Strategy.optimizer_step
_accumulate = precision_module.Precision.accumulate_grads
_precision_backward = precision_module.Precision.backward
micro_grads = []  # O2: each micro-batch's reduced half gradients, as the masters receive them
reduced_digest = [None]


in_autograd = [0]


def probed_precision_backward(self, loss):
    collectives[0] = 0
    _precision_backward(self, loss)
    in_autograd[0], collectives[0] = collectives[0], 0


def probed_backward(self, loss):
    collectives[0] = in_autograd[0] = 0
    reduced_digest[0] = None
    _backward(self, loss)
    event = {"backward": in_autograd[0], "after": collectives[0]}
    if reduced_digest[0] is not None:
        event["reduced"] = reduced_digest[0]
    emit(event)
    collectives[0] = 0


def probed_accumulate(self):
    grads = [None if p.grad is None else p.grad.detach().clone() for p, _ in self._master_pairs]
    micro_grads.append(grads)
    digest = hashlib.sha1()
    for g in grads:
        if g is not None:
            digest.update(g.float().numpy().tobytes())
    reduced_digest[0] = digest.hexdigest()
    _accumulate(self)


def probed_optimizer_step(self, optimizer):
    collectives[0] = 0
    pairs = self.precision._master_pairs
    event = {}
    if pairs:
        # the fp32 sum of the micro-batches' half gradients: bf16/fp16 values are added
        # exactly in float64, then rounded once, as one fp32 addition of two of them rounds
        diff = 0.0
        for i, (_, master) in enumerate(pairs):
            parts = [micro[i] for micro in micro_grads if micro[i] is not None]
            expected = sum(part.double() for part in parts).float()
            diff = max(diff, (master.grad - expected).abs().max().item())
        event = {"masters_exact": diff == 0.0, "masters_max_diff": diff,
                 "micro_batches": len(micro_grads)}
        micro_grads.clear()
    _optimizer_step(self, optimizer)
    emit({"step": collectives[0], **event})
    collectives[0] = 0


_fit = engine.Trainer.fit


def probed_fit(self):
    state = self.strategy.module_state_dict()  # collective under FSDP: on every rank
    if self.strategy.is_main():
        torch.save(state, os.path.join(out_dir, "initial.pth"))
    _fit(self)


engine.Trainer.fit = probed_fit
base.Strategy.backward = probed_backward
base.Strategy.optimizer_step = probed_optimizer_step
precision_module.Precision.accumulate_grads = probed_accumulate
precision_module.Precision.backward = probed_precision_backward

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
sys.argv = [script, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
runpy.run_path(script, run_name="__main__")
