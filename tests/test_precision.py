"""The precision plugin through the strategy that drives it: opt levels, O2 masters, loss scaling.

The half type is always named explicitly (never `auto`), so the same paths run on CPUs with
and without native bfloat16; float16 runs on the CPU too (slowly), which is how the loss-scaling
paths are tested without a GPU.
"""
from __future__ import annotations

import copy
import math
import os
import threading

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision

from conftest import spawn_ranks, unused_port

from imagenet_recipes.config import UsageError
from imagenet_recipes.precision import Precision, StaticLossScaler
from imagenet_recipes.strategies import DataParallelStrategy, DDPStrategy, Strategy


def _tiny_convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _setup(level, amp_dtype="bfloat16", loss_scale=None, strategy_class=Strategy, model=None):
    strategy = strategy_class(Precision(level, amp_dtype, loss_scale), device="cpu")
    strategy.setup_environment()
    model = strategy.setup_module(model or _tiny_convnet())
    params = [p for _, p in strategy.named_optimizer_params()]
    optimizer = strategy.setup_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9))
    return strategy, model, optimizer


def _batch(g, scale=1.0):
    return torch.randn(8, 3, 12, 12, generator=g) * scale, torch.randint(0, 4, (8,), generator=g)


def _micro_step(strategy, x, y, accum=1, last=True):
    """What the engine does for one micro-batch (`strategy.model`: what setup_module returned,
    called in its precision)."""
    with strategy.micro_step(last=last):
        loss = nn.functional.cross_entropy(strategy.model(x), y)
        strategy.backward(loss / accum)
    return loss


def _train_steps(level, steps=3, amp_dtype="bfloat16", loss_scale=None):
    strategy, model, optimizer = _setup(level, amp_dtype, loss_scale)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        losses.append(_micro_step(strategy, *_batch(g)).item())
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    return strategy, strategy.module, optimizer, losses  # the bare model, to inspect


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_every_opt_level_trains_on_cpu(level):
    _, model, _, losses = _train_steps(level, steps=6)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    expected = {"O0": torch.float32, "O1": torch.float32, "O2": torch.bfloat16,
                "O3": torch.bfloat16}[level]
    assert model[0].weight.dtype == expected
    assert model[1].weight.dtype == (torch.bfloat16 if level == "O3" else torch.float32)


def test_o2_keeps_fp32_master_weights_in_sync():
    strategy, model, optimizer, _ = _train_steps("O2")
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in masters)
    assert masters[0] is not model[0].weight  # a separate fp32 copy of the bf16 conv weight
    assert torch.equal(masters[0].to(torch.bfloat16), model[0].weight)
    assert masters[2] is model[1].weight  # BatchNorm is fp32 already: its own master
    state = strategy.module_state_dict()
    assert state["0.weight"].dtype == torch.float32 and torch.equal(state["0.weight"], masters[0])


def test_o2_restore_gives_the_masters_the_saved_fp32_values():
    """A resumed O2 run must continue from the saved fp32 masters, not from their rounding to
    the half model: restoring into a fresh strategy (made from other weights) and stepping
    both once more gives bit-identical masters."""
    trained, model, optimizer, _ = _train_steps("O2", steps=4)
    # deep copies, as a checkpoint file is: state dicts hold references to live tensors
    state, opt_state = copy.deepcopy((trained.module_state_dict(), optimizer.state_dict()))
    master = state["0.weight"]
    assert not torch.equal(master, master.to(torch.bfloat16).float())  # fp32 has more bits

    fresh, fresh_model, fresh_optimizer = _setup("O2", model=nn.Sequential(*_tiny_convnet()))
    fresh.load_module_state_dict(state)
    fresh_optimizer.load_state_dict(opt_state)
    assert torch.equal(fresh.module_state_dict()["0.weight"], master)
    g = torch.Generator().manual_seed(7)
    x, y = _batch(g)
    for strategy, m, opt in ((trained, model, optimizer), (fresh, fresh_model, fresh_optimizer)):
        _micro_step(strategy, x, y)
        strategy.optimizer_step(opt)
    for name, value in trained.module_state_dict().items():
        assert torch.equal(value, fresh.module_state_dict()[name]), name


