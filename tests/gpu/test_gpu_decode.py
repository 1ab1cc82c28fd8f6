"""Group `decode`: `--data-backend gpu` (TorchCodec's nvJPEG decode, one roi_align per batch)
on the device, and its batches against the pytorch loader's. Skipped, saying so, where
TorchCodec is not installed."""
import pytest
import torch

from .gpu_tier import ARCH, DEVICE, SMALL, finite_losses, need, on_device, train

WHY = "pip install torchcodec (requirements.txt pins the tested version)"


def test_gpu_decode_loader_trains(runs, images, saw):
    need("torchcodec", WHY)
    log = train(runs, "gpu-decode", "nd.py", [*SMALL, "--data-backend", "gpu",
                                              "--channels-last", images])
    device = on_device(log)
    losses = finite_losses(log)
    assert all(e["skipped"] == 0 for e in log["train_epoch"]), log["train_epoch"]
    saw(f"{len(losses)} steps on {device}, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def _batches(backend: str, images, split: str):
    """In this process: every batch of one pass of `split`, as (images, targets) on the device."""
    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data import build_loaders
    from imagenet_recipes.strategies import Strategy

    cfg = parse_args(["-a", ARCH, "--image-size", "64", "-b", "16", "-j", "2", "--seed", "7",
                      "--data-backend", backend, "--channels-last", str(images)])
    train_loader, val_loader, _ = build_loaders(cfg, Strategy().data_shard(),
                                                torch.device(DEVICE))
    loader = train_loader if split == "train" else val_loader
    loader.set_epoch(1)
    try:
        return [(x.clone(), y.clone()) for x, y in loader], loader.skipped
    finally:
        train_loader.close()
        val_loader.close()


@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_decode_batches_match_the_pytorch_loaders(split, images, saw, number):
    """The same samples in the same order, the same layout, images close: nvJPEG's and
    libjpeg-turbo's decodes differ by a level or two, roi_align's resize from torchvision's
    antialiased one by the bounds of tests/test_gpu_decode.py (0.05 per batch, 0.1 per image,
    1.0 per pixel, in normalised units), loosened a little for the decoders."""
    need("torchcodec", WHY)
    ours, skipped = _batches("gpu", images, split)
    theirs, skipped_pt = _batches("pytorch", images, split)
    assert skipped == skipped_pt == 0
    assert len(ours) == len(theirs), "batch count"
    for (x, y), (x_pt, y_pt) in zip(ours, theirs):
        assert x.device.type == DEVICE and x.dtype == torch.float32 and x.shape == x_pt.shape
        assert x.is_contiguous(memory_format=torch.channels_last), "layout"
        assert y.dtype == torch.int64 and torch.equal(y.cpu(), y_pt.cpu()), "targets differ"
    diff = (torch.cat([x for x, _ in ours]) - torch.cat([x for x, _ in theirs])).abs().float()
    mean, image, pixel = diff.mean().item(), diff.mean((1, 2, 3)).max().item(), diff.max().item()
    number(f"{split}_mean_abs_diff", round(mean, 4))
    number(f"{split}_worst_image_mean_abs_diff", round(image, 4))
    number(f"{split}_max_abs_diff", round(pixel, 4))
    assert mean < 0.07 and image < 0.15 and pixel < 1.5, (mean, image, pixel)
    saw(f"{split}: {sum(len(y) for _, y in ours)} images, same targets and layout; vs pytorch "
        f"mean |diff| {mean:.4f}, worst image {image:.4f}, max {pixel:.3f} (normalised)")
