"""RESULTS.md's measured sections and their figures, rebuilt from the run logs kept in results/.

    launch/env.sh python -m bench.regenerate              # rewrite those blocks and figures
    launch/env.sh python -m bench.regenerate --check      # exit 1 if anything would change
    launch/env.sh python -m bench.regenerate --archive runs/sweep-20261123-050000 sweep
                                   # keep a new measurement: its logs into results/sweep/

results/ holds only what the tables and figures are computed from: each run's `log.jsonl`
(a few kB; no checkpoints, no TensorBoard events) and the measuring tool's own record
(`sweep.json`). From them alone this module writes, byte for byte the same on every machine:

  results/quickstart/<run>/   the `quickstart` block and figures/quickstart_curves.png
  results/sweep/              the `sweep` block and figures/scaling_*.png (bench.sweep)
  results/loop/               the `bench_loop` block (bench.loop --json results/loop/bench_loop.json)
  results/recipes/            the `recipes` block and figures/recipes_study.png (bench.recipes)
"""
from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from bench.common import (REPO, logged_hardware, markdown_table, read_log, run_dirs,
                          write_block)

RESULTS = REPO / "results"
HEADINGS = {"quickstart": "## Quickstart (`bash launch/quickstart.sh`)",
            "recipes": "## Recipes at an equal small budget (CPU)",
            "sweep": "## Strategy sweep",
            "bench_loop": "## Engine overhead: one engine step vs a hand-written step"}


def quickstart_block(folder: Path, figures: Path) -> str:
    """The quickstart on each kind of machine it was run on: table and learning curves."""
    from bench import plot_curves, summarize

    runs = run_dirs(folder)
    rows = [summarize.row(d) for d in runs]
    cols = ["run", "precision", "device", "procs", "global batch", "img/s", "val top-1",
            "best top-1", "epochs", "wall s"]
    plot_curves.plot(runs, figures / "quickstart_curves.png")
    per_epoch = []
    for run_dir in runs:
        val = read_log(run_dir).get("val", [])
        per_epoch.append([run_dir.name] + [f"{v['loss']:,.2f} / {v['top1']:.1f}" for v in val])
    epochs = max(len(r) for r in per_epoch) - 1
    return "\n".join([
        "`bash launch/quickstart.sh`, once per kind of CPU (logs: `results/quickstart/`). It "
        "picks O1 (bf16 autocast) where the CPU has native bf16 and O0 (fp32) where bf16 would "
        "be emulated; img/s is the median of the logged intervals after the first, wall s the "
        "training run's (data generation excluded):",
        "",
        markdown_table(cols, [[str(r[c]) for c in cols] for r in rows], right_from=3),
        "",
        "Validation loss / top-1 (%) after each epoch:",
        "",
        markdown_table(["run", *(f"epoch {e}" for e in range(epochs))], per_epoch,
                       right_from=1),
        "",
        "![quickstart learning curves](figures/quickstart_curves.png)",
    ]) + "\n"


def sweep_block(folder: Path, figures: Path) -> str:
    from bench import plot_scaling, results

    plot_scaling.draw(folder, figures)
    return results.sweep_block(folder)