def test_o2_accumulates_micro_batch_gradients_in_fp32():
    """4 micro-batches: the masters' gradient is the fp32 sum of the 4 half gradients, not a
    sum rounded to bfloat16 after every addition (apex accumulated in the fp32 masters)."""
    strategy, model, optimizer = _setup("O2")
    g = torch.Generator().manual_seed(3)
    batches = [_batch(g) for _ in range(4)]
    half_grads = []
    for x, y in batches:  # each micro-batch's own half gradient, from a copy of the model
        probe, _, _ = _setup("O2", model=_tiny_convnet())
        _micro_step(probe, x, y, accum=4)
        # the probe moved it into its (empty) master gradient: an exact fp32 copy of the half one
        half_grads.append(probe.named_optimizer_params()[0][1].grad.to(torch.bfloat16))
    for i, (x, y) in enumerate(batches):
        _micro_step(strategy, x, y, accum=4, last=i == 3)
    master_grad = strategy.named_optimizer_params()[0][1].grad
    fp32_sum = sum(h.float() for h in half_grads)
    bf16_sum = half_grads[0]
    for h in half_grads[1:]:
        bf16_sum = bf16_sum + h  # what accumulating in the half model's .grad computes
    assert master_grad.dtype == torch.float32
    assert torch.equal(master_grad, fp32_sum)
    assert not torch.equal(master_grad, bf16_sum.float())  # the test can tell them apart
    assert strategy.module[0].weight.grad is None  # the half gradients were moved, not copied


@pytest.mark.parametrize("level,dtype,loss_scale,expected", [
    ("O0", "bfloat16", None, "none"),
    ("O0", "bfloat16", "128", "StaticLossScaler"),  # apex honoured loss_scale at every level
    ("O0", "bfloat16", "dynamic", "GradScaler"),
    ("O1", "float16", None, "GradScaler"),
    ("O1", "float16", "128", "StaticLossScaler"),
    ("O2", "float16", None, "GradScaler"),
    ("O2", "float16", "dynamic", "GradScaler"),
    ("O3", "float16", None, "none"),
    ("O3", "float16", "128", "StaticLossScaler"),
    ("O3", "float16", "dynamic", "cannot unscale half gradients"),
    ("O1", "bfloat16", None, "none"),
    ("O1", "bfloat16", "128", "never needs loss scaling"),
    ("O2", "bfloat16", "dynamic", "never needs loss scaling"),
    ("O3", "bfloat16", "64", "never needs loss scaling"),
])
def test_loss_scale_is_applied_or_refused_per_level(level, dtype, loss_scale, expected):
    precision = Precision(level, dtype, loss_scale)
    if expected not in ("none", "GradScaler", "StaticLossScaler"):
        with pytest.raises(UsageError, match=expected):
            precision.bind(torch.device("cpu"), notice=lambda m: None)
        return
    precision.bind(torch.device("cpu"), notice=lambda m: None)
    assert precision.describe()["loss_scaling"] == expected
    if expected != "none":
        _, _, _, losses = _train_steps(level, steps=2, amp_dtype=dtype, loss_scale=loss_scale)
        assert all(torch.isfinite(torch.tensor(losses)))


def test_explicit_float16_is_honoured_on_cpu(capsys):
    precision = Precision("O1", "float16")
    precision.bind(torch.device("cpu"))
    assert precision.half is torch.float16 and precision.scaler.is_enabled()
    assert "float16 on a CPU is emulated and slow" in capsys.readouterr().out
    auto = Precision("O1", "auto")
    auto.bind(torch.device("cpu"), notice=lambda m: None)
    assert auto.half is torch.bfloat16 and not auto.scaler.is_enabled()


def test_static_loss_scale_skips_non_finite_steps():
    w = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    scaler = StaticLossScaler(128.0)
    scaler.scale((w * 2).sum()).backward()
    scaler.step(opt)
    assert torch.equal(w.detach(), torch.full((2,), -1.0))  # grad 2 after unscaling
    w.grad = torch.tensor([float("inf"), 1.0])
    scaler.step(opt)
    assert torch.equal(w.detach(), torch.full((2,), -1.0))  # skipped


@pytest.mark.parametrize("level,loss_scale", [("O1", None), ("O2", None), ("O2", "128"),
                                              ("O3", "128")])
def test_float16_loss_scaling_tracks_fp32(level, loss_scale):
    """float16 with its loss scaler (GradScaler, or a fixed scale) follows an fp32 reference
    closely, and the scaler state round-trips."""
    strategy, model, optimizer = _setup(level, "float16", loss_scale)
    precision = strategy.precision
    reference = _tiny_convnet()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = _batch(g)
        loss = _micro_step(strategy, x, y)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        ref_loss = nn.functional.cross_entropy(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=2e-2)
    expected_scale = 128.0 if loss_scale else 65536.0
    assert precision.loss_scale() == expected_scale  # scaled, and no overflow skipped
    state = precision.state_dict()
    precision.load_state_dict({**state, "scaler_type": "Other", "scaler": {"scale": 1.0}})
    assert precision.loss_scale() == expected_scale  # a scaler of another kind is not loaded


