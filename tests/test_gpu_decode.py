"""`--data-backend gpu` on the CPU: TorchCodec decodes in the training process, one roi_align
crops and resizes the batch. Against the `pytorch` backend: the same samples in the same order
on each rank, the same crop boxes and flips, images within the resize's tolerance; damaged files
decoded or skipped and counted alike; real runs, a 2-rank one and an exact mid-epoch resume.

The tolerance: the two backends cut the same box out of the same decoded pixels (libjpeg-turbo
in both on a CPU), but resize it differently. Enlarging, roi_align's single bilinear sample per
pixel is torchvision's bilinear resize (equal here to float rounding); shrinking, roi_align
averages ceil(box/output) bilinear samples over each output pixel's footprint (a box filter)
where torchvision's antialiased resize weighs a triangle twice as wide, and rounds to uint8.
Both are weighted averages of the same few neighbouring pixels, so they differ only where the
image changes within a pixel or two. Measured on the tiny folder (boxes up to ~2x the output),
in normalised units (one level of 255 is about 0.017): batches differ by 0.018-0.029 on average
at 32 px (0.005 at 48 px, where most boxes are enlarged), no image by more than 0.071 on
average, no pixel by more than 0.49 (a sharp edge). The bounds:
0.05 per batch, 0.1 per image, 1.0 per pixel. What they catch: the same images with every box
moved by one pixel differ by 0.36 per batch, at least 0.18 per image and up to 2.7 per pixel;
with every flip wrong, 0.71 and up to 4.4. The crops themselves are also checked exactly
(against roi_align of the `pytorch` backend's own crop, and torchvision's resize of the box).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import roi_align
from torchvision.transforms.v2 import functional as TF

from conftest import (LOADER_WORKERS, TINY, add_damaged_files, records, run_script, traced,
                      traced_samples)
from imagenet_recipes.config import UsageError, parse_args
from imagenet_recipes.data import Shard, build_loaders, read_image_uint8
from imagenet_recipes.data import gpu_decode
from imagenet_recipes.data.folders import image_folders

CPU = torch.device("cpu")
# normalised units, per batch, per image and per pixel; see the module docstring
BATCH_TOLERANCE, IMAGE_TOLERANCE, PIXEL_TOLERANCE = 0.05, 0.1, 1.0


@pytest.fixture
def torchcodec():
    return pytest.importorskip("torchcodec", reason="torchcodec is in requirements.txt; this "
                               "environment lacks it")


DECODER_MODULES = {"torchcodec": "torchcodec", "nvimgcodec": "nvidia.nvimgcodec"}


@pytest.fixture(params=list(DECODER_MODULES))
def gpu_decoder(request):
    """Each --gpu-decoder in turn (its flags), on the CPU: libjpeg-turbo through TorchCodec
    (whole images) and through nvImageCodec (each crop's region)."""
    pytest.importorskip(DECODER_MODULES[request.param],
                        reason="requirements.txt has it; this environment lacks it")
    return ["--gpu-decoder", request.param]


def _cfg(data, backend="gpu", *extra):
    return parse_args(["-a", "timm/test_resnet", "--image-size", "32", "-b", "8", "-j", "0",
                       "--seed", "3", "--data-backend", backend, *map(str, extra), str(data)],
                      entry="nd")


def _batches(cfg, split: str, rank: int = 0, world: int = 1, epoch: int = 1):
    """Every (images, targets) batch of one rank's pass over `split`, and its skipped count."""
    train, val, _ = build_loaders(cfg, Shard(rank, world, is_main=rank == 0), CPU)
    loader = train if split == "train" else val
    loader.set_epoch(epoch)
    batches = [(x, y) for x, y in loader]
    train.close()
    val.close()
    return batches, loader.skipped


def _assert_close_to_pytorch(data, split: str, rank: int = 0, world: int = 1, *extra):
    """The gpu backend's pass equals the pytorch backend's: batches, targets, skipped count;
    images within the tolerance. -> the differences: (mean, worst image's mean, max)."""
    ours, skipped = _batches(_cfg(data, "gpu", *extra), split, rank, world)
    theirs, skipped_pt = _batches(_cfg(data, "pytorch", *extra), split, rank, world)
    assert skipped == skipped_pt
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs]
    x, x_pt = torch.cat([x for x, _ in ours]), torch.cat([x for x, _ in theirs])
    assert x.dtype == torch.float32 and x.shape == x_pt.shape
    diff = (x - x_pt).abs()
    worst_image = diff.mean((1, 2, 3)).max()
    assert diff.mean() < BATCH_TOLERANCE, diff.mean()
    assert worst_image < IMAGE_TOLERANCE and diff.max() < PIXEL_TOLERANCE, (worst_image,
                                                                             diff.max())
    return diff.mean().item(), worst_image.item(), diff.max().item()


