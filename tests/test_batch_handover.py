"""How the `pytorch` backend's loader workers hand a batch to the training process: stacked once,
straight into shared memory (pickling it to the training process then copies nothing), in the
layout the samples were made in (a training crop resized channels-last is stacked with a plain
copy, not a transposing one), into a slot's memory the training process has released
(batch_memory.py), and normalised on the device into the layout the model wants."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import loaders_for
from imagenet_recipes.config import parse_args
from imagenet_recipes.data.batch_memory import SLOTS
from imagenet_recipes.data.folders import collate_uint8, image_folders
from imagenet_recipes.data.loading import UInt8Normalizer
from imagenet_recipes.options import AugmentOptions
from imagenet_recipes.strategies import Strategy

pytest.importorskip("nvidia.nvimgcodec", reason="requirements.txt has it; this environment "
                    "lacks it")

SIZE = 48


def collated_in_the_worker(batch):
    """collate_uint8 as the loader's worker runs it, with what only the worker can see: whether
    the batch's memory was shared before the hand-over."""
    images, targets, _, _ = collate_uint8(batch)
    return images, targets, images.untyped_storage().is_shared()


def worker_batches(dataset, keys):
    loader = DataLoader(dataset, batch_size=4, sampler=keys, num_workers=1,
                        collate_fn=collated_in_the_worker, multiprocessing_context="fork")
    return list(loader)


@pytest.fixture(scope="module")
def folders(tiny_imagefolder):
    cfg = parse_args(["-a", "resnet18", "--image-size", str(SIZE), str(tiny_imagefolder)],
                     entry="nd")
    return image_folders(cfg.data, AugmentOptions.of(cfg))


@pytest.mark.slow
def test_training_batches_are_stacked_channels_last_into_shared_memory(folders):
    train, _ = folders
    assert train.decode_regions
    keys = [(index, 1000 + index, None) for index in range(8)]
    batches = worker_batches(train, keys)
    for number, (images, targets, shared) in enumerate(batches):
        assert shared, "stacked into private memory, copied again to hand it over"
        assert images.shape == (4, 3, SIZE, SIZE)
        assert images.is_contiguous(memory_format=torch.channels_last)
        expected = [train[key][0] for key in keys[4 * number:4 * number + 4]]
        assert torch.equal(images, torch.stack(expected))  # the same pixels, only laid out
        assert targets.tolist() == [train[key][1] for key in keys[4 * number:4 * number + 4]]


@pytest.mark.slow
def test_validation_batches_keep_their_layout_in_shared_memory(folders):
    _, val = folders
    keys = [(index, 0, None) for index in range(8)]
    for number, (images, _, shared) in enumerate(worker_batches(val, keys)):
        assert shared
        assert images.is_contiguous()  # center crops of a CHW resize: stacked as they are
        expected = [val[key][0] for key in keys[4 * number:4 * number + 4]]
        assert torch.equal(images, torch.stack(expected))


def test_in_the_training_process_the_batch_is_made_in_private_memory(folders):
    train, _ = folders
    images, _, _, tag = collate_uint8([train[(index, index, None)] for index in range(3)])
    assert tag is None
    assert not images.untyped_storage().is_shared()
    assert images.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_channels_last_batch_is_normalised_into_the_layout_asked_for(channels_last):
    torch.manual_seed(0)
    planar = torch.randint(0, 256, (4, 3, 9, 7), dtype=torch.uint8)
    as_decoded = planar.contiguous(memory_format=torch.channels_last)
    normalize = UInt8Normalizer(torch.device("cpu"), channels_last)
    out = normalize(as_decoded)
    torch.testing.assert_close(out, normalize(planar), rtol=0, atol=0)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)


def pytorch_loaders(data, workers: int):
    cfg = parse_args(["-a", "resnet18", "--image-size", str(SIZE), "-b", "4", "-j",
                      str(workers), "--device", "cpu", str(data)], entry="nd")
    train, val, _ = loaders_for(cfg, Strategy().data_shard(), torch.device("cpu"))
    return train, val


@pytest.mark.slow
def test_a_worker_writes_again_only_into_memory_the_training_process_released(
        tiny_imagefolder):
    train, _ = pytorch_loaders(tiny_imagefolder, workers=1)
    try:
        train.set_epoch(0)
        batches = list(train.loader)  # not released: every batch still readable
        assert len(batches) == 16 > SLOTS
        tags = [batch.tag for batch in batches]
        # the worker's slots, each once; then fresh memory, as none was released
        assert sorted(tags[:SLOTS]) == [(0, slot) for slot in range(SLOTS)]
        assert tags[SLOTS:] == [None] * (len(tags) - SLOTS)
        expected = [train.loader.dataset[key] for key in train.sampler]
        for number, batch in enumerate(batches):
            assert torch.equal(batch.images,
                               torch.stack([image for image, _, _ in
                                            expected[4 * number:4 * number + 4]])), number

        for batch in batches:
            train.slots.release(batch.tag)
        train.set_epoch(1)
        tags = []
        for batch in train.loader:  # released as read: the slots serve every batch
            tags.append(batch.tag)
            train.slots.release(batch.tag)
        assert len(tags) == 16 and None not in tags
    finally:
        train.close()


@pytest.mark.slow
def test_batches_through_reused_memory_are_those_made_in_the_training_process(
        tiny_imagefolder):
    """Two epochs of training and validation batches from a worker writing into its slots are
    the batches made without workers, pixel for pixel."""
    seen = {}
    for workers in (0, 1):
        train, val = pytorch_loaders(tiny_imagefolder, workers)
        try:
            for epoch in range(2):
                train.set_epoch(epoch)
                seen[workers, "train", epoch] = [(images.clone(), targets.clone())
                                                 for images, targets in train]
            seen[workers, "val"] = [(images.clone(), targets.clone()) for images, targets in val]
        finally:
            train.close()
            val.close()
    for key in [("train", 0), ("train", 1), ("val",)]:
        ours, reference = seen[(1, *key)], seen[(0, *key)]
        assert len(ours) == len(reference) > 0
        for (images, targets), (images_ref, targets_ref) in zip(ours, reference):
            assert torch.equal(targets, targets_ref)
            assert torch.equal(images, images_ref), key
