"""scripts/cifar10.py on tiny fake datasets in both layouts, and on the real copy when present."""

import io
import os
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from cifar10 import CLASSES, load_cifar10  # noqa: E402


def fake_images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def test_pickle_layout(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    want_x, want_y = [], []
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        x = fake_images(3, i)
        y = [(i + j) % 10 for j in range(3)]
        # The pickles store each image as 3072 bytes: all R, then all G, then all B (row-major).
        data = np.concatenate([x[..., c].reshape(3, 1024) for c in range(3)], axis=1)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": y}, f)
        want_x.append(x)
        want_y.append(y)
    for path in (tmp_path, folder):
        x, y = load_cifar10(path, "train")
        assert x.dtype == np.uint8 and x.shape == (15, 32, 32, 3) and y.dtype == np.int64
        np.testing.assert_array_equal(x, np.concatenate(want_x[:5]))
        np.testing.assert_array_equal(y, np.concatenate(want_y[:5]))
    x, y = load_cifar10(tmp_path, "test")
    np.testing.assert_array_equal(x, want_x[5])
    np.testing.assert_array_equal(y, want_y[5])


def test_zip_layout(tmp_path):
    # A flat-coloured image survives JPEG compression almost exactly, which pins the channel order.
    colours = {"automobile": (200, 30, 40), "truck": (10, 220, 90), "airplane": (60, 70, 250)}
    with zipfile.ZipFile(tmp_path / "test.zip", "w") as z:
        for cls, rgb in colours.items():
            for k in range(2):
                buf = io.BytesIO()
                Image.fromarray(np.full((32, 32, 3), rgb, dtype=np.uint8)).save(buf, format="JPEG", quality=95)
                z.writestr(f"test/{cls}/{k:04d}.jpg", buf.getvalue())
    x, y = load_cifar10(tmp_path, "test")
    assert x.shape == (6, 32, 32, 3) and x.dtype == np.uint8
    # Sorted by path: airplane, automobile, truck -> indices 0, 1, 9.
    np.testing.assert_array_equal(y, [0, 0, 1, 1, 9, 9])
    for i, cls in enumerate(["airplane", "airplane", "automobile", "automobile", "truck", "truck"]):
        assert np.abs(x[i].astype(int) - np.array(colours[cls])).max() <= 3
    np.testing.assert_array_equal(load_cifar10(tmp_path / "test.zip", "test")[1], y)


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_cifar10(tmp_path, "valid")
    with pytest.raises(ValueError, match="no CIFAR-10 train split"):
        load_cifar10(tmp_path, "train")
    with zipfile.ZipFile(tmp_path / "train.zip", "w") as z:
        z.writestr("train/unicorn/0000.jpg", b"")
    with pytest.raises(ValueError, match="unicorn"):
        load_cifar10(tmp_path, "train")


# CIFAR10_DATA may name the folder; otherwise the JPEG copy is looked for in two usual places.
CANDIDATES = [
    Path(os.environ.get("CIFAR10_DATA", ROOT / "data" / "cifar10")),
    ROOT.parent / "shared" / "data" / "cifar10",
]
REAL = [p for p in CANDIDATES if (p / "test.zip").is_file()]


@pytest.mark.skipif(not REAL, reason="no JPEG copy of CIFAR-10 (test.zip) found; set CIFAR10_DATA to its folder")
def test_real_test_split():
    x, y = load_cifar10(REAL[0], "test")
    assert x.shape == (10_000, 32, 32, 3) and x.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(y, minlength=10), [1000] * 10)
    assert len(CLASSES) == 10 and CLASSES[1] == "automobile"
    # Natural images: mid-range mean, full dynamic range, not all one colour.
    assert 90 < x.mean() < 160 and x.min() == 0 and x.max() == 255 and x.std() > 40