def loop_block(folder: Path, figures: Path) -> str:
    """bench.loop's record: the engine's step against a bare step, round by round."""
    record = json.loads((folder / "bench_loop.json").read_text())
    cfg, hw, median = record["config"], record["hardware"], record["median"]
    ratios = [r["ratio"] for r in record["rounds"]]
    steps = cfg["warmup"] + cfg["repeats"] * cfg["steps"]
    return "\n".join([
        f"Command: `launch/env.sh {record['command']}` ({cfg['arch']}, {cfg['image_size']} px, "
        f"batch {cfg['batch_size']}, {cfg['opt_level']}, one process with "
        f"{hw['torch_threads']} thread(s)) on {hw['cpu']} ({hw['cpu_cores']} cores, "
        f"{hw['gpu'] or 'no GPU'}), torch {hw['torch']}, at commit "
        f"{record.get('commit', 'unknown')} (record: `results/loop/bench_loop.json`):",
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


def recipes_block(folder: Path, figures: Path) -> str:
    """bench.recipes: the presets at the same budget, per run and per preset."""
    from bench import recipes

    rows = recipes.summary_rows(folder)
    recipes.draw_figure(folder, figures / "recipes_study.png")
    first = read_log(run_dirs(folder)[0])["run"][0]
    cfg = first["config"]
    table = [[r["run"], r["preset"], str(r["seed"]), str(r["epochs"]), f"{r['final']:.1f}",
              f"{r['best']:.1f}", "-" if r["ema_final"] is None else f"{r['ema_final']:.1f}",
              f"{r['train_s']:.0f}"] for r in rows]
    by_preset: Dict[str, List[float]] = {}
    for r in rows:
        by_preset.setdefault(r["preset"], []).append(r["final"])
    means = {p: sum(v) / len(v) for p, v in by_preset.items()}
    ranked = sorted(means, key=means.get, reverse=True)
    verdict = (f"At this budget `{ranked[0]}` ends highest: {means[ranked[0]]:.1f} % mean final "
               "top-1 against " + ", ".join(f"`{p}` {means[p]:.1f} %" for p in ranked[1:])
               + f" ({len(rows) // len(means)} seed(s) per preset).")
    scored = sum(r["ema_scored"] for r in rows)
    if scored:
        verdict += (f" The EMA scored above the weights it averages in "
                    f"{sum(r['ema_above'] for r in rows)} of {scored} validations.")
    return "\n".join([
        f"`launch/env.sh python -m bench.recipes` (logs: `results/recipes/`): each preset of "
        f"`recipes/` scaled to the same budget by the tool's one rule (epoch counts and image "
        f"sizes in proportion, the preset's per-256 lr at global batch {first['global_batch']}, "
        f"the EMA's horizon kept as the same share of the run), {cfg['arch']}, "
        f"{cfg['epochs']} epochs, one process, O0, on `{Path(cfg['data']).name}` "
        f"({first['train_samples_per_rank']} generated training images; validation "
        f"every epoch), on {logged_hardware(first)}, commit "
        f"{first.get('commit', 'unknown')}:",
        "",
        markdown_table(["run", "preset", "seed", "epochs", "final top-1", "best top-1",
                        "EMA final top-1", "train s"], table, right_from=2),
        "",
        verdict + " This compares the recipes at a budget far from the one they were made "
        "for (the published runs train 90 and 600 epochs on 1.28 M images); it says nothing "
        "about their ImageNet accuracy.",
        "",
        "![validation top-1 per epoch](figures/recipes_study.png)",
    ]) + "\n"


# section (RESULTS.md block name) -> (folder under results/, block writer)
SECTIONS: Dict[str, Tuple[str, Callable[[Path, Path], str]]] = {
    "quickstart": ("quickstart", quickstart_block),
    "sweep": ("sweep", sweep_block),
    "bench_loop": ("loop", loop_block),
    "recipes": ("recipes", recipes_block),
}


FOLDERS = [folder for folder, _ in SECTIONS.values()]


def regenerate(results_dir: Path, results_md: Path, figures: Path) -> List[str]:
    """Every section whose logs are in `results_dir`; returns the sections written."""
    written = []
    for name, (folder_name, block) in SECTIONS.items():
        folder = results_dir / folder_name
        if folder.is_dir() and any(folder.iterdir()):
            write_block(results_md, name, block(folder, figures), HEADINGS[name])
            written.append(name)
    return written


def check(results_dir: Path, results_md: Path, figures: Path) -> List[str]:
    """The files regeneration would change (written into a scratch copy, compared)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch_md, scratch_figures = Path(tmp) / "RESULTS.md", Path(tmp) / "figures"
        shutil.copy(results_md, scratch_md)
        scratch_figures.mkdir()
        regenerate(results_dir, scratch_md, scratch_figures)
        changed = [] if filecmp.cmp(scratch_md, results_md, shallow=False) else [
            str(results_md)]
        for made in sorted(scratch_figures.iterdir()):
            kept = figures / made.name
            if not kept.is_file() or not filecmp.cmp(made, kept, shallow=False):
                changed.append(str(kept))
        return changed


def archive(source: Path, section: str, results_dir: Path = RESULTS) -> Path:
    """Copy the logs of a measurement (every log.jsonl under `source`, and the tool's own
    *.json records at its top) into results/<section>/, replacing what was there."""
    target = results_dir / section
    if target.exists():
        shutil.rmtree(target)
    for log in sorted(source.rglob("log.jsonl")):
        if "_replaced" in log.parts:
            continue
        dest = target / log.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, dest)
    for record in source.glob("*.json"):
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(record, target / record.name)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the files that would change")
    parser.add_argument("--archive", nargs=2, metavar=("RUNS_DIR", "SECTION"),
                        help="copy a measurement's logs into results/SECTION "
                             f"({', '.join(FOLDERS)}) first")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--results", type=Path, default=REPO / "RESULTS.md")
    parser.add_argument("--figures", type=Path, default=REPO / "figures")
    args = parser.parse_args(argv)
    if args.archive:
        source, section = Path(args.archive[0]), args.archive[1]
        if section not in FOLDERS:
            parser.error(f"section must be one of {', '.join(FOLDERS)}")
        print(f"archived {source} -> {archive(source, section, args.results_dir)}")
    if args.check:
        changed = check(args.results_dir, args.results, args.figures)
        for path in changed:
            print(f"would change: {path}")
        return 1 if changed else 0
    written = regenerate(args.results_dir, args.results, args.figures)
    print(f"regenerated: {', '.join(written) or 'nothing (no logs under results/)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
