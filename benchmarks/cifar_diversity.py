"""Sample diversity of a saved grid of CIFAR images: the two statistics cifar_fpo.py logs at validation.

`div_cos` is the mean pairwise cosine distance of the shipped SimCLR encoder's features and `div_classes`
the number of distinct CIFAR-10 classes the shipped classifier predicts (rewards.py `sample_diversity`),
over the images of one grid file (PNG or JPG). The grid layout is `RunFolder.save_images`'s: `padding`
pixels before every row and column of cells and at the top-left edge, cells of `cell` pixels (32 for a
grid the trainer wrote; another size is resized to 32 x 32). Rows and columns default to as many as fit.

    python benchmarks/cifar_diversity.py runs/<run>/samples/update_00020.png
    python benchmarks/cifar_diversity.py grid.jpg --rows 3 --cols 5 --count 12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rewards  # noqa: E402


def read_grid(
    path, rows: Optional[int] = None, cols: Optional[int] = None, padding: int = 2, cell: int = 32
) -> torch.Tensor:
    """The grid's cells, row by row, as (rows * cols, 3, 32, 32) images in [-1, 1]."""
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    height, width, _ = pixels.shape
    rows = rows or (height - padding) // (cell + padding)
    cols = cols or (width - padding) // (cell + padding)
    need = (padding + rows * (cell + padding), padding + cols * (cell + padding))
    if rows < 1 or cols < 1 or need[0] > height + padding or need[1] > width + padding:
        raise ValueError(
            f"{path}: {rows} x {cols} cells of {cell} px with padding {padding} need about {need[1]} x {need[0]} px, "
            f"the image is {width} x {height}"
        )
    cells = []
    for r in range(rows):
        for c in range(cols):
            y, x = padding + r * (cell + padding), padding + c * (cell + padding)
            cells.append(pixels[y : y + cell, x : x + cell])
    images = torch.from_numpy(np.stack(cells)).permute(0, 3, 1, 2) / 127.5 - 1.0
    if cell != 32:
        images = F.interpolate(images, size=(32, 32), mode="bilinear", antialias=True, align_corners=False)
    return images.clamp(-1.0, 1.0).contiguous()


def measure(images: torch.Tensor, features: Callable) -> Dict[str, float]:
    """{"div_cos", "div_classes"} of (N, 3, 32, 32) images with `rewards.make_diversity_features`'s function."""
    cos, classes = rewards.sample_diversity(*features(images))
    return {"div_cos": cos, "div_classes": classes}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", help="image file holding a grid of CIFAR images")
    p.add_argument("--rows", type=int, default=None, help="rows of cells (default: as many as fit)")
    p.add_argument("--cols", type=int, default=None, help="columns of cells (default: as many as fit)")
    p.add_argument("--padding", type=int, default=2, help="pixels between cells and at the top-left edge")
    p.add_argument("--cell", type=int, default=32, help="side of one cell in pixels")
    p.add_argument("--count", type=int, default=None, help="use the first COUNT cells (a part-full last row)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a = p.parse_args(argv)
    images = read_grid(a.grid, a.rows, a.cols, a.padding, a.cell)[: a.count]
    stats = measure(images, rewards.make_diversity_features(a.device))
    print(json.dumps({"grid": str(a.grid), "images": int(images.shape[0]), **stats}))
    return stats


if __name__ == "__main__":
    main()