def test_resnet_o2_keeps_every_batchnorm_fp32():
    precision = Precision("O2", "bfloat16")
    precision.bind(torch.device("cpu"))
    model = precision.convert_module(torchvision.models.resnet18(num_classes=10))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.weight.dtype == torch.float32 and m.running_var.dtype == torch.float32
        elif isinstance(m, nn.Conv2d):
            assert m.weight.dtype == torch.bfloat16


def test_float64_runs_the_whole_step_in_float64():
    precision = Precision("O0", float64=True)
    strategy = Strategy(precision, device="cpu")
    strategy.setup_environment()
    strategy.setup_module(_tiny_convnet())
    x, y = _batch(torch.Generator().manual_seed(0))
    loss = _micro_step(strategy, x, y)
    assert loss.dtype == torch.float64 and strategy.module[0].weight.grad.dtype == torch.float64
    with pytest.raises(UsageError, match="--float64"):
        Precision("O1", float64=True)


# --- DataParallel: autocast in the replica threads -------------------------------------------
class _DtypeProbe(nn.Module):
    """Records the dtype a matmul produces inside forward, i.e. the autocast dtype in force."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        out = self.linear(x)
        self.seen.append(out.dtype)
        return out


def test_dataparallel_replicas_run_at_the_requested_half_dtype():
    """nn.DataParallel runs each replica in a new thread (parallel_apply), where autocast
    state starts afresh and is re-entered with only `enabled=True`: the device's default dtype
    (fp16 on CUDA, bf16 on CPU). The replica module must enter the run's own dtype. Here the
    run asks for float16 on the CPU, whose default is bfloat16: the same mismatch as a bf16 run
    on GPUs, checked without GPUs."""
    strategy = DataParallelStrategy(Precision("O1", "float16"), device="cpu")
    strategy.setup_environment()
    probe = _DtypeProbe()
    replica = strategy.replica_module(probe)

    def parallel_apply_worker():  # what torch.nn.parallel.parallel_apply's _worker does
        with torch.autocast("cpu", enabled=True):
            replica(torch.randn(2, 4))

    with strategy.precision.forward_context():  # InPrecision's, in the main thread
        thread = threading.Thread(target=parallel_apply_worker)
        thread.start()
        thread.join()
    assert probe.seen == [torch.float16]
    # and the replica wrapper changes nothing else: same parameters, same state dict keys
    assert list(replica.module.state_dict()) == list(probe.state_dict())


# --- fp16 overflow across ranks (real processes, gloo) ----------------------------------------
def _overflow_rank(rank: int, port: int, level: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    strategy, model, optimizer = _setup(level, "float16", strategy_class=DDPStrategy)
    try:
        g = torch.Generator().manual_seed(rank)
        params = dict(strategy.named_optimizer_params())  # fp32 masters under O2
        before = {k: v.detach().clone() for k, v in params.items()}
        # Only rank 1's batch overflows float16 (1e6 x activations): its gradient is inf/nan.
        x, y = _batch(g, scale=1e6 if rank == 1 else 1.0)
        _micro_step(strategy, x, y)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        skipped = all(torch.equal(before[k], v) for k, v in params.items())
        scale_after_overflow = strategy.precision.loss_scale()
        _micro_step(strategy, *_batch(g))  # a normal step on both ranks
        strategy.optimizer_step(optimizer)
        results[rank] = {"skipped": skipped, "scale": scale_after_overflow,
                         "weights": {k: v.detach().clone() for k, v in params.items()}}
    finally:
        strategy.teardown()


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(level):
    results = mp.Manager().dict()
    spawn_ranks(_overflow_rank, (unused_port(), level, results), nprocs=2)
    assert results[0]["skipped"] and results[1]["skipped"]
    assert results[0]["scale"] == results[1]["scale"] == 32768.0  # 65536 halved, on both
    for name, value in results[0]["weights"].items():
        # ranks stay in step (parameters; BatchNorm running stats are per rank without SyncBN)
        assert torch.equal(value, results[1]["weights"][name]), name


# --- PowerSGD under fp16 loss scaling (real processes, gloo) ---------------------------------
def _powersgd_state(strategy):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    for _, state in strategy.wrapper._comm_hooks:
        state = getattr(state, "powersgd", state)  # unwrapped, if the hook wraps torch's
        if isinstance(state, PowerSGDState):
            return state
    raise AssertionError("no PowerSGD hook registered")


def _powersgd_rank(rank: int, port: int, level: str, overflow_at, results) -> None:
    """12 steps of PowerSGD (compressing from step 2 on) on a fixed batch per rank; at step
    `overflow_at` (None: never) rank 1's batch overflows float16 and, in the run without an
    overflow, that step is simply not taken."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    strategy = DDPStrategy(Precision(level, "float16"), device="cpu", comm_hook="powersgd",
                           powersgd_start_step=2)
    strategy.setup_environment()
    try:
        strategy.setup_module(_tiny_convnet())
        params = dict(strategy.named_optimizer_params())  # fp32 masters under O2
        optimizer = strategy.setup_optimizer(torch.optim.SGD(params.values(), lr=0.5,
                                                             momentum=0.9))
        x, y = _batch(torch.Generator().manual_seed(rank))
        losses, scales = [], []
        for step in range(12):
            if step == (overflow_at if overflow_at is not None else 5):
                if overflow_at is None:
                    continue  # the reference run: the step the other run loses is not taken
                # Only rank 1's batch overflows float16 (1e6 x activations).
                _micro_step(strategy, x * (1e6 if rank == 1 else 1.0), y)
            else:
                losses.append(_micro_step(strategy, x, y).item())
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
            scales.append(strategy.precision.loss_scale())
        state = _powersgd_state(strategy)
        memories = [*state.error_dict.values(), *state.p_memory_dict.values(),
                    *state.q_memory_dict.values()]
        results[rank] = {
            "losses": losses, "scales": scales, "memories": len(memories),
            "finite": all(bool(torch.isfinite(t).all()) for t in memories),
            "weights": {k: v.detach().clone() for k, v in params.items()}}
    finally:
        strategy.teardown()


