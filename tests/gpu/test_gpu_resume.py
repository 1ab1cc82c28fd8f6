"""Group `resume`: O2 float16 preempted mid-epoch and resumed ends bit for bit where an
uninterrupted run ends."""
import torch

from .gpu_tier import BATCH, DEVICE, SMALL, WORKERS, train
from .test_gpu_ranks import preempt_and_resume


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_o2_float16_resume_is_bit_exact(runs, images, saw):
    args = [*SMALL[:4], "-b", BATCH, "-j", WORKERS, "--epochs", "2", "--steps-per-epoch", "5",
            "--device", DEVICE, "--opt-level", "O2", "--amp-dtype", "float16",
            "--deterministic", "--seed", "3", images]
    train(runs, "o2-straight", "nd.py", [*args, "-p", "1"])
    stopped = preempt_and_resume(runs, "o2-cut", "nd.py", args, nproc=0)
    a = torch.load(runs / "o2-straight/checkpoint.pth", map_location="cpu", weights_only=False)
    b = torch.load(runs / "o2-cut/checkpoint.pth", map_location="cpu", weights_only=False)
    for part in ("model", "optimizer", "precision"):
        assert _same(a[part], b[part]), f"{part} state differs after the resume"
    saw(f"stopped after step {stopped}, resumed: model, fp32 masters, optimizer and loss "
        "scaler identical to the uninterrupted run's")
