"""`--data-backend gpu` on the CPU: TorchCodec decodes in the training process, one roi_align
crops and resizes the batch. Against the `pytorch` backend: the same samples in the same order
on each rank, the same crop boxes and flips, images within the resize's tolerance; damaged files
decoded or skipped and counted alike; real runs and a 2-rank one (its exact mid-epoch resume
is tests/test_fault_tolerance.py's, for each backend).

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

from conftest import (LOADER_WORKERS, REPO, TESTS, TINY, TRAIN, add_damaged_files, loaders_for,
                      records, run_forked, script_env, traced, traced_samples)
from imagenet_recipes.config import UsageError, parse_args
from imagenet_recipes.data import Shard, read_image_uint8
from imagenet_recipes.data import gpu_decode, gpu_resample
from imagenet_recipes.data.folders import image_folders
from imagenet_recipes.options import AugmentOptions, LoaderOptions, PlanOptions
from imagenet_recipes.run_plan import plan_run

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
    train, val, _ = loaders_for(cfg, Shard(rank, world, is_main=rank == 0), CPU)
    loader = train if split == "train" else val
    loader.set_epoch(epoch)
    batches = [(x, y) for x, y in loader]
    train.close()
    val.close()
    return batches, loader.skipped


def _assert_close_to_pytorch(data, split: str, rank: int = 0, world: int = 1, *extra,
                             decoder: tuple = ()):
    """The gpu backend's pass (with the `decoder` flags, its own) equals the pytorch backend's:
    batches, targets, skipped count; images within the tolerance. -> the differences: (mean,
    worst image's mean, max)."""
    ours, skipped = _batches(_cfg(data, "gpu", *decoder, *extra), split, rank, world)
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
    train_set, _ = image_folders(cfg.data, AugmentOptions.of(cfg))
    draw = gpu_decode.CropDraw(AugmentOptions.of(cfg))
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


@pytest.mark.parametrize("strip_rows", [gpu_resample._STRIP_ROWS, 50])
@pytest.mark.parametrize("layout", ["CHW", "HWC", "both"])
def test_one_roi_align_over_the_packed_batch_is_each_crop_resized_alone(strip_rows, layout,
                                                                        monkeypatch):
    """Packing the boxes into one canvas (several strips when it is tall) changes nothing: each
    output is roi_align of its own cut-out region (which clamps at the region's edges, as the
    pytorch backend's crop-then-resize does); enlarged ones equal torch's bilinear resize.
    Images in CHW memory (TorchCodec, torchvision) and HWC (nvImageCodec), alone or mixed in
    one batch, are read where they lie."""
    monkeypatch.setattr(gpu_resample, "_STRIP_ROWS", strip_rows)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, (h, w) in enumerate([(40, 60), (72, 33), (17, 90), (64, 64), (30, 20)]):
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        if layout == "HWC" or (layout == "both" and i % 2):  # a CHW view of HWC memory
            image = image.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        top, left = i % 3, (2 * i) % 5
        ch, cw = h - top - i, w - left - 1
        samples.append(gpu_resample.Decoded(image, i, (top, left, ch, cw),
                                          (0.0, 0.0, float(cw), float(ch)), i % 2 == 1))
    out = gpu_resample.crop_resize(samples, 24, CPU)
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
    box = torch.tensor([[0.0, *gpu_resample.val_box(height, width, resize, crop)]])
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
            loaders_for(_cfg(tiny_imagefolder, "gpu", *extra), Shard(), CPU)


def test_without_its_decoder_the_backend_says_what_to_install(tiny_imagefolder, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # import fails
    with pytest.raises(UsageError, match="pip install torchcodec"):
        loaders_for(_cfg(tiny_imagefolder), Shard(), CPU)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(UsageError, match=r"pip install 'nvidia-nvimgcodec-cu13\[nvjpeg\]'"):
        loaders_for(_cfg(tiny_imagefolder, "gpu", "--gpu-decoder", "nvimgcodec"), Shard(), CPU)


# --- against the pytorch backend -----------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
def test_training_batches_match_the_pytorch_backend_on_every_rank(tiny_imagefolder, gpu_decoder,
                                                                  world):
    for rank in range(world):
        _assert_close_to_pytorch(tiny_imagefolder, "train", rank, world, decoder=gpu_decoder)


def test_validation_and_progressive_crops_match_the_pytorch_backend(tiny_imagefolder,
                                                                    gpu_decoder):
    _assert_close_to_pytorch(tiny_imagefolder, "val", 1, 2, decoder=gpu_decoder)
    # --progressive-resize: epoch 1 of 0..2 crops 48 px (enlarging most boxes)
    _assert_close_to_pytorch(tiny_imagefolder, "train", 0, 1,
                             "--progressive-resize", "32", "64", "0", "2", decoder=gpu_decoder)


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
    _assert_close_to_pytorch(data, "train", 0, 1, "-b", "7", decoder=gpu_decoder)
    _assert_close_to_pytorch(data, "val", 0, 1, "-b", "7", decoder=gpu_decoder)


# --- real runs -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_gpu_backend_trains_with_loader_workers(tiny_imagefolder, tmp_path, torchcodec):
    run_forked("nd.py", TINY + LOADER_WORKERS + ["-b", "8", "--epochs", "2", "--lr", "0.4",
                                                 "--data-backend", "gpu", "--channels-last",
                                                 "--logdir", tmp_path, "--run-name", "gpu",
                                                 tiny_imagefolder])
    epochs = records(tmp_path / "gpu", "train_epoch")
    assert [e["count"] for e in epochs] == [64, 64] and all(e["skipped"] == 0 for e in epochs)
    assert [v["count"] for v in records(tmp_path / "gpu", "val")] == [20, 20]
    assert records(tmp_path / "gpu", "run")[0]["config"]["data_backend"] == "gpu"


@pytest.mark.slow
def test_two_ranks_train_each_sample_once_per_epoch(tiny_imagefolder, tmp_path, torchcodec):
    """The ranks forked as torchrun starts them (conftest.run_forked): the sampler's shards are
    the subject here, torchrun's own start is tested with real processes elsewhere."""
    (wrapper, *script), trace_env = traced("ddp.py", tmp_path / "trace")
    run_forked(wrapper, [*script, *TINY, "-b", "4", "--epochs", "2", "--data-backend", "gpu",
                         "--logdir", tmp_path, "--run-name", "ddp", tiny_imagefolder],
               nproc=2, env=trace_env)
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
    run_forked("ddp.py", TINY + ["-b", "7", "--epochs", "1", "--data-backend", "gpu",
                                 "--logdir", tmp_path, "--run-name", "damaged", data], nproc=2)
    epoch = records(tmp_path / "damaged", "train_epoch")[0]
    assert epoch["count"] == 70 and epoch["skipped"] == sum(not ok for ok in
                                                             train_damaged.values())
    # none of the six is a plain JPEG: each went to the CPU decoder, counted, with its reason
    assert epoch["cpu_decoded"] == len(train_damaged)
    assert list(epoch["cpu_decoded_reasons"]) == [gpu_decode.NOT_PLAIN_JPEG]
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


# --- no silent fallback ---------------------------------------------------------------------------
class _Faulty:
    """A stand-in GPU decoder: TorchCodec's CPU decode (libjpeg-turbo), then `fault`
    (decode_agreement.FAULTS) on each image and the crop it is asked for."""
    crops = True
    name = "faulty"

    def __init__(self, fault: str):
        from decode_agreement import FAULTS
        from imagenet_recipes.data.jpeg_decoders import make_decoder

        self.fault, self.whole = FAULTS[fault], make_decoder("torchcodec", CPU)
        torch.manual_seed(0)  # the garbage's

    def __call__(self, files, regions):
        def cut(x, dy=0, dx=0, region=None):
            top, left, h, w = region
            return x[:, top + dy:top + dy + h, left + dx:left + dx + w]

        return [self.fault(x, lambda y, dy=0, dx=0, r=r: cut(y, dy, dx, r))
                for x, r in zip(self.whole(files, [None] * len(files)), regions)]


@pytest.mark.parametrize("fault", ["none", "channels-swapped", "mirrored", "crop-one-pixel-off",
                                   "crop-one-block-off", "garbage"])
def test_the_agreement_bounds_catch_each_planted_fault_on_the_made_images(fault, torchcodec):
    """The CPU half of the GPU tier's bounded check of the default decoder (tests/gpu/
    test_gpu_decode.py): on images made to expose the usual faults (decode_agreement.py:
    distinct levels per channel, one colour so that chroma upsampling cannot matter, fine
    asymmetric detail in luma), libjpeg-turbo through TorchCodec agrees exactly; a stand-in
    that swaps channels, mirrors, cuts a pixel or a block off, or returns garbage breaks the
    bounds. And repeating chroma instead of interpolating it (what TorchCodec's nvJPEG does
    on a GPU) changes nothing on these images: nvImageCodec told to repeat it agrees too."""
    from decode_agreement import agreement_on_made_images, agrees
    from imagenet_recipes.data import jpeg_decoders

    if fault == "none":
        numbers = agreement_on_made_images(jpeg_decoders.make_decoder("torchcodec", CPU))
        assert agrees(numbers) and numbers["mean_abs"] == 0, numbers
        pytest.importorskip("nvidia.nvimgcodec")
        repeated = agreement_on_made_images(
            jpeg_decoders.NvImageCodecDecoder(CPU, fancy_upsampling=False))
        assert agrees(repeated) and repeated["mean_abs"] < 0.5, repeated
        return
    numbers = agreement_on_made_images(_Faulty(fault))
    assert not agrees(numbers), numbers


def _planted(mode: str, data, tmp_path, name: str) -> subprocess.CompletedProcess:
    """train/nd.py --data-backend gpu --gpu-decoder nvimgcodec, with nvImageCodec's decoder
    planted (tests/planted_decoder.py)."""
    cmd = [sys.executable, str(TESTS / "planted_decoder.py"), mode, str(TRAIN / "nd.py"),
           *map(str, TINY + ["-b", "8", "--epochs", "1", "--data-backend", "gpu",
                             "--gpu-decoder", "nvimgcodec", "--logdir", tmp_path,
                             "--run-name", name, data])]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=script_env())


@pytest.mark.slow
def test_a_decoder_that_decodes_nothing_is_refused_at_start(tiny_imagefolder, tmp_path):
    """nvImageCodec importing but decoding nothing (no nvJPEG, no hardware decoder): the run
    stops before training with one line naming the cause and the fix, exit 2 (it used to train
    to the end on the CPU without a word)."""
    pytest.importorskip("nvidia.nvimgcodec")
    proc = _planted("nothing", tiny_imagefolder, tmp_path, "nothing")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "--gpu-decoder nvimgcodec decoded nothing" in errors[0]
    assert "nvidia-nvimgcodec-cu13[nvjpeg]" in errors[0] and "--data-backend pytorch" in errors[0]
    # which nvJPEG the process holds: the nvidia-nvjpeg wheel's, loaded with the package
    assert "(nvJPEG loaded here: " in errors[0] and "/cu13/lib/libnvjpeg.so.13" in errors[0]
    assert not (tmp_path / "nothing").exists() or not records(tmp_path / "nothing", "train")


@pytest.mark.slow
def test_images_a_decoder_refuses_are_counted_with_their_reason(tiny_imagefolder, tmp_path):
    """The check at start passes, then the decoder refuses every third image: each goes to the
    CPU decoder, and the count (with its reason) reaches the progress line, the JSONL records
    and a line after the epoch; the batches stay whole."""
    pytest.importorskip("nvidia.nvimgcodec")
    proc = _planted("every-third", tiny_imagefolder, tmp_path, "third")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 8 batches of 8 training images (positions 2 and 5 refused), 20 validation images in
    # batches of 8, 8, 4 (positions 2, 5; 2, 5; 2)
    epoch = records(tmp_path / "third", "train_epoch")[0]
    assert epoch["count"] == 64 and epoch["cpu_decoded"] == 16
    assert epoch["cpu_decoded_reasons"] == {"nvimgcodec: no image (its log says why)": 16}
    val = records(tmp_path / "third", "val")[0]
    assert val["count"] == 20 and val["cpu_decoded"] == 5
    last = records(tmp_path / "third", "train")[-1]
    assert last["cpu_decoded"] == 16
    assert "cpu-decoded 16" in proc.stdout
    assert "16 training images decoded on the CPU by torchvision, not by --gpu-decoder " \
           "nvimgcodec" in proc.stdout


def test_out_of_memory_and_cuda_errors_are_raised_not_decoded_on_the_cpu(monkeypatch):
    """A file's own error is a refusal (decoded on the CPU, counted); the device's is raised."""
    pytest.importorskip("torchcodec")
    from imagenet_recipes.data import jpeg_decoders

    decoder = jpeg_decoders.make_decoder("torchcodec", CPU)
    files = [torch.zeros(4, dtype=torch.uint8)] * 3

    def fails_with(err):
        def decode_jpeg(data, device):
            if isinstance(data, list) or int(data.sum()) == 0:
                raise err
            return torch.zeros((3, 2, 2), dtype=torch.uint8)
        return decode_jpeg

    for err in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("CUDA error: an illegal memory access was encountered"),
                RuntimeError("nvjpegDecodeJpegDevice failed with status: 6")):
        monkeypatch.setattr(decoder, "decode_jpeg", fails_with(err))
        with pytest.raises(type(err)):
            decoder(files, [None] * 3)
    # a damaged file among good ones: refused with TorchCodec's reason, the rest decoded
    monkeypatch.setattr(decoder, "decode_jpeg", fails_with(RuntimeError("Not a JPEG file")))
    good = torch.ones(4, dtype=torch.uint8)
    out = decoder([good, files[0], good], [None] * 3)
    assert isinstance(out[1], jpeg_decoders.Refused) and "Not a JPEG file" in out[1].reason
    assert out[0].shape == out[2].shape == (3, 2, 2)
    # every file of a batch refused alone: not the files' fault
    with pytest.raises(RuntimeError, match="decoded none of the 3 JPEGs"):
        decoder(files, [None] * 3)


