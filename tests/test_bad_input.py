"""Bad input ends with one clear message and exit status 2, and writes nothing.

Most checks run the entry script's own body (its strategy's `main` in the registry:
`imagenet_recipes.cli.main`, `imagenet_recipes.ps.main.main`) in the test's process, which is what the script runs after Python has started it; a few marked `slow`
start the real script, to show that nothing between the shell and that body changes the answer.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from conftest import TINY, run_script
from imagenet_recipes.registry import ENTRIES, STRATEGIES


def run_in_process(script: str, args, capsys) -> tuple:
    """(exit status, stdout, stderr) of train/<script> run with `args`, in this process.
    Loaders load in the process (-j 0): the checks here end before any worker would start."""
    entry = next(e.name for e in ENTRIES.values() if e.script == f"train/{script}")
    argv = [str(a) for a in args] + ["-j", "0"]
    main = importlib.import_module(STRATEGIES[ENTRIES[entry].strategy].main).main
    try:
        main(entry, argv=argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def _check_usage_error(code, err, message, tmp_path):
    assert code == 2, err[-2000:]
    assert message in err, err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists(), "a failed start must not leave a run dir behind"


@pytest.fixture
def expect_usage_error(tmp_path, capsys):
    """expect_usage_error(args, message, script="nd.py"): train/<script> with `args` ends with
    exit status 2, `message` on stderr, no traceback and no run directory (in this process)."""
    def expect(args, message, script="nd.py"):
        code, _, err = run_in_process(script, list(args) + ["--logdir", tmp_path / "runs"],
                                      capsys)
        _check_usage_error(code, err, message, tmp_path)
    return expect


@pytest.mark.slow
@pytest.mark.parametrize("script,args,message", [
    ("nd.py", [], "does not exist"),
    ("ddp.py", ["--fp16-allreduce"], "--fp16-allreduce is an option of train/hvd.py"),
    ("ps.py", ["--mode", "esync", "--esync-epsilon", "-0.1"], "--esync-epsilon must be >= 0"),
])
def test_a_real_process_ends_the_same_way(tmp_path, script, args, message):
    """What the in-process checks below run is what the script runs once Python has started
    it: three of them, as real processes, end the same way."""
    proc = run_script(script, TINY + args + ["--logdir", tmp_path / "runs", tmp_path / "nope"],
                      check=False, timeout=120)
    _check_usage_error(proc.returncode, proc.stderr, message, tmp_path)


def test_missing_data_dir(expect_usage_error, tmp_path):
    expect_usage_error(TINY + [tmp_path / "nope"], "does not exist")


def test_a_file_given_as_the_data_folder(expect_usage_error, tmp_path):
    archive = tmp_path / "imagenet.tar"
    archive.write_bytes(b"not a folder")
    expect_usage_error(TINY + [archive], "is a file, not a folder")


def test_flat_imagenet_val_points_to_the_prepare_script(expect_usage_error, tiny_imagefolder, tmp_path):
    """ILSVRC2012_img_val.tar extracts to 50,000 images in val/ itself, without classes."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder / "train", data / "train")
    (data / "val").mkdir()
    for i, image in enumerate(sorted((tiny_imagefolder / "val").rglob("*.JPEG"))):
        shutil.copy(image, data / "val" / f"ILSVRC2012_val_{i + 1:08d}.JPEG")
    expect_usage_error(TINY + [data], "python data/prepare_imagenet_val.py")


def test_no_dataset_argument(expect_usage_error, tmp_path):
    expect_usage_error(TINY, "the dataset path is missing")


def test_empty_data_dir(expect_usage_error, tmp_path):
    (tmp_path / "data").mkdir()
    expect_usage_error(TINY + [tmp_path / "data"], "train")


def test_no_class_folders(expect_usage_error, tmp_path):
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
    expect_usage_error(TINY + [tmp_path / "data"], "class")


def test_val_classes_differ(expect_usage_error, tiny_imagefolder, tmp_path):
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    shutil.rmtree(sorted((data / "val").iterdir())[0])
    expect_usage_error(TINY + [data], "class folders differ")