# --- the pieces ----------------------------------------------------------------------------------
def test_crop_draw_is_the_pytorch_backends_crop_and_flip(tiny_imagefolder, torchcodec):
    """CropDraw's box and flip, applied with torchvision's own crop and resize, give exactly the
    image the pytorch backend's dataset gives for the same sample key."""
    cfg = _cfg(tiny_imagefolder, "pytorch")
    train_set, _ = image_folders(cfg)
    draw = gpu_decode.CropDraw(cfg)
    flips = set()
    for index in range(0, len(train_set), 5):
        for seed in (index, 10 ** 15 + index):
            image, target, unreadable = train_set[(index, seed, None)]
            decoded = read_image_uint8(train_set.samples[index][0])
            (top, left, h, w), flip = draw(seed, *decoded.shape[1:])
            expected = TF.resized_crop(decoded, top, left, h, w, [32, 32], antialias=True)
            expected = TF.horizontal_flip(expected) if flip else expected
            assert torch.equal(image, expected), (index, seed)
            flips.add(flip)
    assert flips == {True, False}


@pytest.mark.parametrize("strip_rows", [gpu_decode._STRIP_ROWS, 50])
def test_one_roi_align_over_the_packed_batch_is_each_crop_resized_alone(strip_rows, monkeypatch):
    """Packing the boxes into one canvas (several strips when it is tall) changes nothing: each
    output is roi_align of its own cut-out region (which clamps at the region's edges, as the
    pytorch backend's crop-then-resize does); enlarged ones equal torch's bilinear resize."""
    monkeypatch.setattr(gpu_decode, "_STRIP_ROWS", strip_rows)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, (h, w) in enumerate([(40, 60), (72, 33), (17, 90), (64, 64), (30, 20)]):
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        top, left = i % 3, (2 * i) % 5
        ch, cw = h - top - i, w - left - 1
        samples.append(gpu_decode.Decoded(image, i, (top, left, ch, cw),
                                          (0.0, 0.0, float(cw), float(ch)), i % 2 == 1))
    out = gpu_decode.crop_resize(samples, 24, CPU)
    assert out.shape == (5, 3, 24, 24) and out.dtype == torch.float32
    for s, o in zip(samples, out):
        top, left, h, w = s.region
        crop = s.image[:, top:top + h, left:left + w].float()[None]
        alone = roi_align(crop, torch.tensor([[0.0, 0, 0, w, h]]), (24, 24), 1.0, -1, True)[0]
        alone = alone.flip(2) if s.flip else alone
        assert torch.allclose(o, alone, atol=1e-3), s.region
        if h <= 24 and w <= 24:  # enlarged: torchvision's bilinear resize, to float rounding
            resized = F.interpolate(crop, (24, 24), mode="bilinear", align_corners=False)[0]
            resized = resized.flip(2) if s.flip else resized
            assert torch.allclose(o, resized, atol=1e-3)


@pytest.mark.parametrize("height,width,resize,crop", [(40, 60, 37, 32), (375, 500, 256, 224),
                                                       (500, 333, 256, 224), (30, 30, 73, 64)])
