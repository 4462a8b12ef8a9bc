"""Minimal CIFAR-10 reader used by the scripts that build the shipped weights.

Two layouts are understood:

- the standard Python pickles (``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``, as
  downloaded by torchvision), either the ``cifar-10-batches-py`` folder itself or a folder that
  contains it;
- a JPEG copy: ``train.zip`` holding ``train/<class>/NNNN.jpg`` and ``test.zip`` holding
  ``test/<class>/NNNN.jpg``, with class names in CIFAR-10 index order (``CLASSES``). JPEG images
  differ slightly from the original pixels.

``load_cifar10(path, split)`` returns ``(images, labels)``: uint8 ``(N, 32, 32, 3)`` RGB and
int64 ``(N,)``.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLITS = ("train", "test")
PICKLE_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def _load_pickles(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name in PICKLE_FILES[split]:
        with open(folder / name, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)


def _load_zip(archive: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    images, labels = [], []
    with zipfile.ZipFile(archive) as z:
        names = sorted(n for n in z.namelist() if n.lower().endswith((".jpg", ".jpeg", ".png")))
        for name in names:
            parts = name.split("/")
            if len(parts) < 3 or parts[-3] != split or parts[-2] not in CLASSES:
                raise ValueError(
                    f"unexpected entry {name!r} in {str(archive)!r}; expected {split}/<class>/<file>.jpg"
                    f" with class in {list(CLASSES)}"
                )
            with Image.open(io.BytesIO(z.read(name))) as im:
                img = np.asarray(im.convert("RGB"), dtype=np.uint8)
            if img.shape != (32, 32, 3):
                raise ValueError(f"image {name!r} in {str(archive)!r} has shape {img.shape}; expected (32, 32, 3)")
            images.append(img)
            labels.append(CLASSES.index(parts[-2]))
    if not images:
        raise ValueError(f"no images in {str(archive)!r}")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def load_cifar10(path: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Read a CIFAR-10 split (``"train"``: 50,000 images, ``"test"``: 10,000) from ``path``.

    ``path`` is a ``cifar-10-batches-py`` folder, a folder containing one, a folder containing
    ``<split>.zip``, or the zip archive itself. Returns uint8 images (N, 32, 32, 3) and int64 labels.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not supported; allowed: {list(SPLITS)}")
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".zip":
        return _load_zip(path, split)
    for folder in (path, path / "cifar-10-batches-py"):
        if all((folder / n).is_file() for n in PICKLE_FILES[split]):
            return _load_pickles(folder, split)
    if (path / f"{split}.zip").is_file():
        return _load_zip(path / f"{split}.zip", split)
    raise ValueError(
        f"no CIFAR-10 {split} split in {str(path)!r}; expected cifar-10-batches-py pickles"
        f" or {split}.zip ({split}/<class>/NNNN.jpg)"
    )
