"""Numeric precision, kept separate from distribution: apex's opt levels on native torch.amp.

  O0  fp32 everywhere (or float64 with --float64, for exact parity checks between strategies).
  O1  fp32 weights; ops run under torch.autocast; dynamic loss scaling for float16.
  O2  the model is cast to half except normalisation layers, which stay fp32; the optimizer
      updates fp32 "master" copies of the half weights (loss-scaled for float16), then copies
      them back. Gradients of accumulation micro-batches are summed in the fp32 masters.
  O3  everything half, no master weights, no loss scaling by default.

bfloat16 has float32's exponent range, so it never needs a loss scaler: with bf16 the scaler is
disabled and `backward`/`optimizer_step` take the same code path as fp32.

The plugin is called by the strategy (which owns the model and optimizer lifecycle) and never
calls back into it: the strategy decides when gradients are reduced, this module decides what
dtype everything has and how the loss is scaled.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .options import PrecisionOptions
from .errors import UsageError

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_half_dtype(requested: str, device: torch.device, notice=print) -> torch.dtype:
    """auto: float16 on a GPU, bfloat16 on a CPU. An explicit choice is honoured everywhere
    (float16 on a CPU is slow, but it is how the loss-scaling path is tested without a GPU)."""
    if requested == "auto":
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    else:
        dtype = _DTYPES[requested]
    if device.type == "cpu":
        if dtype is torch.float16:
            notice("note: float16 on a CPU is emulated and slow; bfloat16 is the CPU half type")
        elif not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            notice("note: this CPU has no native bfloat16 (AVX512-BF16 / AMX), so bf16 math is "
                   "emulated and much slower than fp32 here (see RESULTS.md); O0 is faster on it")
    return dtype


class StaticLossScaler:
    """A fixed loss scale (apex's `loss_scale=<float>`), with GradScaler's interface.

    GradScaler cannot hold its scale constant (its growth factor must be > 1), so this small
    class does it: scale the loss, unscale the gradients, skip the step if any is not finite.
    It also accepts half gradients (O3), which GradScaler refuses to unscale.
    """

    def __init__(self, scale: float):
        self.scale_value = float(scale)
        self._found_inf: Optional[torch.Tensor] = None  # set by unscale_, used by step

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale in place and note whether any is not finite."""
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        # One fused unscale + non-finite check, and a single host sync for the whole model.
        self._found_inf = torch.zeros(1, device=grads[0].device)
        inv_scale = torch.full((1,), 1.0 / self.scale_value, device=grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, inv_scale)

    def step(self, optimizer: torch.optim.Optimizer) -> Optional[float]:
        if self._found_inf is None:
            self.unscale_(optimizer)
        found_inf, self._found_inf = self._found_inf, None
        if found_inf is None or found_inf.item() != 0:  # no gradients, or an overflow
            return None
        return optimizer.step()

    def update(self) -> None:
        pass

    def get_scale(self) -> float:
        return self.scale_value

    def is_enabled(self) -> bool:
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale_value}

    def load_state_dict(self, state: dict) -> None:
        self.scale_value = float(state["scale"])


