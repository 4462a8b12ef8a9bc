"""Measure a CIFAR-10 generator with the shipped classifier: class histogram and Frechet distances.

For `n` samples (20 Euler steps by default) from the generator this reports
- the class histogram under the classifier (argmax of its logits),
- the Frechet distance between Gaussian fits of the classifier's penultimate features (256-d,
  global max-pooled) of the samples and of the CIFAR-10 test set,
next to two references measured the same way against the same test features:
- the floor: `n` training images (a seeded subset), i.e. what a perfect generator would score;
- the ceiling: `n` samples of an untrained U-Net of the same configuration (seeded random init).
These are classifier-feature distances, not the Inception FID, and the JPEG copy of CIFAR-10 differs
slightly from the original pixels; compare numbers only within this table.

Produced the numbers in weights/cfm-cifar10-small/README.md with (one H200, about 1 minute):

    python scripts/evaluate_generator.py --data <cifar10 folder> --out-dir <folder>
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from cifar10 import load_cifar10  # noqa: E402

import rewards  # noqa: E402
from cifar_fpo import sample_images  # noqa: E402
from fpo_utils.devices import pick_device  # noqa: E402
from fpo_utils.unet import DEFAULT_MODEL, UNet2D, load_unet, resolve_model  # noqa: E402

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass
class Args:
    data: str
    """CIFAR-10 location: a `cifar-10-batches-py` folder or a folder with train.zip/test.zip."""
    model: str = DEFAULT_MODEL
    """Generator folder (diffusers format)."""
    classifier_path: Optional[str] = None
    """Classifier weights (default: the shipped one)."""
    n: int = 10_000
    """Samples per generator and training images for the floor."""
    sample_steps: int = 20
    """Euler steps (app:cifar)."""
    batch_size: int = 1000
    """Sampling batch size."""
    seed: int = 0
    """Seed of the latents, the training subset and the untrained U-Net."""
    out_dir: str = "generator_eval"
    """Where `generator_eval.json` and `samples.png` are written."""
    device: str = "auto"
    """auto, cpu or cuda."""


@torch.no_grad()
def features_and_classes(clf, images: torch.Tensor, batch: int = 1000):
    """Penultimate classifier features (N, 256) and predicted classes (N,) for images in [-1, 1]."""
    feats, classes = [], []
    for s in range(0, images.shape[0], batch):
        x = images[s : s + batch]
        h = clf.features(clf.normalise(x)).amax(dim=(2, 3))
        feats.append(h.double().cpu())
        classes.append((clf.head(h) * clf.logit_scale).argmax(dim=1).cpu())
    return torch.cat(feats).numpy(), torch.cat(classes).numpy()


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)) between Gaussian fits of two feature sets."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    w, v = np.linalg.eigh(s_a)
    root_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    cross = np.linalg.eigvalsh(root_a @ s_b @ root_a)  # same eigenvalues as S_a S_b
    return float(
        ((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2 * np.sqrt(np.clip(cross, 0, None)).sum()
    )


@torch.no_grad()
def generate(net, n: int, steps: int, seed: int, batch: int, device, convention) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in range(0, n, batch):
        z = torch.randn((min(batch, n - s), 3, 32, 32), generator=gen).to(device)
        out.append(sample_images(net, z, steps, convention))
    return torch.cat(out)


def save_grid(images: torch.Tensor, path: Path, nrow: int = 8):
    """Images in [-1, 1] (N, 3, H, W) as one PNG grid with 2-pixel white gutters."""
    from PIL import Image

    x = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    n, h, w, _ = x.shape
    grid = np.full((-(-n // nrow) * (h + 2) + 2, nrow * (w + 2) + 2, 3), 255, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, nrow)
        grid[2 + r * (h + 2) : 2 + r * (h + 2) + h, 2 + c * (w + 2) : 2 + c * (w + 2) + w] = x[i]
    Image.fromarray(grid).save(path)


def to_tensor(u8: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(u8).permute(0, 3, 1, 2).float().div(127.5).sub(1).to(device)


def main(args: Args) -> dict:
    device = pick_device(args.device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    clf = rewards.load_classifier(args.classifier_path, device=device)
    test_u8, _ = load_cifar10(args.data, "test")
    train_u8, _ = load_cifar10(args.data, "train")
    rng = np.random.default_rng(args.seed)
    subset = rng.choice(len(train_u8), size=min(args.n, len(train_u8)), replace=False)
    f_test, _ = features_and_classes(clf, to_tensor(test_u8, device))
    f_train, _ = features_and_classes(clf, to_tensor(train_u8[subset], device))

    net = load_unet(resolve_model(args.model), device=device)
    convention = net.convention
    samples = generate(net, args.n, args.sample_steps, args.seed, args.batch_size, device, convention)
    f_gen, cls_gen = features_and_classes(clf, samples)
    save_grid(samples[:64].cpu(), out / "samples.png")

    torch.manual_seed(args.seed)
    untrained = UNet2D.from_config(net.config).to(device).eval()
    f_untrained, _ = features_and_classes(
        clf, generate(untrained, args.n, args.sample_steps, args.seed, args.batch_size, device, convention)
    )
    hist = np.bincount(cls_gen, minlength=10) / len(cls_gen)
    result = {
        "model": args.model,
        "n": args.n,
        "sample_steps": args.sample_steps,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "class_histogram": {c: float(p) for c, p in zip(CLASSES, hist)},
        "max_class_fraction": float(hist.max()),
        "frechet_generator_vs_test": frechet_distance(f_gen, f_test),
        "frechet_train_vs_test_floor": frechet_distance(f_train, f_test),
        "frechet_untrained_vs_test_ceiling": frechet_distance(f_untrained, f_test),
        "seconds": time.time() - t0,
    }
    (out / "generator_eval.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
