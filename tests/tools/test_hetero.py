"""bench.hetero, the slow-and-uneven-workers comparison, and lab/hetero.py, the whole study: the
commands they run, how the report counts local SGD's traffic and what it concludes from a table
of runs. In-process but for one dry run of the study's script (its real runs are read by
test_results' byte-for-byte regeneration of results/hetero/)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from conftest import lab_module, run_lab

from imagenet_recipes.bench import hetero, ps_stats


def _args(**kw) -> argparse.Namespace:
    defaults = dict(arch="resnet18", image_size=32, batch_size=16, epochs=6, lr=0.4,
                    warmup_epochs=1, print_freq=5, repeats=2, workers=3,
                    profiles=list(hetero.PROFILES), splits=list(hetero.SPLITS),
                    methods=list(hetero.RUN_METHODS), more=hetero.MoreMethods(),
                    esync_epsilon=0.05, loader_workers=1)
    return argparse.Namespace(**{**defaults, **kw})


def _study_args(**kw) -> argparse.Namespace:
    """lab/hetero.py's: every method, the local SGD experiment's two included."""
    study = lab_module("hetero").LOCAL_SGD_METHODS
    return _args(methods=list(hetero.METHODS), more=study, local_sgd_period=4,
                 local_sgd_warmup_steps=14, outer_lr=0.7, outer_momentum=0.9, **kw)


def _flag(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def _program(argv):
    """The module a launch runs (`-m MODULE`, after torchrun's own options)."""
    return argv[len(argv) - argv[::-1].index("-m")]


def test_the_tool_runs_the_products_methods_under_every_profile_and_ddp_only_on_iid():
    listed = hetero.jobs(_args(), Path("out"), Path("data"))
    names = [name for name, _ in listed]
    per_seed = len(hetero.PROFILES) * (2 * len(hetero.RUN_METHODS) - 1)
    assert len(names) == 2 * per_seed and len(set(names)) == len(names)
    assert all(n.endswith("-s0") for n in names[:per_seed])  # seeds outermost
    for name, argv in listed:
        profile = next(p for p in hetero.PROFILES if name.startswith(p + "-"))
        slowdown, start = hetero.PROFILES[profile]
        assert _flag(argv, "--worker-slowdown") == slowdown
        assert _flag(argv, "--slowdown-from-epoch") == str(start)
        assert not any("experiments" in a for a in argv)  # a tool starts no experiment
        if "-ddp-" in name:
            assert _program(argv) == "imagenet_recipes.bench.slow_workers.ddp"
            assert "-iid-" in name and "--nproc_per_node=3" in argv
        else:
            assert _program(argv) == "imagenet_recipes.bench.slow_workers.ps"
            assert "--nproc_per_node=4" in argv
            split = "by-class" if "-by-class-" in name else "iid"
            assert _flag(argv, "--split") == split
            mode, _, rule = name.split(f"-{split}-")[1].rsplit("-s", 1)[0].partition("-")
            assert _flag(argv, "--mode") == mode
            option = {"async": "--async-rule", "esync": "--esync-average"}.get(mode)
            assert option is None or _flag(argv, option) == rule
    midway = dict(hetero.jobs(_args(profiles=["midway"], repeats=1), Path("o"), Path("d")))
    assert all(_flag(a, "--slowdown-from-epoch") == "3" for a in midway.values())


def test_the_lab_study_adds_local_sgd_and_diloco_on_the_iid_split_only():
    listed = dict(hetero.jobs(_study_args(), Path("out"), Path("data")))
    tool = dict(hetero.jobs(_args(), Path("out"), Path("data")))
    added = {name: argv for name, argv in listed.items() if name not in tool}
    assert set(listed) >= set(tool)
    assert len(added) == 2 * len(hetero.PROFILES) * 2  # 2 methods, iid only, 2 seeds
    for name, argv in added.items():
        assert "-iid-" in name and ("-local-sgd-" in name or "-diloco-" in name)
        assert _program(argv) == "imagenet_recipes.experiments.local_sgd"
        assert "--nproc_per_node=3" in argv and _flag(argv, "--local-sgd-period") == "4"
        assert (_flag(argv, "--local-sgd-outer-momentum") == "0.9") == ("diloco" in name)
        assert _flag(argv, "--worker-slowdown") is not None  # the experiment takes it itself


def test_local_sgd_traffic_counts_warm_up_steps_averagings_and_the_epoch_ends():
    assert ps_stats.all_reduces({}, 80, 6) == 80  # plain DDP: one per step
    cfg = {"local_sgd_period": 4, "local_sgd_warmup_steps": 14}
    assert ps_stats.all_reduces(cfg, 80, 6) == 14 + 66 // 4 + 2 * 6
    assert ps_stats.all_reduces(cfg, 10, 1) == 10 + 0 + 2  # still in its warm-up


def _row(method, seed, final, time, profile="one-2x", split="iid"):
    return {"profile": profile, "split": split, "method": method, "seed": seed,
            "final": final, "time": time}


def test_verdicts_name_the_fastest_method_that_always_reached_the_target_and_the_spread():
    rows = [_row("sync", 0, 90, 50), _row("sync", 1, 92, 60),
            _row("ddp", 0, 91, 40), _row("ddp", 1, 93, 45),
            _row("async-plain", 0, 50, None), _row("async-plain", 1, 60, 20),
            _row("esync-mean", 0, 89, 30), _row("esync-mean", 1, 95, 33),
            _row("esync-normalized", 0, 93, 70), _row("esync-normalized", 1, 94, 80)]
    (found,) = hetero.verdicts(rows)
    # async-plain was faster once but missed the target once: not a winner
    assert (found["fastest"], found["fastest_s"]) == ("esync-mean", 31.5)
    assert found["next_ratio"] == 42.5 / 31.5  # ddp, the next one
    assert found["level"] == ["ddp", "esync-mean"] and found["below"] == ["async-plain"]
    assert found["above"] == ["esync-normalized"]
    (none,) = hetero.verdicts([_row("sync", 0, 90, None)])
    assert none["fastest"] is None and none["level"] == none["below"] == none["above"] == []


def test_the_block_says_the_verdicts_in_words():
    run = {"config": {"arch": "resnet18", "image_size": 32, "batch_size": 16, "epochs": 6,
                      "lr": 0.4, "local_sgd_period": 4, "local_sgd_warmup_steps": 14},
           "hardware": {"gpus": [], "cpu": "Some CPU", "cpu_count": 2},
           "versions": {"torch": "2.15.0"}, "commit": "abc1234"}
    rows = [dict(_row(m, s, final, t), run=run, gap=final - 91, samples_s=100.0,
                 kb_per_sample=1000.0, traffic="computed" if m == "local-sgd" else "measured")
            for m, s, final, t in [("sync", 0, 90, 50), ("sync", 1, 92, 60),
                                   ("local-sgd", 0, 91, 40), ("local-sgd", 1, 93, 45),
                                   ("async-plain", 0, 50, None), ("async-plain", 1, 60, 20)]]
    text = hetero.report(rows, 5.0)
    assert ("* **one-2x, iid**: fastest to the target in every run: **local-sgd** (42 s "
            "median; the next 1.29x slower); final top-1 within sync's spread: local-sgd; "
            "below all of sync's runs: async-plain.") in text
    assert "`--local-sgd-period 4 --local-sgd-warmup-steps 14`" in text
    assert "| one-2x | iid | local-sgd | 2 | 92.0 (91.0-93.0) | +1.0 (+0.0 to +2.0) | " \
           "42 (40-45) (2 of 2) | 100 | 1000 (computed) |" in text
    assert "minus\n5 points" in text or "minus 5 points" in text


@pytest.mark.slow
def test_the_lab_study_runs_as_its_docstring_says(tmp_path):
    """`python lab/hetero.py --dry-run`: the tool's command line with the study's options added,
    the experiment's module started under torchrun beside the tool's."""
    proc = run_lab("hetero", "--dry-run", "--quick", "--profiles", "one-2x", "--repeats", "1",
                   "--splits", "iid", "--local-sgd-period", "3", "--out", tmp_path / "h")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "torch.distributed.run" in line]
    modules = sorted({line.split(" -m ")[2].split()[0] for line in lines})
    assert modules == ["imagenet_recipes.bench.slow_workers.ddp",
                       "imagenet_recipes.bench.slow_workers.ps",
                       "imagenet_recipes.experiments.local_sgd"]
    assert sum("--local-sgd-period 3" in line for line in lines) == 2  # local-sgd, diloco
