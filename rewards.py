"""Image rewards for CIFAR-10 post-training (paper Appendix app:rewards).

Every reward takes generated images as float tensors in [-1, 1] of shape (N, 3, 32, 32) and
returns one float32 score per image, at its native output scale (app:rewards: "The rewards keep
their native output scales").

The module has three layers:

1. Pixel maths: small pure functions (``to01``, ``gaussian_blur``, ``soft_red_map``,
   ``patch_mask``, ``red_patch_attribute``, ``mixed_texture_attribute``, ``edge_features``,
   ``edge_score``, ``digit7_structure``, ``simclr_score``). Each constant carries the paper
   label it comes from.
2. Small networks whose weights ship with the project in ``weights/``: ``CifarClassifier``
   (the frozen CIFAR-10 classifier behind ``p_auto``) and ``SimCLREncoder`` (the frozen
   self-supervised encoder behind the SimCLR reward). ``scripts/`` trains them.
3. Backends and the factory ``make_reward(name, ...)``.
4. Sample diversity (``make_diversity_features``, ``sample_diversity``): the SimCLR encoder's mean
   pairwise cosine distance and the classifier's number of distinct classes over a set of images.

The module imports nothing from its project, so it can be copied out alone. The weights folder
(classifier, SimCLR encoder, Edge calibration) is, first found first: the ``weights_dir`` argument
of ``make_reward`` and the loaders, the ``FPO_WEIGHTS_DIR`` environment variable, else ``weights/``
beside this file; ``classifier_path``, ``simclr_path`` and ``edge_calibration`` name single files.

Choices the paper leaves open (documented where they are made):

* Gaussian blur ``B``: sigma = 1, kernel radius ``ceil(3 sigma)`` (7 taps for sigma = 1),
  separable, reflect padding, kernel normalised to sum one.
* Edge features work on the channel-mean grey image with reflect padding; the calibration
  width is ``a_j = max(2.5 sd_j, .05 |mu_j|, .001)`` (see ``edge_width``).
* Digit7 border density ratio ``b`` = mean ink on the outer 3-pixel border divided by the mean
  ink of the whole image (+1e-6); centroid coordinates are pixel centres on ``linspace(-1, 1, 32)``.
* Digit7 and CLIP prompt strings (the paper names the prompts' content, not their exact text)
  are ``DIGIT7_POSITIVE``, ``DIGIT7_NEGATIVES`` and ``CLIP_TEMPLATES`` below.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent
WEIGHTS_DIR = ROOT / "weights"  # the shipped weights, used when neither weights_dir nor FPO_WEIGHTS_DIR is set
WEIGHTS_ENV = "FPO_WEIGHTS_DIR"  # environment variable naming the weights folder
CLASSIFIER_FILE = "cifar10-classifier.safetensors"
SIMCLR_FILE = "simclr-cifar10.safetensors"
EDGE_CALIBRATION_FILE = "edge-calibration.json"
BESIDE = "it sits beside the weights file, with the same stem"  # where a network's JSON config is

REWARDS = ("auto-a35", "mixed", "edge", "clip", "simclr", "digit7")
# Model-free parts of the rewards above, accepted by make_reward too (cheap, used in tests and smoke runs).
PIXEL_REWARDS = ("red-patch", "mixed-texture", "digit7-structure")

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
AUTOMOBILE = 1  # app:rewards: "class-1 confidence"
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# Five text templates per class (app:rewards, CLIP reward).
CLIP_TEMPLATES = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a black and white photo of a {}.",
    "a low contrast photo of a {}.",
    "a high contrast photo of a {}.",
)
CLIP_LOGIT_SCALE = 20.0  # app:rewards: softmax(20 cosine)
# Digit7 prompts (app:rewards): a centred handwritten seven against five negatives
# (blank white, solid black, digit three, digit eight, abstract texture).
DIGIT7_POSITIVE = "a centered handwritten digit seven, black ink on a white background."
DIGIT7_NEGATIVES = (
    "a blank white image.",
    "a solid black image.",
    "a handwritten digit three.",
    "a handwritten digit eight.",
    "an abstract texture.",
)
DIGIT7_SEMANTIC_SCALE = 12.0  # app:rewards: C = sigmoid(12 (s+ - mean s-))
DIGIT7_WEIGHTS = (0.75, 0.25)  # app:rewards: R = .75 C + .25 T
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Pixel constants (app:rewards).
BLUR_SIGMA = 1.0
PATCH_ROWS = (20, 28)
PATCH_COLS = (10, 22)
RED_OFFSET, RED_TEMPERATURE = 0.10, 0.08
AUTO_ATTRIBUTE_SCALE, AUTO_OUTSIDE_WEIGHT = 6.0, 0.5
MIXED_SCALE, MIXED_THRESHOLD, MIXED_EPS = 12.0, 0.03, 1e-12
EDGE_WIDTH_MULTIPLIER, EDGE_RELATIVE_FLOOR, EDGE_ABSOLUTE_FLOOR = 2.5, 0.05, 0.001
EDGE_BLUR_SCALES = (0.0, 1.0)
EDGE_FEATURE_NAMES = tuple(
    f"{op}_{stat}_blur{int(s)}" for s in EDGE_BLUR_SCALES for op in ("sobel", "laplacian") for stat in ("mean", "sd")
)
SIMCLR_TAU = 0.08
DIGIT7_OCCUPANCY, DIGIT7_OCCUPANCY_WIDTH = 0.18, 0.12
DIGIT7_CENTROID_WIDTH = 0.55
DIGIT7_BORDER, DIGIT7_BORDER_SCALE = 3, 0.10
DIGIT7_CONTRAST = 0.5
DIGIT7_STABILISER = 1e-6


# --------------------------------------------------------------------------------------------
# Pixel maths
# --------------------------------------------------------------------------------------------


def check_images(x: torch.Tensor) -> torch.Tensor:
    """Raise a one-line ValueError unless ``x`` is a float tensor of shape (N, 3, 32, 32)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or tuple(x.shape[1:]) != (3, 32, 32):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"images must be a tensor of shape (N, 3, 32, 32) in [-1, 1], got {shape}")
    if not x.is_floating_point():
        raise ValueError(f"images must be a floating-point tensor in [-1, 1], got dtype {x.dtype}")
    return x


