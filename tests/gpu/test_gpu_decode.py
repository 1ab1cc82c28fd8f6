"""Group `decode`: `--data-backend gpu` on the device with each --gpu-decoder (TorchCodec's
nvJPEG decode; nvImageCodec's hardware and CUDA decoders, crop regions only), one roi_align per
batch: each decoder against libjpeg-turbo on the same crops (tests/decode_agreement.py's
bounds), the batches against the pytorch loader's, and the batches decoded beside the step
against those decoded in the training thread. Skipped, saying so, where a decoder is not
installed."""
import pytest
import torch

from .gpu_tier import (ARCH, DEVICE, SMALL, finite_losses, need_decoder, on_device,
                       one_process_loaders, train)

WHY = {"torchcodec": "pip install torchcodec (requirements.txt pins the tested version)",
       "nvidia.nvimgcodec": "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]' (requirements.txt "
                            "pins the tested version)"}
MODULE = {"torchcodec": "torchcodec", "nvimgcodec": "nvidia.nvimgcodec"}


def test_gpu_decode_loader_trains(runs, images, saw):
    need_decoder("torchcodec", "torchcodec", WHY["torchcodec"])
    log = train(runs, "gpu-decode", "nd.py", [*SMALL, "--data-backend", "gpu",
                                              "--channels-last", images])
    device = on_device(log)
    losses = finite_losses(log)
    assert all(e["skipped"] == 0 for e in log["train_epoch"]), log["train_epoch"]
    # every generated JPEG decoded by the GPU decoder, none by torchvision on the CPU
    assert all(e["cpu_decoded"] == 0 for e in log["train_epoch"] + log["val"]), \
        [e.get("cpu_decoded_reasons") for e in log["train_epoch"] + log["val"]]
    saw(f"{len(losses)} steps on {device}, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        "no image decoded on the CPU")


# About 25 ms of a GPU's cycles (torch.cuda._sleep spins for that many clock cycles)
LATE_CYCLES = 50_000_000


def _late(prepare):
    """The gpu loader's batch preparation, ending on its stream with the batch's images NaN for
    a while, then right: a reader not ordered after the side stream reads NaN."""
    def late(batch, size):
        prepared = prepare(batch, size)
        if prepared is not None and DEVICE == "cuda":
            images = prepared[0]
            kept = images.clone()
            images.fill_(float("nan"))
            torch.cuda._sleep(LATE_CYCLES)
            images.copy_(kept)
        return prepared
    return late


def _batches(backend: str, images, split: str, *extra: str, ahead: int = 2,
             late: bool = False):
    """In this process: every batch of one pass of `split`, as (images, targets) on the device
    (`ahead`: the gpu backend's batches decoded beside the step, 0: in this thread). `late`:
    each batch finishes late on the side stream (_late), and the training stream waits before
    it reads each one, as a step would, while the thread prepares the next batches: a missing
    wait on the side stream's event reads NaN, a missing record_stream lets the next batch
    overwrite the one still to be read."""
    from imagenet_recipes.config import parse_args

    cfg = parse_args(["-a", ARCH, "--image-size", "64", "-b", "16", "-j", "2", "--seed", "7",
                      "--data-backend", backend, "--channels-last", *extra, str(images)])
    train_loader, val_loader, _ = one_process_loaders(cfg, torch.device(DEVICE))
    loader = train_loader if split == "train" else val_loader
    loader.ahead = ahead
    loader.set_epoch(1)
    if late:
        loader._prepare = _late(loader._prepare)

    def taken(x, y):
        if late and DEVICE == "cuda":
            torch.cuda._sleep(LATE_CYCLES)  # the step before, on the training stream
        return x.clone(), y.clone()

    try:
        return [taken(x, y) for x, y in loader], loader.skipped
    finally:
        train_loader.close()
        val_loader.close()


@pytest.mark.parametrize("decoder", ["nvimgcodec", "torchcodec"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_decode_batches_match_the_pytorch_loaders(decoder, split, images, saw, number):
    """The same samples in the same order, the same layout, images close: the resize's
    difference from torchvision's antialiased one is bounded by tests/test_gpu_decode.py (0.05
    per batch, 0.1 per image, in normalised units, where one level of 255 is about 0.017),
    loosened by the decoders' own (a level or two on average; held apart to
    tests/decode_agreement.py's bounds in the check below). No bound on single pixels: at
    colour edges a GPU decoder's chroma upsampling moves values by much more (2.28 normalised,
    about 130 levels, at one pixel on an H200 with TorchCodec), which the share bound of the
    decoder check keeps rare."""
    need_decoder(decoder, MODULE[decoder], WHY[MODULE[decoder]])
    ours, skipped = _batches("gpu", images, split, "--gpu-decoder", decoder)
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
    # TorchCodec repeats chroma on a GPU (jpeg_decoders.py): measured, not bounded there
    repeated_chroma = decoder == "torchcodec" and DEVICE == "cuda"
    saw(f"{decoder} {split}: {sum(len(y) for _, y in ours)} images, same targets and layout; "
        f"vs pytorch mean |diff| {mean:.4f}, worst image {image:.4f}, max {pixel:.3f} "
        f"(normalised{'; chroma repeated: measured, not bounded' if repeated_chroma else ''})")
    if not repeated_chroma:
        assert mean < 0.07 and image < 0.15, (mean, image, pixel)


@pytest.mark.parametrize("decoder", ["nvimgcodec", "nvimgcodec-repeated-chroma", "torchcodec"])
def test_gpu_decoders_agree_with_libjpeg_turbo_on_the_same_crops(decoder, images, saw, number):
    """Each GPU decoder's crops of the training JPEGs against libjpeg-turbo's (torchvision's
    CPU decode_image), in 0-255: tests/decode_agreement.py's bounds (torchvision's and
    TorchCodec's own). Decoders that repeat chroma rather than interpolate it are measured, not
    bounded: TorchCodec on a GPU (its nvJPEG handle has nvJPEG's default flags, which no
    setting of TorchCodec changes) and nvImageCodec told to (DALI's default): what the
    interpolation buys."""
    from decode_agreement import agreement, agrees  # tests/, as pytest's rootdir conftest has it
    from torchvision.io import ImageReadMode, decode_image

    from imagenet_recipes.data import jpeg_decoders

    name = decoder.split("-")[0]
    need_decoder(name, MODULE[name], WHY[MODULE[name]])
    device = torch.device(DEVICE)
    repeated_chroma = decoder.endswith("repeated-chroma") or (name == "torchcodec"
                                                               and device.type == "cuda")
    decode = (jpeg_decoders.NvImageCodecDecoder(device, fancy_upsampling=False)
              if decoder.endswith("repeated-chroma") else jpeg_decoders.make_decoder(name, device))
    files = sorted((images / "train").rglob("*.JPEG"))[:128]
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    wholes = [decode_image(d, mode=ImageReadMode.RGB) for d in data]
    # a crop of each image's middle, away from the edges, as RandomResizedCrop cuts them
    regions = [(h // 5, w // 6, h // 2, (2 * w) // 3) for h, w in (x.shape[1:] for x in wholes)]
    decoded = decode(data, regions)
    refused = [x.reason for x in decoded if isinstance(x, jpeg_decoders.Refused)]
    assert not refused, f"the decoder refused {len(refused)} generated JPEGs: {refused[0]}"
    if not decode.crops:
        decoded = [x[:, t:t + h, l:l + w] for x, (t, l, h, w) in zip(decoded, regions)]
    assert all(x.device.type == device.type for x in decoded)
    numbers = agreement(decoded, [x[:, t:t + h, l:l + w] for x, (t, l, h, w) in
                                  zip(wholes, regions)])
    for key, value in numbers.items():
        number(key, round(value, 5))
    saw(f"{decoder}: {len(files)} crops vs libjpeg-turbo: mean |diff| "
        f"{numbers['mean_abs']:.3f} levels, {100 * numbers['within_3']:.2f} % within 3"
        f"{' (chroma repeated: measured, not bounded)' if repeated_chroma else ''}")
    if not repeated_chroma:
        assert agrees(numbers), numbers


def test_gpu_decode_batches_beside_the_step_are_those_decoded_in_line(images, saw):
    """Batches decoded ahead on a side stream by a background thread (the default) are the
    batches decoded in the training thread, bit for bit, with each batch finishing late on the
    side stream and the training stream busy before it reads each one: the hand-over (the
    event the training stream waits on, record_stream) loses or mixes nothing."""
    need_decoder("nvimgcodec", "nvidia.nvimgcodec", WHY["nvidia.nvimgcodec"])
    ahead, _ = _batches("gpu", images, "train", "--gpu-decoder", "nvimgcodec", ahead=2,
                        late=True)
    in_line, _ = _batches("gpu", images, "train", "--gpu-decoder", "nvimgcodec", ahead=0)
    assert len(ahead) == len(in_line)
    for (x, y), (x_line, y_line) in zip(ahead, in_line):
        assert torch.equal(y, y_line) and torch.equal(x, x_line)
    saw(f"{len(ahead)} batches, identical with and without the overlap")


@pytest.mark.parametrize("decoder", ["torchcodec", "nvimgcodec", "nvimgcodec-whole"])
def test_gpu_decoders_agree_on_images_made_to_expose_their_faults(decoder, saw, number):
    """Each GPU decoder, TorchCodec (the default) included, held to tests/decode_agreement.py's
    bounds against libjpeg-turbo on images made to expose the usual faults: distinct levels per
    channel under one colour (chroma upsampling, interpolated or repeated, cannot matter, so
    no decoder is let off), fine asymmetric detail in luma. A decoder that swaps channels,
    mirrors, cuts its crop a pixel or a block off or returns garbage breaks them (the CPU half,
    tests/test_gpu_decode.py, plants each)."""
    from decode_agreement import agreement_on_made_images, agrees

    from imagenet_recipes.data import jpeg_decoders

    name = "nvimgcodec" if decoder.startswith("nvimgcodec") else decoder
    need_decoder(decoder, MODULE[name], WHY[MODULE[name]])
    numbers = agreement_on_made_images(jpeg_decoders.make_decoder(decoder, torch.device(DEVICE)))
    for key, value in numbers.items():
        number(key, round(value, 5))
    saw(f"{decoder}: 16 crops of made images vs libjpeg-turbo: mean |diff| "
        f"{numbers['mean_abs']:.3f} levels, {100 * numbers['within_3']:.2f} % within 3")
    assert agrees(numbers), numbers


def test_gpu_decode_preparing_a_batch_waits_for_nothing_but_its_decoder(images, saw):
    """The producer's work after decoding (gather, roi_align, flips, normalisation, the one
    copy of the batch's host tensors) makes no host synchronisation: CUDA's sync-debug mode
    raises on the first. The decoder's own call is left out: TorchCodec ends each call with a
    synchronisation, and nvImageCodec's is made to wait for its stream (jpeg_decoders.py)."""
    need_decoder("nvimgcodec", "nvidia.nvimgcodec", WHY["nvidia.nvimgcodec"])
    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data import gpu_resample
    from imagenet_recipes.data.host_batch import HostBatch

    cfg = parse_args(["-a", ARCH, "--image-size", "64", "-b", "16", "-j", "2", "--seed", "7",
                      "--data-backend", "gpu", "--gpu-decoder", "nvimgcodec", "--channels-last",
                      str(images)])
    train_loader, val_loader, _ = one_process_loaders(cfg, torch.device(DEVICE))
    train_loader.set_epoch(1)
    raw = iter(train_loader.loader)
    try:
        for step in range(3):  # two to warm up (allocations, kernels), then the one checked
            samples, _ = train_loader.decoder(next(raw))
            cuda = DEVICE == "cuda" and step == 2
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
            try:
                stage = HostBatch(torch.device(DEVICE))
                stage.add(torch.tensor([s.target for s in samples]))
                batch, _ = gpu_resample.resample(samples, 64, stage)
                train_loader.normalize(batch)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
    finally:
        del raw
        train_loader.close()
        val_loader.close()
    saw(f"a batch of {len(samples)} prepared after its decoding with no host synchronisation"
        f"{'' if DEVICE == 'cuda' else ' (the CPU: sync-debug mode not applicable)'}")
