"""Scaling model for data-parallel training: predicted img/s and scaling efficiency, checked
against published multi-device results and against this machine's runs.

    launch/env.sh python -m imagenet_recipes.bench.scaling                    # presets + validation table
    launch/env.sh python -m imagenet_recipes.bench.scaling --runs runs/bench-cpu  # + this CPU, measured
    launch/env.sh python -m imagenet_recipes.bench.scaling --measure-loopback --runs runs/sweep-x
    launch/env.sh python -m imagenet_recipes.bench.scaling --predict --preset dgx-a100 --arch resnet50 \\
        --grad-dtype fp32 --img-s 2470 --batch 256 --devices 8 16 64 --algo ring hier ps

The model (imagenet_recipes/bench/scaling/model.py) in one paragraph. A device computes one step of `batch`
images in T1 (a published or measured single-device throughput). Gradients of S bytes are then
averaged across N devices; that collective costs T_comm from the alpha-beta model for a flat
ring all-reduce, a hierarchical all-reduce or a sharded parameter server, and the part of it
that backward cannot hide is added to the step. Hardware presets and the published cases are in
cases.py (each with its source), this machine's runs and loopback link in measured.py, the
tables and the RESULTS.md block in report.py (bench.regenerate writes that block, from the sweep
kept in results/sweep/).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from imagenet_recipes.bench.scaling.cases import PRESETS, validate
from imagenet_recipes.bench.scaling.measured import collect_runs, cpu_comparison, measure_loopback
from imagenet_recipes.bench.scaling.model import ALGOS, DTYPE_BYTES, GB, PARAMS, US, Link, check_params
from imagenet_recipes.bench.scaling.report import cpu_markdown, custom_prediction, presets_markdown, \
    validation_markdown


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, action="append", default=[],
                    help="folder of run dirs (each with log.jsonl; searched recursively); "
                         "repeatable")
    ap.add_argument("--measure-loopback", action="store_true",
                    help="measure gloo all-reduce bandwidth/latency between 2 local processes")
    ap.add_argument("--loopback-gbs", type=float, help="loopback bandwidth, GB/s")
    ap.add_argument("--loopback-us", type=float, help="loopback latency per step, us")
    ap.add_argument("--check-params", action="store_true",
                    help="recount the PARAMS table with torchvision")
    ap.add_argument("--json", type=Path, help="also write the tables as JSON here")
    pr = ap.add_argument_group("custom prediction (--predict)")
    pr.add_argument("--predict", action="store_true")
    pr.add_argument("--preset", choices=sorted(PRESETS), default="dgx-a100")
    pr.add_argument("--arch", default="resnet50")
    pr.add_argument("--grad-dtype", choices=sorted(DTYPE_BYTES), default="fp32")
    pr.add_argument("--img-s", type=float, help="single-device images/s")
    pr.add_argument("--step-time", type=float, help="single-device step time, s (with --batch)")
    pr.add_argument("--batch", type=int, default=256, help="images per device per step")
    pr.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    pr.add_argument("--devices-per-node", type=int)
    pr.add_argument("--algo", nargs="+", choices=ALGOS, default=["ring", "hier", "ps"])
    pr.add_argument("--ps-servers", type=int, help="PS shards (default: one per node)")
    pr.add_argument("--ps-dedicated", action="store_true", help="servers on their own nodes")
    pr.add_argument("--bucket-mb", type=float, default=25.0, help="MiB per bucket; 0: per tensor")
    pr.add_argument("--overlap", type=float, help="0..1, share of backward usable for comm")
    pr.add_argument("--backward-fraction", type=float, default=2 / 3)
    pr.add_argument("--accum", type=int, default=1, help="micro-batches per all-reduce")
    pr.add_argument("--intra-gbs", type=float)
    pr.add_argument("--intra-us", type=float)
    pr.add_argument("--inter-gbs", type=float)
    pr.add_argument("--inter-us", type=float)
    pr.add_argument("--nics", type=int)
    pr.add_argument("--host-img-s", type=float, help="input-pipeline ceiling per node, img/s")
    pr.add_argument("--storage-img-s", type=float, help="shared-storage ceiling, img/s")
    args = ap.parse_args(argv)
    if args.predict:
        if not args.img_s and not args.step_time:
            ap.error("--predict needs the single-device speed: --img-s N, or --step-time S "
                     "with --batch")
        if args.overlap is not None and not 0 <= args.overlap <= 1:
            ap.error("--overlap is a fraction between 0 and 1")
        if args.arch not in PARAMS:
            import torchvision

            if not callable(getattr(torchvision.models, args.arch, None)):
                ap.error(f"--arch {args.arch}: not a torchvision model (e.g. resnet50, "
                         "vgg16, inception_v3)")
    for d in args.runs:
        if not d.is_dir():
            ap.error(f"--runs {d}: no such folder (give a folder that holds run dirs with "
                     "log.jsonl files)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.check_params:
        problems = check_params()
        print("\n".join(problems) if problems else
              f"PARAMS table matches torchvision for {', '.join(PARAMS)}")
        return 1 if problems else 0
    if args.predict:
        print(custom_prediction(args))
        return 0

    rows = validate()
    print(f"Hardware presets\n\n{presets_markdown(sorted({r.case.hardware for r in rows}))}\n")
    print(f"Predicted vs published\n\n{validation_markdown(rows)}\n")
    scored = [r for r in rows if not r.case.anchor]
    print(f"{sum(abs(r.error) <= 0.15 for r in scored)} of {len(scored)} cases within +-15 %; "
          f"worst {max(scored, key=lambda r: abs(r.error)).case.name} "
          f"({max(abs(r.error) for r in scored):.0%}).\n")

    loop = PRESETS["cpu-loopback"].intra
    loop_note = "preset (measured 2026-11-22 on a quiet machine)"
    if args.measure_loopback:
        loop = measure_loopback()
        loop_note = f"measured now ({time.strftime('%Y-%m-%d')})"
    if args.loopback_gbs or args.loopback_us:
        loop = Link((args.loopback_gbs or loop.bandwidth / GB) * GB,
                    (args.loopback_us if args.loopback_us is not None
                     else loop.latency / US) * US)
        loop_note = "given on the command line"
    print(f"Loopback ({loop_note}): {loop.bandwidth / GB:.2f} GB/s, {loop.latency / US:.0f} us")
    cpu_hw = replace(PRESETS["cpu-loopback"], intra=loop, inter=loop)
    cpu_rows = None
    if args.runs:
        runs = collect_runs(args.runs)
        cpu_rows = cpu_comparison(runs, cpu_hw)
        print(f"\nThis machine: {len(runs)} runs with logs under "
              f"{', '.join(map(str, args.runs))}\n\n{cpu_markdown(cpu_rows)}")
    if args.json:
        args.json.write_text(json.dumps({
            "validation": [{"case": r.case.name, "published": r.case.published,
                            "metric": r.case.metric, "predicted": r.predicted,
                            "error": r.error, "anchor": r.case.anchor} for r in rows],
            "cpu": cpu_rows, "loopback": {"bandwidth": loop.bandwidth, "latency": loop.latency},
        }, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
