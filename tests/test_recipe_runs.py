"""The recipe features in real runs of the entry scripts on CPU: every preset trains a few
steps, a run's saved config repeats it, EMA and clipping are exact across strategies (float64)
and survive a resume, and the DALI backend's augmentations do what the pytorch backend's do."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import REPO, TINY, records, run_forked, weights

PRESETS = sorted((REPO / "recipes").glob("*.toml"))
# A preset scaled down to the tiny set: small model, crops and batch, 9 one-step epochs (longer
# than every preset's warm-up), fp32 so that the time does not depend on the CPU's bf16.
SCALED_DOWN = ["-a", TINY[1], "-b", "8", "--epochs", "9", "--steps-per-epoch", "1",
               "--train-crop-size", "32", "--val-resize-size", "36", "--val-crop-size", "32",
               "--opt-level", "O0", "-j", "1", "-p", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_each_preset_trains_a_few_steps(preset, tiny_imagefolder, tmp_path):
    proc = run_forked("ddp_apex.py", ["--config", preset, *SCALED_DOWN, "--logdir", tmp_path,
                                      "--run-name", "r", tiny_imagefolder])
    assert "=> recipe " in proc.stdout and "--grad-accum" in proc.stdout  # what it changed
    run = records(tmp_path / "r", "run")[0]
    assert run["config"]["config"] == str(preset) and run["global_batch"] == 8
    losses = [r["loss"] for r in records(tmp_path / "r", "train")]
    assert len(losses) == 9 and all(math.isfinite(x) for x in losses)
    assert records(tmp_path / "r", "end")[0]["reason"] == "finished"
    if run["config"]["model_ema"]:
        assert [v["count"] for v in records(tmp_path / "r", "val_ema")] == [20] * 9


@pytest.mark.slow
def test_a_saved_config_repeats_the_run(tiny_imagefolder, tmp_path):
    args = TINY + ["-b", "8", "--epochs", "2", "--steps-per-epoch", "3", "--opt", "nesterov",
                   "--lr-schedule", "cosine", "--mixup-alpha", "0.2", "--cutmix-alpha", "1",
                   "--auto-augment", "ta_wide", "--model-ema", "--model-ema-steps", "2",
                   "--logdir", tmp_path]
    run_forked("nd.py", args + ["--run-name", "first", tiny_imagefolder])
    run_forked("nd.py", ["--config", tmp_path / "first", "--run-name", "again"])
    first, again = (records(tmp_path / name, "train") for name in ("first", "again"))
    assert [r["loss"] for r in first] == [r["loss"] for r in again]
    assert records(tmp_path / "again", "run")[0]["config"]["auto_augment"] == "ta_wide"


# nd vs DDP (2 x 4, SyncBN) in float64 with the features whose correctness depends on the
# strategy: clipping must see the reduced gradient, EMA the shared weights, the groups the
# same parameters.
UNCLIPPED = TINY + ["--epochs", "2", "--lr", "0.4", "--seed", "3", "--float64", "--opt",
                    "nesterov", "--norm-weight-decay", "0", "--model-ema",
                    "--model-ema-steps", "2", "--model-ema-decay", "0.99", "--lr-schedule",
                    "cosine", "--warmup-epochs", "0.5"]
PARITY = UNCLIPPED + ["--clip-grad-norm", "0.5"]
REL = 1e-6


def _state(run_dir, key):
    """The float tensors of the checkpoint's model ("model") or moving average ("model_ema")."""
    state = weights(run_dir)[key]
    state = state["model"] if key == "model_ema" else state
    return {k: v for k, v in state.items() if v.is_floating_point()}


def _assert_close(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=REL, atol=REL * 1e-2, msg=name)


