"""Group `recipes`: a published preset's recipe features (EMA, MixUp/CutMix, TrivialAugment,
random erasing, repeated augmentation, label smoothing) on the device, shrunk to a few steps."""
from .gpu_tier import ARCH, BATCH, DEVICE, IMAGE, WORKERS, finite_losses, on_device, train


def test_torchvision_v2_preset_trains_with_ema(runs, images, saw):
    size = int(IMAGE)
    args = ["--config", "recipes/torchvision_v2.toml", "-a", ARCH, "-b", BATCH, "-j", WORKERS,
            "-p", "1", "--epochs", "1", "--steps-per-epoch", "6", "--warmup-epochs", "0",
            "--train-crop-size", str(size), "--val-resize-size", str(size + size // 8),
            "--val-crop-size", str(size), "--model-ema-steps", "1", "--device", DEVICE, images]
    log = train(runs, "recipe-torchvision_v2", "ddp.py", args, nproc=1)
    losses = finite_losses(log)
    on_device(log)
    assert log.get("val_ema"), "no validation of the EMA weights was logged"
    ema = log["val_ema"][-1]
    assert 0 <= ema["top1"] <= 100 and ema["count"] == log["val"][-1]["count"]
    saw(f"{len(losses)} steps, loss {losses[-1]:.3f}; top-1 {log['val'][-1]['top1']:.2f}, "
        f"EMA {ema['top1']:.2f}")
