"""The studies' page (bench/studies/README.md) rebuilt from the records in bench/studies/records/,
as bench.regenerate rebuilds RESULTS.md from results/:

    launch/env.sh python -m bench.studies              # rewrite the page's measured blocks
    launch/env.sh python -m bench.studies --check      # exit 1 if anything would change
    launch/env.sh python -m bench.studies --archive runs/bench_hvd-20261123-110000 hvd
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import regenerate
from bench.common import REPO, markdown_table, shown_commit

HERE = REPO / "bench" / "studies"


def loop_block(folder: Path, figures: Path) -> str:
    """bench.studies.loop's record: the engine's step against a bare step, round by round."""
    record = json.loads((folder / "bench_loop.json").read_text())
    cfg, hw, median = record["config"], record["hardware"], record["median"]
    ratios = [r["ratio"] for r in record["rounds"]]
    steps = cfg["warmup"] + cfg["repeats"] * cfg["steps"]
    return "\n".join([
        f"Command: `launch/env.sh {record['command']}` ({cfg['arch']}, {cfg['image_size']} px, "
        f"batch {cfg['batch_size']}, {cfg['opt_level']}, one process with "
        f"{hw['torch_threads']} thread(s)) on {hw['cpu']} ({hw['cpu_cores']} cores, "
        f"{hw['gpu'] or 'no GPU'}), torch {hw['torch']}, at commit "
        f"{shown_commit(record.get('commit'))} (record: "
        "`bench/studies/records/loop/bench_loop.json`):",
        "",
        markdown_table(["rounds x steps", "engine img/s (median)", "bare img/s (median)",
                        "engine / bare (median of rounds)"],
                       [[f"{len(ratios)} x {cfg['steps']}", f"{median['engine_img_s']:.1f}",
                         f"{median['bare_img_s']:.1f}", f"**{median['ratio']:.2f}x**"]]),
        "",
        f"Single rounds scatter between {min(ratios):.2f}x and {max(ratios):.2f}x, so only the "
        f"median of many rounds means anything (target: >= {record['target']}). Same math: "
        f"after {steps} steps each, the two models' weights differ by at most "
        f"{record['max_weight_diff']:.3g}.",
    ]) + "\n"


def layout_block(folder: Path, figures: Path) -> str:
    from bench.studies import layout

    return layout.table(json.loads((folder / "bench_layout.json").read_text()))


def hvd_block(folder: Path, figures: Path) -> str:
    from bench.studies import hvd

    return hvd.report(folder)


def ddp_cost_block(folder: Path, figures: Path) -> str:
    from bench.studies import ddp_cost

    return ddp_cost.block(folder)


PAGE = regenerate.Document(
    page=HERE / "README.md", records=HERE / "records",
    sections={"bench_loop": ("loop", loop_block), "bench_layout": ("layout", layout_block),
              "bench_hvd": ("hvd", hvd_block), "bench_ddp_cost": ("ddp_cost", ddp_cost_block)},
    headings={"bench_loop": "## Engine overhead: one engine step vs a hand-written step",
              "bench_layout": "## Memory layout on a CPU: NCHW or channels_last "
                              "(`bench/studies/layout.py`)",
              "bench_hvd": "## Horovod vs DDP (`bench/studies/hvd.py`)",
              "bench_ddp_cost": "## Where DDP's efficiency goes (`bench/studies/ddp_cost.py`)"})

if __name__ == "__main__":
    sys.exit(regenerate.main(document=PAGE, description=__doc__))