@pytest.mark.slow
def test_ema_and_clipping_are_the_same_under_ddp_and_horovod(tiny_imagefolder, tmp_path):
    common = PARITY + ["--logdir", tmp_path, tiny_imagefolder]
    run_forked("nd.py", common + ["-b", "8", "--run-name", "nd"])
    run_forked("ddp.py", common + ["-b", "4", "--sync-bn", "--run-name", "ddp"], nproc=2)
    for key in ("model", "model_ema"):
        _assert_close(_state(tmp_path / "nd", key), _state(tmp_path / "ddp", key))
    ema, model = _state(tmp_path / "nd", "model_ema"), _state(tmp_path / "nd", "model")
    assert max((ema[k] - model[k]).abs().max().item() for k in model) > 1e-3  # it averages
    nd_val = records(tmp_path / "nd", "val_ema")
    assert [v["top1"] for v in nd_val] == pytest.approx(
        [v["top1"] for v in records(tmp_path / "ddp", "val_ema")])
    # Sensitivity: the clip is active (without it the run differs).
    run_forked("nd.py", UNCLIPPED + ["--logdir", tmp_path, "-b", "8", "--run-name",
                                     "unclipped", tiny_imagefolder])
    unclipped = _state(tmp_path / "unclipped", "model")
    assert max((unclipped[k] - model[k]).abs().max().item() for k in model) > 1e-3
    pytest.importorskip("horovod.torch", reason="Horovod is not built: "
                                                "bash launch/install_horovod.sh")
    from test_horovod import run_hvd

    run_hvd(common + ["-b", "4", "--sync-bn", "--run-name", "hvd"])
    for key in ("model", "model_ema"):
        _assert_close(_state(tmp_path / "nd", key), _state(tmp_path / "hvd", key))


# The EMA's resume under O2 (an fp32 average of the masters, bit for bit after a resume) is
# checked in tests/test_mixed_precision.py, in the O2 float16 DDP resume's runs.


# --- DALI's augmentations against the pytorch backend's ------------------------------------------
def _dali_augmented(files, size, policy, erase, seed):
    """uint8 HWC (policy) or normalised float (erasing) images through DALI's CPU operators:
    decode, resize to size x size, then the same functions imagenet_recipes/data/dali.py uses."""
    from nvidia.dali import fn, pipeline_def, types

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data.dali_augment import apply_policy, random_erase

    cfg = parse_args(["--dummy", "--auto-augment", policy])

    def graph():
        encoded, _ = fn.readers.file(files=files, labels=[0] * len(files), name="Reader")
        images = fn.resize(fn.decoders.image(encoded, output_type=types.RGB),
                           resize_x=size, resize_y=size)
        if erase:
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[128.0] * 3, std=[64.0] * 3)
            return random_erase(images, erase, fn, types)
        return apply_policy(images, cfg, size)

    pipe = pipeline_def(graph, enable_conditionals=True, batch_size=len(files), num_threads=1,
                        device_id=None, seed=seed)()
    pipe.build()
    out = pipe.run()[0]
    return torch.stack([torch.as_tensor(out.at(i)) for i in range(len(files))])


def _torch_augmented(files, size, policy, seed):
    from torchvision.io import decode_image
    from torchvision.transforms import v2

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data.augment import auto_augment

    transform = auto_augment(parse_args(["--dummy", "--auto-augment", policy])) or v2.Identity()
    torch.manual_seed(seed)
    resize = v2.Resize((size, size), antialias=True)
    return torch.stack([transform(resize(decode_image(f))) for f in files]).permute(0, 2, 3, 1)


@pytest.mark.parametrize("policy", ["imagenet", "ra", "ta_wide"])
def test_dali_policies_change_images_as_much_as_torchvisions(policy, tiny_imagefolder):
    """The same policy (not the same random draws): the mean absolute change it makes to the
    same 64 images is of the same size in both backends."""
    pytest.importorskip("nvidia.dali")
    files = sorted(str(p) for p in (tiny_imagefolder / "train").rglob("*.JPEG"))[:64]
    size = 32
    base = _dali_augmented(files, size, "none", 0.0, seed=1).float()
    dali = (_dali_augmented(files, size, policy, 0.0, seed=1).float() - base).abs().mean()
    plain = _torch_augmented(files, size, "none", seed=1).float()
    torch_change = (_torch_augmented(files, size, policy, seed=1).float() - plain).abs().mean()
    assert dali > 5 and torch_change > 5  # both really augment (pixel values 0..255)
    assert 0.67 < dali / torch_change < 1.5, (dali.item(), torch_change.item())  # 0.8-1.1 seen


def test_dali_random_erasing_matches_torchvisions_rate_and_area(tiny_imagefolder):
    pytest.importorskip("nvidia.dali")
    files = sorted(str(p) for p in (tiny_imagefolder / "train").rglob("*.JPEG"))[:64]
    erased = _dali_augmented(files, 32, "none", 0.5, seed=3)
    plain = _dali_augmented(files, 32, "none", 0.0, seed=3).permute(0, 3, 1, 2).float()
    boxes = ((erased == 0).all(1) & ((plain - 128) / 64 != 0).any(1)).float().mean((1, 2))
    hit = boxes > 0
    assert 0.3 < hit.float().mean() < 0.7  # p = 0.5
    # torchvision's area fraction is U(0.02, 0.33): mean 0.175
    assert 0.1 < boxes[hit].mean() < 0.25
