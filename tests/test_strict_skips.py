"""tests/strict_skips.py, as launch/test.sh runs it (`--strict-skips`, two xdist workers): a
skip nobody declared fails the run and names the test and what it missed; a requirement of
requirements.txt that does not import stops the run before any test, naming it; declared skips
pass. Each in a pytest of its own, on a planted test file."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO, TESTS
from strict_skips import EXPECTED_SKIPS, expected, requirements

PLANTED = '''
import pytest

def test_runs():
    assert 1 + 1 == 2

def test_needs_a_piece():
    pytest.importorskip("a_component_that_did_not_install")
'''


def strict_pytest(folder, *args) -> subprocess.CompletedProcess:
    """pytest --strict-skips in `folder`/tests/, beside a copy of the plugin and, one folder up,
    of requirements.txt (where the plugin reads it), as the repository has them. `python -m`
    puts the folder first on the path: the plugin, and any package planted there, import."""
    tests = folder / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copy(TESTS / "strict_skips.py", tests)
    shutil.copy(REPO / "requirements.txt", folder)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "strict_skips", "-p",
                           "no:cacheprovider", "--strict-skips", "-n", "2", *args],
                          cwd=tests, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_an_undeclared_skip_fails_the_run_naming_the_test_and_the_missing_piece(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_planted.py").write_text(PLANTED)
    strict = strict_pytest(tmp_path, "test_planted.py")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert ("UNEXPECTED SKIP test_planted.py::test_needs_a_piece: could not import "
            "'a_component_that_did_not_install'") in strict.stdout
    assert "1 passed, 1 skipped" in strict.stdout
    # the same run without --strict-skips is green: what the option is for
    plain = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            "test_planted.py"], cwd=tmp_path / "tests", capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout


@pytest.mark.slow
def test_a_requirement_that_does_not_import_stops_the_run_before_any_test(tmp_path):
    """TorchCodec planted broken (a package of its name that fails to import, first on the
    path): the run stops at once, exit 4, naming it and its error."""
    broken = tmp_path / "tests" / "torchcodec"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libtorchcodec_core.so: cannot "
                                        "open shared object file')\n")
    (tmp_path / "tests" / "test_planted.py").write_text(
        PLANTED.replace("test_needs_a_piece", "test_never_reached"))
    strict = strict_pytest(tmp_path, "test_planted.py")
    assert strict.returncode == 4, strict.stdout + strict.stderr
    out = strict.stdout + strict.stderr
    assert "requirements.txt names what does not import here" in out
    assert "torchcodec (import torchcodec): ImportError: libtorchcodec_core.so" in out
    assert "passed" not in strict.stdout


def test_only_gpu_tests_without_a_gpu_and_slurm_without_root_may_skip(monkeypatch):
    """(and CPU-only checks where a GPU is visible)"""
    import strict_skips

    assert [rule.tests for rule in EXPECTED_SKIPS] == ["tests/gpu/*", "tests/*",
                                                       "tests/test_slurm.py::*"]
    gpu_reason = "no CUDA GPU is visible (torch 2.15.0): the GPU tier runs on a GPU machine"
    monkeypatch.setattr(strict_skips, "_no_cuda", lambda: True)
    assert expected("tests/gpu/test_gpu_nccl.py::test_x", gpu_reason)
    assert expected("tests/gpu/test_gpu_dali.py", gpu_reason)  # a module skipped whole
    assert not expected("tests/gpu/test_gpu_decode.py::test_y", "could not import 'torchcodec'")
    assert not expected("tests/test_horovod.py::test_z", gpu_reason)
    assert not expected("tests/test_dali.py", "could not import 'nvidia.dali'")
    monkeypatch.setattr(strict_skips, "_no_cuda", lambda: False)  # a GPU machine runs them
    assert not expected("tests/gpu/test_gpu_nccl.py::test_x", gpu_reason)
    slurm_reason = "the local SLURM cluster needs root (slurmd starts jobs as their user)"
    monkeypatch.setattr(strict_skips, "_slurm_cannot_run", lambda: True)
    assert expected("tests/test_slurm.py::test_sbatch", slurm_reason)
    monkeypatch.setattr(strict_skips, "_slurm_cannot_run", lambda: False)  # root: CI
    assert not expected("tests/test_slurm.py::test_sbatch", slurm_reason)


def test_every_requirement_of_this_machine_is_checked():
    names = dict(requirements())
    assert names["torchcodec"] == "torchcodec" and names["pillow"] == "PIL"
    assert names["nvidia-nvimgcodec-cu13"] == "nvidia.nvimgcodec"
    assert names["nvidia-dali-cuda130"] == "nvidia.dali" and names["pyyaml"] == "yaml"


def test_the_suite_runs_with_strict_skips_and_the_conftest_loads_its_plugin(request):
    """Checks that hold the checker in place: launch/test.sh's pytest call (what CI runs) passes
    --strict-skips, and tests/conftest.py loads the plugin's hooks (this run knows the option).
    Taken out of either, this fast test fails."""
    import shlex

    import conftest
    import strict_skips

    script = (REPO / "launch/test.sh").read_text().replace("\\\n", " ")
    calls = [shlex.split(line) for line in script.splitlines()
             if "-m pytest" in line and not line.lstrip().startswith("#")]
    assert calls, "launch/test.sh runs no pytest"
    for call in calls:
        assert "--strict-skips" in call, " ".join(call)
    assert conftest.pytest_addoption is strict_skips.pytest_addoption
    assert conftest.pytest_configure is strict_skips.pytest_configure
    assert request.config.getoption("--strict-skips") in (True, False)  # registered
