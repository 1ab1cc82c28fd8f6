"""The `pytorch` backend's training samples with only each RandomResizedCrop's region decoded
(nvImageCodec's CPU decoder, data/jpeg_decoders.py CropRegionReader) are the samples of decoding
the whole file: the same pixels, bit for bit, for every sample key, with the policies and
erasing after the crop, and for the files a folder really holds (grayscale, CMYK, PNGs named
.JPEG, damaged ones), which go the old way."""
from __future__ import annotations

import shutil

import pytest
import torch

from conftest import add_damaged_files
from imagenet_recipes.config import parse_args
from imagenet_recipes.data import jpeg_decoders
from imagenet_recipes.data.folders import image_folders
from imagenet_recipes.options import AugmentOptions

pytest.importorskip("nvidia.nvimgcodec", reason="requirements.txt has it; this environment "
                    "lacks it")


@pytest.fixture
def regions_decoded(monkeypatch) -> list:
    """One entry per sample the region reader gave (True) or left to whole decoding (False)."""
    seen = []
    read = jpeg_decoders.CropRegionReader.__call__

    def counted(self, data, crop):
        image = read(self, data, crop)
        seen.append(image is not None)
        return image

    monkeypatch.setattr(jpeg_decoders.CropRegionReader, "__call__", counted)
    return seen


def pairs(data, *extra, every: int = 3):
    """(with regions, whole) of every `every`th training sample, each under two seeds."""
    cfg = parse_args(["-a", "resnet18", "--image-size", "48", *extra, str(data)], entry="nd")
    train, _ = image_folders(cfg.data, AugmentOptions.of(cfg))
    assert train.decode_regions
    for index in range(0, len(train), every):
        for seed in (index, 10 ** 12 + index):
            train.decode_regions = True
            regions = train[(index, seed, None)]
            train.decode_regions = False
            whole = train[(index, seed, None)]
            yield index, regions, whole


@pytest.mark.parametrize("extra", [[], ["--auto-augment", "ta_wide", "--random-erase", "0.5"]],
                         ids=["crop-flip", "policy-erasing"])
def test_region_decoding_gives_the_samples_of_whole_decoding(tiny_imagefolder, extra,
                                                             regions_decoded):
    count = 0
    for index, (image, target, skipped), (image_whole, target_whole, skipped_whole) in \
            pairs(tiny_imagefolder, *extra):
        assert (target, skipped) == (target_whole, skipped_whole)
        assert torch.equal(image, image_whole), index
        count += 1
    assert count > 20 and regions_decoded == [True] * count  # every one through its region


@pytest.mark.parametrize("shift", [(0, 16), (16, 0), (0, 1)], ids=["one-MCU-right",
                                                                     "one-MCU-down", "one-pixel"])
def test_a_region_off_by_one_block_gives_other_pixels(tiny_imagefolder, monkeypatch, shift,
                                                      regions_decoded):
    """What the test above would see if the region decoded were not the crop's box: the box
    moved by one 16-pixel block (a 4:2:0 JPEG's MCU) or by one pixel gives other pixels for
    every sample decoded through it."""
    nvimgcodec = jpeg_decoders.import_nvimgcodec()
    exact = nvimgcodec.Region
    down, right = shift

    def moved(top, left, bottom, right_edge):
        # up or left where the box can move so; else down or right, which leaves the image
        # where the box already touches its far edge (nvImageCodec then decodes nothing and
        # the file is decoded whole)
        dy = -down if top >= down else down
        dx = -right if left >= right else right
        return exact(top + dy, left + dx, bottom + dy, right_edge + dx)

    monkeypatch.setattr(nvimgcodec, "Region", moved)
    alike = [torch.equal(image, image_whole)
             for _, (image, *_), (image_whole, *_) in pairs(tiny_imagefolder)]
    through_moved_box = [same for same, decoded in zip(alike, regions_decoded) if decoded]
    assert len(through_moved_box) >= 10 and not any(through_moved_box), \
        (sum(through_moved_box), len(through_moved_box), len(alike))


def test_files_other_than_plain_jpegs_are_decoded_whole_alike(tiny_imagefolder, tmp_path,
                                                              regions_decoded):
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    add_damaged_files(sorted((data / "train").iterdir())[0])
    for index, (image, target, skipped), (image_whole, target_whole, skipped_whole) in \
            pairs(data, every=1):
        assert (target, skipped) == (target_whole, skipped_whole), index
        assert torch.equal(image, image_whole), index
    assert True in regions_decoded and False in regions_decoded  # both ways taken


def test_validation_decodes_whole_images(tiny_imagefolder):
    cfg = parse_args(["-a", "resnet18", str(tiny_imagefolder)], entry="nd")
    _, val = image_folders(cfg.data, AugmentOptions.of(cfg))
    assert not val.decode_regions


def test_a_region_reader_that_cannot_be_made_leaves_whole_images_with_one_warning(
        tiny_imagefolder, monkeypatch):
    """nvImageCodec imports but its reader cannot be made in this process (a loader worker with
    CUDA hidden and libcuda present, say): every sample is still read, decoded whole, the same
    pixels as with regions; one warning says why, and no file is counted unreadable. (Made
    inside the per-file error handler, it made every file "unreadable" instead.)"""
    cfg = parse_args(["-a", "resnet18", "--image-size", "48", str(tiny_imagefolder)], entry="nd")
    expected, _ = image_folders(cfg.data, AugmentOptions.of(cfg))
    keys = [(index, index, None) for index in range(0, len(expected), 4)]
    wanted = [expected[key] for key in keys]

    def cannot(self):
        raise RuntimeError("nvImageCodec: CUDA driver initialisation failed")

    monkeypatch.setattr(jpeg_decoders.CropRegionReader, "__init__", cannot)
    train, _ = image_folders(cfg.data, AugmentOptions.of(cfg))
    assert train.decode_regions
    with pytest.warns(UserWarning) as warned:
        got = [train[key] for key in keys]
    said = [str(w.message) for w in warned if "region reader" in str(w.message)]
    assert len(said) == 1 and "could not be made here" in said[0], said
    assert "CUDA driver initialisation failed" in said[0] and "whole images" in said[0]
    assert not train.decode_regions
    for (image, target, skipped), (image_want, target_want, skipped_want) in zip(got, wanted):
        assert skipped == skipped_want == 0 and target == target_want
        assert torch.equal(image, image_want)
