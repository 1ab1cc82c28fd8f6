"""What a user sees in TensorBoard: scalars against samples seen (runs of any world size
overlay), tag groups, the run's config as text and as an hparams session, for the engine and
the parameter server. Read back with TensorBoard's own reader, and through the HTTP API of a
real `tensorboard` server started on the runs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, TINY, records, run_forked, unused_port

# Every test here starts real processes, and they share the module's runs: one xdist worker
# runs them all, so the runs are made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tensorboard")]

TRAIN_IMAGES = 64  # tiny_imagefolder


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def runs(tiny_imagefolder, tmp_path_factory):
    """One epoch over all 64 images three ways: nd with global batch 8, DDP 2 x 8 (global 16)
    and the synchronous parameter server with 2 workers x 8."""
    logdir = tmp_path_factory.mktemp("tb_runs")
    common = TINY + ["-p", "2", "--epochs", "1", "--logdir", logdir, tiny_imagefolder]
    run_forked("nd.py", common + ["-b", "8", "--run-name", "nd"])
    run_forked("ddp.py", common + ["-b", "8", "--run-name", "ddp"], nproc=2)
    run_forked("ps.py", common + ["-b", "8", "--run-name", "ps"], nproc=3)
    return logdir


def _accumulator(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events


@pytest.mark.parametrize("name", ["nd", "ddp", "ps"])
def test_scalars_are_plotted_against_samples_seen_under_clear_groups(runs, name):
    events = _accumulator(runs / name)
    tags = set(events.Tags()["scalars"])
    expected = {"eval/top1", "eval/loss", "eval/top5", "train/loss", "train/lr", "train/step",
                "train_epoch/loss", "train_epoch/img_s", "final/best_top1"}
    assert expected <= tags, expected - tags
    assert not any(tag.startswith(("epoch/", "val/")) for tag in tags)
    train, val = records(runs / name, "train"), records(runs / name, "val")
    assert [e.step for e in events.Scalars("train/loss")] == [r["samples_seen"] for r in train]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(
        [r["loss"] for r in train], rel=1e-6)
    assert [e.value for e in events.Scalars("eval/top1")] == pytest.approx(
        [r["top1"] for r in val], rel=1e-6)
    # One epoch is all 64 images whatever the world size and global batch: the curves overlay.
    assert [e.step for e in events.Scalars("train_epoch/loss")] == [TRAIN_IMAGES]
    assert events.Scalars("eval/top1")[-1].step == TRAIN_IMAGES
    best = records(runs / name, "end")[0]["best_top1"]
    assert events.Scalars("final/best_top1")[-1].value == pytest.approx(best)


def test_the_x_axis_differs_from_the_optimizer_step_where_world_sizes_differ(runs):
    """nd takes 8 steps of 8, DDP 4 steps of 16: the same samples, half the steps."""
    nd, ddp = (_accumulator(runs / name) for name in ("nd", "ddp"))
    assert [e.value for e in nd.Scalars("train/step")] == [2, 4, 6, 8]
    assert [e.value for e in ddp.Scalars("train/step")] == [2, 4]
    assert [e.step for e in nd.Scalars("train/step")] == [16, 32, 48, 64]
    assert [e.step for e in ddp.Scalars("train/step")] == [32, 64]


def _get(url: str, data: bytes = None):
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", "X-TensorBoard-Feature-Flags": "{}"})
    with urllib.request.urlopen(request, timeout=60) as response:  # room for a loaded server
        return json.loads(response.read())


def test_a_real_tensorboard_server_serves_scalars_text_and_hparams(runs):
    port = unused_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(runs), "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "false", "--reload_interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    base = f"http://127.0.0.1:{port}/data"

    def query(**params):
        return urllib.parse.urlencode(params)

    def served(name: str) -> bool:
        """Whether the server has read all of a run: a run is listed as soon as its directory
        is found, and its events are read after that, in the server's reload cycles; the last
        one the run wrote is its final/best_top1."""
        try:
            return bool(_get(f"{base}/plugin/scalars/scalars?"
                             f"{query(run=name, tag='final/best_top1')}"))
        except OSError:  # not listening yet, the run not read yet (HTTPError)
            return False

    try:
        # polled with a deadline that leaves a loaded machine minutes
        deadline = time.monotonic() + 300
        while not all(served(name) for name in ("nd", "ddp", "ps")):
            assert server.poll() is None, server.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the runs were not all served after 300 s"
            time.sleep(0.5)
        listed = _get(f"{base}/runs")
        assert sorted(listed) == ["ddp", "nd", "ps"], listed

        for name in ("nd", "ddp", "ps"):
            points = _get(f"{base}/plugin/scalars/scalars?{query(run=name, tag='eval/top1')}")
            val = records(runs / name, "val")
            assert [p[1] for p in points] == [r["samples_seen"] for r in val]
            assert [p[2] for p in points] == pytest.approx([r["top1"] for r in val], rel=1e-6)
            text = _get(f"{base}/plugin/text/text?{query(run=name, tag='run/config/text_summary')}")
            # add_text's tag gets "/text_summary"; the plugin renders the Markdown to HTML
            html = text[0]["text"]
            config = json.loads(html[html.index("{"):html.rindex("}") + 1].replace("&quot;", '"'))
            assert config["config"]["batch_size"] == 8 and config["kind"] == "run"

        experiment = _get(f"{base}/plugin/hparams/experiment",
                          data=json.dumps({"experimentName": ""}).encode())
        hparams = {h["name"] for h in experiment["hparamInfos"]}
        assert {"arch", "lr", "batch_size", "entry", "world_size", "precision.opt_level"} <= hparams
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert {"eval/top1", "eval/loss", "final/best_top1"} <= metrics
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Traceback" not in output, output[-3000:]
