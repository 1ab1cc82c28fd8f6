#!/usr/bin/env python3
"""Sort the flat ILSVRC2012 validation images into per-class folders.

The official ``ILSVRC2012_img_val.tar`` extracts to 50,000 files in a single
directory (``ILSVRC2012_val_00000001.JPEG`` ... ``ILSVRC2012_val_00050000.JPEG``)
with no labels. ``torchvision.datasets.ImageFolder`` (and so the training
code) needs ``val/<wnid>/<image>``, the same layout as the train split. This
script moves (or copies) each image into the folder of its WordNet id.

Label sources, pick whichever you have (``--labels``; the format is detected):

* the official devkit, ``ILSVRC2012_devkit_t12.tar.gz`` or its extracted
  directory: ``data/ILSVRC2012_validation_ground_truth.txt`` holds one
  ILSVRC2012_ID (1..1000) per line in val-file order, and ``data/meta.mat``
  maps those IDs to wnids (needs scipy);
* Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first
  token of PredictionString is the wnid);
* a text file with one wnid per line in val-file order (e.g. the widely
  shared ``imagenet_2012_validation_synset_labels.txt``), or lines of
  ``<image name> <wnid>``.

"Val-file order" is the sorted order of the file names, which for the official
zero-padded names is the numeric order the ground truth refers to.

The operation is resumable: images already sitting in a class folder (from an
interrupted or earlier run) are recognised and only the rest are moved, so the
script can simply be re-run. Every failure that needs user action exits with
status 2 and a one-line explanation.

Example::

    python data/prepare_imagenet_val.py /data/imagenet/val \\
        --labels ILSVRC2012_devkit_t12.tar.gz --train-dir /data/imagenet/train
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import io
import os
import re
import shutil
import sys
import tarfile
from collections import Counter
from pathlib import Path

IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png"}
WNID_RE = re.compile(r"^n\d{8}$")
GT_NAME = "ILSVRC2012_validation_ground_truth.txt"
META_NAME = "meta.mat"
NUM_LEAF_CLASSES = 1000  # ILSVRC2012_IDs 1..1000 are the leaf (competition) classes


class PrepError(Exception):
    """A problem the user has to fix; reported as one message with exit code 2."""


# ----------------------------------------------------------------------------
# Label readers. Each returns either a list of wnids (in val-file order) or a
# dict {image stem: wnid}; the two cases are reconciled in `assign_labels`.
# ----------------------------------------------------------------------------

def _wnids_from_meta(meta_bytes: bytes, source: str) -> dict[int, str]:
    """Map ILSVRC2012_ID -> wnid for the leaf classes from a devkit meta.mat."""
    try:
        import scipy.io
    except ImportError as e:  # only the devkit path needs scipy
        raise PrepError("reading the devkit's meta.mat needs scipy: pip install scipy") from e
    try:
        # squeeze_me flattens MATLAB's (N, 1) struct array and 1x1 cells into
        # plain Python values, whatever the exact shape in the file is.
        mat = scipy.io.loadmat(io.BytesIO(meta_bytes), squeeze_me=True)
        synsets = mat["synsets"]
        ids = [int(x) for x in synsets["ILSVRC2012_ID"].ravel()]
        wnids = [str(x) for x in synsets["WNID"].ravel()]
        names = synsets.dtype.names or ()
        children = ([int(x) for x in synsets["num_children"].ravel()]
                    if "num_children" in names else None)
    except PrepError:
        raise
    except Exception as e:  # corrupt file or missing fields: say which file
        raise PrepError(f"cannot read synsets (ILSVRC2012_ID, WNID) from {source}: {e}") from e
    mapping = {}
    for k, (sid, wnid) in enumerate(zip(ids, wnids)):
        # meta.mat also lists the 860 internal WordNet nodes (IDs 1001..1860);
        # they never occur as labels. Prefer the explicit "no children" flag,
        # fall back to the documented ID range when the field is absent.
        is_leaf = children[k] == 0 if children is not None else 1 <= sid <= NUM_LEAF_CLASSES
        if is_leaf:
            mapping[sid] = wnid
    if not mapping:
        raise PrepError(f"{source} contains no leaf synsets")
    return mapping


def _labels_from_devkit_files(gt_text: str, meta_bytes: bytes, source: str) -> list[str]:
    id_to_wnid = _wnids_from_meta(meta_bytes, source)
    labels = []
    for lineno, line in enumerate(gt_text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            sid = int(line)
        except ValueError:
            raise PrepError(f"{source}: {GT_NAME} line {lineno} is not an integer ID: {line!r}") from None
        if sid not in id_to_wnid:
            raise PrepError(f"{source}: {GT_NAME} line {lineno} has ID {sid}, which is not a leaf class in meta.mat")
        labels.append(id_to_wnid[sid])
    return labels


def read_devkit(path: Path) -> list[str]:
    """Labels from the devkit tarball or an extracted devkit directory."""
    if path.is_dir():
        # Accept the devkit root, its data/ folder, or the folder the tarball
        # was extracted into (which contains ILSVRC2012_devkit_t12/).
        for d in (path / "data", path, path / "ILSVRC2012_devkit_t12" / "data"):
            if (d / GT_NAME).is_file() and (d / META_NAME).is_file():
                return _labels_from_devkit_files((d / GT_NAME).read_text(), (d / META_NAME).read_bytes(), str(d))
        raise PrepError(f"{path} does not look like the ILSVRC2012 devkit: data/{GT_NAME} and data/{META_NAME} not found")
    # Read the two small members straight from the archive; no need to
    # extract the devkit to disk.
    try:
        with tarfile.open(path) as tar:
            gt = meta = None
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                if member.name.endswith("data/" + GT_NAME) or member.name == GT_NAME:
                    gt = tar.extractfile(member).read().decode()
                elif member.name.endswith("data/" + META_NAME) or member.name == META_NAME:
                    meta = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise PrepError(f"cannot read devkit archive {path}: {e}") from e
    if gt is None or meta is None:
        raise PrepError(f"{path} does not contain data/{GT_NAME} and data/{META_NAME}; is it the ILSVRC2012 devkit?")
    return _labels_from_devkit_files(gt, meta, str(path))


def read_kaggle_csv(path: Path) -> dict[str, str]:
    """Labels from Kaggle's LOC_val_solution.csv, keyed by image stem."""
    labels = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"ImageId", "PredictionString"} <= set(reader.fieldnames):
            raise PrepError(f"{path}: expected a CSV header with ImageId,PredictionString")
        for row in reader:
            tokens = (row["PredictionString"] or "").split()
            # PredictionString is "wnid x0 y0 x1 y1 [wnid x0 ...]" (one entry
            # per bounding box); all boxes of a val image share the class.
            if not tokens or not WNID_RE.match(tokens[0]):
                raise PrepError(f"{path}: row for {row['ImageId']!r} has no wnid in PredictionString")
            labels[Path(row["ImageId"]).stem] = tokens[0]
    return labels


