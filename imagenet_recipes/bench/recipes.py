"""Recipe presets side by side at an equal, small budget, on CPU with generated data.

    launch/env.sh python -m imagenet_recipes.bench.recipes                        # V1 vs V2, ~7 min on 2 cores
    launch/env.sh python -m imagenet_recipes.bench.recipes --dry-run              # the commands only
    launch/env.sh python -m imagenet_recipes.bench.regenerate --archive runs/recipes-20261123-090000 recipes

Every preset trains the same model for the same number of epochs on the same generated dataset
(data/make_synthetic.py: --classes x --train-per-class JPEGs), one process, fp32. A preset is
scaled to that budget by one rule, the same for all:
  epochs        --epochs E; everything the preset counts in epochs (step size, milestones,
                warm-up, progressive-resizing ramp) x E / its own epochs
  images        crop and resize sizes x --image-size / 224 (the preset's train crop, validation
                resize and crop keep their ratios: V2 still trains smaller than it validates)
  model, batch  -a --arch, -b --batch-size; --lr stays the preset's per-256 rate, scaled by the
                global batch as always
  EMA           updated every step, and its horizon kept as the same share of the run: under
                torchvision's rule the average takes in (1 - decay) x train images in all, so
                the decay becomes 1 - (1 - decay) x 1,281,167 / the train images
Everything else (optimizer, weight decay groups, label smoothing, MixUp/CutMix, auto-augment,
erasing, repeated augmentation) is the preset's own. Runs go to <out>/<preset>-s<seed>/;
bench.regenerate draws RESULTS.md's `recipes` block and figures/recipes_study.png from them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from imagenet_recipes.bench.common import REPO, read_log, run_dirs
from imagenet_recipes.bench.jobs import dataset_command, launcher, run_batch, stamped_out

IMAGENET_TRAIN_IMAGES = 1_281_167
DEFAULT_PRESETS = ("torchvision_v1", "torchvision_v2")


def scaled_options(preset: Path, epochs: int, image_size: int, train_images: int) -> List[str]:
    """The options that fit `preset` to the study's budget (see the module docstring)."""
    from imagenet_recipes import config
    from imagenet_recipes.data import augment

    cfg = config.parse_args(["--dummy", "--config", str(preset)])
    factor, size = epochs / cfg.epochs, image_size / 224

    def px(value: float) -> str:
        return str(max(8, int(round(value * size))))

    val_resize, val_crop = augment.val_sizes(cfg)
    out = ["--epochs", str(epochs), "--train-crop-size", px(cfg.image_size),
           "--val-resize-size", px(val_resize), "--val-crop-size", px(val_crop),
           "--warmup-epochs", f"{cfg.warmup_epochs * factor:.4g}"]
    if cfg.lr_schedule == "step":
        out += ["--lr-step-size", str(max(1, round(cfg.lr_step_size * factor)))]
    if cfg.lr_schedule == "multistep":
        out += ["--lr-steps", *(str(max(1, round(m * factor))) for m in cfg.lr_steps)]
    if cfg.progressive_resize:
        low, high, start, end = cfg.progressive_resize
        out += ["--progressive-resize", px(low), px(high), str(round(start * factor)),
                str(max(round(start * factor) + 1, round(end * factor)))]
    if cfg.model_ema:
        kept = (1 - cfg.model_ema_decay) * IMAGENET_TRAIN_IMAGES / train_images
        out += ["--model-ema-steps", "1", "--model-ema-decay", f"{max(1e-6, 1 - kept):.6g}"]
    return out


def jobs(args) -> List[tuple]:
    train_images = args.classes * args.train_per_class
    listed = []
    for name in args.presets:
        preset = REPO / "recipes" / f"{name}.toml"
        options = scaled_options(preset, args.epochs, args.image_size, train_images)
        for seed in range(args.seeds):
            run = f"{name}-s{seed}"
            listed.append((run, launcher("nd", 1) + [
                "--config", str(preset), *options, "-a", args.arch, "-b", str(args.batch_size),
                "--seed", str(seed), "-j", str(args.workers), "-p", str(args.print_freq),
                "--opt-level", "O0", "--logdir", str(args.out), "--run-name", run,
                str(args.data)]))
    return listed


