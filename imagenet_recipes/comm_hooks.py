"""PowerSGD (torch's DDP communication hook) made safe under dynamic fp16 loss scaling.

DDP hands its hooks the gradients as backward produced them: multiplied by the loss scale.
torch's powerSGD_hook keeps two memories across steps, both in those scaled units:
  - the error feedback (per bucket, per rank): what compression left out, added to the next
    step's gradients;
  - the warm-start Qs (per bucket, the same on every rank): the low-rank factors the next step
    starts its power iteration from.
Two things go wrong with a dynamic scaler:
  1. An overflow after PowerSGD's start step puts inf/NaN into both memories (the P all-reduce
     spreads one rank's inf to every rank). GradScaler skips that step and halves the scale,
     but nothing resets the memories, so every later step is NaN again: every step skipped,
     the scale halving towards 0, the model frozen.
  2. When the scale changes, the error feedback is still in the old units: after a halving it
     adds twice what was left out, after k overflows in a row 2**k times.
This wrapper fixes both without changing PowerSGD itself: it re-expresses the error feedback
in the current scale's units before each step, and when a step's result is not finite it puts
back the memories it had before that step (the step itself is skipped by the scaler).
"""
from typing import Callable, Dict, Optional

import torch


class LossScaledPowerSGD:
    """The `state` registered with DDP for --ddp-comm-hook powersgd (see `powersgd_hook`).

    `powersgd` is torch's PowerSGDState; `loss_scale()` returns the scale the gradients being
    reduced were made with (None when not scaling). `synchronous`: finish each bucket's
    PowerSGD inside the hook call. PowerSGD chains its second and third all-reduces onto the
    first one in callbacks; gloo runs callbacks in completion order, so with two buckets or
    more (O2 always has two: half weights and fp32 norm layers) ranks issue them in different
    orders and hang (pytorch#58467). DDP calls the hook for bucket after bucket in the same
    order on every rank, so finishing each one there keeps the ranks' all-reduces in step.
    """

    def __init__(self, powersgd, loss_scale: Callable[[], Optional[float]],
                 synchronous: bool = False):
        self.powersgd, self.loss_scale, self.synchronous = powersgd, loss_scale, synchronous
        self.error_scale: Dict[int, float] = {}  # bucket -> the scale its error feedback is in

    def hook(self, bucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

        state, index = self.powersgd, bucket.index()
        scale = self.loss_scale() or 1.0
        error = state.error_dict.get(index)
        if error is not None and self.error_scale.get(index, scale) != scale:
            # What compression left out at the old scale, in this step's units.
            error = error * (scale / self.error_scale[index])
            state.error_dict[index] = error
        self.error_scale[index] = scale
        # PowerSGD replaces the error tensor (never writes into it), so a reference keeps the
        # old one; it writes its P and Q factors in place, so those are copied (they are small:
        # rank x (rows + columns) per matrix).
        p, q = state.p_memory_dict.get(index), state.q_memory_dict.get(index)
        saved = (error, None if p is None else p.clone(), None if q is None else q.clone())

        def keep_memories_finite(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            reduced = fut.value()
            if not bool(torch.isfinite(reduced).all()):
                # An overflow on some rank (or inside PowerSGD's half arithmetic). The result is
                # the same on every rank (all of it came out of all-reduces), so every rank
                # decides alike: the scaler skips the step, and the memories go back to what
                # they were before it (or, on PowerSGD's first step, to none).
                for memory, value in zip((state.error_dict, state.p_memory_dict,
                                          state.q_memory_dict), saved):
                    if value is None:
                        memory.pop(index, None)
                    else:
                        memory[index] = value
            elif index in state.error_dict and not bool(
                    torch.isfinite(state.error_dict[index]).all()):
                # A finite result but this rank's own error overflowed (half gradients): it is
                # this rank's alone, and dropping it only loses one step's left-out part.
                state.error_dict[index] = torch.zeros_like(state.error_dict[index])
            return reduced

        fut = powerSGD_hook(state, bucket).then(keep_memories_finite)
        if self.synchronous:
            fut.wait()
        return fut


# No `from __future__ import annotations` in this module: DDP checks this signature's return
# annotation against the real Future[Tensor] object, not a string.
def powersgd_hook(state: LossScaledPowerSGD, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's hook signature (state, bucket) around LossScaledPowerSGD.hook."""
    return state.hook(bucket)