def read_text_labels(path: Path) -> list[str] | dict[str, str]:
    """One wnid per line (ordered), or '<image name> <wnid>' per line (keyed)."""
    lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
    if lines and all(len(t) == 1 and WNID_RE.match(t[0]) for t in lines):
        return [t[0] for t in lines]
    if lines and all(len(t) == 2 and WNID_RE.match(t[1]) for t in lines):
        return {Path(t[0]).stem: t[1] for t in lines}
    if lines and all(len(t) == 1 and t[0].isdigit() for t in lines):
        # A common mistake: passing the devkit's ground truth file alone.
        raise PrepError(f"{path} holds integer class IDs (like {GT_NAME}); they need meta.mat to be "
                        "mapped to wnids, so pass the devkit directory or tarball as --labels instead")
    raise PrepError(f"unknown label file format: {path} (expected the ILSVRC2012 devkit, "
                    "LOC_val_solution.csv, or a text file with one wnid per line)")


def detect_format(path: Path) -> str:
    if path.is_dir():
        return "devkit"
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")) or tarfile.is_tarfile(path):
        return "devkit"
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\0" in head:  # binary and not a tarball: nothing we know
        raise PrepError(f"unknown label file format: {path} (binary file)")
    first_line = head.decode(errors="replace").splitlines()[0] if head.strip() else ""
    if first_line.replace(" ", "").startswith("ImageId,") or name.endswith(".csv"):
        return "kaggle"
    return "txt"


