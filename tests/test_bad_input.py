"""Bad input ends with one clear message and exit status 2, and writes nothing."""
from __future__ import annotations

import pytest
import torch

from conftest import TINY, run_script


def _expect_usage_error(args, message, tmp_path, script="nd.py"):
    proc = run_script(script, list(args) + ["--logdir", tmp_path / "runs"], check=False,
                      timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists(), "a failed start must not leave a run dir behind"


def test_missing_data_dir(tmp_path):
    _expect_usage_error(TINY + [tmp_path / "nope"], "does not exist", tmp_path)


def test_a_file_given_as_the_data_folder(tmp_path):
    archive = tmp_path / "imagenet.tar"
    archive.write_bytes(b"not a folder")
    _expect_usage_error(TINY + [archive], "is a file, not a folder", tmp_path)


def test_flat_imagenet_val_points_to_the_prepare_script(tiny_imagefolder, tmp_path):
    """ILSVRC2012_img_val.tar extracts to 50,000 images in val/ itself, without classes."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder / "train", data / "train")
    (data / "val").mkdir()
    for i, image in enumerate(sorted((tiny_imagefolder / "val").rglob("*.JPEG"))):
        shutil.copy(image, data / "val" / f"ILSVRC2012_val_{i + 1:08d}.JPEG")
    _expect_usage_error(TINY + [data], "python data/prepare_imagenet_val.py", tmp_path)


def test_no_dataset_argument(tmp_path):
    _expect_usage_error(TINY, "the dataset path is missing", tmp_path)


def test_empty_data_dir(tmp_path):
    (tmp_path / "data").mkdir()
    _expect_usage_error(TINY + [tmp_path / "data"], "train", tmp_path)


def test_no_class_folders(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
    _expect_usage_error(TINY + [tmp_path / "data"], "class", tmp_path)


def test_val_classes_differ(tiny_imagefolder, tmp_path):
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    shutil.rmtree(sorted((data / "val").iterdir())[0])
    _expect_usage_error(TINY + [data], "class folders differ", tmp_path)


def test_empty_class_folder(tiny_imagefolder, tmp_path):
    """A class folder without images (an interrupted copy, say) is refused before training,
    naming the folder."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(tiny_imagefolder, data)
    empty = sorted((data / "train").iterdir())[1]
    for image in empty.iterdir():
        image.unlink()
    _expect_usage_error(TINY + [data], empty.name, tmp_path)


def test_dali_gpu_without_a_gpu(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--data-backend", "dali-gpu", tiny_imagefolder],
                        "use --data-backend dali-cpu", tmp_path)


def test_fp16_allreduce_is_horovod_only(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--fp16-allreduce", tiny_imagefolder],
                        "--fp16-allreduce is an option of train/hvd.py, not of train/ddp.py; "
                        "DDP's counterpart is --ddp-comm-hook fp16", tmp_path, script="ddp.py")


def test_ddp_comm_hook_needs_ddp(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--ddp-comm-hook", "fp16", tiny_imagefolder],
                        "--ddp-comm-hook is an option of train/ddp.py, train/ddp_apex.py, not of "
                        "train/nd.py", tmp_path)


def _help(script: str) -> str:
    return run_script(script, ["-h"]).stdout


@pytest.mark.parametrize("script,absent", [
    ("nd.py", ["--ddp-comm-hook", "--fp16-allreduce", "--sync-bn", "--dist-timeout", "--mode "]),
    ("ddp.py", ["--fp16-allreduce", "--mode ", "--evaluator"]),
    ("hvd.py", ["--ddp-comm-hook", "--powersgd-rank", "--dist-timeout"]),
    ("ps.py", ["--ddp-comm-hook", "--grad-accum", "--sync-bn", "--compile", "--evaluate",
               "--opt ",
               "--model-ema", "--mixup-alpha", "--clip-grad-norm", "--norm-weight-decay"]),
])
def test_help_lists_only_the_scripts_own_options_in_groups(script, absent):
    text = " ".join(_help(script).split(" "))
    headings = [line for line in text.splitlines() if line.endswith(" options:")]
    expected = ["presets options:", "data options:", "augmentation options:", "model options:",
                "optimization options:", "regularization options:", "precision options:",
                "distribution options:", "checkpointing options:", "logging options:"] + (["parameter server options:"] if script == "ps.py" else [])
    assert headings == expected, headings
    for flag in absent:
        assert flag not in text, f"{script} -h lists {flag}"
    assert "(default: None)" not in text and "(default: False)" not in text
    options = text[text.index("optimization options:"):]
    seed_help = " ".join(options[options.index("--seed"):options.index("--deterministic")].split())
    assert seed_help.count("default") == 1 and seed_help.endswith("(default: 0)"), seed_help


def test_ddp_help_has_the_ddp_options():
    text = _help("ddp.py")
    for flag in ("--ddp-comm-hook", "--sync-bn", "--dist-timeout", "--opt-level"):
        assert flag in text


def test_powersgd_needs_a_warm_up_step(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--ddp-comm-hook", "powersgd", "--powersgd-start-step", "1",
                                tiny_imagefolder], "--powersgd-start-step >= 2", tmp_path,
                        script="ddp.py")


