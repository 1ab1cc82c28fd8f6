"""matplotlib for the figure tools: files only, and the one way a figure is written.

Beside each PNG, `data/<name>.json` holds what the figure shows (each axes' titles, labels,
scales and ticks set by the tool, its lines' points, its bars, markers, filled areas and
texts, values to 6 significant digits): `bench.regenerate --check` compares that, not the PNG's
bytes, which change with the matplotlib build and its fonts."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def data_path(png: Path) -> Path:
    """Where the data of the figure `png` is written."""
    return png.parent / "data" / f"{png.stem}.json"


def _rounded(value):
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def _points(array) -> list:
    return _rounded([[float(x) for x in row] for row in array])


def _fixed(axis) -> dict:
    """Ticks the tool set itself (categories, chosen positions); automatic ones are left out."""
    from matplotlib.ticker import FixedFormatter, FixedLocator

    fixed = {}
    if isinstance(axis.get_major_locator(), FixedLocator):
        fixed["ticks"] = _rounded([float(t) for t in axis.get_major_locator().locs])
    if isinstance(axis.get_major_formatter(), FixedFormatter):
        fixed["labels"] = [str(label) for label in axis.get_major_formatter().seq]
    return fixed


def _shown(label: str) -> str:
    """A legend label; matplotlib's own names for unlabelled artists start with "_"."""
    return "" if label.startswith("_") else label


def figure_data(fig) -> dict:
    """What a figure shows, from its artists, in data coordinates."""
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.patches import Rectangle

    axes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        axes.append({
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
            "xticks": _fixed(ax.xaxis), "yticks": _fixed(ax.yaxis),
            # matplotlib names unlabelled artists itself ("_child3"): no data
            "lines": [{"label": _shown(line.get_label()), "points": _points(line.get_xydata())}
                      for line in ax.get_lines()],
            "bars": [_rounded([p.get_x(), p.get_y(), p.get_width(), p.get_height()])
                     for p in ax.patches if isinstance(p, Rectangle)],
            "markers": [_points(c.get_offsets()) for c in ax.collections
                        if isinstance(c, PathCollection)],
            "areas": [[_points(path.vertices) for path in c.get_paths()]
                      for c in ax.collections if isinstance(c, PolyCollection)],
            "texts": [t.get_text() for t in ax.texts],
            "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
        })
    return {"title": fig.get_suptitle(), "axes": axes}


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    data_path(path).parent.mkdir(parents=True, exist_ok=True)
    data_path(path).write_text(json.dumps(figure_data(fig)) + "\n")
    # No software version in the file: with one matplotlib build, the same logs give the same
    # bytes.
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {path}")