def to01(x: torch.Tensor) -> torch.Tensor:
    """Map images from [-1, 1] to ``x01 = clip((x + 1) / 2, 0, 1)`` (app:rewards)."""
    return ((x + 1.0) * 0.5).clamp(0.0, 1.0)


def gaussian_kernel1d(sigma: float, dtype=torch.float32, device=None) -> torch.Tensor:
    """Normalised 1-D Gaussian taps on ``[-r, r]`` with radius ``r = ceil(3 sigma)``."""
    radius = max(1, math.ceil(3.0 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return (k / k.sum()).to(dtype=dtype, device=device)


def gaussian_blur(x: torch.Tensor, sigma: float = BLUR_SIGMA) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, H, W) images; ``B`` of app:rewards uses sigma = 1.

    Kernel radius ``ceil(3 sigma)`` (7 taps at sigma = 1), normalised to sum one, reflect padding,
    applied per channel. ``sigma = 0`` returns the input unchanged.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if sigma == 0:
        return x
    k = gaussian_kernel1d(sigma, dtype=x.dtype, device=x.device)
    r = (k.numel() - 1) // 2
    c = x.shape[1]
    y = F.pad(x, (r, r, 0, 0), mode="reflect")
    y = F.conv2d(y, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    y = F.pad(y, (0, 0, r, r), mode="reflect")
    return F.conv2d(y, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def soft_red_map(z: torch.Tensor) -> torch.Tensor:
    """``r(z) = sigmoid((z_R - max(z_G, z_B) - .10) / .08)`` per pixel (app:rewards); (N,3,H,W) -> (N,H,W)."""
    return torch.sigmoid((z[:, 0] - torch.maximum(z[:, 1], z[:, 2]) - RED_OFFSET) / RED_TEMPERATURE)


def patch_mask(height: int = 32, width: int = 32, device=None) -> torch.Tensor:
    """Boolean (H, W) mask of the patch P: rows 20:28, columns 10:22 (app:rewards)."""
    m = torch.zeros(height, width, dtype=torch.bool, device=device)
    m[PATCH_ROWS[0] : PATCH_ROWS[1], PATCH_COLS[0] : PATCH_COLS[1]] = True
    return m


def masked_mean(v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of (N, H, W) maps over the pixels where the (H, W) boolean ``mask`` is true."""
    return v[:, mask].mean(dim=1)


def red_patch_attribute(x: torch.Tensor) -> torch.Tensor:
    """Auto-A35 attribute ``sigmoid(6 [<r(B(x01))>_P - .5 <r(B(x01))>_{P^c}])`` (app:rewards)."""
    r = soft_red_map(gaussian_blur(to01(x)))
    p = patch_mask(*r.shape[-2:], device=r.device)
    return torch.sigmoid(AUTO_ATTRIBUTE_SCALE * (masked_mean(r, p) - AUTO_OUTSIDE_WEIGHT * masked_mean(r, ~p)))


def forward_differences(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward differences along rows and columns of (N, C, H, W) maps.

    ``g1[i, j] = e[i+1, j] - e[i, j]`` and ``g2[i, j] = e[i, j+1] - e[i, j]``; the difference maps
    are zero-padded at the last row (g1) and last column (g2) to keep the input's shape
    (app:rewards). The patch P never touches the last row or column, so the rewards do not
    depend on this boundary convention.
    """
    g1 = F.pad(e[..., 1:, :] - e[..., :-1, :], (0, 0, 0, 1))
    g2 = F.pad(e[..., :, 1:] - e[..., :, :-1], (0, 1, 0, 0))
    return g1, g2


def high_frequency_magnitude(x01: torch.Tensor) -> torch.Tensor:
    """Mixed's ``d = mean_ch sqrt((grad1 e)^2 + (grad2 e)^2 + 1e-12)`` with ``e = x01 - B(x01)``."""
    e = x01 - gaussian_blur(x01)
    g1, g2 = forward_differences(e)
    return torch.sqrt(g1**2 + g2**2 + MIXED_EPS).mean(dim=1)


def mixed_texture_attribute(x: torch.Tensor) -> torch.Tensor:
    """Mixed attribute ``sigmoid(12 [<d r(x01)>_P - .03])`` (app:rewards): red high-frequency texture in P."""
    x01 = to01(x)
    v = high_frequency_magnitude(x01) * soft_red_map(x01)
    return torch.sigmoid(MIXED_SCALE * (masked_mean(v, patch_mask(*v.shape[-2:], device=v.device)) - MIXED_THRESHOLD))


def grey(x01: torch.Tensor) -> torch.Tensor:
    """Channel-mean grey image, (N, 3, H, W) -> (N, 1, H, W)."""
    return x01.mean(dim=1, keepdim=True)


_SOBEL_X = ((-1.0, 0.0, 1.0), (-2.0, 0.0, 2.0), (-1.0, 0.0, 1.0))
_LAPLACIAN = ((0.0, 1.0, 0.0), (1.0, -4.0, 1.0), (0.0, 1.0, 0.0))


def _conv3x3(g: torch.Tensor, kernel) -> torch.Tensor:
    k = torch.tensor(kernel, dtype=g.dtype, device=g.device).view(1, 1, 3, 3)
    return F.conv2d(F.pad(g, (1, 1, 1, 1), mode="reflect"), k)


def sobel_magnitude(g: torch.Tensor) -> torch.Tensor:
    """``sqrt(Sx^2 + Sy^2)`` of (N, 1, H, W) grey images with 3x3 Sobel kernels and reflect padding."""
    gx = _conv3x3(g, _SOBEL_X)
    gy = _conv3x3(g, tuple(zip(*_SOBEL_X)))
    return torch.sqrt(gx**2 + gy**2 + MIXED_EPS)


def laplacian_magnitude(g: torch.Tensor) -> torch.Tensor:
    """``|Laplacian|`` of (N, 1, H, W) grey images with the 4-neighbour kernel and reflect padding."""
    return _conv3x3(g, _LAPLACIAN).abs()


def edge_features(x: torch.Tensor) -> torch.Tensor:
    """The eight Edge features (app:rewards), (N, 3, 32, 32) in [-1, 1] -> (N, 8).

    At blur scales 0 (none) and 1 (Gaussian sigma 1) of the grey image of ``x01``: mean and
    population SD over pixels of the Sobel magnitude and of the Laplacian magnitude, in the order
    of ``EDGE_FEATURE_NAMES``.
    """
    g = grey(to01(x))
    feats = []
    for s in EDGE_BLUR_SCALES:
        gs = gaussian_blur(g, s)
        for mag in (sobel_magnitude(gs), laplacian_magnitude(gs)):
            flat = mag.flatten(1)
            feats += [flat.mean(dim=1), flat.std(dim=1, unbiased=False)]
    return torch.stack(feats, dim=1)


def edge_width(
    sd,
    mean,
    multiplier: float = EDGE_WIDTH_MULTIPLIER,
    relative_floor: float = EDGE_RELATIVE_FLOOR,
    absolute_floor: float = EDGE_ABSOLUTE_FLOOR,
) -> np.ndarray:
    """Calibrated Edge widths ``a_j = max(2.5 sd_j, .05 |mu_j|, .001)`` (app:rewards).

    The paper names the width multiplier (2.5), relative floor (.05) and absolute floor (.001);
    this applies the multiplier to the calibration SD and floors it relative to |mean|, then absolutely.
    """
    sd, mean = np.asarray(sd, dtype=np.float64), np.asarray(mean, dtype=np.float64)
    return np.maximum(np.maximum(multiplier * sd, relative_floor * np.abs(mean)), absolute_floor)


def edge_score(x: torch.Tensor, calib: dict) -> torch.Tensor:
    """Edge reward ``mean_j [1 + ((f_j - mu_j) / a_j)^2]^-1`` over the 8 features (app:rewards).

    ``calib`` holds ``"mean"`` and ``"width"`` (8 numbers each), e.g. from ``load_edge_calibration``.
    """
    f = edge_features(x)
    mu = torch.as_tensor(calib["mean"], dtype=f.dtype, device=f.device)
    a = torch.as_tensor(calib["width"], dtype=f.dtype, device=f.device)
    if mu.shape != (f.shape[1],) or a.shape != (f.shape[1],):
        raise ValueError(f"edge calibration needs 8 means and 8 widths, got {tuple(mu.shape)} and {tuple(a.shape)}")
    return (1.0 / (1.0 + ((f - mu) / a) ** 2)).mean(dim=1)


def digit7_structure_factors(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-image factors and statistics of the Digit7 structure score T (app:rewards).

    Ink ``I = 1 - mean_ch x01``; occupancy ``m = <I>``; ink-weighted centroid ``(cx, cy)`` with
    pixel centres on ``linspace(-1, 1, 32)`` (x = column, y = row); border density ratio
    ``b = <I>_border / (<I> + 1e-6)`` on the outer 3-pixel border; contrast ``std_pop(1 - I)``.
    Returns the statistics (m, cx, cy, b, std) and the four factors (occupancy, centroid, border,
    contrast).
    """
    ink = 1.0 - to01(x).mean(dim=1)  # (N, H, W)
    n, h, w = ink.shape
    ys = torch.linspace(-1.0, 1.0, h, dtype=ink.dtype, device=ink.device).view(1, h, 1)
    xs = torch.linspace(-1.0, 1.0, w, dtype=ink.dtype, device=ink.device).view(1, 1, w)
    mass = ink.sum(dim=(1, 2))
    m = ink.mean(dim=(1, 2))
    cx = (ink * xs).sum(dim=(1, 2)) / (mass + DIGIT7_STABILISER)
    cy = (ink * ys).sum(dim=(1, 2)) / (mass + DIGIT7_STABILISER)
    k = DIGIT7_BORDER
    border = torch.ones(h, w, dtype=torch.bool, device=ink.device)
    border[k : h - k, k : w - k] = False
    b = masked_mean(ink, border) / (m + DIGIT7_STABILISER)
    std = (1.0 - ink).flatten(1).std(dim=1, unbiased=False)
    return {
        "m": m,
        "cx": cx,
        "cy": cy,
        "b": b,
        "std": std,
        "occupancy": torch.exp(-(((m - DIGIT7_OCCUPANCY) / DIGIT7_OCCUPANCY_WIDTH) ** 2)),
        "centroid": torch.exp(-(cx**2 + cy**2) / DIGIT7_CENTROID_WIDTH**2),
        "border": torch.exp(-b / DIGIT7_BORDER_SCALE),
        "contrast": (std / DIGIT7_CONTRAST).clamp(0.0, 1.0),
    }


def digit7_structure(x: torch.Tensor) -> torch.Tensor:
    """Digit7 structure ``T = e^{-((m-.18)/.12)^2} e^{-(cx^2+cy^2)/.55^2} e^{-b/.10} clip(std_pop(1-I)/.5, 0, 1)``."""
    f = digit7_structure_factors(x)
    return f["occupancy"] * f["centroid"] * f["border"] * f["contrast"]


def simclr_score(cos: torch.Tensor, target: int = AUTOMOBILE, tau: float = SIMCLR_TAU) -> torch.Tensor:
    """SimCLR reward ``sigmoid((s+ - tau log(1/9 sum_j exp(s_j / tau))) / tau)`` (app:rewards).

    ``cos`` is (N, K) cosine similarity to K normalised class prototypes; ``s+`` is the target
    column and the sum runs over the K - 1 other columns (K = 10, tau = .08 in the paper).
    """
    if cos.ndim != 2 or not 0 <= target < cos.shape[1]:
        raise ValueError(f"cos must be (N, K) with 0 <= target < K, got shape {tuple(cos.shape)} and target {target}")
    k = cos.shape[1]
    others = torch.cat([cos[:, :target], cos[:, target + 1 :]], dim=1)
    soft_max_others = tau * (torch.logsumexp(others / tau, dim=1) - math.log(k - 1))
    return torch.sigmoid((cos[:, target] - soft_max_others) / tau)


# --------------------------------------------------------------------------------------------
# Networks whose weights ship with the project
# --------------------------------------------------------------------------------------------


class _Normalise(nn.Module):
    """[-1, 1] images -> per-channel standardised CIFAR-10 statistics."""

    def __init__(self, mean=CIFAR10_MEAN, std=CIFAR10_STD):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def forward(self, x):
        return ((x + 1.0) * 0.5 - self.mean) / self.std


def _conv_bn(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out)]


class CifarClassifier(nn.Module):
    """Small CIFAR-10 convolutional classifier; the frozen backend of ``p_auto``.

    A 3x3 stem, then ``len(widths) - 1`` groups of (conv, 2x2 max-pool, BN, GELU, conv, BN, GELU),
    global max-pool and a bias-free linear head scaled by ``logit_scale``. Takes images in [-1, 1];
    normalisation is inside the module. Returns logits (N, 10).
    """

    def __init__(self, widths=(32, 64, 256, 256), num_classes: int = 10, logit_scale: float = 1.0):
        super().__init__()
        self.widths, self.logit_scale = tuple(widths), logit_scale
        self.normalise = _Normalise()
        layers = [*_conv_bn(3, widths[0]), nn.GELU()]
        for c_in, c_out in zip(widths[:-1], widths[1:]):
            layers += [
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                nn.MaxPool2d(2),
                nn.BatchNorm2d(c_out),
                nn.GELU(),
            ]
            layers += [*_conv_bn(c_out, c_out), nn.GELU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], num_classes, bias=False)

    def forward(self, x):
        h = self.features(self.normalise(x)).amax(dim=(2, 3))
        return self.head(h) * self.logit_scale


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class SimCLREncoder(nn.Module):
    """Small CIFAR ResNet encoder (3x3 stem, BasicBlock stages, global average pool).

    ``widths`` gives one stage per entry (the first at full resolution, each later one halves it),
    ``blocks`` residual blocks per stage. Takes images in [-1, 1]; normalisation is inside the
    module. Returns the (N, widths[-1]) representation the SimCLR reward compares with the class
    prototypes (app:rewards: "normalized class prototypes from a frozen encoder").
    """

    def __init__(self, widths=(64, 128, 256), blocks: int = 2):
        super().__init__()
        self.widths, self.blocks = tuple(widths), blocks
        self.normalise = _Normalise()
        self.stem = nn.Sequential(*_conv_bn(3, widths[0]), nn.ReLU())
        stages, c = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                stages.append(_BasicBlock(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
        self.stages = nn.Sequential(*stages)
        self.dim = widths[-1]

    def forward(self, x):
        return self.stages(self.stem(self.normalise(x))).mean(dim=(2, 3))


class ProjectionHead(nn.Module):
    """SimCLR projection MLP used only during training (Linear-BN-ReLU-Linear)."""

    def __init__(self, dim_in: int, hidden: int = 512, dim_out: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim_in, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, dim_out)
        )

    def forward(self, h):
        return self.net(h)


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


def find_weights_dir(weights_dir=None) -> tuple[pathlib.Path, str]:
    """The weights folder and how it was chosen: the ``weights_dir`` argument, else the
    ``FPO_WEIGHTS_DIR`` environment variable, else ``weights/`` beside this file."""
    if weights_dir is not None:
        return pathlib.Path(weights_dir), "the weights_dir argument"
    if os.environ.get(WEIGHTS_ENV):
        return pathlib.Path(os.environ[WEIGHTS_ENV]), WEIGHTS_ENV
    return WEIGHTS_DIR, "the default beside rewards.py"


def _weights_file(path, file_name: str, arg: str, what: str, weights_dir=None) -> pathlib.Path:
    """`path` when given, else `file_name` in the weights folder; a missing file raises one line naming
    the path looked at and how to point at another."""
    if path is not None:
        return _require_file(pathlib.Path(path), what, f"check {arg}")
    folder, source = find_weights_dir(weights_dir)
    how = f"pass {arg}=<file> or weights_dir=<folder>, or set {WEIGHTS_ENV}=<folder holding {file_name}>"
    return _require_file(folder / file_name, what, f"weights folder from {source}; {how}")


def _require_file(path: pathlib.Path, what: str, how: str) -> pathlib.Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path} ({how})")
    return path


def _load_safetensors(path: pathlib.Path, device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # safetensors is a core dependency

    return {k: (v.float() if v.is_floating_point() else v).to(device) for k, v in load_file(str(path)).items()}


def load_classifier(path=None, device="cpu", weights_dir=None) -> CifarClassifier:
    """Load the frozen CIFAR-10 classifier (eval mode, fp32).

    ``path`` defaults to ``cifar10-classifier.safetensors`` in the weights folder (`find_weights_dir`);
    its architecture is read from the JSON file with the same stem (``"model": {"widths": [...]}``).
    """
    path = _weights_file(path, CLASSIFIER_FILE, "classifier_path", "classifier weights", weights_dir)
    config = json.loads(_require_file(path.with_suffix(".json"), "classifier config", BESIDE).read_text())
    model = CifarClassifier(**config["model"])
    model.load_state_dict(_load_safetensors(path, device))
    return model.to(device).eval().requires_grad_(False)


def load_simclr(path=None, device="cpu", weights_dir=None) -> tuple[SimCLREncoder, torch.Tensor]:
    """Load the frozen SimCLR encoder and its ten unit-norm class prototypes (10, D).

    ``path`` defaults to ``simclr-cifar10.safetensors`` in the weights folder (`find_weights_dir`),
    which stores the encoder under ``encoder.*`` and the prototypes under ``prototypes``; the
    architecture is read from the JSON file with the same stem.
    """
    path = _weights_file(path, SIMCLR_FILE, "simclr_path", "SimCLR weights", weights_dir)
    config = json.loads(_require_file(path.with_suffix(".json"), "SimCLR config", BESIDE).read_text())
    tensors = _load_safetensors(path, device)
    encoder = SimCLREncoder(**config["model"])
    encoder.load_state_dict({k[len("encoder.") :]: v for k, v in tensors.items() if k.startswith("encoder.")})
    prototypes = F.normalize(tensors["prototypes"], dim=1)
    return encoder.to(device).eval().requires_grad_(False), prototypes


def load_edge_calibration(path=None, weights_dir=None) -> dict:
    """Load the Edge calibration JSON (``"mean"`` and ``"width"``, 8 numbers each, plus provenance);
    ``path`` defaults to ``edge-calibration.json`` in the weights folder (`find_weights_dir`)."""
    path = _weights_file(path, EDGE_CALIBRATION_FILE, "edge_calibration", "edge calibration", weights_dir)
    calib = json.loads(path.read_text())
    for key in ("mean", "width"):
        if len(calib.get(key, ())) != len(EDGE_FEATURE_NAMES):
            raise ValueError(f"{path}: '{key}' must list {len(EDGE_FEATURE_NAMES)} numbers")
    return calib


def load_openclip(model_name: str = "ViT-B-32", pretrained=None, device="cpu"):
    """Return a frozen OpenCLIP ``(model, tokenizer)``.

    ``pretrained`` is an open_clip pretrained tag (e.g. ``"laion2b_s34b_b79k"``; downloaded through
    open_clip's hub code) or the path of a local weights file for ``model_name``. There is no
    default: a reward must never run on a randomly initialised CLIP.
    """
    if pretrained is None:
        raise ValueError(
            f"CLIP weights for {model_name} are required: pass clip_pretrained=<open_clip tag, "
            f"e.g. laion2b_s34b_b79k> or a local weights file (pip install open_clip_torch)"
        )
    try:
        import open_clip
    except ImportError as exc:
        raise ImportError("the CLIP and Digit7 rewards need open_clip: pip install open_clip_torch") from exc
    is_file = pathlib.Path(str(pretrained)).is_file()
    if not is_file and str(pretrained) not in open_clip.list_pretrained_tags_by_model(model_name):
        raise ValueError(
            f"clip_pretrained={pretrained!r} is neither a local file nor an open_clip tag for {model_name}; "
            f"tags: {open_clip.list_pretrained_tags_by_model(model_name)}"
        )
    try:
        model = open_clip.create_model(model_name, pretrained=str(pretrained), device=device, require_pretrained=True)
    except Exception as exc:  # network failure, missing file, wrong architecture
        raise RuntimeError(
            f"could not load OpenCLIP {model_name} weights '{pretrained}' ({type(exc).__name__}: {exc}); "
            f"download them (open_clip.create_model('{model_name}', pretrained=...)) "
            f"or pass a local file"
        ) from exc
    return model.eval().requires_grad_(False), open_clip.get_tokenizer(model_name)


def clip_preprocess(x: torch.Tensor, model) -> torch.Tensor:
    """Differentiable CLIP preprocessing of [-1, 1] images: bicubic resize to the model's input
    size, then CLIP mean/std normalisation (read from the model when it records them)."""
    visual = model.visual
    size = getattr(visual, "image_size", 224)
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    cfg = getattr(visual, "preprocess_cfg", None) or {}
    mean = torch.tensor(cfg.get("mean", OPENAI_CLIP_MEAN), dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(cfg.get("std", OPENAI_CLIP_STD), dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    x01 = to01(x)
    if tuple(x01.shape[-2:]) != size:
        x01 = F.interpolate(x01, size=size, mode="bicubic", align_corners=False).clamp(0.0, 1.0)
    return (x01 - mean) / std


def _text_embeddings(model, tokenizer, prompts, device) -> torch.Tensor:
    tokens = tokenizer(list(prompts)).to(device)
    return F.normalize(model.encode_text(tokens).float(), dim=-1)


def clip_class_prototypes(model, tokenizer, device="cpu", classes=CIFAR10_CLASSES, templates=CLIP_TEMPLATES):
    """Ten unit-norm text prototypes: the mean of each class's normalised template embeddings, renormalised."""
    protos = [_text_embeddings(model, tokenizer, [t.format(c) for t in templates], device).mean(dim=0) for c in classes]
    return F.normalize(torch.stack(protos), dim=-1)


def clip_image_embeddings(x: torch.Tensor, model) -> torch.Tensor:
    """Unit-norm CLIP image embeddings of [-1, 1] images."""
    return F.normalize(model.encode_image(clip_preprocess(x, model)).float(), dim=-1)


# --------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------


def pixel_proxy_reward(name: str):
    """Model-free reward parts: ``red-patch`` (Auto-A35 attribute), ``mixed-texture`` (Mixed
    attribute) and ``digit7-structure`` (Digit7's T)."""
    table = {
        "red-patch": red_patch_attribute,
        "mixed-texture": mixed_texture_attribute,
        "digit7-structure": digit7_structure,
    }
    if name not in table:
        raise ValueError(f"unknown pixel reward {name!r}; choose one of {PIXEL_REWARDS}")
    return table[name]


def make_reward(
    name: str,
    device="cpu",
    classifier_path=None,
    simclr_path=None,
    edge_calibration=None,
    clip_model: str = "ViT-B-32",
    clip_pretrained=None,
    clip_backend=None,
    weights_dir=None,
):
    """Build a reward ``images (N, 3, 32, 32) in [-1, 1] -> rewards (N,) float32`` on ``device``.

    ``name`` is one of ``REWARDS`` (the paper's six) or ``PIXEL_REWARDS`` (model-free parts).
    Models load once, frozen in eval mode, and the reward runs under ``torch.no_grad``.
    ``edge_calibration`` is a path or an already loaded dict. ``clip_backend`` is an optional
    ``(model, tokenizer)`` pair that replaces ``load_openclip(clip_model, clip_pretrained)``.
    ``weights_dir`` is the folder of the classifier, SimCLR and Edge files not given by path
    (default: ``FPO_WEIGHTS_DIR``, else ``weights/`` beside this file).
    """
    if name not in REWARDS + PIXEL_REWARDS:
        raise ValueError(f"unknown reward {name!r}; choose one of {REWARDS + PIXEL_REWARDS}")
    device = torch.device(device)

    if name in PIXEL_REWARDS:
        score = pixel_proxy_reward(name)
    elif name in ("auto-a35", "mixed"):
        classifier = load_classifier(classifier_path, device, weights_dir)

        def p_auto(x):
            return torch.softmax(classifier(x).float(), dim=1)[:, AUTOMOBILE]

        if name == "auto-a35":

            def score(x):
                return p_auto(x) * red_patch_attribute(x)
        else:

            def score(x):
                return p_auto(2.0 * gaussian_blur(to01(x)) - 1.0) * mixed_texture_attribute(x)
    elif name == "edge":
        calib = (
            edge_calibration
            if isinstance(edge_calibration, dict)
            else load_edge_calibration(edge_calibration, weights_dir)
        )

        def score(x):
            return edge_score(x, calib)
    elif name == "simclr":
        encoder, prototypes = load_simclr(simclr_path, device, weights_dir)

        def score(x):
            cos = F.normalize(encoder(x).float(), dim=1) @ prototypes.T
            return simclr_score(cos, AUTOMOBILE, SIMCLR_TAU)
    else:  # clip, digit7
        model, tokenizer = (
            clip_backend if clip_backend is not None else load_openclip(clip_model, clip_pretrained, device)
        )
        model = model.to(device).eval().requires_grad_(False)
        with torch.no_grad():
            if name == "clip":
                text = clip_class_prototypes(model, tokenizer, device)
            else:
                text = _text_embeddings(model, tokenizer, (DIGIT7_POSITIVE, *DIGIT7_NEGATIVES), device)
        if name == "clip":

            def score(x):
                cos = clip_image_embeddings(x, model) @ text.T
                return torch.softmax(CLIP_LOGIT_SCALE * cos, dim=1)[:, AUTOMOBILE]
        else:

            def score(x):
                cos = clip_image_embeddings(x, model) @ text.T
                semantic = torch.sigmoid(DIGIT7_SEMANTIC_SCALE * (cos[:, 0] - cos[:, 1:].mean(dim=1)))
                return DIGIT7_WEIGHTS[0] * semantic + DIGIT7_WEIGHTS[1] * digit7_structure(x)

    @torch.no_grad()
    def reward(images: torch.Tensor) -> torch.Tensor:
        x = check_images(images).to(device=device, dtype=torch.float32)
        return score(x).float().to(images.device)

    reward.name = name
    return reward


# --------------------------------------------------------------------------------------------
# Sample diversity (not a reward: a check that a generator has not collapsed onto one image)
# --------------------------------------------------------------------------------------------


def mean_pairwise_cosine_distance(features: torch.Tensor) -> torch.Tensor:
    """Mean ``1 - cos(f_i, f_j)`` over the N (N - 1) / 2 distinct pairs of rows of (N, D) ``features``.

    One Gram matmul in float64. 0 when every row points the same way, 1 for orthogonal rows, at most 2;
    a zero row counts as orthogonal to every other row; NaN for N < 2 (no pairs).
    """
    if features.ndim != 2:
        raise ValueError(f"features must be (N, D), got shape {tuple(features.shape)}")
    f = F.normalize(features.double(), dim=1)
    i, j = torch.triu_indices(f.shape[0], f.shape[0], offset=1, device=f.device)
    return 1.0 - (f @ f.T)[i, j].mean()


def make_diversity_features(device="cpu", weights_dir=None):
    """Build ``images (N, 3, 32, 32) in [-1, 1] -> (features (N, D) float32, classes (N,) int64)``.

    ``features`` are the frozen SimCLR encoder's representations (``load_simclr``), ``classes`` the
    frozen CIFAR-10 classifier's argmax (``load_classifier``); both from the weights folder
    (`find_weights_dir`), never a reward's own files, so that runs with different rewards compare.
    Loading leaves the global CPU RNG as it found it (building a module draws its initial weights
    from it) and the function runs under ``torch.no_grad`` and draws nothing.
    """
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        encoder, _ = load_simclr(None, device, weights_dir)
        classifier = load_classifier(None, device, weights_dir)

    @torch.no_grad()
    def features(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = check_images(images).to(device=device, dtype=torch.float32)
        return encoder(x).float(), classifier(x).argmax(dim=1)

    return features


def sample_diversity(features: torch.Tensor, classes: torch.Tensor) -> tuple[float, int]:
    """(mean pairwise SimCLR cosine distance, number of distinct predicted classes) of a set of
    images, from the two outputs of ``make_diversity_features`` over all of them."""
    return float(mean_pairwise_cosine_distance(features)), int(torch.unique(classes).numel())


def diversity_row(feats: list) -> dict:
    """Sample diversity of one validation node from each chunk's (features, classes) (`sample_diversity`):
    `val_div_cos`, the mean pairwise cosine distance of the SimCLR features of all its images, and
    `val_div_classes`, how many distinct CIFAR-10 classes the classifier predicts for them (empty without
    a diversity model, `feats` empty)."""
    if not feats:
        return {}
    cos, classes = sample_diversity(torch.cat([f for f, _ in feats]), torch.cat([c for _, c in feats]))
    return {"val_div_cos": cos, "val_div_classes": classes}
