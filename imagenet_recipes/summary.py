"""The end of a run, as a user reads it: `summary.csv` (a row per epoch, as timm writes one),
the best scores with their epochs (the model's and, with --model-ema, its moving average's),
and the closing lines: how long it took, where the best weights are and the command that
evaluates them.

Only the main rank writes; every rank may keep the bests (they are the same numbers).
"""
from __future__ import annotations

import csv
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .checkpoint import BEST_EMA
from .progress import duration

CSV_NAME = "summary.csv"


@dataclass
class Best:
    """The best validation top-1 so far and the epoch that reached it (epoch None: none yet, or
    a checkpoint written before epochs were kept with it)."""
    top1: float = 0.0
    epoch: Optional[int] = None

    def offer(self, top1: float, epoch: int) -> bool:
        """Keep `top1` if it is better (the first score always is); True when it is (a new best
        to save)."""
        if top1 > self.top1 or (self.epoch is None and self.top1 == 0.0):
            self.top1, self.epoch = top1, epoch
            return True
        return False


def csv_row(epoch: int, lr: float, train: Dict[str, float], val: Dict[str, float],
            ema: Optional[Dict[str, float]]) -> Dict[str, float]:
    row = {"epoch": epoch, "lr": lr, "train_loss": train["loss"], "train_top1": train["top1"],
           "val_loss": val["loss"], "val_top1": val["top1"], "val_top5": val["top5"]}
    if ema is not None:
        row.update(val_ema_loss=ema["loss"], val_ema_top1=ema["top1"], val_ema_top5=ema["top5"])
    row.update(img_s=train["img_s"], epoch_seconds=train["epoch_time"])
    return row


def append_csv_row(run_dir: Path, row: Dict[str, float]) -> None:
    """One epoch onto RUN_DIR/summary.csv; the header first when the file is new (a resumed
    run continues its file)."""
    path = run_dir / CSV_NAME
    new = not path.is_file()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})


# Set by launch/env.sh to how it is named from the user's folder: a run started through it had
# its environment (torchrun, and even `python`, may be on no other PATH), so the commands the
# run prints for the user start with it too.
ENV_SH = "RECIPES_ENV_SH"


def evaluate_command(launcher: str, script: str, best: Path, data: Optional[str],
                     ran: Optional[str] = None) -> str:
    """The command that scores `best` as this run validated it, on one process (`-e` takes
    the model, sizes, precision and layout from the run that wrote the checkpoint), to type
    into the shell the run was started from. `ran`: the script this process runs
    (sys.argv[0]), whose clone holds `script`."""
    start = {"python": ["python"], "torchrun": ["torchrun", "--nproc_per_node=1"],
             "horovodrun": ["horovodrun", "-np", "1", "python"]}.get(launcher, ["python"])
    through = [os.environ[ENV_SH]] if os.environ.get(ENV_SH) else []
    words = [*through, *start, shown_script(script, ran), "-e", "--resume", str(best)]
    return shlex.join(words + ([data] if data else []))


def shown_script(script: str, ran: Optional[str]) -> str:
    """An entry script (train/nd.py) as a path to type in the current folder: relative where
    the clone is below it (the repository root: train/nd.py, as the README shows it), else
    absolute. Found beside `ran` (train/ is one folder below the root);
    `script` as it is when that clone has no such file (a tool's or a test's own process)."""
    if ran:
        path = Path(ran).resolve().parent.parent / script
        if path.is_file():
            try:
                return str(path.relative_to(Path.cwd().resolve()))
            except ValueError:
                return str(path)
    return script


def closing_lines(reason: str, epochs_done: int, seconds: float, samples: int,
                  best: Best, best_ema: Optional[Best], best_path: Optional[Path],
                  evaluate: Optional[str]) -> List[str]:
    """What the main rank prints when the run ends."""
    epoch = "?" if best.epoch is None else best.epoch
    scores = "no validation" if best.epoch is None and best.top1 == 0.0 else \
        f"best top-1 {best.top1:.3f} at epoch {epoch}"
    if best_ema is not None and best_ema.epoch is not None:
        scores += f"; EMA {best_ema.top1:.3f} at epoch {best_ema.epoch}"
    rate = f", {samples / seconds:.1f} img/s" if seconds > 0 and samples else ""
    lines = [f"=> {reason}: {scores}; {epochs_done} epoch(s) in {duration(seconds)}{rate}"]
    if best_path is not None:
        lines.append(f"=> best model: {best_path}")
        if best_ema is not None and best_ema.epoch is not None:
            lines.append(f"=> best EMA model: {best_path.parent / BEST_EMA}")
    if evaluate:
        lines.append(f"=> evaluate it: {evaluate}")
    return lines
