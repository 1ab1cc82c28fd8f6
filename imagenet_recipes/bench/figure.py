"""matplotlib for the figure tools: files only, and the one way a figure is written."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # No software version in the file: the same logs give the same bytes (RESULTS.md's
    # figures are checked for that).
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {path}")