def test_unknown_arch(tiny_imagefolder, tmp_path):
    _expect_usage_error(["-a", "resnet5000", tiny_imagefolder], "unknown architecture", tmp_path)


@pytest.mark.parametrize("flag", ["-b", "--epochs"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_non_positive_sizes(tiny_imagefolder, tmp_path, flag, value):
    _expect_usage_error(TINY + [flag, value, tiny_imagefolder], "must be a positive integer",
                        tmp_path)


def test_unknown_opt_level(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--opt-level", "O4", tiny_imagefolder], "invalid choice",
                        tmp_path)


def test_apex_only_option_is_explained(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--keep-batchnorm-fp32", "True", tiny_imagefolder],
                        "apex-only option", tmp_path, script="ddp_apex.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_requested_without_gpu(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--device", "cuda", tiny_imagefolder], "no CUDA GPU", tmp_path)


def test_resume_file_missing(tiny_imagefolder, tmp_path):
    _expect_usage_error(TINY + ["--resume", tmp_path / "nope.pth", tiny_imagefolder],
                        "no such checkpoint", tmp_path)


def test_resume_a_folder_without_a_checkpoint(tiny_imagefolder, tmp_path):
    (tmp_path / "empty_run").mkdir()
    _expect_usage_error(TINY + ["--resume", tmp_path / "empty_run", tiny_imagefolder],
                        "that folder has no checkpoint.pth", tmp_path)


def test_resume_file_not_a_checkpoint(tiny_imagefolder, tmp_path):
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"this is not a checkpoint")
    _expect_usage_error(TINY + ["--resume", junk, tiny_imagefolder], "not a readable checkpoint",
                        tmp_path)


def test_resume_refuses_arbitrary_pickles(tiny_imagefolder, tmp_path):
    """weights_only loading: a file that needs arbitrary unpickling is refused, not executed."""
    evil = tmp_path / "evil.pth"
    import argparse
    torch.save({"model": {}, "optimizer": {}, "epoch": 1, "arch": "resnet18",
                "payload": argparse.Namespace(x=1)}, evil)  # not on the weights-only allowlist
    _expect_usage_error(TINY + ["--resume", evil, tiny_imagefolder], "not a readable checkpoint",
                        tmp_path)


def test_resume_from_another_architecture(tiny_imagefolder, tmp_path):
    run_script("nd.py", TINY + ["-b", "16", "--epochs", "1", "--steps-per-epoch", "1",
                                "--logdir", tmp_path / "first", "--run-name", "r18",
                                tiny_imagefolder])
    _expect_usage_error(["-a", "resnet34", "--image-size", "32", "--resume",
                         tmp_path / "first/r18/checkpoint.pth", tiny_imagefolder],
                        "holds arch resnet18", tmp_path)


@pytest.mark.parametrize("args,message", [
    (["--esync-epsilon", "-0.1"], "--esync-epsilon must be >= 0"),
    (["--local-momentum", "1"], "--local-momentum must be in [0, 1)"),
    (["--esync-rule", "fastest"], "invalid choice: 'fastest'"),
])
def test_bad_esync_options(tiny_imagefolder, tmp_path, args, message):
    _expect_usage_error(TINY + ["--mode", "esync", *args, tiny_imagefolder], message, tmp_path,
                        script="ps.py")
