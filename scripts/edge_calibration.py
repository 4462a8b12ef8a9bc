"""Calibrate the Edge reward: eight feature means and widths from 4,096 CIFAR-10 training images.

Writes ``weights/edge-calibration.json``, which ``rewards.load_edge_calibration()`` reads. For
each of the eight features of ``rewards.edge_features`` (Sobel and Laplacian magnitude, mean and
SD over pixels, at blur scales 0 and 1) the mean ``mu_j`` and population SD ``sd_j`` over the
calibration images give the width ``a_j = max(2.5 sd_j, .05 |mu_j|, .001)`` (app:rewards: width
multiplier 2.5, relative floor .05, absolute floor .001; see ``rewards.edge_width``).

The paper calibrates on "the first 4,096 CIFAR training images". With the standard
``cifar-10-batches-py`` pickles that is exactly what ``--subset first`` does. The JPEG copy of
CIFAR-10 is ordered by class folder rather than in the original order, so its first 4,096 images
would all be airplanes; ``--subset seeded`` (the default) instead takes a fixed random subset of
4,096 training images drawn with ``numpy.random.default_rng(seed).choice(N, 4096, replace=False)``
(sorted), and records that choice in the JSON file.

The shipped file was produced on a 2-core CPU (15.6 s including JPEG decoding) with

    python scripts/edge_calibration.py --data /path/to/cifar10 --out weights/edge-calibration.json

from the JPEG copy of CIFAR-10 (``train.zip``), seed 0.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from cifar10 import load_cifar10  # noqa: E402

import rewards  # noqa: E402


@dataclass
class Args:
    data: str = "data/cifar10"
    """folder with cifar-10-batches-py pickles or train.zip (scripts/cifar10.py)"""
    out: str = "weights/edge-calibration.json"
    """output JSON file"""
    num_images: int = 4096
    """calibration images (app:rewards: 4,096)"""
    subset: str = "seeded"
    """'first' (the paper's choice; needs the original order) or 'seeded' (fixed random subset)"""
    seed: int = 0
    """seed of the 'seeded' subset"""


def calibrate(images_u8: np.ndarray) -> dict:
    """Feature means, population SDs and widths of uint8 (N, 32, 32, 3) images."""
    x = torch.as_tensor(images_u8).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    with torch.no_grad():
        feats = torch.cat([rewards.edge_features(x[i : i + 512]) for i in range(0, len(x), 512)]).double().numpy()
    mean, sd = feats.mean(axis=0), feats.std(axis=0)
    width = rewards.edge_width(sd, mean)
    return {
        "features": list(rewards.EDGE_FEATURE_NAMES),
        "mean": mean.tolist(),
        "sd": sd.tolist(),
        "width": width.tolist(),
    }


def main(args: Args) -> None:
    if args.subset not in ("first", "seeded"):
        raise ValueError(f"subset={args.subset!r} is not supported; allowed: ['first', 'seeded']")
    t0 = time.time()
    images, _ = load_cifar10(args.data, "train")
    if args.num_images > len(images):
        raise ValueError(f"num_images={args.num_images} exceeds the {len(images)} training images")
    if args.subset == "first":
        idx = np.arange(args.num_images)
    else:
        idx = np.sort(np.random.default_rng(args.seed).choice(len(images), args.num_images, replace=False))
    calib = calibrate(images[idx])
    calib.update(
        {
            "width_rule": "max(2.5 * sd, 0.05 * |mean|, 0.001)",
            "width_multiplier": rewards.EDGE_WIDTH_MULTIPLIER,
            "relative_floor": rewards.EDGE_RELATIVE_FLOOR,
            "absolute_floor": rewards.EDGE_ABSOLUTE_FLOOR,
            "num_images": args.num_images,
            "subset": args.subset,
            "seed": args.seed if args.subset == "seeded" else None,
            "source": pathlib.Path(args.data).name,
            "note": (
                "first N training images in file order"
                if args.subset == "first"
                else "fixed seeded random subset: numpy.random.default_rng(seed).choice(N_train, num_images, "
                "replace=False), sorted; used because the JPEG copy of CIFAR-10 is ordered by class, "
                "not in the original order, so the paper's first 4,096 images cannot be reproduced from it"
            ),
        }
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(calib, indent=2) + "\n")
    print(f"wrote {out} from {args.num_images} images in {time.time() - t0:.1f}s")
    for name, m, a in zip(calib["features"], calib["mean"], calib["width"]):
        print(f"  {name:24s} mean {m:.5f} width {a:.5f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