@pytest.mark.parametrize("name", list(DECODER_MODULES))
def test_the_check_at_start_decodes_a_known_jpeg_where_the_run_decodes(name):
    pytest.importorskip(DECODER_MODULES[name])
    from imagenet_recipes.data.decoder_check import probe_decoder

    line = probe_decoder(name, CPU)
    assert line.startswith(f"{name}: decodes on the CPU") and "0.00 levels" in line


def test_the_decoders_are_built_as_dali_builds_its_own(monkeypatch):
    """nvImageCodec's decoder gets the rank's share of the cores as CPU threads (not every core
    for each decoder), buffers preallocated for the batch size, the hardware decoder's share
    from --gpu-hw-decoder-load and no CPU backend on a GPU; one decoder per rank."""
    from types import SimpleNamespace

    from imagenet_recipes.data import gpu_decode, jpeg_decoders

    built = []

    class Backend:
        def __init__(self, kind, load_hint=None):
            self.kind, self.load_hint = kind, load_hint

    def decoder(**kwargs):
        built.append(kwargs)
        return SimpleNamespace()

    kinds = SimpleNamespace(HW_GPU_ONLY="hw", GPU_ONLY="gpu", HYBRID_CPU_GPU="hybrid",
                            CPU_ONLY="cpu")
    fake = SimpleNamespace(Decoder=decoder, Backend=Backend, BackendKind=kinds,
                           NVIMGCODEC_DEVICE_CPU_ONLY=-99999)
    monkeypatch.setattr(jpeg_decoders, "import_nvimgcodec", lambda: fake)
    settings = jpeg_decoders.DecoderSettings(threads=2, batch_size=208, hw_load=0.9)
    jpeg_decoders.make_decoder("nvimgcodec", torch.device("cuda", 3), settings)
    gpu = built.pop()
    assert gpu["device_id"] == 3 and gpu["max_num_cpu_threads"] == 2
    assert set(gpu["options"].split()) == {
        ":fancy_upsampling=1", "nvjpeg_cuda_decoder:preallocate_buffers=1",
        "nvjpeg_hw_decoder:preallocate_batch_size=208"}
    assert [(b.kind, b.load_hint) for b in gpu["backends"]] == [
        ("hw", 0.9), ("gpu", None), ("hybrid", None)]
    jpeg_decoders.make_decoder("nvimgcodec", CPU, settings)
    cpu = built.pop()
    assert cpu["device_id"] == -99999 and cpu["max_num_cpu_threads"] == 2
    assert [b.kind for b in cpu["backends"]] == ["cpu"]

    # What the backend builds: 8 ranks of a 16-core node, -b 208, --gpu-hw-decoder-load 0.9
    seen = []
    monkeypatch.setattr(gpu_decode, "make_decoder",
                        lambda name, device, s: seen.append((name, s)) or SimpleNamespace())
    monkeypatch.setattr(gpu_decode, "check_decoder", lambda decode, device: "checked")
    monkeypatch.setattr(gpu_decode, "cores_per_process", lambda local_world: 16 // local_world)
    cfg = parse_args(["-a", "resnet50", "-b", "208", "-j", "0", "--data-backend", "gpu",
                      "--gpu-decoder", "nvimgcodec", "--gpu-hw-decoder-load", "0.9",
                      "/nonexistent"], entry="nd")
    with pytest.raises(UsageError, match="does not exist"):  # after the decoder is made
        gpu_decode.build(LoaderOptions.of(cfg), Shard(0, 8, local_world_size=8), CPU,
                         plan_run(PlanOptions.of(cfg), 8, "cpu"))
    assert seen == [("nvimgcodec", jpeg_decoders.DecoderSettings(threads=2, batch_size=208,
                                                                 hw_load=0.9))]
    with pytest.raises(UsageError, match="--gpu-hw-decoder-load is a share"):
        parse_args(["--data-backend", "gpu", "--gpu-hw-decoder-load", "1.5", "/x"], entry="nd")


def test_region_decoding_in_the_workers_says_once_when_nvimgcodec_is_missing(
        tiny_imagefolder, monkeypatch, capsys):
    """Without nvImageCodec the pytorch backend's workers decode whole images (slower, same
    samples): one line says so, once per process, on the main rank."""
    from imagenet_recipes.data import folders

    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    monkeypatch.setattr(folders, "_told_whole_decoding", False)
    for _ in range(2):
        train, val, _ = loaders_for(_cfg(tiny_imagefolder, "pytorch"), Shard(), CPU)
        train.close()
        val.close()
    said = [line for line in capsys.readouterr().out.splitlines() if "nvImageCodec" in line]
    assert len(said) == 1 and "decode whole images" in said[0], said
    assert "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'" in said[0]
    train, val, _ = loaders_for(_cfg(tiny_imagefolder, "pytorch"), Shard(1, 2, is_main=False),
                                  CPU)
    assert not capsys.readouterr().out


# --- the batch's trip to the device -------------------------------------------------------------
class _Moves(torch.overrides.TorchFunctionMode):
    """Counts the calls that can move host data to a device: Tensor.to or .cuda with a device,
    torch.tensor / as_tensor / from_numpy given one. (Allocating on the device, torch.empty or
    arange with device=, copies nothing from the host.)"""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_device = any(isinstance(a, (torch.device, str)) for a in args[1:]) or \
            kwargs.get("device") is not None
        if (func in (torch.Tensor.to, torch.Tensor.cuda) and to_device) or (
                func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None):
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_producer_sends_each_batch_to_the_device_in_one_copy(tiny_imagefolder, gpu_decoder,
                                                                 split, monkeypatch):
    """Preparing a batch (decode, gather, roi_align, flips, targets) moves host data to the
    device once: every small host tensor (gather indices, boxes, flips, targets; a few per group
    of crops) goes in one packed copy (host_batch.py), not one blocking copy each. On the CPU
    the packing and the copy run as a GPU's would (host_batch.packs forced), and every call
    that could move host data is counted: one per batch. The batches are the same as without
    the packing."""
    from imagenet_recipes.data import host_batch

    cfg = _cfg(tiny_imagefolder, "gpu", *gpu_decoder)
    plain, _ = _batches(cfg, split)
    monkeypatch.setattr(host_batch, "packs", lambda device: True)
    sends = []
    send = host_batch.HostBatch.send
    monkeypatch.setattr(host_batch.HostBatch, "send",
                        lambda self: sends.append(len(self.parts)) or send(self))
    train, val, _ = loaders_for(cfg, Shard(), CPU)
    loader = train if split == "train" else val
    loader.ahead = 0  # prepared in this thread, where the counting mode is
    loader.set_epoch(1)
    counted, packed = [], []
    with _Moves() as moves:
        for x, y in loader:
            counted.append(len(moves.calls))
            packed.append((x.clone(), y.clone()))
    train.close()
    val.close()
    assert len(packed) == len(plain) >= 2
    assert counted == list(range(1, len(packed) + 1)), moves.calls  # one `to` per batch
    assert set(moves.calls) == {"to"} and len(sends) == len(packed)
    assert min(sends) >= 5  # rows, boxes, places of a group; flips; targets
    for (x, y), (x_plain, y_plain) in zip(packed, plain):
        assert torch.equal(y, y_plain) and torch.equal(x, x_plain)


# --- memory bounded by what is decoded ------------------------------------------------------------
def test_one_large_image_does_not_widen_the_canvas_of_the_whole_batch(monkeypatch):
    """63 crops of 150-450 px and one 5,000 x 3,000 px region (a large validation image) in one
    batch: every roi_align call's canvas is within 3x its own regions' pixels (rows and columns
    of padding included; 1.0-1.4x here), and the batch's canvases within 1.5x its pixels. One
    canvas as wide as the widest region for the whole batch (how it was) is 6.8x them here (7
    strips of 4,086 rows x 5,001 columns). Each sample is still its own region resampled
    alone, in its place in the batch."""
    canvases = []
    pack = gpu_resample.pack_regions

    def measured(pixels, plan, rows):
        canvas = pack(pixels, plan, rows)
        padded = sum((h + 2) * (w + 1) for _, _, h, w in plan.regions)
        canvases.append((canvas.shape[0] * canvas.shape[2] * canvas.shape[3], padded))
        return canvas

    monkeypatch.setattr(gpu_resample, "pack_regions", measured)
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(64):
        h, w = ((3000, 5000) if i == 17 else
                tuple(int(x) for x in torch.randint(150, 451, (2,), generator=g)))
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        samples.append(gpu_resample.Decoded(image, i, (0, 0, h, w), (0.0, 0.0, float(w), float(h)),
                                          i % 2 == 0))
    out = gpu_resample.crop_resize(samples, 32, CPU)
    assert len(canvases) >= 2
    for pixels, padded in canvases:
        assert pixels <= 3 * padded, canvases
    total = sum(pixels for pixels, _ in canvases)
    regions = sum(h * w for _, _, h, w in (s.region for s in samples))
    assert total <= 1.5 * regions, (total, regions)
    for i in (0, 17, 63):  # the large one and two small ones, each where it belongs
        s = samples[i]
        _, _, h, w = s.region
        alone = roi_align(s.image.float()[None], torch.tensor([[0.0, 0, 0, w, h]]), (32, 32),
                          1.0, -1, True)[0]
        assert torch.allclose(out[i], alone.flip(2) if s.flip else alone, atol=1e-3)


def test_validation_resamples_only_the_pixels_its_centre_crop_reads():
    """The region validation decodes and packs: what Resize + CenterCrop's box reads, not the
    whole image; resampled from it, the box gives what it gives on the whole image."""
    image = torch.randint(0, 256, (3, 500, 375), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(2))
    box = gpu_resample.val_box(500, 375, 256, 224)
    (top, left, h, w), inner = gpu_resample.val_region(500, 375, box)
    assert h * w < 0.8 * 500 * 375
    whole = gpu_resample.crop_resize([gpu_resample.Decoded(image, 0, (0, 0, 500, 375), box, False)],
                                   224, CPU)
    cut = image[:, top:top + h, left:left + w]
    region = gpu_resample.crop_resize([gpu_resample.Decoded(cut, 0, (0, 0, h, w), inner, False)],
                                    224, CPU)
    # the same sample positions, up to float32 rounding of the shifted box (a few 1e-5 px,
    # 0.013 levels here, on noise that changes by up to 255 levels per pixel)
    assert (whole - region).abs().max() < 0.05
