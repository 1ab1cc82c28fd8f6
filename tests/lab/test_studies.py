"""The lab's one-question studies (lab/): their scripts keep running as the engine evolves.
Marked `study`: the default test run leaves them out; `launch/env.sh python -m pytest -m study`
runs them (nothing here is timed). Their page, rebuilt from their records, is checked in the
whole suite (tests/lab/test_lab_page.py)."""
from __future__ import annotations

import json
import os

import pytest

from conftest import lab_module, read_jsonl, records, run_lab

pytestmark = pytest.mark.study


@pytest.mark.slow
def test_bench_loop_runs_and_checks_same_math():
    proc = run_lab("loop", "-a", "resnet18", "--image-size", "32", "-b", "4",
                    "--steps", "2", "--warmup", "1", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine/bare img/s ratio:" in proc.stdout
    check = next(l for l in proc.stdout.splitlines() if l.startswith("same math check:"))
    assert check.endswith("steps each = 0"), check  # bit-identical weights after both loops


@pytest.mark.slow
def test_bench_rpc_transport_shows_uv_leaves_a_waiting_process_idle():
    proc = run_lab("rpc_transport", "--mb", "1", "--repeats", "2", "--idle", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
        if line.startswith("| ") and "round trip" not in line)}
    assert set(rows) == {"uv", "tensorpipe"}
    assert all(float(rows[t][0]) >= float(rows[t][1]) > 0 for t in rows)  # median, fastest
    # CPU time, not wall time: on a busy machine uv's waiting processes still spend ~none
    # (TensorPipe's shared memory polls: about 100 % each on an idle machine).
    assert all(int(share.rstrip("%")) < 25 for share in rows["uv"][2:]), rows


@pytest.mark.slow
def test_bench_ddp_cost_takes_ddp_apart_from_the_kept_logs(tmp_path):
    """lab/ddp_cost.py: nd, two nd at once, DDP 1 and DDP 2 in turns, every ratio computed
    from the runs' own logs; the bare loop alone and under DDP; the all-reduce sized as the model's
    gradients."""
    import statistics

    import torchvision

    from imagenet_recipes.bench.common import interval_img_s
    block = lab_module("ddp_cost").block

    out = tmp_path / "results" / "ddp_cost" / "tiny"
    # Two CPUs on any machine (the tool's processes inherit it): 2 processes x 1 thread then
    # keep both busy, and gloo's all-reduce has no idle core to hide on, which the bare-DDP
    # check below relies on.
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(everywhere)[:2])
    try:
        proc = run_lab("ddp_cost", "--image-size", "32", "-b", "8", "--steps", "11",
                        "--rounds", "1", "--out", out, timeout=600)
    finally:
        os.sched_setaffinity(0, everywhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "bench_ddp_cost.json").read_text())
    assert record["order"] == [["nd", ["nd-r0"]], ["nd x2", ["ndx2-r0", "ndx2-r0-p1"]],
                               ["DDP 1", ["DDP1-r0"]], ["DDP 2", ["DDP2-r0"]]]
    assert read_jsonl(out / "DDP2-r0")[0]["world_size"] == 2
    model = torchvision.models.resnet18(num_classes=10)
    assert record["allreduce"]["numel"] == sum(p.numel() for p in model.parameters())
    assert record["allreduce"]["wall_ms"] > 0

    rate = {run: statistics.median(interval_img_s(out / run))
            for _, runs in record["order"] for run in runs}
    nd, nd2 = rate["nd-r0"], rate["ndx2-r0"] + rate["ndx2-r0-p1"]
    ddp1, ddp2 = rate["DDP1-r0"], rate["DDP2-r0"]
    text = block(out.parent)  # what bench.regenerate writes, from the logs alone
    assert "(logs: `lab/records/ddp_cost/tiny/`)" in text
    assert text.split("\n", 1)[1].strip() in proc.stdout  # the tool's own report, but for that
    assert f"| nd x2 | {nd2:.1f} |" in text
    for label, value in [("nd x2 / (2 x nd)", nd2 / (2 * nd)), ("DDP 1 / nd", ddp1 / nd),
                         ("DDP 2 / nd x2", ddp2 / nd2), ("DDP 2 / (2 x DDP 1)", ddp2 / (2 * ddp1)),
                         ("DDP 2 / (2 x nd)", ddp2 / (2 * nd))]:
        assert f"{label}: **{value:.2f}**" in text, label
    # the hand-written loop: every timed step of each launch, its processes summed
    bare = record["bare"]
    assert list(bare) == ["bare x2", "bare DDP 2"]
    assert all(len(rounds) == 1 and len(rounds[0]) == 11 for rounds in bare.values())
    bare2, bare_ddp2 = (statistics.median(bare[k][0]) for k in bare)
    assert f"| bare x2 | {bare2:.1f} |" in text and f"| bare DDP 2 | {bare_ddp2:.1f} |" in text
    assert f"bare DDP 2 / bare x2: **{bare_ddp2 / bare2:.2f}**" in text
    # under DDP for real (not a rate, which the machine's load decides): each process trains on
    # a batch of its own, and only the all-reduce keeps the two copies' weights equal
    (ddp,), (independent,) = (record["bare_weights"][k] for k in ("bare DDP 2", "bare x2"))
    assert ddp[0] == ddp[1] and independent[0] != independent[1], record["bare_weights"]


@pytest.mark.slow
def test_bench_layout_times_both_layouts_per_size_and_writes_its_record(tmp_path):
    record_path = tmp_path / "bench_layout.json"
    proc = run_lab("layout", "--sizes", "32", "48", "-b", "2", "--steps", "1",
                    "--rounds", "1", "--json", record_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(record_path.read_text())
    assert [r["size"] for r in record["sizes"]] == [32, 48]
    for r in record["sizes"]:
        assert r["NCHW"] > 0 and r["channels_last"] > 0
        assert f"| {r['size']} px |" in proc.stdout
        assert f"**{r['NCHW'] / r['channels_last']:.2f}x**" in proc.stdout


@pytest.mark.slow
def test_bench_hvd_keeps_its_logs_and_reports_from_them(tmp_path):
    pytest.importorskip("horovod.torch",
                        reason="Horovod is not built: bash launch/install_horovod.sh")
    """lab/hvd.py: DDP and Horovod in turns; the block comes from the kept logs alone."""
    out = tmp_path / "bench_hvd"
    proc = run_lab("hvd", "--image-size", "32", "-b", "4", "--steps", "11",
                    "--rounds", "1", "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "bench_hvd.json").read_text())
    assert record["order"] == ["ddp-0", "hvd-0"]
    assert records(out / "hvd-0", "run")[0]["strategy"] == "hvd"
    report = run_lab("hvd", "--report", out)
    assert report.returncode == 0, report.stderr[-3000:]
    assert report.stdout.strip() in proc.stdout
    ratio = next(line for line in report.stdout.splitlines()
                 if line.startswith("| **Horovod / DDP**"))
    assert float(ratio.split("|")[2].strip(" *")) > 0
