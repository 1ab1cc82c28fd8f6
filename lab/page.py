"""The studies' page (lab/README.md) rebuilt from the records in lab/records/,
as bench.regenerate rebuilds RESULTS.md from results/:

    launch/env.sh python lab/page.py              # rewrite the page's measured blocks
    launch/env.sh python lab/page.py --check      # exit 1 if anything would change
    launch/env.sh python lab/page.py --archive runs/bench_hvd-20261123-110000 hvd
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from imagenet_recipes.bench import regenerate
from imagenet_recipes.bench.common import shown_commit
from imagenet_recipes.bench.render import render

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"  # this page's prose


def loop_block(folder: Path, figures: Path) -> str:
    """lab/loop.py's record: the engine's step against a bare step, round by round."""
    record = json.loads((folder / "bench_loop.json").read_text())
    cfg, hw, median = record["config"], record["hardware"], record["median"]
    ratios = [r["ratio"] for r in record["rounds"]]
    steps = cfg["warmup"] + cfg["repeats"] * cfg["steps"]
    return render("loop", TEMPLATES, record=record, cfg=cfg, hw=hw, median=median, ratios=ratios,
                  steps=steps, commit=shown_commit(record.get("commit")))


def layout_block(folder: Path, figures: Path) -> str:
    import layout  # a study beside this script (its folder is first on sys.path)

    return layout.table(json.loads((folder / "bench_layout.json").read_text()))


def hvd_block(folder: Path, figures: Path) -> str:
    import hvd  # a study beside this script (its folder is first on sys.path)

    return hvd.report(folder)


def ddp_cost_block(folder: Path, figures: Path) -> str:
    import ddp_cost  # a study beside this script (its folder is first on sys.path)

    return ddp_cost.block(folder)


PAGE = regenerate.Document(
    page=HERE / "README.md", records=HERE / "records",
    sections={"bench_loop": ("loop", loop_block), "bench_layout": ("layout", layout_block),
              "bench_hvd": ("hvd", hvd_block), "bench_ddp_cost": ("ddp_cost", ddp_cost_block)},
    headings={"bench_loop": "## Engine overhead: one engine step vs a hand-written step",
              "bench_layout": "## Memory layout on a CPU: NCHW or channels_last "
                              "(`lab/layout.py`)",
              "bench_hvd": "## Horovod vs DDP (`lab/hvd.py`)",
              "bench_ddp_cost": "## Where DDP's efficiency goes (`lab/ddp_cost.py`)"})

if __name__ == "__main__":
    sys.exit(regenerate.main(document=PAGE, description=__doc__))
