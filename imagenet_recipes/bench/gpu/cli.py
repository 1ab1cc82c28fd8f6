"""bench.gpu's command line: its options, checked, with the targets (--target) and the units to
run (--group, --only) resolved; the help is the package's docstring."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from imagenet_recipes.bench.gpu.units import GROUPS, PEER_ROWS, TARGETS, select
from imagenet_recipes.registry import GPU_DECODERS


def parse_cli(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    # The package is imported before any of its modules (and imports this one): its docstring is
    # read from the loaded package, not imported.
    doc = sys.modules[__package__].__doc__
    p = argparse.ArgumentParser(prog="python -m imagenet_recipes.bench.gpu",
                                description=doc.split("\n")[0], epilog=doc.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a check of the tool itself with a tiny configuration "
                        "(default: %(default)s)")
    p.add_argument("-a", "--arch", default="resnet50", help="(default: %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="(default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=256, help="(default: %(default)s)")
    p.add_argument("--steps", type=int, default=20,
                   help="steps per round (pairs) and per log interval (nd, DDP) "
                        "(default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed steps first (scripts: rounded up to whole intervals, at least "
                        "one) (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds / intervals; img/s is their median "
                        "(default: %(default)s)")
    p.add_argument("--amp-dtype", default="float16", choices=("float16", "bfloat16"),
                   help="half type of the compile pair and of the entry scripts' rows "
                        "(default: %(default)s)")
    p.add_argument("-j", "--workers", type=int, default=None,
                   help="loader workers (DALI: threads) of the loader rows (default: the "
                        "engine's own choice for one process)")
    p.add_argument("--group", help=f"comma-separated groups: {', '.join(GROUPS)} (default, "
                   "without --only: all)")
    p.add_argument("--only", help="comma-separated units (see --list); with --group, both")
    p.add_argument("--list", action="store_true", help="print the units and exit")
    p.add_argument("--target", action="append", default=[], metavar="NAME=VALUE",
                   help=f"replace a target ({', '.join(f'{k}={v:g}' for k, v in TARGETS.items())})")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", type=Path, metavar="PATH", help="the record (rewritten after "
                   "each unit)")
    p.add_argument("--out", type=Path, help="the runs and their console output (default: "
                   "runs/bench_gpu-DATE-TIME)")
    p.add_argument("--data", type=Path, help="the generated JPEG set of the loader rows "
                   "(default: runs/bench_gpu-data/<size>; made once, reused)")
    p.add_argument("--prepare-data", action="store_true",
                   help="only make the loader rows' JPEG set (at --data) and exit: beside "
                        "another job, before the measurements that read it")
    p.add_argument("--loader-window", type=int, default=10, metavar="N",
                   help="log intervals a loader row counts over (the JPEG set is sized for "
                        "them; the batches ready before the clock are 1/N of the window at "
                        "most) (default: %(default)s)")
    p.add_argument("--decode-workers", metavar="LIST",
                   help="comma-separated -j of the decode group's pytorch rows, or 'default': "
                        "the loader rows' -j (default: from a few to every core but one)")
    p.add_argument("--skip-decoder", action="append", default=[], metavar="NAME=CAUSE",
                   help="a GPU decoder (torchcodec, nvimgcodec) found not to work here (e.g. by "
                        "launch/gpu_check.sh --probe): the rows decoding with it are skipped, "
                        "CAUSE their note")
    p.add_argument("--nvimgcodec-whole", metavar="CAUSE",
                   help="nvImageCodec's region decoding fails here (CAUSE, e.g. from "
                        "launch/gpu_check.sh --probe): the rows that decode with --gpu-decoder "
                        "nvimgcodec decode whole images instead (--gpu-decoder nvimgcodec-whole), "
                        "saying so in their config and note")
    p.add_argument("--reuse", action="append", default=[], type=Path, metavar="RECORD",
                   help="an earlier record of the same machine and sizes (--json): a unit this "
                        "run only brings along as a reference (not named by --group or --only) "
                        "is copied from the first such record holding its rows measured, not "
                        "measured again")
    p.add_argument("--row-timeout", type=float, default=360,
                   help="seconds an entry script's run may take (default: %(default)s)")
    p.add_argument("--commit", help="the commit measured, for a copied tree without .git "
                   "(default: git's)")
    p.add_argument("--timm-benchmark", type=Path, metavar="PATH",
                   help="timm's benchmark.py, fetched by you (the timm-benchmark unit)")
    peers = p.add_argument_group("peers (bench.e2e)")
    peers.add_argument("--timm", type=Path, help="timm's train.py, fetched by you")
    peers.add_argument("--torchvision", type=Path,
                       help="torchvision's references/classification/train.py, fetched by you "
                            "with the modules beside it")
    peers.add_argument("--peers-data", type=Path,
                       help="an ImageFolder root with train/ and val/ (default: bench.e2e "
                            "generates 10 classes x (--peers-train-per-class + 50) JPEGs)")
    peers.add_argument("--peers-train-per-class", type=int, default=800,
                       help="(default: %(default)s)")
    peers.add_argument("--peers-epochs", type=int, default=3,
                       help="3 or more gives the steady state (default: %(default)s)")
    peers.add_argument("--peers-repeats", type=int, default=2, help="(default: %(default)s)")
    peers.add_argument("--peers-only", help="comma-separated contenders of ours to run beside "
                       f"the peers ({', '.join(c for c in PEER_ROWS if c.startswith('nd '))}; "
                       "default: all that can run here)")
    peers.add_argument("--peers-timeout", type=float, default=540,
                       help="seconds the whole comparison may take (default: %(default)s)")
    args = p.parse_args(argv)
    from imagenet_recipes.bench import bare_loop as loop  # torch, like every measurement after the parse

    loop.check_sizes(p, args)
    if args.peers_only and not set(args.peers_only.split(",")) <= {
            c for c in PEER_ROWS if c.startswith("nd ")}:
        p.error(f"--peers-only {args.peers_only}: contenders are "
                f"{', '.join(c for c in PEER_ROWS if c.startswith('nd '))}")
    if args.workers is not None and args.workers <= 0:
        p.error("--workers must be positive (the loader rows measure worker processes)")
    if args.loader_window <= 0:
        p.error("--loader-window must be positive")
    if args.decode_workers and args.decode_workers != "default" and not all(
            w.isdigit() and int(w) > 0 for w in args.decode_workers.split(",")):
        p.error(f"--decode-workers {args.decode_workers}: positive numbers, comma-separated, "
                "or 'default'")
    args.skipped_decoders = {}
    for item in args.skip_decoder:
        name, _, cause = item.partition("=")
        if name not in GPU_DECODERS:
            p.error(f"--skip-decoder {item}: decoders are {', '.join(GPU_DECODERS)}")
        args.skipped_decoders[name] = cause or "does not work here"
    args.targets = dict(TARGETS)
    for item in args.target:
        name, _, value = item.partition("=")
        if name not in TARGETS:
            p.error(f"--target {item}: unknown target {name!r} ({', '.join(TARGETS)})")
        try:
            args.targets[name] = float(value)
        except ValueError:
            p.error(f"--target {item}: {value!r} is not a number")
    try:
        args.units = select(args.group, args.only)
        args.named_units = select(args.group, args.only, needs=False)
    except ValueError as err:
        p.error(str(err))
    return args
