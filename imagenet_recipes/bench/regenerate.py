"""RESULTS.md's measured sections and their figures, rebuilt from the run logs kept in results/.

    launch/env.sh python -m imagenet_recipes.bench.regenerate              # rewrite those blocks and figures
    launch/env.sh python -m imagenet_recipes.bench.regenerate --check      # exit 1 if anything would change
    launch/env.sh python -m imagenet_recipes.bench.regenerate --archive runs/sweep-20261123-050000 sweep
                                   # keep a new measurement: its runs into results/sweep/

results/ holds only what the tables and figures are computed from, one folder per section: the
runs of a measurement, compacted into one `runs.jsonl` (imagenet_recipes.bench.kept: the records
and fields the blocks read; the full logs stay in the measurement's runs/ folder), and the
measuring tool's own record (`sweep.json`, `bench_io.json`, ...). From them alone this module
writes the same blocks on every machine, and figures that show the same data (`figures/data/`:
what `--check` compares):

  results/quickstart/         the `quickstart` block and figures/quickstart_curves.png
  results/cpu/                the `bench_cpu` block (tools/bench_cpu.sh)
  results/io/                 the `bench_io` block, figures/io_per_core.png and io.png
                              (bench.io --workers 1 --json results/io/bench_io_per_core.json,
                              bench.io --json results/io/bench_io.json), and loader workers as
                              processes or threads (bench.loader_threads --json
                              results/io/loader_threads.json)
  results/e2e/                the `bench_e2e` block (bench.e2e --json results/e2e/bench_e2e.json)
  results/sweep/              the `sweep` and `scaling_model` blocks and figures/scaling_*.png
                              (bench.sweep)
  results/ps/                 the `bench_ps` block and figures/ps_*.png (bench.ps)
  results/esync/              the `esync` block and figures/esync_study.png (bench.esync)
  results/async-rules/        the `async_rules` block and figures/async_rules.png (bench.esync
                              --variants sync async-plain async-staleness)
  results/esync-averages/     the `esync_averages` block and figures/esync_averages.png
                              (bench.esync --variants sync esync-mean esync-normalized)
  results/hetero/             the `hetero` block and figures/hetero_study.png (bench.hetero)
  results/recipes/            the `recipes` block and figures/recipes_study.png (bench.recipes)
  results/gpu/                the `gpu` block: GPU throughput (bench.gpu --json
                              results/gpu/NAME.json, one record per call; a row measured in
                              several records shows the latest). Without a record the block
                              says that none exists.
  results/gpu-tier/           the `gpu_tier` block: the GPU tier's checks.jsonl (bash
                              launch/gpu_check.sh --out DIR; --archive DIR gpu-tier). Without
                              it the block says the tier has not run on a GPU.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from imagenet_recipes.bench.common import (REPO, logged_device, logged_hardware, read_log,
                          repo_relative, run_dirs, shown_commit, write_block)
from imagenet_recipes.bench import kept
from imagenet_recipes.bench.render import render

RESULTS = REPO / "results"
HEADINGS = {"quickstart": "## Quickstart (`bash launch/quickstart.sh`)",
            "bench_cpu": "## CPU: nd vs DDP, fp32 vs bf16",
            "bench_io": "## Input pipelines (`imagenet_recipes/bench/io.py`)",
            "bench_e2e": "## End to end vs pytorch/examples and timm (`imagenet_recipes/bench/e2e.py`)",
            "scaling_model": "## Scaling model",
            "sweep": "## Strategy sweep",
            "bench_ps": "## Parameter server vs DDP with a slow worker",
            "ps_servers": "## Parameter server: one server process or two (`--num-servers`)",
            "esync": "## ESync vs synchronous and asynchronous SGD, IID and by-class",
            "async_rules": "## Asynchronous SGD: plain or staleness-aware (`--async-rule`)",
            "esync_averages": "## ESync: plain or normalised averaging (`--esync-average`)",
            "hetero": "## Slow and uneven workers: which method (`imagenet_recipes/bench/hetero.py`)",
            "recipes": "## Recipes at an equal small budget (CPU)",
            "gpu_tier": "## GPU tier (`launch/gpu_check.sh`)",
            "gpu": "## GPU throughput (`imagenet_recipes/bench/gpu/`)"}


def quickstart_block(folder: Path, figures: Path) -> str:
    """The quickstart on each kind of machine it was run on: table and learning curves."""
    from imagenet_recipes.bench import plot_curves, summarize

    runs = run_dirs(folder)
    rows = [summarize.row(d) for d in runs]
    cols = ["run", "precision", "device", "procs", "global batch", "img/s", "val top-1",
            "best top-1", "epochs", "wall s"]
    plot_curves.plot(runs, figures / "quickstart_curves.png")
    per_epoch = []
    for run_dir in runs:
        val = read_log(run_dir).get("val", [])
        per_epoch.append([run_dir.name] + [f"{v['loss']:,.2f} / {v['top1']:.1f}" for v in val])
    return render("quickstart", cols=cols, rows=[[str(r[c]) for c in cols] for r in rows],
                  epochs=[f"epoch {e}" for e in range(max(len(r) for r in per_epoch) - 1)],
                  per_epoch=per_epoch)


def sweep_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import plot_scaling, results

    plot_scaling.draw(folder, figures)
    return results.sweep_block(folder)


def cpu_block(folder: Path, figures: Path) -> str:
    """tools/bench_cpu.sh: nd vs DDP, fp32 vs bf16 (native and emulated), synthetic vs JPEG."""
    from imagenet_recipes.bench import summarize

    runs = run_dirs(folder)
    rows, rate = [], {}
    for run_dir in runs:
        r = summarize.row(run_dir)
        run = read_log(run_dir)["run"][0]
        rate[run_dir.name] = float(r["img/s"])
        rows.append([r["run"], r["script"],
                     f"{run['world_size']} x {run['hardware']['torch_threads']}",
                     r["precision"], "synthetic" if run["config"]["dummy"] else "JPEG",
                     str(r["global batch"]), str(run["steps_per_epoch"]), r["img/s"],
                     r["img/s/proc"], r["wall s"]])
    first = read_log(runs[0])["run"][0]

    def ratio(text: str, a: str, b: str, processes: int = 1) -> List[dict]:
        """run a's img/s over run b's (over `processes` x b's: weak-scaling efficiency)."""
        if a not in rate or b not in rate:
            return []
        return [{"text": text, "a": rate[a], "b": rate[b], "processes": processes,
                 "ratio": rate[a] / (processes * rate[b])}]

    ddp, nd2 = "ddp-2x1thread-fp32-synthetic", "nd-2threads-fp32-synthetic"
    ratios = (ratio("DDP weak-scaling efficiency, 2 processes x 1 thread vs 1 process x 1 "
                    "thread (synthetic)", ddp, "nd-1thread-fp32-synthetic", processes=2)
              + ratio("DDP 2 x 1 thread vs one process using both cores (synthetic)", ddp, nd2)
              + ratio("DDP on JPEGs (decode and augmentation in 1 loader worker per process) "
                      "vs on synthetic data", "ddp-2x1thread-fp32-jpeg", ddp)
              + ratio("nd (2 threads) on JPEGs vs on synthetic data", "nd-2threads-fp32-jpeg",
                      nd2)
              + ratio("O1 bf16 vs fp32, DDP 2 x 1 thread, as this CPU runs it",
                      "ddp-2x1thread-O1bf16-synthetic", ddp)
              + ratio("O1 bf16 vs fp32, DDP 2 x 1 thread, held to AVX2 (bf16 emulated)",
                      "ddp-2x1thread-O1bf16-synthetic-avx2",
                      "ddp-2x1thread-fp32-synthetic-avx2"))
    return render("cpu", rows=rows, ratios=ratios, hardware=logged_hardware(first),
                  commit=shown_commit(first.get("commit")))


def recipes_block(folder: Path, figures: Path) -> str:
    """bench.recipes: the presets at the same budget, per run and per preset."""
    from imagenet_recipes.bench import recipes

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
    return render("recipes", run=first, cfg=cfg, data=Path(cfg["data"]).name,
                  hardware=logged_hardware(first), commit=shown_commit(first.get("commit")),
                  rows=table, means=sorted(means.items(), key=lambda kv: -kv[1]),
                  seeds=len(rows) // len(means), ema_scored=sum(r["ema_scored"] for r in rows),
                  ema_above=sum(r["ema_above"] for r in rows))


def io_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import io, loader_threads

    parts = [io.block(folder, figures)]
    threads = folder / loader_threads.RECORD
    if threads.exists():
        parts.append(loader_threads.block(json.loads(threads.read_text())))
    return "\n\n".join(parts)


def e2e_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import e2e

    return e2e.block(folder, figures)


def scaling_block(folder: Path, figures: Path) -> str:
    """The scaling model against the published cases, and against the sweep's runs on this
    machine (the same logs as the sweep section)."""
    from imagenet_recipes.bench.scaling.cases import PRESETS, validate
    from imagenet_recipes.bench.scaling.measured import collect_runs, cpu_comparison
    from imagenet_recipes.bench.scaling.report import results_block

    loop = PRESETS["cpu-loopback"].intra
    host = logged_device(read_log(run_dirs(folder)[0])["run"][0])
    return results_block(
        validate(), cpu_comparison(collect_runs([folder]), PRESETS["cpu-loopback"]), loop,
        "the `cpu-loopback` preset (gloo all-reduce between 2 processes, measured by "
        "`python -m imagenet_recipes.bench.scaling --measure-loopback` on a quiet machine)",
        "Written by `launch/env.sh python -m imagenet_recipes.bench.regenerate` from the published numbers in "
        "`imagenet_recipes/bench/scaling/cases.py` and the strategy sweep's logs (`results/sweep/`); "
        "`python -m imagenet_recipes.bench.scaling --runs DIR` prints the same tables for other runs.", host)


def ps_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import plot_ps, results

    plot_ps.draw(folder, figures, None)
    return results.bench_ps_block(folder, None)


def ps_servers_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import results

    return results.ps_servers_block(folder)


def gpu_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import gpu

    return gpu.block(folder)


def gpu_tier_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import gpu_tier

    return gpu_tier.block(folder)


def esync_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import esync

    return esync.block(folder, figures)


def async_rules_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import esync

    return esync.block(folder, figures, "async_rules.png")


def esync_averages_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import esync

    return esync.block(folder, figures, "esync_averages.png")


def hetero_block(folder: Path, figures: Path) -> str:
    from imagenet_recipes.bench import hetero

    return hetero.block(folder, figures)


# section (RESULTS.md block name) -> (folder under results/, block writer)
SECTIONS: Dict[str, Tuple[str, Callable[[Path, Path], str]]] = {
    "quickstart": ("quickstart", quickstart_block),
    "bench_cpu": ("cpu", cpu_block),
    "bench_io": ("io", io_block),
    "bench_e2e": ("e2e", e2e_block),
    "scaling_model": ("sweep", scaling_block),
    "sweep": ("sweep", sweep_block),
    "bench_ps": ("ps", ps_block),
    "ps_servers": ("ps-servers", ps_servers_block),
    "esync": ("esync", esync_block),
    "async_rules": ("async-rules", async_rules_block),
    "esync_averages": ("esync-averages", esync_averages_block),
    "hetero": ("hetero", hetero_block),
    "recipes": ("recipes", recipes_block),
    "gpu_tier": ("gpu-tier", gpu_tier_block),
    "gpu": ("gpu", gpu_block),
}


# Measured only on a machine with a CUDA GPU: absent until one has run the tool.
GPU_FOLDERS = ["gpu", "gpu-tier"]


@dataclass(frozen=True)
class Document:
    """A Markdown page whose measured blocks are rebuilt from kept records: RESULTS.md from
    results/, the lab's page from lab/records/ (lab/page.py)."""
    page: Path
    records: Path
    sections: Dict[str, Tuple[str, Callable[[Path, Path], str]]]
    headings: Dict[str, str]
    # Written even when their folder is absent: the block then says that nothing was
    # measured, so the page never reads as if the GPU paths had been run.
    always: frozenset = frozenset()
    # Runs archived compacted, one runs.jsonl per folder (imagenet_recipes.bench.kept), rather
    # than as their full logs.
    compact: bool = False

    @property
    def folders(self) -> List[str]:
        return list(dict.fromkeys(folder for folder, _ in self.sections.values()))


RESULTS_PAGE = Document(REPO / "RESULTS.md", RESULTS, SECTIONS, HEADINGS,
                        frozenset({"gpu", "gpu_tier"}), compact=True)
FOLDERS = RESULTS_PAGE.folders


def regenerate(results_dir: Path, results_md: Path, figures: Path,
               document: Document = RESULTS_PAGE) -> List[str]:
    """Every section whose logs are in `results_dir`; returns the sections written."""
    written = []
    for name, (folder_name, block) in document.sections.items():
        folder = results_dir / folder_name
        if (folder.is_dir() and any(folder.iterdir())) or name in document.always:
            write_block(results_md, name, block(folder, figures), document.headings[name])
            written.append(name)
    return written


def check(results_dir: Path, results_md: Path, figures: Path,
          document: Document = RESULTS_PAGE) -> List[str]:
    """The files regeneration would change (written into a scratch copy, compared)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch_md, scratch_figures = Path(tmp) / results_md.name, Path(tmp) / "figures"
        shutil.copy(results_md, scratch_md)
        scratch_figures.mkdir()
        regenerate(results_dir, scratch_md, scratch_figures, document)
        changed = [] if filecmp.cmp(scratch_md, results_md, shallow=False) else [
            str(results_md)]
        # A figure by its data (bench.figure): what it shows, not its PNG's bytes.
        from imagenet_recipes.bench.figure import data_path

        for made in sorted(scratch_figures.glob("*.png")):
            made_data, kept_data = data_path(made), data_path(figures / made.name)
            if not kept_data.is_file() or not (figures / made.name).is_file() or \
                    json.loads(made_data.read_text()) != json.loads(kept_data.read_text()):
                changed.append(str(figures / made.name))
        return changed


def archive(source: Path, section: str, results_dir: Path = RESULTS, compact: bool = True,
            add: bool = False) -> Path:
    """Keep a measurement in results/<section>/, replacing what was there (`add`: adding its runs
    to those kept, a run of the same name replaced): its runs' logs (every log.jsonl under
    `source`, which may be one run's folder; compacted into one runs.jsonl,
    imagenet_recipes.bench.kept, unless `compact` is False: then copied as they are) and the
    tools' own records at its top."""
    target = results_dir / section
    earlier = [(r.name, read_log(r)) for r in run_dirs(target)] \
        if add and compact and target.is_dir() else []
    if target.exists() and not add:
        shutil.rmtree(target)
    logs = [log for log in sorted(source.rglob("log.jsonl")) if "_replaced" not in log.parts]
    if compact and logs:
        new = [(source.name if log.parent == source else log.parent.relative_to(source).as_posix(),
                read_log(log.parent)) for log in logs]
        names = {name for name, _ in new}
        runs = sorted([r for r in earlier if r[0] not in names] + new, key=lambda r: r[0])
        kept.write(runs, target, intervals=section in kept.INTERVALS)
    for log in logs if not compact else []:
        dest = target / log.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, dest)
    # the tools' records: bench.*'s JSON, the GPU tier's checks.jsonl
    for record in [*source.glob("*.json"), *source.glob("checks.jsonl")]:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(record, target / record.name)
    return target