def test_the_validation_box_is_torchvisions_resize_then_centre_crop(height, width, resize, crop):
    """Sampled once per output pixel (plain bilinear), the box gives what Resize (without
    antialiasing) + CenterCrop give: the same sample positions, shrinking or enlarging."""
    image = torch.rand(1, 1, height, width) * 255
    box = torch.tensor([[0.0, *gpu_decode.val_box(height, width, resize, crop)]])
    scale = max(height, width) / min(height, width)
    out = roi_align(image, box, (crop, crop), 1.0, 1, True)[0]  # one sample: plain bilinear
    expected = TF.center_crop(TF.resize(image[0], [resize], antialias=False), [crop])
    assert out.shape == expected.shape
    # float32 positions computed two ways: within 1e-4 pixel, on pixels of random 0..255 values
    assert torch.allclose(out, expected, atol=0.05), (scale, (out - expected).abs().max())


def test_refused_augmentations_name_the_backends_that_have_them(tiny_imagefolder):
    for extra in (["--auto-augment", "ta_wide"], ["--random-erase", "0.25"]):
        with pytest.raises(UsageError, match=r"--data-backend gpu does not do .*pytorch, "
                                             r"dali-gpu or dali-cpu"):
            build_loaders(_cfg(tiny_imagefolder, "gpu", *extra), Shard(), CPU)


