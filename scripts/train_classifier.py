"""Train the frozen CIFAR-10 classifier behind ``p_auto`` (Auto-A35 and Mixed rewards).

Produces ``weights/cifar10-classifier.safetensors`` (fp16 weights) and
``weights/cifar10-classifier.json`` (architecture, training settings, test accuracy), which
``rewards.load_classifier()`` reads.

Recipe: ``rewards.CifarClassifier`` (about 2.0M parameters), random horizontal flips and
reflect-padded random 32x32 crops (pad 4) done on the GPU on a uint8 copy of the dataset,
label smoothing .2, SGD with Nesterov momentum .9 and a one-cycle learning rate (linear warm-up
then linear decay to zero), weight decay 5e-4, batch 512, bf16 autocast on CUDA.

The shipped file was produced with

    python scripts/train_classifier.py --data <folder with train.zip and test.zip> --out-dir weights

(the defaults above: 40 epochs) from the JPEG copy of CIFAR-10 on one NVIDIA H200 (torch 2.11,
CUDA 13.0) in 24.5 s of training; test accuracy 90.36% on the 10,000 test images (fp16 weights,
no test-time augmentation; the same 90.36% when re-measured on a CPU with ``--eval-only``).
``--data`` is a folder holding either the standard ``cifar-10-batches-py`` pickles or
``train.zip``/``test.zip`` JPEG archives (see ``scripts/cifar10.py``). Test accuracy on the 10,000
test images is stored in the JSON file when the test split is available; ``--eval-only``
recomputes it from a saved file.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import tyro

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from cifar10 import load_cifar10  # noqa: E402

import rewards  # noqa: E402


@dataclass
class Args:
    data: str = "data/cifar10"
    """folder with cifar-10-batches-py pickles or train.zip/test.zip (scripts/cifar10.py)"""
    out_dir: str = "weights"
    """where cifar10-classifier.safetensors and .json are written"""
    epochs: int = 40
    """training epochs over the 50,000 training images"""
    batch_size: int = 512
    """images per SGD step"""
    lr: float = 0.2
    """peak learning rate of the one-cycle schedule"""
    warmup: float = 0.15
    """fraction of the steps spent warming the learning rate up linearly from zero"""
    momentum: float = 0.9
    """Nesterov momentum"""
    weight_decay: float = 5e-4
    """L2 weight decay (SGD)"""
    label_smoothing: float = 0.2
    """label smoothing of the cross-entropy loss"""
    pad: int = 4
    """reflect padding before the random 32x32 crop"""
    widths: tuple[int, ...] = (32, 64, 256, 256)
    """stem width followed by the width of each conv group (rewards.CifarClassifier)"""
    seed: int = 0
    """random seed"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """torch device for training"""
    eval_only: bool = False
    """only evaluate an existing out_dir/cifar10-classifier.safetensors on the test split"""


def to_tensor(images, device) -> torch.Tensor:
    """uint8 (N, 32, 32, 3) array -> uint8 (N, 3, 32, 32) tensor on ``device``."""
    return torch.as_tensor(images).permute(0, 3, 1, 2).contiguous().to(device)


def uint8_to_pm1(x: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float images in [-1, 1]."""
    return x.float() / 127.5 - 1.0


def flip_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and reflect-padded random crop of a float (N, C, H, W) batch."""
    n, c, h, w = x.shape
    dev = x.device
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    x = torch.where(flip.view(n, 1, 1, 1), x.flip(3), x)
    if pad == 0:
        return x
    xp = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    dy = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    rows = (dy.view(n, 1) + torch.arange(h, device=dev)).view(n, 1, h, 1).expand(n, c, h, w + 2 * pad)
    xp = xp.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(w, device=dev)).view(n, 1, 1, w).expand(n, c, h, w)
    return xp.gather(3, cols)


@torch.no_grad()
def accuracy(model, images_u8: torch.Tensor, labels: torch.Tensor, batch: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on uint8 (N, 3, 32, 32) images (no test-time augmentation)."""
    model.eval()
    correct = 0
    for i in range(0, len(labels), batch):
        logits = model(uint8_to_pm1(images_u8[i : i + batch]))
        correct += (logits.argmax(1) == labels[i : i + batch]).sum().item()
    return correct / len(labels)


def save(model, path: pathlib.Path, meta: dict) -> None:
    from safetensors.torch import save_file

    state = {k: (v.half() if v.is_floating_point() else v).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")


def main(args: Args) -> None:
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cifar10-classifier.safetensors"
    device = torch.device(args.device)

    def test_split():
        try:
            xt, yt = load_cifar10(args.data, "test")
        except (FileNotFoundError, OSError, ValueError) as exc:
            print(f"test split unavailable ({exc}); skipping test accuracy")
            return None
        return to_tensor(xt, device), torch.as_tensor(yt, device=device)

    if args.eval_only:
        model = rewards.load_classifier(path, device)
        test = test_split()
        acc = accuracy(model, *test)
        meta = json.loads(path.with_suffix(".json").read_text())
        meta["test_accuracy"] = acc
        meta["test_images"] = int(len(test[1]))
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"test accuracy {acc:.4f} on {len(test[1])} images")
        return

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device=device).manual_seed(args.seed)
    xtr, ytr = load_cifar10(args.data, "train")
    xtr, ytr = to_tensor(xtr, device), torch.as_tensor(ytr, device=device)
    test = test_split()
    print(f"train {tuple(xtr.shape)} on {device}")

    model = rewards.CifarClassifier(widths=args.widths).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True, weight_decay=args.weight_decay
    )
    steps_per_epoch = len(ytr) // args.batch_size
    total = args.epochs * steps_per_epoch
    warm = max(1, int(args.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / (total - warm))
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(ytr), device=device, generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            x = flip_crop(uint8_to_pm1(xtr[idx]), args.pad, gen).contiguous(memory_format=torch.channels_last)
            with autocast:
                loss = F.cross_entropy(model(x).float(), ytr[idx], label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        msg = f"epoch {epoch + 1}/{args.epochs} loss {loss.item():.4f} {time.time() - t0:.1f}s"
        if test is not None and (epoch + 1) % 10 == 0:
            msg += f" test acc {accuracy(model, *test):.4f}"
        print(msg, flush=True)
    train_seconds = time.time() - t0
    model = model.to(memory_format=torch.contiguous_format).eval()
    meta = {
        "model": {"widths": list(args.widths), "num_classes": 10, "logit_scale": 1.0},
        "classes": list(rewards.CIFAR10_CLASSES),
        "input": "images in [-1, 1], (N, 3, 32, 32); CIFAR-10 mean/std normalisation inside the module",
        "train_args": asdict(args),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "train_seconds": round(train_seconds, 1),
        "torch": torch.__version__,
    }
    if test is not None:
        # measured on the fp16-rounded weights that ship
        save(model, path, meta)
        acc = accuracy(rewards.load_classifier(path, device), *test)
        meta.update(test_accuracy=acc, test_images=int(len(test[1])))
        print(f"test accuracy {acc:.4f}")
    save(model, path, meta)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB) in {train_seconds:.1f}s")


if __name__ == "__main__":
    main(tyro.cli(Args))
