"""Group `dali`: the DALI loaders on the device, and their batches against the pytorch loader's.
Skipped, saying so, where DALI is not installed."""
import pytest
import torch

from .gpu_tier import (ARCH, DEVICE, SIMULATED, SMALL, finite_losses, need, one_process_loaders,
                       train)

WHY = "pip install nvidia-dali-cuda130 (or carry its wheels to an offline machine)"


@pytest.mark.parametrize("backend", [
    pytest.param("dali-gpu", marks=pytest.mark.skipif(
        SIMULATED, reason="dali-gpu decodes on a GPU: nothing to simulate on the CPU")),
    "dali-cpu"])
def test_dali_loader_trains(backend, runs, images, saw):
    need("nvidia.dali", WHY)
    log = train(runs, backend, "nd.py", [*SMALL, "--data-backend", backend, images])
    losses = finite_losses(log)
    saw(f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def test_dali_batches_match_the_pytorch_loaders(images, saw):
    """In this process: the validation batches of dali-gpu, dali-cpu and pytorch hold the same
    images in the same order and layout (decoders and resizers differ pixel by pixel, so images
    compare by their channel means and correlation)."""
    need("nvidia.dali", WHY)
    from imagenet_recipes.config import parse_args

    device = torch.device(DEVICE)
    backends = ["pytorch", "dali-cpu"] + ([] if SIMULATED else ["dali-gpu"])
    batches = {}
    for backend in backends:
        cfg = parse_args(["-a", ARCH, "--image-size", "64", "-b", "16", "-j", "2",
                          "--data-backend", backend, "--channels-last", str(images)])
        train_loader, val_loader, _ = one_process_loaders(cfg, device)
        try:
            batches[backend] = [(x.clone(), y.clone()) for x, y in val_loader]
        finally:
            train_loader.close()
            val_loader.close()
    worst_mean, worst_corr = 0.0, 1.0
    for backend in backends[1:]:
        assert len(batches[backend]) == len(batches["pytorch"]), f"{backend}: batch count"
        for (x_pt, y_pt), (x, y) in zip(batches["pytorch"], batches[backend]):
            assert x.device.type == device.type and x.dtype == torch.float32, backend
            assert x.shape == x_pt.shape, f"{backend}: shape {tuple(x.shape)}"
            assert x.is_contiguous(memory_format=torch.channels_last), f"{backend}: layout"
            assert torch.equal(y, y_pt), f"{backend}: targets differ"
            worst_mean = max(worst_mean, (x.mean((2, 3)) - x_pt.mean((2, 3))).abs().max().item())
            worst_corr = min(worst_corr, torch.corrcoef(
                torch.stack([x.flatten(), x_pt.flatten()]))[0, 1].item())
    assert worst_mean < 0.15 and worst_corr > 0.7, \
        f"images differ: channel means by {worst_mean:.3f}, correlation {worst_corr:.3f}"
    images_seen = sum(len(y) for _, y in batches["pytorch"])
    saw(f"{' / '.join(backends[1:])} vs pytorch, {images_seen} validation images: same targets "
        f"and layout; channel means within {worst_mean:.3f}, correlation >= {worst_corr:.3f}")
