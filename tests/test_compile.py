"""--compile on the CPU, through the real entry script: a compiled run trains as the eager one
does, and resumes (from its own checkpoint or from an eager run's) to the same state.

torch.compile (inductor's C++ kernels on the CPU) costs far more than these runs' training: on a
2-core CPU (busy with other tests) 49 s for test_resnet's training graph (forward and backward)
and 12 s for its evaluation graph, cold; 2 s and 0.6 s from inductor's cache (measured). A
test's compiled runs share one inductor cache (TORCHINDUCTOR_CACHE_DIR, empty at the test's
start), so each graph is compiled once, as on a fresh machine, and the later runs load it; the
eager runs are forked (conftest.run_forked). Each test takes 70 s alone, 100-130 s beside the
suite's other worker (measured). Batches of 4 fill every training and validation batch (64 and
20 images), so no run compiles a second graph for a shorter last batch.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import (TINY, assert_resume_is_exact, first_conv_weight, records,
                      run_forked, run_script, weights)
from imagenet_recipes.models import build_model

# Every test here starts real processes. Both in one xdist group: each compiles for a minute
# with one core busy, and two side by side would leave the other tests' worker no core.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile")]

# EMA every 2 of the 3 steps per epoch: copied at step 2, averaged at steps 4 and 6. (The EMA's
# decay per update follows --epochs, torchvision's rule, so the first epoch of a run cut with
# --epochs 1 must not average: its decay would be the 1-epoch run's.)
RUN = TINY + ["-b", "4", "--steps-per-epoch", "3", "--seed", "2", "--model-ema",
              "--model-ema-steps", "2"]
# float64: compiled and eager kernels sum in other orders (inductor fuses and vectorises), which
# float64 keeps at ~1e-16 per operation: after 6 steps the weights differ by 1.1e-15 and the EMA
# by 6.7e-16 (measured), where one step of other training moves them by ~1e-2. 1e-9 leaves room
# for other CPUs' kernels.
FLOAT64_TOL = 1e-9


@pytest.fixture
def inductor_cache(tmp_path):
    """One inductor cache for a test's runs, empty at its start (the two tests compile
    different graphs: float64, and O2's bfloat16)."""
    cache = tmp_path / "inductor_cache"
    cache.mkdir()
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache)}


def _assert_close_states(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, b[name], rtol=0, atol=tol, msg=name)
        else:
            assert torch.equal(value, b[name]), name


def graphs(run: Path, kind: str) -> list:
    """compiled_graphs of each `kind` record: graphs torch.compile made in that phase so far
    (training: train_epoch; evaluation: val), None where the record has no count."""
    return [r.get("compiled_graphs") for r in records(run, kind)]


def test_compiled_run_trains_and_resumes_as_the_eager_one(tiny_imagefolder, tmp_path,
                                                          inductor_cache):
    """float64, 2 epochs of 3 steps, EMA on: an eager run straight, and an eager first epoch
    resumed compiled for the second, end with the same weights, BatchNorm statistics and EMA,
    under the same checkpoint keys (the bare model's: no `_orig_mod.`), the second epoch's
    losses equal. The compiled process made its graphs in training and in evaluation, counted
    apart, which tells a run that trained eagerly (tests/plants/compile) from one that did.
    A compiled run from its first step, and a compiled checkpoint resumed compiled: the O2
    test below."""
    common = RUN + ["--float64", "--epochs", "2", "--logdir", tmp_path]

    def argv(name, *extra):
        return [*common, "--run-name", name, *extra, tiny_imagefolder]

    # the eager runs forked (conftest.run_forked: no inductor setting reaches them, none needed),
    # the compiled one a fresh interpreter with the test's own inductor cache
    run_forked("nd.py", argv("eager"))
    run_forked("nd.py", argv("resumed", "--epochs", "1"))  # the last --epochs wins
    run_script("nd.py", argv("resumed", "--compile", "--resume", "auto"), env=inductor_cache)
    cache = Path(inductor_cache["TORCHINDUCTOR_CACHE_DIR"])
    assert any(cache.rglob("*.so")), "the compiled run left no compiled kernel"
    eager, resumed = weights(tmp_path / "eager"), weights(tmp_path / "resumed")
    configs = [r["config"]["compile"] for r in records(tmp_path / "resumed", "run")]
    assert configs == [False, True]
    # a training graph and an evaluation graph (BatchNorm in eval mode), each made once, by the
    # compiled process only
    for run, count in (("eager", [None, None]), ("resumed", [None, 1])):
        assert graphs(tmp_path / run, "train_epoch") == count, run
        assert graphs(tmp_path / run, "val") == count, run
    assert [e["epoch"] for e in records(tmp_path / "resumed", "train_epoch")] == [0, 1]
    for part in ("model", "model_ema"):
        keys = resumed[part] if part == "model" else resumed[part]["model"]
        assert not [k for k in keys if "_orig_mod" in k]
    _assert_close_states(eager["model"], resumed["model"], FLOAT64_TOL)
    _assert_close_states(eager["model_ema"]["model"], resumed["model_ema"]["model"],
                         FLOAT64_TOL)
    assert resumed["model_ema"]["updates"] == eager["model_ema"]["updates"] == 3
    assert resumed["optimizer"]["state"].keys() == eager["optimizer"]["state"].keys()
    losses = {name: [r["loss"] for r in records(tmp_path / name, "train")]
              for name in ("eager", "resumed")}
    assert len(losses["eager"]) == len(losses["resumed"]) == 6
    assert losses["resumed"][3:] == pytest.approx(losses["eager"][3:], rel=1e-9)
    assert len(set(losses["eager"])) == 6  # it trained


def test_compiled_o2_run_resumes_bit_for_bit(tiny_imagefolder, tmp_path, inductor_cache):
    """O2 (bfloat16) + EMA, compiled: 2 epochs straight == 1 epoch, then --resume auto, bit for
    bit (the same compiled kernels on the same state), the fp32 masters and the EMA of them
    included; the checkpoint's keys are the bare model's, as an eager run's are (the optimizer's
    keys against an eager run's: the test above)."""
    args = RUN + ["--opt-level", "O2", "--amp-dtype", "bfloat16", "--compile"]
    state = assert_resume_is_exact(
        lambda argv: run_script("nd.py", argv, env=inductor_cache), args, tiny_imagefolder,
        tmp_path)
    resumed = weights(tmp_path / "cut")
    assert state["model_ema"]["updates"] == resumed["model_ema"]["updates"] == 3
    for name, value in state["model_ema"]["model"].items():
        assert value.dtype != torch.bfloat16, name  # an fp32 average of the masters
        assert torch.equal(value, resumed["model_ema"]["model"][name]), name
    conv = first_conv_weight(state["model"])
    assert conv.dtype == torch.float32 and not torch.equal(conv, conv.bfloat16().float())
    bare = build_model(TINY[1], num_classes=4).state_dict().keys()  # tiny_imagefolder's 4
    assert state["model"].keys() == state["model_ema"]["model"].keys() == bare