class Precision:
    """Owns dtypes, autocast, loss scaling and the optimizer step of one opt level.

    Life cycle (driven by the strategy): `bind(device)` once the device is known ->
    `convert_module` before the model is wrapped -> `setup_masters` once, after the initial
    broadcast, so the fp32 masters are copies of rank 0's weights -> per step `backward`,
    (O2) `accumulate_grads` after the gradients are reduced, `optimizer_step`.
    """

    def __init__(self, opt_level: str = "O0", amp_dtype: str = "auto",
                 loss_scale: Optional[str] = None, float64: bool = False,
                 clip_grad_norm: Optional[float] = None):
        if float64 and opt_level != "O0":
            raise UsageError(f"--float64 runs O0 in float64; it cannot be combined with "
                             f"--opt-level {opt_level}")
        self.opt_level, self.amp_dtype = opt_level, amp_dtype
        self.loss_scale_arg, self.float64 = loss_scale, float64
        self.clip_grad_norm = clip_grad_norm
        self.half: Optional[torch.dtype] = None
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        # O2: (half model parameter, fp32 master parameter) pairs. fp32 parameters (norm layers)
        # are their own master and are not listed.
        self._master_pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []

    @classmethod
    def from_config(cls, cfg: PrecisionOptions) -> "Precision":
        return cls(cfg.opt_level, cfg.amp_dtype, cfg.loss_scale, cfg.float64,
                   cfg.clip_grad_norm)

    def bind(self, device: torch.device, notice=print) -> None:
        """Resolve the half type and the loss scaler for `device` (UsageError if the requested
        --loss-scale has no meaning at this level and dtype)."""
        self.device = device
        if self.opt_level != "O0":
            self.half = resolve_half_dtype(self.amp_dtype, device, notice)
        self.scaler = self._make_scaler(device)

    def _make_scaler(self, device: torch.device):
        # apex's defaults: O1 and O2 with float16 scale dynamically, O0 and O3 do not. An
        # explicit --loss-scale is honoured wherever scaling can mean something.
        level, requested = self.opt_level, self.loss_scale_arg
        if requested is None:
            dynamic = self.half is torch.float16 and level in ("O1", "O2")
            return torch.amp.GradScaler(device.type, enabled=dynamic)
        if self.half is torch.bfloat16:
            raise UsageError(f"--loss-scale {requested}: bfloat16 has float32's exponent range "
                             "and never needs loss scaling. Drop --loss-scale, or use "
                             "--amp-dtype float16")
        if self.float64:
            raise UsageError("--loss-scale cannot be combined with --float64")
        if requested == "dynamic":
            if level == "O3":
                raise UsageError("--loss-scale dynamic with O3: torch's GradScaler cannot "
                                 "unscale half gradients, and O3 has no fp32 masters. Use a "
                                 "fixed scale (e.g. --loss-scale 128) or --opt-level O2")
            return torch.amp.GradScaler(device.type, enabled=True)
        return StaticLossScaler(float(requested))

    def describe(self) -> dict:
        dtype = self.half or (torch.float64 if self.float64 else torch.float32)
        return {"opt_level": self.opt_level, "dtype": str(dtype).replace("torch.", ""),
                "loss_scaling": type(self.scaler).__name__ if self.scaling else "none"}

    @property
    def scaling(self) -> bool:
        return self.scaler.is_enabled()

    @property
    def has_masters(self) -> bool:
        """O2: the optimizer updates fp32 copies, and gradients must be moved into them."""
        return self.opt_level == "O2"

    # --- model and optimizer ---------------------------------------------------------------------
    def convert_module(self, model: nn.Module) -> nn.Module:
        """Cast the model for O2/O3/float64 (after it is on its device, before wrapping)."""
        if self.float64:
            return model.double()
        if self.opt_level == "O2":
            model.to(self.half)
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._NormBase):
                    # Normalisation stays fp32: its statistics over a half batch lose precision,
                    # and cuDNN / the CPU kernels accept half inputs with fp32 parameters.
                    m.float()
        elif self.opt_level == "O3":
            model.to(self.half)
        return model

    def setup_masters(self, model: nn.Module) -> None:
        """O2: fp32 copies of the half parameters, made once from the weights every rank now
        shares (after the strategy's initial broadcast)."""
        if self.has_masters:
            self._master_pairs = [(p, p.detach().float().clone().requires_grad_(True))
                                  for p in model.parameters() if p.dtype != torch.float32]

    def named_optimizer_params(self, model: nn.Module) -> List[Tuple[str, torch.Tensor]]:
        """(name, parameter) pairs the optimizer must update: fp32 masters under O2 (named
        after the model parameter each one masters), the model's own parameters otherwise."""
        master = {id(p): m for p, m in self._master_pairs}
        return [(name, master.get(id(p), p)) for name, p in model.named_parameters()]

    def module_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """Model weights for a checkpoint, always at full precision where we have it (O2 saves
        the fp32 masters), so checkpoints move freely between opt levels."""
        state = model.state_dict()
        if self._master_pairs:
            name_of = {id(p): n for n, p in model.named_parameters()}
            for p, m in self._master_pairs:
                state[name_of[id(p)]] = m.detach().clone()
        return state

    @torch.no_grad()
    def load_module_state_dict(self, model: nn.Module, state: Dict[str, torch.Tensor]) -> None:
        """The inverse of module_state_dict: the masters get the saved fp32 values exactly,
        the half model their rounding."""
        model.load_state_dict(state)  # casts to the model's dtypes
        if self._master_pairs:
            name_of = {id(p): n for n, p in model.named_parameters()}
            for p, m in self._master_pairs:
                m.copy_(state[name_of[id(p)]])

    @torch.no_grad()
    def load_parameters(self, model: nn.Module, values) -> None:
        """Set the parameters from full-precision values in model order (a parameter server's
        weights): the masters get them exactly, the half model their rounding."""
        master = {id(p): m for p, m in self._master_pairs}
        for p, value in zip(model.parameters(), values):
            p.copy_(value)
            if id(p) in master:
                master[id(p)].copy_(value)

    # --- the step ------------------------------------------------------------------------------
    def forward_context(self):
        """Autocast for O1. A fresh context per call: DataParallel re-enters it in each of its
        replica threads (autocast state is per thread)."""
        if self.opt_level == "O1":
            return torch.autocast(self.device.type, dtype=self.half)
        return contextlib.nullcontext()

    def convert_input(self, images: torch.Tensor) -> torch.Tensor:
        if self.float64:
            return images.double()
        return images.to(self.half) if self.opt_level in ("O2", "O3") else images

    def convert_output(self, output: torch.Tensor) -> torch.Tensor:
        """The loss is computed in fp32 (float64 with --float64), whatever the model ran in."""
        return output if output.dtype == torch.float64 else output.float()

    def wrap(self, module: nn.Module) -> "InPrecision":
        """`module` as the loops call it: `model(images)` in this precision (see InPrecision)."""
        return InPrecision(module, self)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """O2: add the (reduced) half gradients of the model into the fp32 masters' gradients
        and free them, so micro-batches of gradient accumulation are summed in fp32."""
        for p, m in self._master_pairs:
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.float()
            else:
                m.grad.add_(p.grad)
            p.grad = None

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale (if scaling), clip (--clip-grad-norm), skip the step on overflow, update,
        and under O2 copy the masters back into the half model. Every gradient must already be
        reduced, and under O2 moved into the masters by `accumulate_grads` (the strategy does
        both), so the norm is the global one, the same on every rank."""
        if self.clip_grad_norm is not None:
            self.scaler.unscale_(optimizer)  # a no-op when not scaling
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
        if self._master_pairs:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in self._master_pairs],
                                     [m for _, m in self._master_pairs])

    def loss_scale(self) -> Optional[float]:
        return float(self.scaler.get_scale()) if self.scaling else None

    def state_dict(self) -> dict:
        return {"opt_level": self.opt_level, "scaler_type": type(self.scaler).__name__,
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore dynamic loss-scaling state; a fixed --loss-scale always wins, and a scaler of
        another kind (dynamic vs static, or none) starts afresh."""
        same_kind = state.get("scaler_type") == type(self.scaler).__name__
        if state.get("scaler") and self.scaling and same_kind and not isinstance(
                self.scaler, StaticLossScaler):
            self.scaler.load_state_dict(state["scaler"])


class InPrecision(nn.Module):
    """The one seam between a training or evaluation loop and the precision: calling it runs
    the wrapped module (plain, DDP, DataParallel or compiled) under the precision's forward
    context (autocast for O1), on the input converted to the model's dtype (half under O2/O3,
    float64 under --float64), and gives the output back in the loss's dtype (fp32, or
    float64). The loops call `model(images)` and never the precision (Lightning Fabric's
    module wrapper plays the same part). It holds no state: state dicts come from the bare
    module the strategy keeps."""

    def __init__(self, module: nn.Module, precision: Precision):
        super().__init__()
        self.module, self.precision = module, precision

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        precision = self.precision
        with precision.forward_context():
            output = self.module(precision.convert_input(images))
        return precision.convert_output(output)
