"""Train the frozen SimCLR encoder behind the SimCLR reward and its ten class prototypes.

Produces ``weights/simclr-cifar10.safetensors`` (fp16 encoder weights under ``encoder.*`` and the
ten unit-norm class prototypes under ``prototypes``) and ``weights/simclr-cifar10.json``
(architecture, training settings, k-NN and nearest-prototype test accuracy), which
``rewards.load_simclr()`` reads.

Recipe: SimCLR with the NT-Xent loss (temperature ``--temperature``) on two views per image of
``rewards.SimCLREncoder`` (CIFAR ResNet, widths 64/128/256, two BasicBlocks per stage, about 2.8M
parameters) followed by a training-only projection head (256 -> 512 -> 128). Augmentations run on
the GPU with torch ops: random resized crop (area .2-1, aspect 3/4-4/3), horizontal flip, colour
jitter (brightness .4, contrast .4, saturation .4, hue .1; applied with p=.8) and grayscale (p=.2).
SGD with momentum .9, linear warm-up then cosine decay, batch 512 images (1,024 views).

After training, each class prototype is the mean of the normalised encoder representations of
that class's training images (no augmentation), renormalised to unit length; the SimCLR reward
uses the encoder representation, not the projection head (app:rewards: "normalized class
prototypes from a frozen encoder"). Evaluation: weighted k-NN (k=200, temperature .1) of the test
images against the training representations, and nearest-prototype accuracy.

The shipped file was produced with

    python scripts/train_simclr.py --data <folder with train.zip and test.zip> --out-dir weights --epochs 69

from the JPEG copy of CIFAR-10 on one NVIDIA H200 (torch 2.11, CUDA 13.0) in 125.8 s of training
(69 epochs; the run chose that number from a 270 s budget); weighted k-NN (k=200) test accuracy
71.56%, nearest-prototype test accuracy 62.43% on the 10,000 test images. With
``--time-budget`` > 0 and ``--epochs 0`` the script times the second epoch and fixes the number
of epochs that fits the budget (recorded as ``train_args.epochs`` in the JSON, so the run can be
repeated with that fixed value).
"""

from __future__ import annotations

import json
import math
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
    """where simclr-cifar10.safetensors and .json are written"""
    epochs: int = 100
    """training epochs; 0 = as many as fit in --time-budget seconds (timed on the second epoch)"""
    time_budget: float = 0.0
    """seconds of training used to choose the number of epochs when --epochs is 0"""
    batch_size: int = 512
    """images per step (two views each)"""
    lr: float = 0.4
    """peak learning rate"""
    warmup_epochs: int = 5
    """epochs of linear learning-rate warm-up"""
    momentum: float = 0.9
    """SGD momentum"""
    weight_decay: float = 5e-4
    """L2 weight decay (SGD)"""
    temperature: float = 0.2
    """NT-Xent temperature"""
    widths: tuple[int, ...] = (64, 128, 256)
    """encoder stage widths (rewards.SimCLREncoder)"""
    blocks: int = 2
    """residual blocks per encoder stage"""
    knn_k: int = 200
    """neighbours for the weighted k-NN evaluation"""
    seed: int = 0
    """random seed"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """torch device for training"""


def to_tensor(images, device) -> torch.Tensor:
    """uint8 (N, 32, 32, 3) array -> uint8 (N, 3, 32, 32) tensor on ``device``."""
    return torch.as_tensor(images).permute(0, 3, 1, 2).contiguous().to(device)


def _grey(x: torch.Tensor) -> torch.Tensor:
    return 0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]


def _hue_rotate(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate hue by ``turns`` (fraction of a full turn) per image in YIQ space."""
    m = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], device=x.device)
    yiq = torch.einsum("ij,njhw->nihw", m, x)
    a = (2 * math.pi * turns).view(-1, 1, 1)
    c, s = torch.cos(a), torch.sin(a)
    i, q = yiq[:, 1], yiq[:, 2]
    yiq = torch.stack([yiq[:, 0], c * i - s * q, s * i + c * q], dim=1)
    return torch.einsum("ij,njhw->nihw", torch.linalg.inv(m), yiq)