def read_labels(path: Path, fmt: str = "auto"):
    if not path.exists():
        raise PrepError(f"label source not found: {path}")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "devkit":
        return read_devkit(path), fmt
    if fmt == "kaggle":
        return read_kaggle_csv(path), fmt
    return read_text_labels(path), fmt


# ----------------------------------------------------------------------------
# Planning and executing the moves.
# ----------------------------------------------------------------------------

def _is_image(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS


def find_images(val_dir: Path, out_dir: Path) -> dict[str, list[Path]]:
    """All val images by file name: flat ones in val_dir plus any already in
    a class folder of out_dir (left by an earlier, possibly interrupted run).

    A name may have several locations (e.g. a flat original plus its copy).
    """
    found: dict[str, list[Path]] = {}
    for p in sorted(val_dir.iterdir()):
        if _is_image(p):
            found.setdefault(p.name, []).append(p)
    if out_dir.is_dir():
        for d in sorted(out_dir.iterdir()):
            # Skip val_dir itself in case it lies inside out_dir: its flat
            # files were collected above and must not count twice.
            if d.is_dir() and not d.name.startswith(".") and d.resolve() != val_dir.resolve():
                for p in sorted(d.iterdir()):
                    if _is_image(p):
                        found.setdefault(p.name, []).append(p)
    return found


def assign_labels(names: list[str], labels) -> dict[str, str]:
    """Pair every image name with its wnid; errors if the two do not match up."""
    if len(labels) != len(names):
        raise PrepError(f"label count ({len(labels)}) does not match the number of val images "
                        f"({len(names)}); is the val directory complete and the label file for ILSVRC2012?")
    if isinstance(labels, list):
        # Ordered labels follow the official numbering, i.e. sorted names.
        return dict(zip(sorted(names), labels))
    missing = [n for n in names if Path(n).stem not in labels]
    if missing:
        raise PrepError(f"{len(missing)} val images have no label, e.g. {missing[0]}")
    return {n: labels[Path(n).stem] for n in names}


def check_train_classes(wnids: set[str], train_dir: Path) -> list[str]:
    """Error if a val wnid has no train folder; return warnings otherwise."""
    if not train_dir.is_dir():
        raise PrepError(f"train directory not found: {train_dir}")
    train = {d.name for d in train_dir.iterdir() if d.is_dir() and not d.name.startswith(".")}
    unknown = sorted(wnids - train)
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise PrepError(f"{len(unknown)} val wnids are not class folders in {train_dir}: {shown} "
                        "(wrong label file, or train extracted incompletely?)")
    warnings = []
    absent = sorted(train - wnids)
    if absent:
        # ImageFolder numbers classes by sorted folder name, so a class missing
        # from val would shift every later class index between train and val.
        warnings.append(f"warning: {len(absent)} train classes have no val images (e.g. {absent[0]}); "
                        "class indices from ImageFolder would differ between train and val")
    return warnings


def _same_file_content(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)


def prepare_val(val_dir, labels_path, out_dir=None, fmt: str = "auto", copy: bool = False,
                dry_run: bool = False, train_dir=None, verbose: bool = True) -> dict:
    """Sort val images into <out_dir>/<wnid>/ folders; returns a summary dict.

    out_dir defaults to val_dir (in-place, the usual case). Raises PrepError
    for anything the user must fix; nothing is moved before all checks pass.
    """
    log = print if verbose else (lambda *a, **k: None)
    val_dir = Path(val_dir)
    out_dir = Path(out_dir) if out_dir is not None else val_dir
    if not val_dir.is_dir():
        raise PrepError(f"val directory not found: {val_dir}")

    found = find_images(val_dir, out_dir)
    if not found:
        raise PrepError(f"no val images (*.JPEG) found in {val_dir}; extract ILSVRC2012_img_val.tar there first")
    labels, fmt = read_labels(Path(labels_path), fmt)
    assignment = assign_labels(list(found), labels)
    wnids = set(assignment.values())

    warnings = check_train_classes(wnids, Path(train_dir)) if train_dir is not None else []
    for w in warnings:
        print(w, file=sys.stderr)

    # Plan first, act second: every conflict is found before any file moves,
    # so a failed run leaves the directory exactly as it was.
    todo = []  # (source, destination)
    already = 0
    stray = []  # copies in wrong class folders (only from a run with other labels)
    for name, wnid in sorted(assignment.items()):
        dest = out_dir / wnid / name
        locations = found[name]
        if dest in locations:
            already += 1
            # Other locations are either the flat original (kept in --copy
            # mode, or left behind if a copy-mode run is followed by a move
            # run) or a copy in a wrong folder; handled below.
            for loc in locations:
                if loc != dest and loc.parent != val_dir:
                    stray.append(loc)
                elif loc != dest and not copy:
                    if not _same_file_content(loc, dest):
                        raise PrepError(f"{loc} and {dest} both exist but differ; remove the wrong one")
                    todo.append((loc, None))  # flat duplicate of a finished copy: drop it
            continue
        flat = [loc for loc in locations if loc.parent == val_dir]
        source = flat[0] if flat else locations[0]  # else: it sits in a wrong class folder
        todo.append((source, dest))
        stray.extend(loc for loc in locations if loc != source and loc.parent != val_dir)

    verb = "copy" if copy else "move"
    n_transfer = sum(1 for _, d in todo if d is not None)
    counts = Counter(assignment.values())
    summary = {
        "format": fmt,
        "images": len(assignment),
        "classes": len(wnids),
        "already_in_place": already,
        "moved": 0 if copy else n_transfer,
        "copied": n_transfer if copy else 0,
        "min_per_class": min(counts.values()),
        "max_per_class": max(counts.values()),
        "dry_run": dry_run,
        "warnings": warnings,
    }

    if dry_run:
        log(f"dry run: would {verb} {n_transfer} images into {len(wnids)} class folders under {out_dir} "
            f"({already} already in place, labels from {fmt})")
        return summary

    for src, dest in todo:
        if dest is None:
            src.unlink()
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if copy or src.parent != val_dir:
            if copy and src.parent == val_dir:
                # Copy to a temporary name, then rename: an interrupted copy
                # never leaves a truncated image under the final name.
                tmp = dest.with_name(dest.name + ".tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
            else:
                # Relabelled file from a wrong class folder: just move it over.
                shutil.move(str(src), str(dest))
        else:
            # A rename within one filesystem is atomic, so resuming after an
            # interruption always sees each image in exactly one place.
            try:
                os.replace(src, dest)
            except OSError:  # out_dir on another filesystem
                shutil.move(str(src), str(dest))
    for p in stray:
        if p.exists():
            p.unlink()

    done = "copied" if copy else "moved"
    log(f"{done} {n_transfer} images into {len(wnids)} class folders under {out_dir} "
        f"({already} already in place; {len(assignment)} images total, "
        f"{summary['min_per_class']}-{summary['max_per_class']} per class; labels from {fmt})")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Move the flat ILSVRC2012 val images into val/<wnid>/ class folders.",
        epilog="Exit status 2 means a problem with the inputs; the message says which.")
    ap.add_argument("val_dir", help="directory holding ILSVRC2012_val_*.JPEG (extracted ILSVRC2012_img_val.tar)")
    ap.add_argument("--labels", required=True,
                    help="devkit tar.gz or directory, LOC_val_solution.csv, or a text file of wnids")
    ap.add_argument("--format", choices=["auto", "devkit", "kaggle", "txt"], default="auto",
                    help="label source format (default: detect)")
    ap.add_argument("--out-dir", default=None,
                    help="where to create the class folders (default: in place, inside val_dir)")
    ap.add_argument("--copy", action="store_true", help="copy instead of move; the flat files stay")
    ap.add_argument("--dry-run", action="store_true", help="check everything and report, change nothing")
    ap.add_argument("--train-dir", default=None,
                    help="train directory whose class folders the val wnids must match")
    args = ap.parse_args(argv)
    try:
        prepare_val(args.val_dir, args.labels, out_dir=args.out_dir, fmt=args.format, copy=args.copy,
                    dry_run=args.dry_run, train_dir=args.train_dir)
    except PrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
