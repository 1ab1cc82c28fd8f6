"""Numeric precision, kept separate from distribution: apex's opt levels on native torch.amp.

  O0  fp32 everywhere.
  O1  fp32 weights; ops run under torch.autocast; dynamic loss scaling for float16.
  O2  the model is cast to half except BatchNorm, which stays fp32; the optimizer updates fp32
      "master" copies of the half weights (loss-scaled for float16), then copies them back.
  O3  everything half, no master weights, no loss scaling (a speed-of-light baseline).

bfloat16 has float32's exponent range, so it never needs a loss scaler: with bf16 the scaler is
disabled and `backward`/`step` take the same code path as fp32. CPUs run fp16 slowly or not at
all, so on CPU an fp16 request falls back to bf16 with a one-line notice.
"""
from __future__ import annotations

import contextlib
from typing import Tuple, Dict, List, Optional

import torch
import torch.nn as nn

from .config import TrainConfig

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_half_dtype(requested: str, device: torch.device, notice=print) -> torch.dtype:
    if requested == "auto":
        return torch.float16 if device.type == "cuda" else _cpu_bfloat16(notice)
    dtype = _DTYPES[requested]
    if device.type != "cpu":
        return dtype
    if dtype is torch.float16:
        notice("note: float16 on CPU is slow or unsupported; using bfloat16 instead")
    return _cpu_bfloat16(notice)


def _cpu_bfloat16(notice) -> torch.dtype:
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        notice("note: this CPU has no native bfloat16 (AVX512-BF16 / AMX), so bf16 math is "
              "emulated and much slower than fp32 here (see RESULTS.md); O0 is faster on it")
    return torch.bfloat16


class StaticLossScaler:
    """A fixed loss scale (apex's `loss_scale=<float>`), with GradScaler's interface.

    GradScaler cannot hold its scale constant (its growth factor must be > 1), so this small
    class does it: scale the loss, unscale the gradients, skip the step if any is not finite.
    """

    def __init__(self, scale: float):
        self.scale_value = float(scale)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        # One fused unscale + non-finite check, and a single host sync for the whole model.
        found_inf = torch.zeros(1, device=grads[0].device)
        inv_scale = torch.full((1,), 1.0 / self.scale_value, device=grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        if found_inf.item() == 0:
            optimizer.step()

    def update(self) -> None:
        pass

    def get_scale(self) -> float:
        return self.scale_value

    def state_dict(self) -> dict:
        return {"scale": self.scale_value}

    def load_state_dict(self, state: dict) -> None:
        self.scale_value = float(state["scale"])


class Precision:
    """Owns casting, autocast, loss scaling and the optimizer step for one opt level."""

    def __init__(self, cfg: TrainConfig, device: torch.device, verbose: bool = True):
        self.opt_level = cfg.opt_level
        self.device = device
        notice = print if verbose else (lambda message: None)
        self.half = (None if self.opt_level == "O0"
                     else resolve_half_dtype(cfg.amp_dtype, device, notice))
        # apex semantics: O1 and O2 scale the loss, O3 does not. bf16 never needs it.
        uses_scaling = self.half is torch.float16 and self.opt_level in ("O1", "O2")
        if uses_scaling and cfg.loss_scale != "dynamic":
            self.scaler = StaticLossScaler(float(cfg.loss_scale))
        else:
            self.scaler = torch.amp.GradScaler(device.type, enabled=uses_scaling)
        # O2: (half model parameter, fp32 master parameter) pairs. fp32 parameters (BatchNorm)
        # are their own master and are not listed.
        self._master_pairs: List[tuple] = []

    def describe(self) -> dict:
        return {"opt_level": self.opt_level,
                "dtype": str(self.half).replace("torch.", "") if self.half else "float32",
                "loss_scaling": type(self.scaler).__name__ if self._scaling else "none"}

    @property
    def _scaling(self) -> bool:
        return isinstance(self.scaler, StaticLossScaler) or self.scaler.is_enabled()

    # --- model and optimizer ---------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Cast the model for O2/O3 (call after it is on its device, before wrapping)."""
        if self.opt_level == "O2":
            model.to(self.half)
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._NormBase):
                    # BatchNorm stays fp32: its statistics over a half batch lose precision, and
                    # cuDNN / the CPU kernels accept half inputs with fp32 parameters.
                    m.float()
            self._master_pairs = [(p, p.detach().float().clone().requires_grad_(True))
                                  for p in model.parameters() if p.dtype != torch.float32]
        elif self.opt_level == "O3":
            model.to(self.half)
        return model

    def named_optimizer_params(self, model: nn.Module) -> List[Tuple[str, torch.Tensor]]:
        """(name, parameter) pairs the optimizer must update: fp32 masters under O2 (named
        after the model parameter each one masters), the model's own parameters otherwise."""
        master = {id(p): m for p, m in self._master_pairs}
        return [(name, master.get(id(p), p)) for name, p in model.named_parameters()]

    def optimizer_params(self, model: nn.Module) -> List[torch.Tensor]:
        return [p for _, p in self.named_optimizer_params(model)]

    def model_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """Model weights for a checkpoint, always at full precision where we have it (O2 saves
        the fp32 masters), so checkpoints move freely between opt levels."""
        state = model.state_dict()
        if self._master_pairs:
            name_of = {id(p): n for n, p in model.named_parameters()}
            for p, m in self._master_pairs:
                state[name_of[id(p)]] = m.detach().clone()
        return state

    def load_model_state_dict(self, model: nn.Module, state: Dict[str, torch.Tensor]) -> None:
        model.load_state_dict(state)  # casts to the model's dtypes
        if self._master_pairs:
            name_of = {id(p): n for n, p in model.named_parameters()}
            with torch.no_grad():
                for p, m in self._master_pairs:
                    m.copy_(state[name_of[id(p)]])

    # --- the step ------------------------------------------------------------------------------
    def autocast(self):
        if self.opt_level == "O1":
            return torch.autocast(self.device.type, dtype=self.half)
        return contextlib.nullcontext()

    def cast_input(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.half) if self.opt_level in ("O2", "O3") else images

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, strategy) -> None:
        """Unscale (if scaling), skip on overflow, update; handles O2's master weights."""
        for p, m in self._master_pairs:
            # O2: the update happens in fp32 (DDP has already reduced these in half precision).
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        # Unscaling, the overflow check and the update must see fully reduced gradients.
        with strategy.synchronized_step(optimizer):
            self.scaler.step(optimizer)
        self.scaler.update()
        if self._master_pairs:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in self._master_pairs],
                                     [m for _, m in self._master_pairs])

    def loss_scale(self) -> Optional[float]:
        return float(self.scaler.get_scale()) if self._scaling else None

    def refresh_masters(self, model: nn.Module) -> None:
        """O2: re-copy the fp32 masters from the model, after DDP's initial broadcast may have
        replaced its weights with rank 0's (masters would otherwise keep this rank's)."""
        with torch.no_grad():
            for p, m in self._master_pairs:
                m.copy_(p)

    def state_dict(self) -> dict:
        return {"opt_level": self.opt_level, "scaler_type": type(self.scaler).__name__,
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore dynamic loss-scaling state; a fixed --loss-scale always wins, and a scaler of
        another kind (dynamic vs static, or none) starts afresh."""
        same_kind = state.get("scaler_type") == type(self.scaler).__name__
        if state.get("scaler") and self._scaling and same_kind and not isinstance(
                self.scaler, StaticLossScaler):
            self.scaler.load_state_dict(state["scaler"])