def augment(x01: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """One SimCLR view of a float (N, 3, 32, 32) batch in [0, 1]; returns images in [-1, 1]."""
    n, dev = x01.shape[0], x01.device

    def u(lo, hi, shape=(n,)):
        return lo + (hi - lo) * torch.rand(shape, device=dev, generator=g)

    # random resized crop + horizontal flip as one affine resampling
    area, logr = u(0.2, 1.0), u(math.log(3 / 4), math.log(4 / 3))
    w = torch.sqrt(area * torch.exp(logr)).clamp(max=1.0)
    h = torch.sqrt(area / torch.exp(logr)).clamp(max=1.0)
    cx, cy = u(-1.0, 1.0) * (1 - w), u(-1.0, 1.0) * (1 - h)
    flip = torch.where(torch.rand(n, device=dev, generator=g) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * flip, cx, h, cy
    grid = F.affine_grid(theta, list(x01.shape), align_corners=False)
    x = F.grid_sample(x01, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    # colour jitter with probability .8
    jit = (torch.rand(n, device=dev, generator=g) < 0.8).view(n, 1, 1, 1)
    y = x * u(0.6, 1.4).view(n, 1, 1, 1)
    y = y.clamp(0, 1)
    m = _grey(y).mean(dim=(1, 2, 3), keepdim=True)
    y = ((y - m) * u(0.6, 1.4).view(n, 1, 1, 1) + m).clamp(0, 1)
    gr = _grey(y)
    y = ((y - gr) * u(0.6, 1.4).view(n, 1, 1, 1) + gr).clamp(0, 1)
    y = _hue_rotate(y, u(-0.1, 0.1)).clamp(0, 1)
    x = torch.where(jit, y, x)
    # grayscale with probability .2
    gray = (torch.rand(n, device=dev, generator=g) < 0.2).view(n, 1, 1, 1)
    x = torch.where(gray, _grey(x).expand_as(x), x)
    return x * 2.0 - 1.0


def nt_xent(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent loss of 2B projections where rows i and i+B are the two views of one image."""
    z = F.normalize(z.float(), dim=1)
    b = z.shape[0] // 2
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(sim, target)


@torch.no_grad()
def embed(encoder, images_u8: torch.Tensor, batch: int = 2000) -> torch.Tensor:
    """Unit-norm encoder representations of uint8 (N, 3, 32, 32) images."""
    encoder.eval()
    out = [
        F.normalize(encoder(images_u8[i : i + batch].float() / 127.5 - 1.0).float(), dim=1)
        for i in range(0, len(images_u8), batch)
    ]
    return torch.cat(out)


@torch.no_grad()
def knn_accuracy(train_f, train_y, test_f, test_y, k: int = 200, t: float = 0.1, classes: int = 10) -> float:
    """Weighted k-NN top-1 accuracy (votes exp(cos / t)) with unit-norm features."""
    correct = 0
    for i in range(0, len(test_y), 1000):
        sim = test_f[i : i + 1000] @ train_f.T
        top, idx = sim.topk(k, dim=1)
        votes = torch.zeros(len(top), classes, device=sim.device)
        votes.scatter_add_(1, train_y[idx], torch.exp(top / t))
        correct += (votes.argmax(1) == test_y[i : i + 1000]).sum().item()
    return correct / len(test_y)


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, classes: int = 10) -> torch.Tensor:
    """Mean unit-norm representation per class, renormalised: (classes, D)."""
    protos = torch.stack([features[labels == c].mean(dim=0) for c in range(classes)])
    return F.normalize(protos, dim=1)


def main(args: Args) -> None:
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "simclr-cifar10.safetensors"
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device=device).manual_seed(args.seed)
    xtr, ytr = load_cifar10(args.data, "train")
    xtr, ytr = to_tensor(xtr, device), torch.as_tensor(ytr, device=device)
    try:
        xte, yte = load_cifar10(args.data, "test")
        xte, yte = to_tensor(xte, device), torch.as_tensor(yte, device=device)
    except (FileNotFoundError, OSError, ValueError) as exc:
        print(f"test split unavailable ({exc}); skipping k-NN evaluation")
        xte = yte = None

    encoder = rewards.SimCLREncoder(widths=args.widths, blocks=args.blocks).to(device)
    head = rewards.ProjectionHead(encoder.dim).to(device)
    encoder, head = encoder.to(memory_format=torch.channels_last), head
    params = list(encoder.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps_per_epoch = len(ytr) // args.batch_size
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    epochs = args.epochs if args.epochs > 0 else None
    t0 = time.time()
    epoch = 0
    while epochs is None or epoch < epochs:
        encoder.train()
        head.train()
        perm = torch.randperm(len(ytr), device=device, generator=gen)
        for i in range(steps_per_epoch):
            step = epoch * steps_per_epoch + i
            total = (epochs or 10**6) * steps_per_epoch
            warm = args.warmup_epochs * steps_per_epoch
            lr = args.lr * (
                (step + 1) / warm
                if step < warm
                else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
            )
            for group in opt.param_groups:
                group["lr"] = lr
            x01 = xtr[perm[i * args.batch_size : (i + 1) * args.batch_size]].float() / 255.0
            views = torch.cat([augment(x01, gen), augment(x01, gen)]).contiguous(memory_format=torch.channels_last)
            with autocast:
                loss = nt_xent(head(encoder(views)), args.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        epoch += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        if epochs is None and epoch == 1:
            t1 = time.time()
        elif epochs is None:  # time the second epoch (the first includes kernel selection)
            epochs = max(args.warmup_epochs + 1, int((args.time_budget - (t1 - t0)) / (time.time() - t1)) + 1)
            print(f"second epoch {time.time() - t1:.1f}s -> {epochs} epochs for a {args.time_budget:.0f}s budget")
        msg = f"epoch {epoch}/{epochs} loss {loss.item():.4f} lr {lr:.3f} {time.time() - t0:.1f}s"
        if xte is not None and epoch % 25 == 0:
            msg += f" knn {knn_accuracy(embed(encoder, xtr), ytr, embed(encoder, xte), yte, args.knn_k):.4f}"
        print(msg, flush=True)
    train_seconds = time.time() - t0

    encoder = encoder.to(memory_format=torch.contiguous_format).eval()
    # prototypes and evaluation from the fp16-rounded encoder that ships
    state = {
        f"encoder.{k}": (v.half() if v.is_floating_point() else v).contiguous().cpu()
        for k, v in encoder.state_dict().items()
    }
    encoder.load_state_dict({k[len("encoder.") :]: v.float() if v.is_floating_point() else v for k, v in state.items()})
    ftr = embed(encoder, xtr)
    protos = class_prototypes(ftr, ytr)
    meta = {
        "model": {"widths": list(args.widths), "blocks": args.blocks},
        "classes": list(rewards.CIFAR10_CLASSES),
        "representation": "global-average-pooled encoder output (projection head not shipped)",
        "prototypes": (
            "mean unit-norm representation of each class's 5,000 training images (no augmentation), renormalised"
        ),
        "input": "images in [-1, 1], (N, 3, 32, 32); CIFAR-10 mean/std normalisation inside the module",
        "train_args": {**asdict(args), "epochs": epochs},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "train_seconds": round(train_seconds, 1),
        "torch": torch.__version__,
    }
    if xte is not None:
        fte = embed(encoder, xte)
        meta["knn_test_accuracy"] = knn_accuracy(ftr, ytr, fte, yte, args.knn_k)
        meta["knn_k"] = args.knn_k
        meta["prototype_test_accuracy"] = (fte @ protos.T).argmax(1).eq(yte).float().mean().item()
        print(
            f"k-NN (k={args.knn_k}) test accuracy {meta['knn_test_accuracy']:.4f}; "
            f"nearest prototype {meta['prototype_test_accuracy']:.4f}"
        )
    from safetensors.torch import save_file

    save_file({**state, "prototypes": protos.float().contiguous().cpu()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB) in {train_seconds:.1f}s")


if __name__ == "__main__":
    main(tyro.cli(Args))