def _run_powersgd(level, overflow_at):
    results = mp.Manager().dict()
    spawn_ranks(_powersgd_rank, (unused_port(), level, overflow_at, results), nprocs=2)
    return dict(results)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_powersgd_survives_an_fp16_overflow_after_its_start_step(level):
    """PowerSGD compresses the loss-scaled gradients and keeps error-feedback and warm-start
    memories across steps. An overflow after its start step (step 5 here; it compresses from
    step 2) must not leave inf/NaN in them: the overflowing step is skipped on both ranks, the
    scale halves once, and the following steps are taken and keep lowering the loss."""
    results = _run_powersgd(level, overflow_at=5)
    for rank in (0, 1):
        r = results[rank]
        # error, P and Q per bucket; O2 has two buckets (half weights, fp32 BatchNorm)
        assert r["memories"] == (6 if level == "O2" else 3)
        assert r["finite"], f"rank {rank}: inf/NaN in PowerSGD's memories"
        # one halving at the overflow, and no step skipped after it
        assert r["scales"] == [65536.0] * 5 + [32768.0] * 7, r["scales"]
    # 11 losses per rank (the overflowing forward is not among them), averaged over the ranks
    # (each rank's own batch is not what the averaged update minimises); 1.269 before the
    # overflow, 1.205 at the end in the run that added this test.
    losses = [(a + b) / 2 for a, b in zip(results[0]["losses"], results[1]["losses"])]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[4] - 0.03, losses  # still learning after the overflow
    for name, value in results[0]["weights"].items():
        assert torch.equal(value, results[1]["weights"][name]), name


@pytest.mark.slow
def test_powersgd_error_feedback_follows_the_loss_scale():
    """The error-feedback memory holds what compression left out, in the units of the loss
    scale it was made at. When the scale halves (after an overflow) it must be halved too,
    or the next step adds twice the left-out gradient. PowerSGD with power-of-two scales is
    exactly scale-equivariant in binary arithmetic (O1 keeps fp32 gradients), so a run that
    loses step 5 to an overflow (and continues at half the scale) must end where a run that
    never takes step 5 ends (at the full scale)."""
    lost = _run_powersgd("O1", overflow_at=5)
    never = _run_powersgd("O1", overflow_at=None)
    assert never[0]["scales"] == [65536.0] * 11
    for name, value in lost[0]["weights"].items():
        # Exactly: halving is exact in binary floating point (in the run that added this test,
        # the conv weight differed by up to 0.11, with weights up to 0.38, without the rescaling)
        assert torch.equal(value, never[0]["weights"][name]), (
            name, (value - never[0]["weights"][name]).abs().max().item())
