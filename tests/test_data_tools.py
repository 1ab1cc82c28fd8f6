"""Tests for the dataset tools in data/: the synthetic ImageFolder generator and
the ImageNet val preparation script.

Everything runs on CPU with tiny images; the whole file takes a few seconds.
The scripts live in data/ (not a package), so they are loaded by file path.
The CLI tests run the scripts as subprocesses with the current interpreter,
exactly as a user would, to check exit codes and messages.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "data"
SYNTH_SCRIPT = DATA_DIR / "make_synthetic.py"
PREP_SCRIPT = DATA_DIR / "prepare_imagenet_val.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered so that pickling (multiprocessing workers) and dataclasses
    # can find the module by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


synth = _load("make_synthetic", SYNTH_SCRIPT)
prep = _load("prepare_imagenet_val", PREP_SCRIPT)


def _run(script: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.JPEG"))}


# Small settings so the generator tests stay fast.
TINY = dict(num_classes=3, train_per_class=4, val_per_class=2, min_size=24, max_size=64, verbose=False)


# ---------------------------------------------------------------------------
# make_synthetic.py
# ---------------------------------------------------------------------------

def test_synthetic_layout_counts_and_jpegs(tmp_path):
    root = tmp_path / "syn"
    summary = synth.make_synthetic_imagefolder(root, seed=1, **TINY)
    assert not summary["skipped"]

    wnids = [f"n{c:08d}" for c in range(3)]
    for split, per_class in (("train", 4), ("val", 2)):
        assert sorted(p.name for p in (root / split).iterdir()) == wnids
        for wnid in wnids:
            files = sorted((root / split / wnid).iterdir())
            assert len(files) == per_class
            assert all(f.suffix == ".JPEG" for f in files)
    # No temporary files left behind by the atomic write.
    assert not list(root.rglob("*.tmp"))

    sizes = set()
    for path in root.rglob("*.JPEG"):
        with Image.open(path) as im:
            assert im.format == "JPEG"
            assert im.mode == "RGB"
            im.load()  # full decode, not just the header
            sizes.add(im.size)
            assert all(24 <= s <= 64 for s in im.size)
    # 18 images drawn from 41x41 possible sizes: they must not all be equal.
    assert len(sizes) > 5

    manifest = json.loads((root / ".synthetic.json").read_text())
    assert manifest["complete"] is True
    assert manifest["classes"] == wnids
    assert manifest["params"]["seed"] == 1


def test_synthetic_is_deterministic(tmp_path):
    a = _files(Path(synth.make_synthetic_imagefolder(tmp_path / "a", seed=3, **TINY)["root"]))
    b = _files(Path(synth.make_synthetic_imagefolder(tmp_path / "b", seed=3, **TINY)["root"]))
    c = _files(Path(synth.make_synthetic_imagefolder(tmp_path / "c", seed=4, **TINY)["root"]))
    assert a == b
    assert a.keys() == c.keys() and a != c


@pytest.mark.slow
def test_synthetic_same_bytes_with_worker_processes(tmp_path):
    # >= 100 images so the multiprocessing path is really taken: the result
    # must not depend on how images are spread over workers.
    kw = dict(num_classes=2, train_per_class=50, val_per_class=5, min_size=16, max_size=24, seed=5,
              verbose=False)
    serial = _files(Path(synth.make_synthetic_imagefolder(tmp_path / "s", workers=1, **kw)["root"]))
    parallel = _files(Path(synth.make_synthetic_imagefolder(tmp_path / "p", workers=2, **kw)["root"]))
    assert len(serial) == 110
    assert serial == parallel


@pytest.mark.slow
def test_synthetic_manifest_skip_and_regenerate(tmp_path):
    root = tmp_path / "syn"
    synth.make_synthetic_imagefolder(root, **TINY)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.JPEG")}

    again = synth.make_synthetic_imagefolder(root, **TINY)
    assert again["skipped"]
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.JPEG")} == before

    # The CLI reports the skip too.
    res = _run(SYNTH_SCRIPT, root, "--classes", 3, "--train-per-class", 4, "--val-per-class", 2,
               "--min-size", 24, "--max-size", 64)
    assert res.returncode == 0, res.stderr
    assert "skipping" in res.stdout

    # Different parameters: the old (own) dataset is replaced, not mixed in.
    other = dict(TINY, train_per_class=2)
    assert not synth.make_synthetic_imagefolder(root, **other)["skipped"]
    assert sum(1 for _ in (root / "train").rglob("*.JPEG")) == 3 * 2

    # A deleted image means the dataset is incomplete: regenerate.
    next((root / "val").rglob("*.JPEG")).unlink()
    assert not synth.make_synthetic_imagefolder(root, **other)["skipped"]
    assert sum(1 for _ in (root / "val").rglob("*.JPEG")) == 3 * 2


@pytest.mark.slow
def test_synthetic_cli_writes_and_refuses_foreign_dir(tmp_path):
    root = tmp_path / "cli"
    res = _run(SYNTH_SCRIPT, root, "--classes", 2, "--train-per-class", 2, "--val-per-class", 1,
               "--min-size", 16, "--max-size", 32, "--seed", 7, "--quality", 80)
    assert res.returncode == 0, res.stderr
    assert "wrote 4 train + 2 val" in res.stdout
    assert len(list(root.rglob("*.JPEG"))) == 6

    # A directory with real data and no manifest must never be wiped.
    foreign = tmp_path / "foreign"
    (foreign / "train" / "n01440764").mkdir(parents=True)
    keep = foreign / "train" / "n01440764" / "precious.JPEG"
    keep.write_bytes(b"not ours")
    res = _run(SYNTH_SCRIPT, foreign, "--classes", 2, "--train-per-class", 1, "--val-per-class", 1,
               "--min-size", 16, "--max-size", 16)
    assert res.returncode == 2
    assert "refusing to overwrite" in res.stderr
    assert keep.read_bytes() == b"not ours"


def _mean_rgb(im: Image.Image) -> np.ndarray:
    return np.asarray(im.convert("RGB"), dtype=np.float32).reshape(-1, 3).mean(0)


def test_synthetic_classes_are_separable(tmp_path):
    """Guard against the generator degenerating into class-independent noise.

    A nearest-centroid classifier on the mean colour (train centroids, val
    queries) must be far above chance (1/6), both on whole images and on
    small random crops with flips, as RandomResizedCrop would produce.
    """
    n_classes = 6
    root = tmp_path / "syn"
    synth.make_synthetic_imagefolder(root, num_classes=n_classes, train_per_class=10, val_per_class=8,
                                     min_size=48, max_size=96, seed=0, workers=1, verbose=False)
    wnids = sorted(p.name for p in (root / "train").iterdir())
    centroids = np.stack([
        np.mean([_mean_rgb(Image.open(p)) for p in (root / "train" / w).iterdir()], axis=0)
        for w in wnids])

    rng = np.random.default_rng(0)
    correct_full = correct_crop = total = 0
    for label, wnid in enumerate(wnids):
        for path in (root / "val" / wnid).iterdir():
            im = Image.open(path).convert("RGB")
            correct_full += int(np.argmin(((centroids - _mean_rgb(im)) ** 2).sum(1)) == label)
            # A crop covering ~10% of the area, flipped, resized to 32 px.
            w, h = im.size
            cw, ch = max(8, int(w * 0.3)), max(8, int(h * 0.3))
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            crop = im.crop((x, y, x + cw, y + ch)).transpose(Image.Transpose.FLIP_LEFT_RIGHT).resize((32, 32))
            correct_crop += int(np.argmin(((centroids - _mean_rgb(crop)) ** 2).sum(1)) == label)
            total += 1
    assert correct_full / total > 0.8, f"whole-image accuracy {correct_full / total:.2f}"
    assert correct_crop / total > 0.8, f"crop accuracy {correct_crop / total:.2f}"


# ---------------------------------------------------------------------------
# prepare_imagenet_val.py
# ---------------------------------------------------------------------------

# ILSVRC2012_IDs are deliberately not in wnid order (as in the real devkit,
# where ID 1 is n02119789), so an ID/wnid mix-up shows up as wrong folders.
ID_TO_WNID = {1: "n02119789", 2: "n01440764", 3: "n04596742"}
N_VAL = 12


def _val_name(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}.JPEG"


@pytest.fixture
def fake_imagenet(tmp_path):
    """A flat val dir of 12 real (tiny) JPEGs of 3 classes plus a train dir.

    Returns (root, truth) where truth maps file name -> wnid.
    """
    root = tmp_path / "imagenet"
    val = root / "val"
    val.mkdir(parents=True)
    ids = [1, 2, 3, 3, 1, 2, 2, 3, 1, 1, 3, 2]  # label of val image i+1
    truth = {}
    for i, sid in enumerate(ids, 1):
        # Distinct content per image so a swapped file would be detectable.
        Image.new("RGB", (8 + i, 8), (20 * i, 0, 0)).save(val / _val_name(i), format="JPEG")
        truth[_val_name(i)] = ID_TO_WNID[sid]
    for wnid in ID_TO_WNID.values():
        (root / "train" / wnid).mkdir(parents=True)
    return root, truth, ids


def _meta_mat_bytes() -> bytes:
    import scipy.io
    # Same field names as the devkit's meta.mat; the (N, 1) shape matches how
    # MATLAB stores the struct array. ID 4 is an internal (non-leaf) node.
    dtype = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")]
    synsets = np.zeros((4, 1), dtype=dtype)
    for row, (sid, wnid) in enumerate(ID_TO_WNID.items()):
        synsets[row, 0] = (sid, wnid, f"class {sid}", 0)
    synsets[3, 0] = (4, "n00001740", "entity", 3)
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"synsets": synsets})
    return buf.getvalue()


def _write_devkit_dir(base: Path, ids) -> Path:
    data = base / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    (data / "meta.mat").write_bytes(_meta_mat_bytes())
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{i}\n" for i in ids))
    return base / "ILSVRC2012_devkit_t12"


def _labels(tmp_path: Path, fmt: str, truth: dict, ids: list) -> Path:
    """Write the label source in the given format and return its path."""
    out = tmp_path / "labels"
    out.mkdir(exist_ok=True)
    if fmt == "devkit_tar":
        src = _write_devkit_dir(out / "extract", ids)
        tar_path = out / "ILSVRC2012_devkit_t12.tar.gz"
        with tarfile.open(tar_path, "w:gz") as tar:
            tar.add(src, arcname="ILSVRC2012_devkit_t12")
        return tar_path
    if fmt == "devkit_dir":
        return _write_devkit_dir(out, ids)
    if fmt == "kaggle":
        path = out / "LOC_val_solution.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["ImageId", "PredictionString"])
            # Unsorted rows and several boxes per image, as in the real file.
            for name in sorted(truth, reverse=True):
                w = truth[name]
                writer.writerow([Path(name).stem, f"{w} 1 2 30 40 {w} 5 6 7 8 "])
        return path
    if fmt == "txt":
        path = out / "val_wnids.txt"
        path.write_text("".join(f"{truth[n]}\n" for n in sorted(truth)))
        return path
    if fmt == "txt_pairs":
        path = out / "val_pairs.txt"
        path.write_text("".join(f"{n} {truth[n]}\n" for n in sorted(truth, reverse=True)))
        return path
    raise ValueError(fmt)


def _assert_sorted(val: Path, truth: dict, flat_left: bool = False):
    placed = {p.name: p.parent.name for p in val.glob("*/*.JPEG")}
    assert placed == truth
    flat = {p.name for p in val.glob("*.JPEG")}
    assert flat == (set(truth) if flat_left else set())


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["devkit_tar", "devkit_dir", "kaggle", "txt", "txt_pairs"])
def test_prepare_val_label_formats(tmp_path, fake_imagenet, fmt):
    root, truth, ids = fake_imagenet
    labels = _labels(tmp_path, fmt, truth, ids)
    originals = {n: (root / "val" / n).read_bytes() for n in truth}

    res = _run(PREP_SCRIPT, root / "val", "--labels", labels, "--train-dir", root / "train")
    assert res.returncode == 0, res.stderr
    assert "moved 12 images into 3 class folders" in res.stdout
    _assert_sorted(root / "val", truth)
    # Files were moved intact, not re-encoded or swapped.
    for name, wnid in truth.items():
        assert (root / "val" / wnid / name).read_bytes() == originals[name]

    # Running again is a no-op.
    res = _run(PREP_SCRIPT, root / "val", "--labels", labels)
    assert res.returncode == 0, res.stderr
    assert "moved 0 images" in res.stdout and "12 already in place" in res.stdout
    _assert_sorted(root / "val", truth)


def test_prepare_val_resumes_partial_run(tmp_path, fake_imagenet):
    root, truth, ids = fake_imagenet
    val = root / "val"
    labels = _labels(tmp_path, "txt", truth, ids)
    # Simulate an interrupted run: some images already in their folders...
    for name in sorted(truth)[:5]:
        (val / truth[name]).mkdir(exist_ok=True)
        (val / name).rename(val / truth[name] / name)
    # ...and one sitting in a wrong folder (from a run with other labels).
    name = sorted(truth)[7]
    wrong = next(w for w in ID_TO_WNID.values() if w != truth[name])
    (val / wrong).mkdir(exist_ok=True)
    (val / name).rename(val / wrong / name)

    summary = prep.prepare_val(val, labels, verbose=False)
    assert summary["already_in_place"] == 5
    assert summary["moved"] == 7
    assert summary["classes"] == 3 and summary["images"] == 12
    _assert_sorted(val, truth)


@pytest.mark.slow
def test_prepare_val_copy_and_dry_run(tmp_path, fake_imagenet):
    root, truth, ids = fake_imagenet
    val = root / "val"
    labels = _labels(tmp_path, "kaggle", truth, ids)

    res = _run(PREP_SCRIPT, val, "--labels", labels, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "would move 12 images into 3 class folders" in res.stdout
    assert sorted(p.name for p in val.iterdir()) == sorted(truth)  # untouched

    res = _run(PREP_SCRIPT, val, "--labels", labels, "--copy")
    assert res.returncode == 0, res.stderr
    assert "copied 12 images" in res.stdout
    _assert_sorted(val, truth, flat_left=True)
    assert not list(val.rglob("*.tmp"))

    # Copy again: nothing to do. Then a move run cleans up the flat copies.
    assert prep.prepare_val(val, labels, copy=True, verbose=False)["copied"] == 0
    summary = prep.prepare_val(val, labels, verbose=False)
    assert summary["moved"] == 0 and summary["already_in_place"] == 12
    _assert_sorted(val, truth)


def test_prepare_val_out_dir(tmp_path, fake_imagenet):
    root, truth, ids = fake_imagenet
    labels = _labels(tmp_path, "devkit_tar", truth, ids)
    out = tmp_path / "val_sorted"
    summary = prep.prepare_val(root / "val", labels, out_dir=out, copy=True, verbose=False)
    assert summary["copied"] == 12 and summary["format"] == "devkit"
    assert {p.name: p.parent.name for p in out.glob("*/*.JPEG")} == truth
    assert len(list((root / "val").glob("*.JPEG"))) == 12


def _error_case(case: str, tmp_path: Path, root: Path, truth: dict, ids: list):
    """Build the inputs of one failure case; returns (argv, expected message)."""
    val = root / "val"
    if case == "missing_val_dir":
        return [tmp_path / "nope", "--labels", _labels(tmp_path, "txt", truth, ids)], "val directory not found"
    if case == "no_images":
        empty = tmp_path / "empty_val"
        empty.mkdir()
        (empty / "README.txt").write_text("not an image")
        return [empty, "--labels", _labels(tmp_path, "txt", truth, ids)], "no val images"
    if case == "count_mismatch":
        path = tmp_path / "short.txt"
        path.write_text("".join(f"{truth[n]}\n" for n in sorted(truth)[:-1]))
        return [val, "--labels", path], "label count (11) does not match the number of val images (12)"
    if case == "devkit_count_mismatch":
        return [val, "--labels", _labels(tmp_path, "devkit_tar", truth, ids + [2])], "label count (13)"
    if case == "non_leaf_id":
        # ID 4 exists in meta.mat but is an internal WordNet node, never a label.
        return [val, "--labels", _labels(tmp_path, "devkit_dir", truth, ids[:-1] + [4])], "not a leaf class"
    if case == "unknown_format":
        path = tmp_path / "labels.txt"
        path.write_text("hello world\nthis is not a label file\n")
        return [val, "--labels", path], "unknown label file format"
    if case == "bare_ground_truth":
        path = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
        path.write_text("".join(f"{i}\n" for i in ids))
        return [val, "--labels", path], "need meta.mat"
    if case == "wnid_not_in_train":
        (root / "train" / ID_TO_WNID[3]).rmdir()
        return ([val, "--labels", _labels(tmp_path, "txt", truth, ids), "--train-dir", root / "train"],
                f"1 val wnids are not class folders in {root / 'train'}: {ID_TO_WNID[3]}")
    raise ValueError(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing_val_dir", "no_images", "count_mismatch", "devkit_count_mismatch",
                                  "non_leaf_id", "unknown_format", "bare_ground_truth", "wnid_not_in_train"])
def test_prepare_val_errors_exit_2(tmp_path, fake_imagenet, case):
    root, truth, ids = fake_imagenet
    argv, message = _error_case(case, tmp_path, root, truth, ids)
    res = _run(PREP_SCRIPT, *argv)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert res.stderr.startswith("error: ")
    # A failed run changes nothing: all images still flat, no class folders.
    assert sorted(p.name for p in (root / "val").iterdir()) == sorted(truth)


@pytest.mark.slow
def test_prepare_val_warns_about_train_classes_without_val(tmp_path, fake_imagenet):
    root, truth, ids = fake_imagenet
    (root / "train" / "n09999999").mkdir()
    res = _run(PREP_SCRIPT, root / "val", "--labels", _labels(tmp_path, "txt", truth, ids),
               "--train-dir", root / "train")
    assert res.returncode == 0, res.stderr
    assert "1 train classes have no val images" in res.stderr
    _assert_sorted(root / "val", truth)