def test_empty_class_folder(expect_usage_error, tiny_imagefolder, tmp_path):
    """A class folder without images (an interrupted copy, say) is refused before training,
    naming the folder."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    empty = sorted((data / "train").iterdir())[1]
    for image in empty.iterdir():
        image.unlink()
    expect_usage_error(TINY + [data], empty.name)


def test_dali_gpu_without_a_gpu(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--data-backend", "dali-gpu", tiny_imagefolder],
                       "use --data-backend dali-cpu")


def test_fp16_allreduce_is_horovod_only(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--fp16-allreduce", tiny_imagefolder],
                       "--fp16-allreduce is an option of train/hvd.py, not of train/ddp.py; "
                       "DDP's counterpart is --ddp-comm-hook fp16", script="ddp.py")


def test_ddp_comm_hook_needs_ddp(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--ddp-comm-hook", "fp16", tiny_imagefolder],
                       "--ddp-comm-hook is an option of train/ddp.py, train/ddp_apex.py, not of "
                       "train/nd.py")


def _help(script: str, capsys) -> str:
    code, out, _ = run_in_process(script, ["-h"], capsys)
    assert code == 0
    return out


@pytest.mark.parametrize("script,absent", [
    ("nd.py", ["--ddp-comm-hook", "--fp16-allreduce", "--sync-bn", "--dist-timeout", "--mode "]),
    ("ddp.py", ["--fp16-allreduce", "--mode ", "--evaluator"]),
    ("hvd.py", ["--ddp-comm-hook", "--powersgd-rank", "--dist-timeout"]),
    ("ps.py", ["--ddp-comm-hook", "--grad-accum", "--sync-bn", "--compile", "--evaluate",
               "--opt ",
               "--model-ema", "--mixup-alpha", "--clip-grad-norm", "--norm-weight-decay"]),
])
def test_help_lists_only_the_scripts_own_options_in_groups(script, absent, capsys):
    text = " ".join(_help(script, capsys).split(" "))
    headings = [line for line in text.splitlines() if line.endswith(" options:")]
    expected = ["presets options:", "data options:", "--data-backend synthetic options:",
                "--data-backend gpu options:", "--data-backend dali-gpu options:",
                "augmentation options:", "model options:",
                "optimization options:", "regularization options:", "precision options:",
                "distribution options:", "checkpointing options:", "logging options:"] + (["parameter server options:"] if script == "ps.py" else [])
    assert headings == expected, headings
    for flag in absent:
        assert flag not in text, f"{script} -h lists {flag}"
    assert "(default: None)" not in text and "(default: False)" not in text
    options = text[text.index("optimization options:"):]
    seed_help = " ".join(options[options.index("--seed"):options.index("--deterministic")].split())
    assert seed_help.count("default") == 1 and seed_help.endswith("(default: 0)"), seed_help


def test_ddp_help_has_the_ddp_options(capsys):
    text = _help("ddp.py", capsys)
    for flag in ("--ddp-comm-hook", "--sync-bn", "--dist-timeout", "--opt-level"):
        assert flag in text


def test_local_sgd_is_an_experiment_not_an_option_of_the_product(expect_usage_error,
                                                                 tiny_imagefolder):
    """Its options belong to the local SGD experiment (tests/experiments/test_local_sgd.py)."""
    expect_usage_error(TINY + ["--local-sgd-period", "4", tiny_imagefolder],
                       "unknown option --local-sgd-period", script="ddp.py")


def test_powersgd_needs_a_warm_up_step(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--ddp-comm-hook", "powersgd", "--powersgd-start-step", "1",
                               tiny_imagefolder], "--powersgd-start-step >= 2", script="ddp.py")


def test_unknown_arch(expect_usage_error, tiny_imagefolder):
    expect_usage_error(["-a", "resnet5000", tiny_imagefolder], "unknown architecture")


@pytest.mark.parametrize("arch,size,crop", [("alexnet", "32", None), ("vgg11", "224", "16"),
                                            ("vit_b_16", "64", None)])
def test_a_crop_smaller_than_the_model_takes(expect_usage_error, tiny_imagefolder, arch, size,
                                             crop):
    """alexnet's and VGG's layers shrink 32 px to nothing, ViT checks its size itself: one line
    naming the model and the crop (training's or validation's), before any data is read."""
    extra = ["--val-crop-size", crop] if crop else []
    expect_usage_error(["-a", arch, "--image-size", size, *extra, "-b", "2", tiny_imagefolder],
                       f"-a {arch} cannot take {crop or size}x{crop or size} crops")


def test_small_crops_a_model_takes_are_taken():
    from imagenet_recipes.models import input_size_refusal

    assert input_size_refusal("timm/test_resnet", 32) is None
    assert input_size_refusal("alexnet", 224) is None  # ImageNet's size: not even built
    assert "Output size is too small" in input_size_refusal("alexnet", 32)


@pytest.mark.parametrize("flag", ["-b", "--epochs"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_non_positive_sizes(expect_usage_error, tiny_imagefolder, flag, value):
    expect_usage_error(TINY + [flag, value, tiny_imagefolder], "must be a positive integer")


def test_unknown_opt_level(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--opt-level", "O4", tiny_imagefolder], "invalid choice")


def test_apex_only_option_is_explained(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--keep-batchnorm-fp32", "True", tiny_imagefolder],
                       "apex-only option", script="ddp_apex.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_requested_without_gpu(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--device", "cuda", tiny_imagefolder], "--device cuda was requested but torch cannot use CUDA: ")


def test_resume_file_missing(expect_usage_error, tiny_imagefolder, tmp_path):
    expect_usage_error(TINY + ["--resume", tmp_path / "nope.pth", tiny_imagefolder],
                       "no such checkpoint")


def test_resume_a_folder_without_a_checkpoint(expect_usage_error, tiny_imagefolder, tmp_path):
    (tmp_path / "empty_run").mkdir()
    expect_usage_error(TINY + ["--resume", tmp_path / "empty_run", tiny_imagefolder],
                       "that folder has no checkpoint.pth")


def test_resume_file_not_a_checkpoint(expect_usage_error, tiny_imagefolder, tmp_path):
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"this is not a checkpoint")
    expect_usage_error(TINY + ["--resume", junk, tiny_imagefolder], "not a readable checkpoint")


def test_resume_refuses_arbitrary_pickles(expect_usage_error, tiny_imagefolder, tmp_path):
    """weights_only loading: a file that needs arbitrary unpickling is refused, not executed."""
    evil = tmp_path / "evil.pth"
    import argparse
    torch.save({"model": {}, "optimizer": {}, "epoch": 1, "arch": "resnet18",
                "payload": argparse.Namespace(x=1)}, evil)  # not on the weights-only allowlist
    expect_usage_error(TINY + ["--resume", evil, tiny_imagefolder], "not a readable checkpoint")


def test_resume_from_another_architecture(expect_usage_error, tiny_imagefolder, tmp_path):
    import torchvision
    saved = tmp_path / "r18.pth"
    torch.save({"arch": "resnet18", "num_classes": 4, "epoch": 1, "optimizer": {},
                "model": torchvision.models.resnet18(num_classes=4).state_dict()}, saved)
    expect_usage_error(["-a", "resnet34", "--image-size", "32", "--resume", saved,
                        tiny_imagefolder], "holds arch resnet18")


@pytest.mark.parametrize("args,message", [
    (["--esync-epsilon", "-0.1"], "--esync-epsilon must be >= 0"),
    (["--local-momentum", "1"], "--local-momentum must be in [0, 1)"),
    (["--esync-rule", "fastest"], "invalid choice: 'fastest'"),
    (["--esync-average", "median"], "invalid choice: 'median'"),
    (["--async-rule", "delayed"], "invalid choice: 'delayed'"),
])
def test_bad_esync_options(expect_usage_error, tiny_imagefolder, args, message):
    expect_usage_error(TINY + ["--mode", "esync", *args, tiny_imagefolder], message,
                       script="ps.py")


@pytest.mark.parametrize("args,message", [
    (["--mode", "bsp"], "invalid choice"),
    (["--num-servers", "0"], "--num-servers must be >= 1"),
    (["--push-dtype", "float8"], "invalid choice: 'float8'"),
    ([], "at least 2 processes"),  # one process: nobody to serve or to train
])
def test_bad_parameter_server_arguments(expect_usage_error, tiny_imagefolder, args, message):
    expect_usage_error(TINY + [*args, tiny_imagefolder], message, script="ps.py")


def test_a_hardware_decoder_share_outside_0_to_1(expect_usage_error, tiny_imagefolder):
    expect_usage_error(TINY + ["--data-backend", "dali-gpu", "--dali-hw-decoder-load", "1.5",
                               tiny_imagefolder], "--dali-hw-decoder-load is a share")