def summary_rows(folder: Path) -> List[dict]:
    """One row per run: the preset, its final and best validation top-1 (and its EMA's)."""
    rows = []
    for run_dir in run_dirs(folder):
        logs = read_log(run_dir)
        run, val, ema = logs["run"][0], logs.get("val", []), logs.get("val_ema", [])
        epochs = logs.get("train_epoch", [])
        rows.append({
            "run": run_dir.name, "preset": Path(run["config"]["config"]).stem,
            "seed": run["config"]["seed"], "epochs": len(val),
            "final": val[-1]["top1"] if val else None,
            "best": max(v["top1"] for v in val) if val else None,
            "ema_final": ema[-1]["top1"] if ema else None,
            "ema_best": max(v["top1"] for v in ema) if ema else None,
            # validations where the EMA scored above the weights it averages, of those with both
            "ema_above": sum(e["top1"] > v["top1"] for v, e in zip(val, ema)),
            "ema_scored": min(len(val), len(ema)),
            "train_s": sum(e["epoch_time"] for e in epochs),
            "img_s": (sum(e["count"] for e in epochs) / sum(e["epoch_time"] for e in epochs)
                      if epochs else None)})
    return rows


def draw_figure(folder: Path, out: Path) -> None:
    """Validation top-1 per epoch of every run (the EMA's dashed), one colour per preset."""
    from imagenet_recipes.bench.figure import plt, save_figure

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {}
    for run_dir in run_dirs(folder):
        logs = read_log(run_dir)
        preset = Path(logs["run"][0]["config"]["config"]).stem
        colour = colours.setdefault(preset, f"C{len(colours)}")
        val = logs.get("val", [])
        ax.plot([v["epoch"] + 1 for v in val], [v["top1"] for v in val], "o-", ms=3,
                color=colour, label=run_dir.name)
        ema = logs.get("val_ema", [])
        if ema:
            ax.plot([v["epoch"] + 1 for v in ema], [v["top1"] for v in ema], "--",
                    color=colour, label=f"{run_dir.name} EMA")
    ax.set(xlabel="epoch", ylabel="validation top-1 (%)", ylim=(0, 101),
           title="presets at an equal budget (bench.recipes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, out)


def print_summary(folder: Path) -> int:
    for row in summary_rows(folder):
        ema = "" if row["ema_final"] is None else f", EMA final {row['ema_final']:.1f} %"
        print(f"{row['run']}: {row['epochs']} epochs, val top-1 final {row['final']:.1f} % "
              f"(best {row['best']:.1f} %){ema}, {row['train_s']:.0f} s of training")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS),
                        help="names of files in recipes/ (without .toml)")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=1, help="runs per preset (seeds 0..N-1)")
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=48,
                        help="what 224 px becomes (every crop and resize is scaled alike)")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--train-per-class", type=int, default=30)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "synthetic-recipes")
    parser.add_argument("-j", "--workers", type=int, default=1)
    parser.add_argument("-p", "--print-freq", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    parser.add_argument("--out", type=Path, help="default: runs/recipes-<date>-<time>")
    parser.add_argument("--redo", help="repeat the finished runs whose name matches")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    missing = [p for p in args.presets if not (REPO / "recipes" / f"{p}.toml").is_file()]
    if missing:
        parser.error(f"no recipes/{missing[0]}.toml")
    args.out = args.out or stamped_out("recipes")
    dataset = dataset_command(args.data, args.classes, args.train_per_class, args.val_per_class,
                              min_size=args.image_size, max_size=2 * args.image_size)
    return run_batch(jobs(args), args.out, args, "recipes.json", dataset, print_summary)


if __name__ == "__main__":
    sys.exit(main())
