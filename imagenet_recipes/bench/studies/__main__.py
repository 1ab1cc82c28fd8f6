"""The studies' page (imagenet_recipes/bench/studies/README.md) rebuilt from the records in imagenet_recipes/bench/studies/records/,
as bench.regenerate rebuilds RESULTS.md from results/:

    launch/env.sh python -m imagenet_recipes.bench.studies              # rewrite the page's measured blocks
    launch/env.sh python -m imagenet_recipes.bench.studies --check      # exit 1 if anything would change
    launch/env.sh python -m imagenet_recipes.bench.studies --archive runs/bench_hvd-20261123-110000 hvd
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from imagenet_recipes.bench import regenerate
from imagenet_recipes.bench.common import REPO, shown_commit
from imagenet_recipes.bench.render import render

HERE = Path(__file__).resolve().parent


def loop_block(folder: Path, figures: Path) -> str:
    """bench.studies.loop's record: the engine's step against a bare step, round by round."""
    record = json.loads((folder / "bench_loop.json").read_text())
    cfg, hw, median = record["config"], record["hardware"], record["median"]
    ratios = [r["ratio"] for r in record["rounds"]]
    steps = cfg["warmup"] + cfg["repeats"] * cfg["steps"]
    return render("studies_loop", record=record, cfg=cfg, hw=hw, median=median, ratios=ratios,
                  steps=steps, commit=shown_commit(record.get("commit")))


def layout_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench.studies import layout

    return layout.table(json.loads((folder / "bench_layout.json").read_text()))


def hvd_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench.studies import hvd

    return hvd.report(folder)


def ddp_cost_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench.studies import ddp_cost

    return ddp_cost.block(folder)


PAGE = regenerate.Document(
    page=HERE / "README.md", records=HERE / "records",
    sections={"bench_loop": ("loop", loop_block), "bench_layout": ("layout", layout_block),
              "bench_hvd": ("hvd", hvd_block), "bench_ddp_cost": ("ddp_cost", ddp_cost_block)},
    headings={"bench_loop": "## Engine overhead: one engine step vs a hand-written step",
              "bench_layout": "## Memory layout on a CPU: NCHW or channels_last "
                              "(`imagenet_recipes/bench/studies/layout.py`)",
              "bench_hvd": "## Horovod vs DDP (`imagenet_recipes/bench/studies/hvd.py`)",
              "bench_ddp_cost": "## Where DDP's efficiency goes (`imagenet_recipes/bench/studies/ddp_cost.py`)"})

if __name__ == "__main__":
    sys.exit(regenerate.main(document=PAGE, description=__doc__))