def main(argv=None, document: Document = RESULTS_PAGE, description: str = __doc__) -> int:
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the files that would change")
    parser.add_argument("--archive", nargs=2, metavar=("RUNS_DIR", "SECTION"),
                        help=f"copy a measurement's logs into {repo_relative(document.records)}/SECTION "
                             f"({', '.join(document.folders)}) first")
    parser.add_argument("--add", action="store_true",
                        help="with --archive: add the runs to those kept in SECTION (a run of "
                             "the same name replaced) instead of replacing them all")
    parser.add_argument("--results-dir", type=Path, default=document.records)
    parser.add_argument("--results", type=Path, default=document.page)
    parser.add_argument("--figures", type=Path, default=REPO / "figures")
    args = parser.parse_args(argv)
    if args.archive:
        source, section = Path(args.archive[0]), args.archive[1]
        if section.split("/")[0] not in document.folders:  # ddp_cost/<label>: one of several
            parser.error(f"section must be one of {', '.join(document.folders)}")
        print(f"archived {source} -> "
              f"{archive(source, section, args.results_dir, document.compact, args.add)}")
    if args.check:
        changed = check(args.results_dir, args.results, args.figures, document)
        for path in changed:
            print(f"would change: {path}")
        return 1 if changed else 0
    written = regenerate(args.results_dir, args.results, args.figures, document)
    print(f"regenerated: {', '.join(written) or 'nothing (no records found)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
