"""Unit tests of the scaling model (imagenet_recipes/bench/scaling/): closed forms, limits, the overlap rule, PS
vs ring, the validation table (a regression guard on which published cases the model
reproduces), run-log reading and the CLI. Pure Python: no torch import, no training run."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from imagenet_recipes.bench.scaling import __main__ as cli
from imagenet_recipes.bench.scaling import cases, measured, report
from imagenet_recipes.bench.scaling import model as sm

GB, US, MIB = sm.GB, sm.US, sm.MIB


def hw(**kw) -> "sm.Hardware":
    base = sm.Hardware("test", 4, intra=sm.Link(100 * GB, 2 * US), inter=sm.Link(10 * GB, 5 * US),
                       nics_per_node=1, overlap=1.0, collective_latency=0.0)
    return replace(base, **kw)


WL = sm.Workload("resnet50", 256, 1000.0, "fp16", bucket_bytes=25 * MIB)


def test_ring_allreduce_matches_closed_form():
    link = sm.Link(10 * GB, 5 * US)
    p, size = 8, 100e6
    expected = 2 * 7 / 8 * size / (10 * GB) + 2 * 7 * 5e-6
    assert sm.ring_allreduce_time(p, size, link) == pytest.approx(expected, rel=1e-12)
    assert sm.ring_allreduce_time(1, size, link) == 0.0
    # bandwidth term tends to 2 S / B, latency term grows linearly with p
    big = sm.ring_allreduce_time(1024, size, sm.Link(10 * GB, 0.0))
    assert big == pytest.approx(2 * size / (10 * GB), rel=1e-3)


def test_flat_ring_uses_the_slowest_hop_and_counts_network_steps():
    h = hw()
    size = 50e6
    assert sm.flat_ring_time(4, 4, size, h) == pytest.approx(
        sm.ring_allreduce_time(4, size, h.intra))  # one node: NVLink only
    n = 16  # 4 nodes of 4
    expected = (2 * 15 / 16 * size / (10 * GB) + (2 * 15 - 2 * 3) * 2 * US + 2 * 3 * 5 * US)
    assert sm.flat_ring_time(n, 4, size, h) == pytest.approx(expected, rel=1e-12)
    # two NICs per node run two rings: the node-crossing bandwidth doubles
    two = sm.flat_ring_time(n, 4, size, hw(nics_per_node=2, inter=sm.Link(10 * GB, 0.0),
                                           intra=sm.Link(100 * GB, 0.0)))
    assert two == pytest.approx(2 * 15 / 16 * size / (20 * GB))


def test_one_device_has_efficiency_one_and_no_communication():
    for algo in sm.ALGOS:
        p = sm.predict(WL, hw(), 1, algo)
        assert p.t_comm == 0.0 and p.exposed == 0.0
        assert p.efficiency == pytest.approx(1.0)
        assert p.img_s == pytest.approx(WL.img_s_1)


def test_efficiency_decreases_with_lower_bandwidth():
    effs = []
    for gbs in (100, 25, 10, 2.5, 1, 0.25):
        h = hw(inter=sm.Link(gbs * GB, 5 * US))
        effs.append(sm.predict(WL, h, 64, "ring").efficiency)
    assert all(a >= b for a, b in zip(effs, effs[1:]))
    assert effs[0] > effs[-1] + 0.2  # a real drop, not rounding
    # and with more nodes at fixed bandwidth (latency term) it never improves
    by_n = [sm.predict(WL, hw(), n, "ring").efficiency for n in (4, 8, 16, 64, 256, 1024)]
    assert all(a >= b for a, b in zip(by_n, by_n[1:]))


def test_full_overlap_hides_comm_shorter_than_backward_except_last_bucket():
    t_comm, t_bwd = 0.05, 0.2
    assert sm.exposed_comm(t_comm, t_bwd, 5, 1.0) == pytest.approx(t_comm / 5)
    assert sm.exposed_comm(t_comm, t_bwd, 1000, 1.0) == pytest.approx(t_comm / 1000)
    assert sm.exposed_comm(t_comm, t_bwd, 5, 0.0) == t_comm        # no overlap
    assert sm.exposed_comm(t_comm, t_bwd, 1, 1.0) == t_comm        # one bucket: none possible
    # comm longer than backward: only backward's worth (minus the last bucket) hides
    assert sm.exposed_comm(0.5, t_bwd, 5, 1.0) == pytest.approx(0.5 - t_bwd * 4 / 5)
    # half the backward window usable
    assert sm.exposed_comm(0.5, t_bwd, 5, 0.5) == pytest.approx(0.5 - 0.1 * 4 / 5)
    # end to end: comm much shorter than backward costs (almost) nothing
    p = sm.predict(replace(WL, bucket_bytes=1 * MIB), hw(), 16, "ring")
    assert p.t_comm < WL.backward_fraction * WL.step_time_1
    assert p.efficiency > 0.995
    assert sm.predict(WL, hw(), 16, "ring", overlap=0.0).exposed == pytest.approx(
        sm.predict(WL, hw(), 16, "ring").t_comm)


def test_ps_sharded_over_all_nodes_moves_what_a_ring_moves_and_one_server_does_not_scale():
    flat = hw(devices_per_node=1, intra=sm.Link(100 * GB, 0.0), inter=sm.Link(10 * GB, 0.0))
    size = 100e6
    for m in (2, 8, 64):
        ring = sm.flat_ring_time(m, 1, size, flat)
        assert sm.ps_time(m, 1, size, flat, servers=m) == pytest.approx(ring)
        # fewer servers than nodes: the servers' NICs become the bottleneck
        assert sm.ps_time(m, 1, size, flat, servers=max(1, m // 2)) >= ring
    one = [sm.ps_time(m, 1, size, flat, servers=1, colocated=False) for m in (8, 16, 32, 64)]
    assert [b / a for a, b in zip(one, one[1:])] == pytest.approx([2, 2, 2])  # linear in m
    ring = [sm.flat_ring_time(m, 1, size, flat) for m in (8, 16, 32, 64)]
    assert ring[-1] / ring[0] < 1.2                                            # ~constant


def test_ps_pull_is_never_hidden_behind_backward():
    h = hw()
    p = sm.predict(WL, h, 16, "ps", ps_servers=4)
    hideable, serial = sm.comm_time("ps", 16, WL, h, ps_servers=4)
    assert serial > 0 and p.exposed >= serial
    assert p.exposed < p.t_comm  # the push part does hide
    r = sm.predict(WL, h, 16, "ring")
    assert r.efficiency > p.efficiency


def test_hierarchical_all_nics_beats_leaders_only_and_matches_ring_on_one_nic():
    size = 100e6
    four = hw(nics_per_node=4)
    assert sm.hierarchical_time(64, 4, size, four) < sm.hierarchical_time(
        64, 4, size, four, leaders_only=True)
    # one NIC, no latency: same inter-node bytes as the flat ring, plus the NVLink phases
    no_lat = hw(intra=sm.Link(100 * GB, 0.0), inter=sm.Link(10 * GB, 0.0))
    hier = sm.hierarchical_time(64, 4, size, no_lat)
    assert hier == pytest.approx(2 * 15 / 16 * size / (10 * GB) + 2 * 3 / 4 * size / (100 * GB))
    assert sm.hierarchical_time(4, 4, size, no_lat) == sm.ring_allreduce_time(4, size,
                                                                             no_lat.intra)


def test_gradient_bytes_and_buckets_follow_the_model_and_dtype():
    assert WL.grad_bytes == 25_557_032 * 2
    assert WL.n_buckets == math.ceil(25_557_032 * 2 / (25 * MIB))
    per_tensor = replace(WL, bucket_bytes=None)
    assert per_tensor.n_buckets == 161
    assert replace(WL, grad_dtype="fp32").grad_bytes == 2 * WL.grad_bytes


def test_validation_cases_regression_guard():
    rows = cases.validate()
    errors = {r.case.name: r.error for r in rows if not r.case.anchor}
    # Outside the model's scope, documented in RESULTS.md: the AMP rows (host input pipeline,
    # not communication: the TF32/FP32 rows of the same tables fit) and HAL beyond 16 GPUs
    # (shared-storage reads). The model is optimistic there, never pessimistic.
    known_out = {"DLE RN50 AMP, DGX A100 80GB", "DLE RN50 AMP, DGX-1 V100 16GB",
                 "HAL RN50 apex O2, 32 V100", "HAL RN50 apex O2, 64 V100"}
    inside = {name for name, e in errors.items() if abs(e) <= 0.15}
    assert inside == set(errors) - known_out, errors
    assert all(errors[name] > 0.15 for name in known_out)
    assert len(inside) >= 11
    anchors = [r for r in rows if r.case.anchor]
    assert len(anchors) == 1 and abs(anchors[0].error) < 0.01


def _write_run(path, entry, world, threads, img_s, start, arch="resnet18", **extra):
    path.mkdir(parents=True)
    cfg = {"arch": arch, "image_size": 64, "batch_size": 32, "dummy": True, "grad_accum": 1}
    recs = [{"kind": "run", "time": start, "elapsed": 0.0, "config": cfg, "entry": entry,
             "world_size": world, "precision": {"opt_level": "O0", "dtype": "float32"},
             "hardware": {"host": "h", "torch_threads": threads}, **extra}]
    recs += [{"kind": "train", "time": start + 5 * i, "elapsed": 5.0 * i, "img_s": v}
             for i, v in enumerate([1.0] + img_s, start=1)]
    recs.append({"kind": "val", "time": 0.3, "elapsed": 5.0 * (len(img_s) + 2)})
    path.joinpath("log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"kin")


def test_runs_are_read_robustly_grouped_and_predicted(tmp_path):
    _write_run(tmp_path / "s" / "nd-alone", "nd", 1, 1, [50, 52, 48], start=1000)
    _write_run(tmp_path / "s" / "nd-twin-a", "nd", 1, 1, [45, 46, 47], start=2000)
    _write_run(tmp_path / "s" / "nd-twin-b", "nd", 1, 1, [44, 46, 48], start=2001)
    _write_run(tmp_path / "s" / "ddp", "ddp", 2, 1, [80, 82, 78], start=3000)
    _write_run(tmp_path / "s" / "hvd", "hvd", 2, 1, [60], start=4000)
    _write_run(tmp_path / "s" / "ps-sync", "ps", 3, 1, [70], start=5000, mode="sync", workers=2)
    _write_run(tmp_path / "s" / "ps-async", "ps", 3, 1, [75], start=6000, mode="async",
               workers=2)
    (tmp_path / "s" / "empty-dir").mkdir()
    (tmp_path / "s" / "no-train").mkdir()
    (tmp_path / "s" / "no-train" / "log.jsonl").write_text('{"kind": "run"}\n')
    runs = measured.collect_runs([tmp_path])
    assert sorted(r.path.name for r in runs) == ["ddp", "hvd", "nd-alone", "nd-twin-a",
                                                 "nd-twin-b", "ps-async", "ps-sync"]
    twin = {r.path.name: r.beside_twin for r in runs if r.entry == "nd"}
    assert twin == {"nd-alone": False, "nd-twin-a": True, "nd-twin-b": True}
    ddp = next(r for r in runs if r.entry == "ddp")
    assert ddp.img_s == 80  # median after dropping the warm-up interval
    loop = replace(cases.PRESETS["cpu-loopback"], intra=sm.Link(1 * GB, 100 * US),
                   inter=sm.Link(1 * GB, 100 * US))
    rows = {r["entry"]: r for r in measured.cpu_comparison(runs, loop)}
    assert set(rows) == {"ddp", "hvd", "ps sync", "ps async"}
    assert "not modelled" in rows["ps async"]["note"] and not rows["ps async"]["predicted"]
    # the PS server is a process of its own: 2 workers, each shipping every tensor to it
    assert rows["ps sync"]["predicted"]["alone"] < rows["ddp"]["predicted"]["alone"]
    assert rows["ddp"]["baseline"] == {"alone": 50, "twin": 46}
    assert 2 * 46 * 0.8 < rows["ddp"]["predicted"]["twin"] < rows["ddp"]["predicted"]["alone"]
    assert rows["ddp"]["predicted"]["alone"] < 2 * 50
    assert "| ddp | 2x1 |" in report.cpu_markdown(list(rows.values()))


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--predict"])
    assert e.value.code == 2
    assert "--img-s" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--runs", str(tmp_path / "missing")])
    assert e.value.code == 2


def test_cli_prediction_table(capsys):
    assert cli.main(["--predict", "--preset", "dgx-a100", "--img-s", "2470", "--batch", "256",
                    "--devices", "1", "8", "64", "--algo", "ring", "ps"]) == 0
    out = capsys.readouterr().out
    assert "| ring | 1 | 1 |" in out and "100.0%" in out and "| ps | 64 | 8 |" in out