def test_without_its_decoder_the_backend_says_what_to_install(tiny_imagefolder, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # import fails
    with pytest.raises(UsageError, match="pip install torchcodec"):
        build_loaders(_cfg(tiny_imagefolder), Shard(), CPU)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(UsageError, match=r"pip install 'nvidia-nvimgcodec-cu13\[nvjpeg\]'"):
        build_loaders(_cfg(tiny_imagefolder, "gpu", "--gpu-decoder", "nvimgcodec"), Shard(), CPU)


# --- against the pytorch backend -----------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
def test_training_batches_match_the_pytorch_backend_on_every_rank(tiny_imagefolder, gpu_decoder,
                                                                  world):
    for rank in range(world):
        _assert_close_to_pytorch(tiny_imagefolder, "train", rank, world, *gpu_decoder)


def test_validation_and_progressive_crops_match_the_pytorch_backend(tiny_imagefolder,
                                                                    gpu_decoder):
    _assert_close_to_pytorch(tiny_imagefolder, "val", 1, 2, *gpu_decoder)
    # --progressive-resize: epoch 1 of 0..2 crops 48 px (enlarging most boxes)
    _assert_close_to_pytorch(tiny_imagefolder, "train", 0, 1, *gpu_decoder,
                             "--progressive-resize", "32", "64", "0", "2")


def test_decoding_only_the_crops_region_is_cutting_it_from_the_whole_image(tiny_imagefolder,
                                                                           torchcodec):
    """nvImageCodec's region decode on a CPU (libjpeg-turbo, the blocks outside the region
    skipped) gives the batches that TorchCodec's whole images, cut, give: bit for bit."""
    pytest.importorskip("nvidia.nvimgcodec")
    whole, _ = _batches(_cfg(tiny_imagefolder, "gpu", "--gpu-decoder", "torchcodec"), "train")
    regions, _ = _batches(_cfg(tiny_imagefolder, "gpu", "--gpu-decoder", "nvimgcodec"), "train")
    assert len(whole) == len(regions) > 1
    for (x, y), (x_region, y_region) in zip(whole, regions):
        assert torch.equal(y, y_region) and torch.equal(x, x_region)


def test_damaged_files_are_decoded_or_replaced_and_counted_as_by_pytorch(tiny_imagefolder,
                                                                         tmp_path, gpu_decoder):
    """Grayscale and CMYK JPEGs and a PNG named .JPEG go to the CPU decoder and train as with
    the pytorch backend; truncated, empty and non-image files are replaced (training, by the
    same next sample) or dropped (validation), and counted alike."""
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    made = add_damaged_files(sorted((data / "train").iterdir())[1])
    add_damaged_files(sorted((data / "val").iterdir())[2])
    ours, skipped = _batches(_cfg(data, "gpu", "-b", "7", *gpu_decoder), "train")
    assert skipped == sum(not ok for ok in made.values())
    _assert_close_to_pytorch(data, "train", 0, 1, "-b", "7", *gpu_decoder)
    _assert_close_to_pytorch(data, "val", 0, 1, "-b", "7", *gpu_decoder)


# --- real runs -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_gpu_backend_trains_with_loader_workers(tiny_imagefolder, tmp_path, torchcodec):
    run_script("nd.py", TINY + LOADER_WORKERS + ["-b", "8", "--epochs", "2", "--lr", "0.4",
                                                 "--data-backend", "gpu", "--channels-last",
                                                 "--logdir", tmp_path, "--run-name", "gpu",
                                                 tiny_imagefolder])
    epochs = records(tmp_path / "gpu", "train_epoch")
    assert [e["count"] for e in epochs] == [64, 64] and all(e["skipped"] == 0 for e in epochs)
    assert [v["count"] for v in records(tmp_path / "gpu", "val")] == [20, 20]
    assert records(tmp_path / "gpu", "run")[0]["config"]["data_backend"] == "gpu"


@pytest.mark.slow
def test_two_ranks_train_each_sample_once_per_epoch(tiny_imagefolder, tmp_path, torchcodec):
    prefix, env = traced("ddp.py", tmp_path / "trace")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *prefix, *map(str, TINY + ["-b", "4", "--epochs", "2", "--data-backend", "gpu",
                                      "--logdir", tmp_path, "--run-name", "ddp",
                                      tiny_imagefolder])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for epoch in (0, 1):
        assert Counter(traced_samples(tmp_path / "trace", epoch)) == Counter(range(64))
    assert [v["count"] for v in records(tmp_path / "ddp", "val")] == [20, 20]


@pytest.mark.slow
def test_damaged_data_is_decoded_or_skipped_and_counted(tiny_imagefolder, tmp_path, torchcodec):
    """As tests/test_fault_tolerance.py's test of the same name, with --data-backend gpu: 2 ranks,
    odd formats train, undecodable files are skipped and counted over both ranks, validation
    counts each readable image once."""
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    train_damaged = add_damaged_files(sorted((data / "train").iterdir())[1])
    val_damaged = add_damaged_files(sorted((data / "val").iterdir())[2])
    run_script("ddp.py", TINY + ["-b", "7", "--epochs", "1", "--data-backend", "gpu",
                                 "--logdir", tmp_path, "--run-name", "damaged", data], nproc=2)
    epoch = records(tmp_path / "damaged", "train_epoch")[0]
    assert epoch["count"] == 70 and epoch["skipped"] == sum(not ok for ok in
                                                             train_damaged.values())
    val = records(tmp_path / "damaged", "val")[0]
    assert val["count"] == 20 + sum(val_damaged.values())
    assert val["skipped"] == sum(not ok for ok in val_damaged.values())


def test_the_decoder_bounds_catch_a_crop_one_pixel_off_and_a_mirrored_one(tiny_imagefolder):
    """The GPU tier's bounds on a decoder against libjpeg-turbo (tests/decode_agreement.py),
    here with nvImageCodec's CPU decoder, which is libjpeg-turbo: the same crops agree (exactly
    here); a crop cut one pixel down and right, or mirrored, does not."""
    pytest.importorskip("nvidia.nvimgcodec")
    from decode_agreement import agreement, agrees
    from imagenet_recipes.data.jpeg_decoders import make_decoder

    files = sorted((tiny_imagefolder / "train").rglob("*.JPEG"))[:24]
    wholes = [read_image_uint8(str(f)) for f in files]
    regions = [(h // 4, w // 4, h // 2, w // 2) for h, w in (x.shape[1:] for x in wholes)]
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    ours = make_decoder("nvimgcodec", CPU)(data, regions)

    def cut(dy: int = 0, dx: int = 0) -> list:
        return [x[:, t + dy:t + dy + h, l + dx:l + dx + w] for x, (t, l, h, w) in
                zip(wholes, regions)]

    same = agreement(ours, cut())
    assert agrees(same) and same["mean_abs"] == 0, same
    off = agreement(ours, cut(1, 1))
    mirrored = agreement([x.flip(2) for x in ours], cut())
    assert not agrees(off), off
    assert not agrees(mirrored), mirrored
