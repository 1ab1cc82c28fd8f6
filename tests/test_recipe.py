"""Recipe features, each asserted by its effect, in-process: optimizers and weight-decay groups,
schedules, EMA, MixUp/CutMix and the losses, augmentations, repeated augmentation, progressive
resizing, gradient clipping, --config files and presets. Runs of the entry scripts with them
are in tests/test_recipe_runs.py."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from conftest import REPO, loaders_for
from imagenet_recipes.config import UsageError, parse_args
from imagenet_recipes.options import PlanOptions
from imagenet_recipes.options.optimization import OPTIMIZERS
from imagenet_recipes.data import Shard, ShardedSampler
from imagenet_recipes.data.augment import MEAN_PIXEL, progressive_crop, train_transform, val_sizes
from imagenet_recipes.data.loading import UInt8Normalizer
from imagenet_recipes.ema import ModelEMA, ema_decay_per_update
from imagenet_recipes.optim import build_optimizer, parameter_groups
from imagenet_recipes.precision import Precision
from imagenet_recipes.presets import (global_batch_target, large_batch_refusal, read_mapping,
                                      scaling_note, split_global_batch)
from imagenet_recipes.run_plan import plan_run
from imagenet_recipes.schedule import LrMultiplier, build_scheduler
from imagenet_recipes.targets import build_criterion, build_mixer

PRESETS = sorted((REPO / "recipes").glob("*.toml"))


def _cfg(*argv):
    return parse_args(["--dummy", *map(str, argv)])


# --- optimizer and weight-decay groups -----------------------------------------------------------
def _norm_params(model):
    return {f"{name}.{p}" for name, m in model.named_modules()
            if isinstance(m, nn.BatchNorm2d) for p in ("weight", "bias")}


def test_norm_and_bias_parameters_get_their_own_weight_decay():
    model = torchvision.models.resnet18(num_classes=4)
    cfg = _cfg("--wd", "1e-4", "--norm-weight-decay", "0", "--bias-weight-decay", "1e-5")
    groups = parameter_groups(cfg, model, list(model.named_parameters()))
    name_of = {id(p): name for name, p in model.named_parameters()}
    by_decay = {g["weight_decay"]: {name_of[id(p)] for p in g["params"]} for g in groups}
    everything = {name for name, _ in model.named_parameters()}
    norm = _norm_params(model)
    assert by_decay == {0.0: norm, 1e-5: {"fc.bias"}, 1e-4: everything - norm - {"fc.bias"}}
    # Without the options: one group, the layout of checkpoints written before them.
    assert len(parameter_groups(_cfg(), model, list(model.named_parameters()))) == 1


def test_o2_groups_hold_the_fp32_masters():
    model = torchvision.models.resnet18(num_classes=4)
    precision = Precision("O2", "bfloat16")
    precision.bind(torch.device("cpu"), notice=lambda m: None)
    precision.convert_module(model)
    precision.setup_masters(model)
    optimizer = build_optimizer(_cfg("--norm-weight-decay", "0"), model,
                                precision.named_optimizer_params(model), lr=0.1)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in params)
    assert model.conv1.weight.dtype == torch.bfloat16
    assert not any(p is model.conv1.weight for p in params)
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay_of[id(model.bn1.weight)] == 0.0  # fp32 norm layers are their own masters


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_takes_a_step(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    optimizer = build_optimizer(_cfg("--opt", name, "--norm-weight-decay", "0"), model,
                                list(model.named_parameters()), lr=0.01)
    expected = {"sgd": "SGD", "nesterov": "SGD", "adamw": "AdamW", "rmsprop": "RMSprop",
                "lars": "Lars", "lamb": "Lamb"}[name]
    assert type(optimizer).__name__ == expected
    assert optimizer.param_groups[0].get("nesterov", False) == (name == "nesterov")
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_lars_trust_ratio_on_a_known_tensor():
    """timm's LARS: update = lr * trust * (g + wd w), trust = 0.001 |w| / (|g| + wd |w|);
    the group without weight decay (biases) takes plain SGD steps."""
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 4.0]]))  # |w| = 5
        layer.bias.fill_(1.0)
    layer.weight.grad = torch.tensor([[0.6, 0.8]])  # |g| = 1
    layer.bias.grad = torch.tensor([0.5])
    optimizer = build_optimizer(_cfg("--opt", "lars", "--momentum", "0", "--wd", "0.1",
                                     "--bias-weight-decay", "0"), layer,
                                list(layer.named_parameters()), lr=2.0)
    optimizer.step()
    trust = 0.001 * 5.0 / (1.0 + 0.1 * 5.0)
    expected = torch.tensor([[3.0, 4.0]]) - 2.0 * trust * (torch.tensor([[0.6, 0.8]])
                                                           + 0.1 * torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(layer.weight.detach(), expected)
    torch.testing.assert_close(layer.bias.detach(), torch.tensor([1.0 - 2.0 * 0.5]))


# --- schedules ---------------------------------------------------------------------------------
def _multiplier(*argv, peak=0.1):
    return LrMultiplier(_cfg(*argv), steps_per_epoch=10, peak_lr=peak)


def test_step_schedule_drops_every_step_size_epochs():
    f = _multiplier("--lr-schedule", "step", "--lr-step-size", "3", "--lr-gamma", "0.5",
                    "--epochs", "10")
    assert [f(s) for s in (0, 29, 30, 59, 60, 99)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.125]


def test_multistep_schedule_drops_at_the_milestones():
    f = _multiplier("--lr-schedule", "multistep", "--lr-steps", "2", "5", "--epochs", "10")
    assert [f(s) for s in (19, 20, 49, 50)] == pytest.approx([1.0, 0.1, 0.1, 0.01])


def test_cosine_schedule_ends_at_the_floor():
    f = _multiplier("--lr-schedule", "cosine", "--epochs", "10", "--lr-min", "0.01")
    assert f(0) == 1.0 and f(100) == pytest.approx(0.1)  # 0.01 of a peak of 0.1
    assert f(50) == pytest.approx(0.1 + 0.9 * 0.5)


def test_linear_and_poly_schedules_after_a_warmup():
    linear = _multiplier("--lr-schedule", "linear", "--epochs", "10", "--warmup-epochs", "2")
    poly = _multiplier("--lr-schedule", "poly", "--lr-power", "2", "--epochs", "10")
    assert linear(60) == pytest.approx(0.5) and linear(100) == 0.0  # 40 of 80 decay steps
    assert poly(50) == pytest.approx(0.25)


def test_warmup_linear_and_constant_with_a_start_factor():
    linear = _multiplier("--warmup-epochs", "1", "--warmup-start-factor", "0.01")
    assert linear(0) == pytest.approx(0.01 + 0.99 * 0.1) and linear(9) == pytest.approx(1.0)
    constant = _multiplier("--warmup-epochs", "1", "--warmup-method", "constant",
                           "--warmup-start-factor", "0.1")
    assert (constant(0), constant(9), constant(10)) == (0.1, 0.1, 1.0)
    with pytest.raises(UsageError, match="constant"):
        _cfg("--warmup-epochs", "1", "--warmup-method", "constant")


def test_the_scheduler_sets_every_groups_lr():
    cfg = _cfg("--lr-schedule", "cosine", "--epochs", "2", "--norm-weight-decay", "0")
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    optimizer = build_optimizer(cfg, model, list(model.named_parameters()), lr=0.4)
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch=5, peak_lr=0.4)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert len(optimizer.param_groups) == 2
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.2, 0.2])


# --- EMA -----------------------------------------------------------------------------------------
def _set(layer, value):
    with torch.no_grad():
        layer.weight.fill_(value)


def test_ema_equals_the_closed_form():
    layer = nn.Linear(1, 1, bias=False)
    ema = ModelEMA(layer, decay=0.9, every=2)
    for step in range(1, 7):
        _set(layer, float(step))
        ema.update(layer, {}, step)
    # updates at steps 2 (a copy), 4 and 6
    assert ema.module.weight.item() == pytest.approx(0.9 * (0.9 * 2 + 0.1 * 4) + 0.1 * 6)
    _set(layer, 10.0)
    ema.update(layer, {}, 8, restart=True)  # warm-up: follow the weights
    _set(layer, 12.0)
    ema.update(layer, {}, 10)
    assert ema.module.weight.item() == 12.0  # the first update after a restart copies


def test_ema_decay_is_torchvisions():
    cfg = _cfg("--model-ema-decay", "0.99998", "--model-ema-steps", "32", "--epochs", "600")
    assert ema_decay_per_update(cfg, 1024, 600) == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    assert ema_decay_per_update(_cfg("--model-ema-decay", "0.5"), 1024, 1) == 0.0


def test_ema_averages_o2_masters_and_buffers_in_fp32():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    precision = Precision("O2", "bfloat16")
    precision.bind(torch.device("cpu"), notice=lambda m: None)
    precision.convert_module(model)
    precision.setup_masters(model)
    ema = ModelEMA(model, decay=0.5, every=1)
    masters = dict(precision.named_optimizer_params(model))
    with torch.no_grad():
        masters["0.weight"].fill_(1.0001)  # below bf16's resolution at 1
        model[0].weight.copy_(masters["0.weight"])
        model[1].running_mean.fill_(2.0)
    ema.update(model, masters, 1)
    assert ema.module[0].weight.dtype == torch.float32
    assert model[0].weight[0, 0].item() == 1.0
    assert ema.module[0].weight[0, 0].item() == pytest.approx(1.0001, abs=1e-6)
    with torch.no_grad():
        model[1].running_mean.fill_(4.0)
        model[1].num_batches_tracked.fill_(7)
    ema.update(model, masters, 2)
    assert ema.module[1].running_mean.tolist() == [3.0, 3.0]
    assert ema.module[1].num_batches_tracked.item() == 7


# --- MixUp, CutMix and the losses ----------------------------------------------------------------
def test_mixup_is_a_convex_combination_with_matching_targets():
    torch.manual_seed(0)
    mix = build_mixer(_cfg("--mixup-alpha", "0.4"), num_classes=5)
    images, labels = torch.rand(8, 3, 6, 6), torch.arange(8) % 5
    mixed, targets = mix(images, labels)
    assert targets.shape == (8, 5)
    torch.testing.assert_close(targets.sum(1), torch.ones(8))
    lam = targets[0, labels[0]].item()
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.roll(1, 0))


def test_cutmix_targets_are_the_pasted_area():
    torch.manual_seed(1)
    mix = build_mixer(_cfg("--cutmix-alpha", "1.0"), num_classes=5)
    images, labels = torch.rand(8, 3, 16, 16), torch.arange(8) % 5
    for _ in range(5):
        mixed, targets = mix(images, labels)
        torch.testing.assert_close(targets.sum(1), torch.ones(8))
        kept = (mixed[0] == images[0]).all(0).float().mean().item()
        assert targets[0, labels[0]].item() == pytest.approx(kept, abs=1e-6)


def test_mixup_and_cutmix_alternate_and_none_without_alphas():
    assert build_mixer(_cfg(), 5) is None
    assert type(build_mixer(_cfg("--mixup-alpha", "0.2", "--cutmix-alpha", "1"), 5)
                ).__name__ == "RandomChoice"


def test_losses_on_hard_and_soft_targets():
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 3), torch.tensor([0, 2, 1, 2])
    onehot = F.one_hot(labels, 3).float()
    bce = build_criterion(_cfg("--loss", "bce", "--label-smoothing", "0.3"), 3)
    expected = F.binary_cross_entropy_with_logits(logits, onehot * 0.7 + 0.1)
    assert bce(logits, labels).item() == pytest.approx(expected.item())
    assert bce(logits, onehot).item() == pytest.approx(expected.item())
    ce = build_criterion(_cfg("--label-smoothing", "0.1"), 3)
    assert ce(logits, onehot).item() == pytest.approx(ce(logits, labels).item())


# --- augmentation --------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["imagenet", "ra", "ta_wide"])
def test_auto_augment_policies_change_the_crops(policy):
    image = torch.randint(0, 256, (3, 48, 48), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    plain = train_transform(_cfg("--image-size", "32"))
    augmented = train_transform(_cfg("--image-size", "32", "--auto-augment", policy))
    changed = 0
    for seed in range(20):
        torch.manual_seed(seed)
        a = plain(image)
        torch.manual_seed(seed)  # the same crop and flip come first
        b = augmented(image)
        assert b.shape == (3, 32, 32) and b.dtype == torch.uint8
        changed += not torch.equal(a, b)
    assert changed >= 10, changed


def test_random_erasing_fills_with_the_mean_colour_which_normalises_to_zero():
    image = torch.full((3, 40, 40), 255, dtype=torch.uint8)
    torch.manual_seed(0)
    erased = train_transform(_cfg("--image-size", "40", "--random-erase", "1.0"))(image)
    box = (erased != 255).all(0)
    assert 0.02 * 1600 * 0.5 < box.sum() < 0.33 * 1600 * 1.5
    assert erased[:, box].T.unique(dim=0).tolist() == [list(MEAN_PIXEL)]
    normalised = UInt8Normalizer(torch.device("cpu"), False)(erased[None])[0]
    assert normalised[:, box].abs().max() < 0.01


@pytest.mark.parametrize("channels_last", [False, True])
def test_uint8_normalizer_values_layout_and_its_input_left_alone(channels_last):
    from imagenet_recipes.data import IMAGENET_MEAN, IMAGENET_STD

    torch.manual_seed(0)
    batch = torch.randint(0, 256, (4, 3, 9, 7), dtype=torch.uint8)
    before = batch.clone()
    out = UInt8Normalizer(torch.device("cpu"), channels_last)(batch)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (batch / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)
    assert torch.equal(batch, before)


def test_crop_sizes():
    assert val_sizes(_cfg()) == (256, 224)
    assert val_sizes(_cfg("--train-crop-size", "176", "--val-resize-size", "232",
                          "--val-crop-size", "224")) == (232, 224)
    assert val_sizes(_cfg("--image-size", "64")) == (73, 64)


def test_progressive_resizing_follows_ffcvs_ramp():
    cfg = _cfg("--progressive-resize", "128", "256", "1", "5", "--epochs", "16")
    assert [progressive_crop(cfg, e) for e in range(7)] == [128, 128, 160, 192, 224, 256, 256]
    # halfway between two multiples of 32 rounds to even, as FFCV's np.round
    ffcv = _cfg("--progressive-resize", "160", "192", "11", "13", "--epochs", "16")
    assert [progressive_crop(ffcv, e) for e in (11, 12, 13)] == [160, 192, 192]
    with pytest.raises(UsageError, match="progressive-resize"):
        _cfg("--progressive-resize", "192", "160", "1", "2")


def test_progressive_resizing_reaches_the_training_batches(tiny_imagefolder):
    cfg = parse_args(["-j", "0", "-b", "4", "--image-size", "32", "--epochs", "4",
                      "--progressive-resize", "32", "96", "0", "2", str(tiny_imagefolder)])
    train, val, _ = loaders_for(cfg, Shard(), torch.device("cpu"))
    sizes = []
    for epoch in (0, 1, 2):
        train.set_epoch(epoch)
        sizes.append(next(iter(train))[0].shape[-1])
    assert sizes == [32, 64, 96]
    assert next(iter(val))[0].shape[-1] == 32


def test_repeated_augmentation_puts_each_copy_on_another_rank_with_its_own_crop():
    size, reps, world = 24, 3, 3
    shards = [list(ShardedSampler(size, r, world, shuffle=True, seed=4, repeats=reps))
              for r in range(world)]
    assert [len(s) for s in shards] == [8, 8, 8]  # the epoch keeps its length
    images = [{k.index for k in shard} for shard in shards]
    assert images[0] == images[1] == images[2] and len(images[0]) == size // reps
    for step in range(8):
        copies = [shard[step] for shard in shards]
        assert len({k.index for k in copies}) == 1 and len({k.seed for k in copies}) == 3
    plain = list(ShardedSampler(size, 0, 1, shuffle=True, seed=4))
    assert len({k.index for k in plain}) == size  # off by default


# --- gradient clipping ---------------------------------------------------------------------------
@pytest.mark.parametrize("opt_level,amp_dtype,loss_scale", [
    ("O0", "auto", None), ("O0", "auto", "128"), ("O1", "float16", None)])
def test_clipping_sees_the_unscaled_gradient(opt_level, amp_dtype, loss_scale):
    precision = Precision(opt_level, amp_dtype, loss_scale, clip_grad_norm=1.0)
    precision.bind(torch.device("cpu"), notice=lambda m: None)
    param = nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    precision.backward((param * torch.tensor([3.0, 4.0])).sum())  # gradient (3, 4), norm 5
    precision.optimizer_step(optimizer)
    torch.testing.assert_close(param.detach(), torch.tensor([-0.6, -0.8]))
    if opt_level == "O1":
        assert precision.scaling  # the dynamic scaler was on, and unscaled first


# --- --config files and presets ------------------------------------------------------------------
CONFIG = {"lr-schedule": "cosine", "wd": 2e-5, "model-ema": True, "lr-steps": [1, 2],
          "label_smoothing": 0.1, "lr": 1}


def _write(path, data):
    if path.suffix == ".toml":
        lines = [f"{k} = {json.dumps(v)}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}"
                 for k, v in data.items()]
        path.write_text("\n".join(lines) + "\n")
    elif path.suffix == ".yaml":
        import yaml
        path.write_text(yaml.safe_dump(data))
    else:
        path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
def test_a_config_file_sets_defaults_and_the_command_line_wins(tmp_path, suffix):
    path = _write(tmp_path / f"preset{suffix}", CONFIG)
    cfg = parse_args(["--dummy", "--config", str(path), "--wd", "1e-3", "--no-model-ema"])
    assert (cfg.lr_schedule, cfg.weight_decay, cfg.model_ema) == ("cosine", 1e-3, False)
    assert (cfg.lr_steps, cfg.label_smoothing, cfg.lr) == ((1, 2), 0.1, 1.0)
    assert isinstance(cfg.lr, float)
    assert parse_args(["--dummy", "--config", str(path)]).model_ema


@pytest.mark.parametrize("data,message", [
    ({"lr-shedule": "cosine"}, "unknown option 'lr-shedule'"),
    ({"lr-schedule": "sine"}, "expected one of step, multistep"),
    ({"epochs": "ninety"}, "expected a int"),
    ({"model-ema": 1}, "expected a bool"),
])
def test_a_config_file_with_a_mistake_is_refused_by_name(tmp_path, data, message):
    path = _write(tmp_path / "bad.toml", data)
    with pytest.raises(UsageError, match=message):
        parse_args(["--dummy", "--config", str(path)])
    with pytest.raises(UsageError, match="no such file"):
        parse_args(["--dummy", "--config", str(tmp_path / "missing.toml")])


def test_a_run_dirs_config_repeats_the_run_but_not_its_invocation(tmp_path):
    cfg = parse_args(["-a", "resnet18", "--lr", "0.3", "--opt", "lamb", "--model-ema",
                      "--progressive-resize", "32", "64", "0", "2", "--resume", "x.pth",
                      "--run-name", "first", "/data/x"])
    (tmp_path / "run").mkdir()
    cfg.save(tmp_path / "run" / "config.json")
    again = parse_args(["--config", str(tmp_path / "run")])
    differ = {k for k, v in cfg.to_dict().items() if again.to_dict()[k] != v}
    assert differ == {"resume", "run_name", "config"}


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_each_preset_loads_and_reproduces_its_published_lr(preset):
    cfg = parse_args(["--dummy", "--config", str(preset)], entry="ddp_apex")
    ref = read_mapping(preset)["reference"]
    for key in ("name", "top1", "epochs", "global_batch", "gpus", "hardware", "lr", "source",
                "differences"):
        assert key in ref, key
    assert cfg.epochs == ref["epochs"] and cfg.arch == "resnet50"
    assert cfg.batch_size * ref["gpus"] == ref["global_batch"]
    # --lr is per 256 images: at the published global batch it is the published lr
    assert cfg.lr * ref["global_batch"] / 256 == pytest.approx(ref["lr"])
    text = preset.read_text()
    assert "torchrun" in text or "sbatch" in text  # the header says how to launch it


def test_a_preset_says_what_changes_on_fewer_processes():
    cfg = parse_args(["--dummy", "--config", str(REPO / "recipes" / "torchvision_v2.toml")])
    plan = plan_run(PlanOptions.of(cfg), world_size=2, device_type="cpu")
    assert (plan.global_batch, plan.lr) == (256, 0.125)
    lines = scaling_note(cfg.config, cfg.lr, plan)
    assert "80.858 %" in lines[0] and "global batch 1024" in lines[0]
    assert "global batch 256" in lines[1] and "--grad-accum 4" in lines[2]
    assert scaling_note(None, 0.1, plan_run(PlanOptions.of(_cfg()), 1, "cpu")) == []
    assert not math.isnan(cfg.lr)


@pytest.mark.parametrize("target,world,most,expected", [
    (2048, 32, 256, (64, 1)), (2048, 8, 256, (256, 1)), (2048, 8, 128, (128, 2)),
    (2048, 1, 256, (256, 8)), (2048, 4, 208, (128, 4)), (1024, 3 * 8, 64, None)])
def test_global_batch_published_keeps_the_recipe_on_any_number_of_processes(target, world, most,
                                                                            expected):
    """--global-batch: -b at most what was given, the fewest micro-batches that make it up."""
    if expected is None:
        with pytest.raises(UsageError, match="does not divide among 24 processes"):
            split_global_batch(target, world, most)
        return
    b, accumulate = split_global_batch(target, world, most)
    assert (b, accumulate) == expected and b * accumulate * world == target and b <= most


def test_more_than_4x_a_presets_global_batch_is_refused_unless_asked_for():
    cfg = parse_args(["--dummy", "--config", "nvidia_rn50_amp"], entry="ddp_apex")
    assert global_batch_target(cfg, cfg.config) is None
    assert large_batch_refusal(cfg.config, cfg, cfg, 4 * 2048, 8.192) is None  # 4 x 8 GPUs x 256
    refused = large_batch_refusal(cfg.config, cfg, cfg, 8 * 2048, 16.384)
    assert refused.startswith("global batch 16384 is 8.00x the published 2048 of NVIDIA "
                              "DeepLearningExamples ResNet-50 v1.5 AMP (peak lr 16.38")
    assert "--global-batch published" in refused and "--allow-large-batch" in refused
    for extra in (["--allow-large-batch"], ["--opt", "lars"], ["--opt", "lamb"]):
        allowed = parse_args(["--dummy", "--config", "nvidia_rn50_amp", *extra],
                             entry="ddp_apex")
        assert large_batch_refusal(allowed.config, allowed, allowed, 8 * 2048, 16.384) is None, \
            extra
    assert large_batch_refusal(None, _cfg(), _cfg(), 10 ** 6, 1.0) is None  # no published batch
    published = parse_args(["--dummy", "--config", "nvidia_rn50_amp", "--global-batch",
                            "published"], entry="ddp_apex")
    assert global_batch_target(published, published.config) == 2048
    with pytest.raises(UsageError, match="needs a --config preset"):
        global_batch_target(parse_args(["--dummy", "--global-batch", "published"]), None)
    for bad in ("x4", "0"):  # refused as it is parsed, before any process plans the run
        with pytest.raises(UsageError, match="--global-batch takes a positive number"):
            parse_args(["--dummy", "--global-batch", bad])


def test_the_readme_and_sbatch_commands_keep_each_presets_global_batch():
    """Each command of README's hardware table and of the sbatch headers that names a preset
    trains at most at its published global batch on the GPUs it names (1, --nproc_per_node,
    nodes x --gpus-per-node), or says --global-batch published. (README's 4-node command
    trained at 4x it: 4 x 8 x 256 = 8,192.)"""
    import re
    import shlex

    commands = re.findall(r"`((?:python|torchrun|sbatch)[^`]*--config [^`]*)`",
                          (REPO / "README.md").read_text())
    for sbatch in (REPO / "launch" / "slurm").glob("*.sbatch"):
        commands += [line.lstrip("# ").strip() for line in sbatch.read_text().splitlines()
                     if line.startswith("#   sbatch") and "--config" in line]
    assert len(commands) >= 4, commands
    for command in commands:
        words = shlex.split(command)
        if "--global-batch" in words:
            assert words[words.index("--global-batch") + 1] == "published", command
            continue
        preset = words[words.index("--config") + 1]
        flags = dict(re.findall(r"--(nproc_per_node|nodes|gpus-per-node)=(\d+)", command))
        gpus = int(flags.get("nproc_per_node", 1)) if "torchrun" in command or \
            "python" in command else int(flags.get("nodes", 1)) * int(flags["gpus-per-node"])
        cfg = parse_args(["--dummy", "--config", preset], entry="ddp_apex")
        ref = read_mapping(REPO / "recipes" / f"{preset}.toml")["reference"]
        # fewer GPUs train a smaller global batch at the linearly scaled lr, as the published
        # recipes' own sources do on fewer GPUs (the run prints how to keep it: --grad-accum);
        # never a larger one unasked
        assert cfg.batch_size * gpus <= ref["global_batch"], command


def test_a_preset_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository root: recipes/ is found all the same
    by_path = parse_args(["--dummy", "--config", str(REPO / "recipes" / "torchvision_v2.toml")])
    for name in ("torchvision_v2", "torchvision_v2.toml"):
        by_name = parse_args(["--dummy", "--config", name])
        assert {k: v for k, v in by_name.to_dict().items() if k != "config"} == \
            {k: v for k, v in by_path.to_dict().items() if k != "config"}
        note = scaling_note(by_name.config, by_name.lr, plan_run(PlanOptions.of(by_name), 2, "cpu"))
        assert note[0].startswith("recipe torchvision ResNet-50")
    # a file of that name in the current folder comes first
    _write(tmp_path / "torchvision_v2.toml", {"epochs": 7})
    assert parse_args(["--dummy", "--config", "torchvision_v2.toml"]).epochs == 7
    with pytest.raises(UsageError, match="no such file or preset .presets: ffcv_16_epochs, "):
        parse_args(["--dummy", "--config", "torchvision_v3"])


def test_help_lists_the_presets_in_a_group_of_their_own(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["-h"], entry="nd")
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    presets = text[text.index("presets options:"):text.index("data options:")]
    assert "--config NAME|FILE|RUN_DIR" in presets
    for preset in PRESETS:
        assert f"\n    {preset.stem} " in presets, preset.stem
    assert "torchvision ResNet-50 V2: 80.858 % top-1 in 600 epochs" in presets


@pytest.mark.parametrize("theirs,ours,value", [
    ("--model", "arch", "resnet50"), ("--lr-warmup-epochs", "warmup_epochs", 2.0),
    ("--lr-warmup-method", "warmup_method", "constant"),
    ("--lr-warmup-decay", "warmup_start_factor", 0.1), ("--smoothing", "label_smoothing", 0.1),
    ("--mixup", "mixup_alpha", 0.2), ("--cutmix", "cutmix_alpha", 1.0),
    ("--clip-grad", "clip_grad_norm", 1.0), ("--log-interval", "print_freq", 5),
])
def test_torchvision_and_timm_spellings_that_mean_the_same_are_aliases(theirs, ours, value):
    cfg = parse_args(["--dummy", "--epochs", "5", theirs, str(value)])
    assert getattr(cfg, ours) == value


@pytest.mark.parametrize("argv,hint", [
    (["--amp"], "--amp is not an option here: mixed precision is --opt-level O1"),
    (["--lr-scheduler", "cosineannealinglr"], "use --lr-schedule .*cosineannealinglr = cosine"),
    (["--sched", "cosine"], "use --lr-schedule"),
    (["--data-path", "/data/imagenet"], "the dataset root is the last argument"),
    (["--output-dir", "out"], "use --logdir DIR"),
    (["--reprob", "0.25"], "use --random-erase P"),
    (["--test-only"], "use -e/--evaluate"),
    (["--no-accel"], "use --device cpu"),
    (["--pretrained", "--dummy"], "--pretrained needs a weights FILE .*nothing is downloaded"),
    (["--pretrained", "-a", "resnet50"], "--pretrained needs a weights FILE"),
])
def test_torchvision_and_timm_spellings_that_differ_are_refused_with_ours(argv, hint):
    # the refused flag takes its value, so the data path after it is still the data path
    with pytest.raises(UsageError, match=hint):
        parse_args([*argv, "/data/imagenet"])


def test_no_prefix_matching_and_errors_in_one_line(capsys):
    for argv, message in ((["--amp-d", "bfloat16"], "unknown option --amp-d"),
                          (["--warmup-epoch", "3"], "did you mean --warmup-epochs?"),
                          (["--lr"], "argument --lr/--learning-rate: expected one argument")):
        with pytest.raises(SystemExit) as exit_:
            parse_args([*argv, "--dummy"], entry="nd")
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert message in err and err.endswith("(see -h)\n") and err.count("\n") == 1, err


def test_evaluating_without_weights_is_refused():
    with pytest.raises(UsageError, match="-e/--evaluate needs weights to score: --resume"):
        parse_args(["--dummy", "-e"])
    assert parse_args(["--dummy", "-e", "--resume", "x.pth"]).evaluate
    assert parse_args(["--dummy", "-e", "--pretrained", "w.pth"]).evaluate


def test_an_lr_that_looks_absolute_and_a_large_batch_without_warmup_are_warned_of():
    from imagenet_recipes.schedule import lr_warnings

    # torchvision V2's command line (--lr 0.5 at global batch 1024) read as per 256 images
    (line,) = lr_warnings(_cfg("--lr", "0.5"), 5, 1024, 2.0)
    assert "at global batch 1024 the lr is 2" in line and "pass --lr 0.125" in line
    assert lr_warnings(_cfg("--lr", "0.5", "--no-lr-scaling"), 0, 1024, 0.5) == []
    assert lr_warnings(_cfg("--lr", "0.5", "--opt", "lamb"), 0, 1024, 2.0) == []
    # 8 GPUs x the default -b 256: no warm-up at 2048
    (line,) = lr_warnings(_cfg(), 0, 2048, 0.8)
    assert "global batch 2048 with no warm-up" in line and "--warmup-epochs 5" in line
    # every preset at its published scale warns of nothing
    for preset in PRESETS:
        cfg = parse_args(["--dummy", "--config", str(preset)])
        ref = read_mapping(preset)["reference"]
        assert lr_warnings(cfg, cfg.warmup_epochs, ref["global_batch"], ref["lr"]) == [], \
            preset.stem


def test_evaluation_takes_the_settings_of_the_checkpoints_run(tmp_path, capsys):
    import torch

    trained = parse_args(["--dummy", "-a", "resnet18", "--image-size", "64", "--opt-level", "O2",
                          "--amp-dtype", "bfloat16", "--no-channels-last", "--lr", "0.3"])
    (tmp_path / "run").mkdir()
    trained.save(tmp_path / "run" / "config.json")
    torch.save({"config": trained.to_dict()}, tmp_path / "moved.pth")  # away from its run dir
    for resume in (tmp_path / "run", tmp_path / "run" / "model_best.pth", tmp_path / "moved.pth"):
        cfg = parse_args(["-e", "--resume", str(resume), "/data/x"])
        assert (cfg.arch, cfg.image_size, cfg.opt_level, cfg.amp_dtype, cfg.channels_last,
                cfg.dummy) == ("resnet18", 64, "O2", "bfloat16", False, True)
        assert cfg.lr == 0.1  # training options stay this command's
        said = capsys.readouterr().out
        assert ("=> -e: the checkpoint's run set --dummy, --train-crop-size 64, --arch "
                "resnet18, --no-channels-last, --opt-level O2, --amp-dtype bfloat16 (a flag on "
                "the command line overrides)") in said  # in -h's order
    # the command line wins; training (no -e) takes nothing from --resume's run
    assert parse_args(["-e", "--resume", str(tmp_path / "run"), "--opt-level", "O0"]
                      ).opt_level == "O0"
    assert parse_args(["--dummy", "--resume", str(tmp_path / "run")]).arch == "resnet50"


# --- the schedule under float16 loss scaling -----------------------------------------------------
def _overflowing_cnn(arch, num_classes, pretrained=None, zero_init_residual=False):
    # A head with huge weights: at GradScaler's first scale (2**16) its float16 gradients
    # overflow, so the first optimizer step is skipped, as ResNet-50's is on a GPU.
    torch.manual_seed(0)
    head = nn.Linear(4, num_classes)
    with torch.no_grad():
        head.weight.mul_(1e4)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), head)


def test_a_skipped_first_step_keeps_the_schedule_and_warns_nothing(tmp_path, monkeypatch):
    """float16 loss scaling skips the first optimizer step by design; torch's LR scheduler then
    warns "lr_scheduler.step() before optimizer.step()" on the first screen of every run. The
    schedule counts loop steps, skipped ones included: the lr sequence is the fp32 run's, and
    no warning is shown."""
    import warnings

    from imagenet_recipes import engine
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    monkeypatch.setattr(engine, "build_model", _overflowing_cnn)

    def run(name, *precision):
        cfg = parse_args(["--dummy", "--image-size", "16", "-b", "4", "-j", "0", "-p", "1",
                          "--epochs", "2", "--steps-per-epoch", "3", "--warmup-epochs", "1",
                          "--lr-schedule", "cosine",
                          "--synthetic-train-size", "24", "--synthetic-val-size", "4",
                          "--logdir", str(tmp_path), "--run-name", name, *precision])
        trainer = engine.Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainer.setup()
            trainer.fit()
        trainer.close()
        train = [json.loads(line) for line in (trainer.run_dir / "log.jsonl").read_text()
                 .splitlines() if json.loads(line)["kind"] == "train"]
        return train, [str(w.message) for w in seen]

    fp16, fp16_warnings = run("fp16", "--opt-level", "O1", "--amp-dtype", "float16")
    fp32, _ = run("fp32", "--opt-level", "O0")
    scales = [r["loss_scale"] for r in fp16]
    assert scales[0] < 2.0 ** 16, f"the first step was not skipped: scales {scales}"
    assert [r["lr"] for r in fp16] == [r["lr"] for r in fp32]
    assert len({r["lr"] for r in fp16}) >= 4  # the warm-up and the decay move it
    assert not [w for w in fp16_warnings if "lr_scheduler.step()" in w], fp16_warnings


@pytest.mark.slow
def test_a_global_batch_is_kept_on_two_processes(tiny_imagefolder, tmp_path):
    """torchrun, 2 ranks, --global-batch 16 with -b 4: 2 micro-batches of 4 per rank, and the
    run record and the per-step counts say 16."""
    from conftest import TINY, records, run_forked

    run_forked("ddp.py", TINY + ["-b", "4", "--global-batch", "16", "--epochs", "1",
                                 "--steps-per-epoch", "2", "--logdir", tmp_path,
                                 "--run-name", "kept", tiny_imagefolder], nproc=2)
    run = records(tmp_path / "kept", "run")[0]
    assert run["global_batch"] == 16
    assert (run["config"]["batch_size"], run["config"]["grad_accum"]) == (4, 2)
    assert [r["count"] for r in records(tmp_path / "kept", "train")] == [16, 16]
