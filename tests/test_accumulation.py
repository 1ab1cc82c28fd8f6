"""Gradient accumulation is exact on every strategy: DDP (`no_sync`), FSDP2
(`set_requires_gradient_sync`) and Horovod (`backward_passes_per_step`), each on 2 ranks x
`-b 4 --grad-accum 2` with --sync-bn, train as nd does with `-b 8 --grad-accum 2`. Horovod's
run asks for it as `--global-batch 16 -b 4`, which the run's plan splits into the same 2
micro-batches per step: the strategy follows the plan, not --grad-accum.

Both sides accumulate the same micro-batches: the sampler deals global positions round-robin
(rank r takes r, r+2, ...), so micro-batch k of the two ranks together is nd's micro-batch k, and
with --sync-bn BatchNorm normalises over the same 8 images. Every run is the real entry script
(under tests/accum_probe.py, which records the samples and counts the gradient collectives),
in float64 (`--float64`, see tests/test_parity.py for why), for 4 optimizer steps (one epoch of
64 images in global batches of 16) on timm's test_resnet, a model with BatchNorm.

TOL = 1e-10 on the weights and BatchNorm statistics (max |difference|; weights are O(0.1)):
float64's summation-order noise after 4 steps is ~2e-15 (measured: 1.8e-15 for DDP, FSDP and Horovod).
Doubling the lr (what a gradient divided by grad_accum one time too few does to SGD) moves them
by 0.28; the fixture measures that each time, so the tolerance is known to be sensitive. The
probe's counts show what numbers cannot: a micro-batch reduced that should not be (no_sync
ignored costs a reduction per micro-batch but gives the same sum, to 2e-15).

O2's accumulation (fp32 masters summing every micro-batch's reduced half gradients) is checked
in tests/test_mixed_precision.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from conftest import REPO, TINY, TRAIN, records, run_forked

# Every test here starts real processes, and they share the module's runs: one xdist worker
# runs them all, so the runs are made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("accumulation")]

PROBE = "tests/accum_probe.py"
COMMON = TINY + ["--epochs", "1", "--lr", "0.4", "--seed", "3", "--float64"]
ACCUM = COMMON + ["--grad-accum", "2"]
TOL = 1e-10
STEPS, MICRO = 4, 2


def probe_events(out_dir: Path) -> Dict[int, List[dict]]:
    """rank -> its events (see tests/accum_probe.py)."""
    events = {}
    for path in out_dir.glob("rank*.jsonl"):
        rank = int(path.name[4:].split("-")[0])
        events[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return dict(sorted(events.items()))


def micro_batches(events: List[dict], batch: int) -> List[List[int]]:
    """The sample indices of each micro-batch of one rank, in order."""
    samples = [e["sample"][1] for e in events if "sample" in e]
    return [samples[i:i + batch] for i in range(0, len(samples), batch)]


def collective_counts(events: List[dict]) -> List[List[int]]:
    """Per optimizer step: the gradient collectives started in each micro-batch's backward,
    then in the step."""
    steps, current = [], []
    for e in events:
        if "backward" in e:
            current.append(e["backward"] + e["after"])
        elif "step" in e:
            steps.append(current + [e["step"]])
            current = []
    return steps


def max_difference(run_a: Path, run_b: Path) -> float:
    """max |a - b| over every floating tensor of the two checkpoints' models (BatchNorm's
    running statistics included); integer buffers must be equal."""
    a = torch.load(run_a / "checkpoint.pth", map_location="cpu", weights_only=True)["model"]
    b = torch.load(run_b / "checkpoint.pth", map_location="cpu", weights_only=True)["model"]
    assert a.keys() == b.keys()
    worst = 0.0
    for name, value in a.items():
        if value.is_floating_point():
            assert value.dtype == b[name].dtype == torch.float64, name
            worst = max(worst, (value - b[name]).abs().max().item())
        else:
            assert torch.equal(value, b[name]), name
    return worst


def run_probed(script: str, out: Path, args: List, nproc: int = 0) -> None:
    out.mkdir(parents=True)
    if script == "hvd.py":
        from test_horovod import horovodrun  # its callers skip where Horovod is not built

        horovodrun([REPO / PROBE, out, TRAIN / script, *args], nproc)
    else:
        run_forked(PROBE, [out, TRAIN / script, *args], nproc=nproc)


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def nd(tiny_imagefolder, tmp_path_factory):
    """nd, -b 8 --grad-accum 2: the reference, and its twice-the-lr control."""
    logdir = tmp_path_factory.mktemp("accumulation")
    common = ACCUM + ["--logdir", logdir, "-b", "8", tiny_imagefolder]
    run_probed("nd.py", logdir / "probe_nd", common + ["--run-name", "nd"])
    run_forked("nd.py", common + ["--lr", "0.8", "--run-name", "nd_2x"])
    control = max_difference(logdir / "nd", logdir / "nd_2x")
    print(f"nd vs nd at twice the lr: max |difference| {control:.3g}")
    assert control > 1e6 * TOL  # TOL is sensitive
    return logdir


def _check_strategy(nd: Path, tiny_imagefolder: Path, script: str,
                    batching: List[str] = ACCUM) -> List[List[int]]:
    """Run `script` on 2 ranks x -b 4 --sync-bn, 2 micro-batches per step (`batching`: the
    options that ask for them) and check it against nd; returns rank 0's collective counts per
    step."""
    name = script[:-3]
    run_probed(script, nd / f"probe_{name}", batching + [
        "--logdir", nd, "-b", "4", "--sync-bn", "--run-name", name, tiny_imagefolder], nproc=2)
    assert [r["count"] for r in records(nd / name, "train")] == [16] * STEPS
    assert records(nd / name, "run")[0]["world_size"] == 2

    # the same micro-batches: rank 0's k-th and rank 1's k-th together are nd's k-th
    reference = micro_batches(probe_events(nd / "probe_nd")[0], 8)
    ranks = probe_events(nd / f"probe_{name}")
    assert sorted(ranks) == [0, 1]
    halves = [micro_batches(ranks[r], 4) for r in (0, 1)]
    assert len(reference) == len(halves[0]) == len(halves[1]) == STEPS * MICRO
    for k, whole in enumerate(reference):
        assert sorted(halves[0][k] + halves[1][k]) == sorted(whole), k

    difference = max_difference(nd / "nd", nd / name)
    print(f"{name} vs nd: max |difference| {difference:.3g}")
    assert difference < TOL, f"{name} vs nd: max |difference| {difference:.3g}"

    counts = [collective_counts(ranks[r]) for r in (0, 1)]
    assert counts[0] == counts[1]
    assert collective_counts(probe_events(nd / "probe_nd")[0]) == [[0, 0, 0]] * STEPS
    return counts[0]


def test_ddp_accumulates_as_nd(nd, tiny_imagefolder):
    """no_sync on the first micro-batch: DDP all-reduces its buckets once per step, during the
    last micro-batch's backward, and the sum is nd's."""
    counts = _check_strategy(nd, tiny_imagefolder, "ddp.py")
    # (DDP rebuilds its buckets after the first step, in the order gradients arrived)
    assert all(first == 0 and buckets >= 1 and step == 0 for first, buckets, step in counts)


def test_fsdp_accumulates_as_nd(nd, tiny_imagefolder):
    """set_requires_gradient_sync(False) on the first micro-batch: each FSDP unit
    reduce-scatters once per step, in the last micro-batch's backward."""
    counts = _check_strategy(nd, tiny_imagefolder, "fsdp.py")
    units = counts[0][1]
    assert units > 1 and counts == [[0, units, 0]] * STEPS  # blocks + the root


def test_horovod_accumulates_as_nd(nd, tiny_imagefolder):
    """backward_passes_per_step = the plan's micro-batches per step (--global-batch 16 over 2
    ranks of -b 4: 2): Horovod's hooks all-reduce each parameter's gradient once per step, when
    the last micro-batch's backward produces it."""
    pytest.importorskip("horovod.torch", reason="Horovod is not built: "
                                                "bash launch/install_horovod.sh")
    counts = _check_strategy(nd, tiny_imagefolder, "hvd.py", COMMON + ["--global-batch", "16"])
    state = torch.load(nd / "hvd" / "checkpoint.pth", map_location="cpu", weights_only=True)
    parameters = sum(1 for k, v in state["model"].items()
                     if v.is_floating_point() and "running" not in k)
    assert counts == [[0, parameters, 0]] * STEPS
