"""Tests for rewards.py: pixel formulas against hand computations, backends, factory errors."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rewards as R

ROOT = pathlib.Path(__file__).resolve().parents[1]


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def image01(rgb01: np.ndarray) -> torch.Tensor:
    """(N, 3, H, W) array in [0, 1] -> tensor in [-1, 1]."""
    return torch.as_tensor(np.asarray(rgb01, dtype=np.float64) * 2.0 - 1.0, dtype=torch.float32)


def grey_canvas(n=1, value=0.5):
    return np.full((n, 3, 32, 32), value)


# ---------------------------------------------------------------- numpy references


def np_blur(img: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """Reference Gaussian blur of one (C, H, W) image: radius ceil(3 sigma), reflect padding."""
    r = math.ceil(3 * sigma)
    t = np.arange(-r, r + 1)
    k = np.exp(-0.5 * (t / sigma) ** 2)
    k /= k.sum()
    c, h, w = img.shape
    p = np.pad(img, ((0, 0), (r, r), (r, r)), mode="reflect")
    out = np.zeros_like(img)
    for i in range(h):
        for j in range(w):
            out[:, i, j] = np.einsum("cab,a,b->c", p[:, i : i + 2 * r + 1, j : j + 2 * r + 1], k, k)
    return out


def np_red(z):
    return 1.0 / (1.0 + np.exp(-(z[0] - np.maximum(z[1], z[2]) - 0.10) / 0.08))


# ---------------------------------------------------------------- basic pixel maths


def test_to01_clips_and_maps():
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0])
    assert torch.allclose(R.to01(x), torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]))


def test_patch_mask_rows_20_28_cols_10_22():
    m = R.patch_mask()
    assert m.sum().item() == 8 * 12
    rows, cols = torch.nonzero(m, as_tuple=True)
    assert (rows.min().item(), rows.max().item(), cols.min().item(), cols.max().item()) == (20, 27, 10, 21)


def test_gaussian_blur_matches_numpy_reference_and_keeps_constants():
    rng = np.random.default_rng(0)
    img = rng.uniform(size=(3, 32, 32))
    got = R.gaussian_blur(torch.as_tensor(img)[None])[0].numpy()
    np.testing.assert_allclose(got, np_blur(img), atol=1e-10)
    assert R.gaussian_kernel1d(1.0).numel() == 7
    const = torch.full((2, 3, 32, 32), 0.3)
    assert torch.allclose(R.gaussian_blur(const), const, atol=1e-6)
    assert torch.equal(R.gaussian_blur(const, 0.0), const)
    with pytest.raises(ValueError, match="sigma"):
        R.gaussian_blur(const, -1.0)


def test_soft_red_map_hand_values():
    z = torch.tensor([[1.0, 0.0, 0.2], [0.5, 0.5, 0.5], [0.3, 0.1, 0.0]]).T.reshape(1, 3, 3, 1)
    want = [sigmoid((1 - 0.2 - 0.1) / 0.08), sigmoid(-0.1 / 0.08), sigmoid((0.3 - 0.1 - 0.1) / 0.08)]
    np.testing.assert_allclose(R.soft_red_map(z).flatten().numpy(), want, rtol=1e-6)


# ---------------------------------------------------------------- Auto-A35 attribute


def red_square(top, left, size=(8, 12)):
    img = grey_canvas()
    img[0, :, top : top + size[0], left : left + size[1]] = np.array([0.9, 0.05, 0.05])[:, None, None]
    return img


def np_red_patch_attribute(img01):
    r = np_red(np_blur(img01))
    p = np.zeros((32, 32), bool)
    p[20:28, 10:22] = True
    return sigmoid(6 * (r[p].mean() - 0.5 * r[~p].mean()))


def test_red_patch_attribute_inside_beats_outside_and_matches_hand_computation():
    inside, outside = red_square(20, 10), red_square(2, 2)
    got = R.red_patch_attribute(image01(np.concatenate([inside, outside]))).double().numpy()
    want = [np_red_patch_attribute(inside[0]), np_red_patch_attribute(outside[0])]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    baseline = R.red_patch_attribute(image01(grey_canvas())).item()
    assert got[0] > 0.9 > baseline > got[1]  # red in P is rewarded, red elsewhere penalised


def test_red_patch_attribute_flat_image_closed_form():
    # constant image: blur keeps it, r constant c everywhere -> sigmoid(6 (c - c / 2)) = sigmoid(3 c)
    img = np.broadcast_to(np.array([0.8, 0.2, 0.3])[None, :, None, None], (1, 3, 32, 32))
    c = sigmoid((0.8 - 0.3 - 0.1) / 0.08)
    assert R.red_patch_attribute(image01(img)).item() == pytest.approx(sigmoid(3 * c), rel=1e-5)


# ---------------------------------------------------------------- Mixed attribute


def test_forward_differences_zero_padded_last_row_and_column():
    e = torch.tensor([[1.0, 2.0, 4.0], [0.0, 5.0, 5.0]]).view(1, 1, 2, 3)
    g1, g2 = R.forward_differences(e)
    assert torch.equal(g1[0, 0], torch.tensor([[-1.0, 3.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(g2[0, 0], torch.tensor([[1.0, 2.0, 0.0], [5.0, 0.0, 0.0]]))


def test_mixed_attribute_prefers_red_texture_in_patch():
    flat = red_square(14, 4, size=(18, 24))  # flat red covering P with its edges away from P
    textured = grey_canvas()
    checker = (np.add.outer(np.arange(8), np.arange(12)) % 2).astype(float)  # 1/0 checkerboard
    textured[0, 0, 20:28, 10:22] = 0.6 + 0.4 * checker
    textured[0, 1:, 20:28, 10:22] = 0.05
    got = R.mixed_texture_attribute(image01(np.concatenate([flat, textured]))).numpy()
    assert got[1] > 0.6 and got[0] == pytest.approx(sigmoid(12 * (1e-6 * sigmoid(0.7 / 0.08) - 0.03)), rel=1e-4)
    # flat red image: e = 0, d = sqrt(1e-12) = 1e-6 -> sigmoid(12 (1e-6 r - .03))
    img = np.broadcast_to(np.array([0.9, 0.05, 0.05])[None, :, None, None], (1, 3, 32, 32))
    r = sigmoid((0.9 - 0.05 - 0.1) / 0.08)
    assert R.mixed_texture_attribute(image01(img)).item() == pytest.approx(sigmoid(12 * (1e-6 * r - 0.03)), rel=1e-5)


def test_mixed_attribute_matches_numpy_reference():
    rng = np.random.default_rng(1)
    img = rng.uniform(size=(1, 3, 32, 32))
    img[0, 0] = np.clip(img[0, 0] + 0.5, 0, 1)
    e = img[0] - np_blur(img[0])
    g1 = np.zeros_like(e)
    g2 = np.zeros_like(e)
    g1[:, :-1] = e[:, 1:] - e[:, :-1]
    g2[:, :, :-1] = e[:, :, 1:] - e[:, :, :-1]
    d = np.sqrt(g1**2 + g2**2 + 1e-12).mean(0)
    want = sigmoid(12 * ((d * np_red(img[0]))[20:28, 10:22].mean() - 0.03))
    assert R.mixed_texture_attribute(torch.as_tensor(img * 2 - 1)).item() == pytest.approx(want, rel=1e-8)


# ---------------------------------------------------------------- Edge


def test_edge_features_of_a_ramp_hand_computed():
    s = 1 / 40
    img = np.broadcast_to((np.arange(32) * s)[None, None, None, :], (1, 3, 32, 32))
    f = R.edge_features(torch.as_tensor(img * 2 - 1)).numpy()[0]
    # Sobel x on a linear ramp: 8 s inside, 0 at the reflect-padded first/last column
    sob = np.full(32, 8 * s)
    sob[[0, 31]] = 0.0
    sob = np.sqrt(sob**2 + 1e-12)
    # Laplacian: 0 inside, |2 s| at the reflect-padded first/last column
    lap = np.zeros(32)
    lap[[0, 31]] = 2 * s
    np.testing.assert_allclose(f[:4], [sob.mean(), sob.std(), lap.mean(), lap.std()], atol=1e-6)
    assert R.EDGE_FEATURE_NAMES[:4] == (
        "sobel_mean_blur0",
        "sobel_sd_blur0",
        "laplacian_mean_blur0",
        "laplacian_sd_blur0",
    )


def test_edge_width_rule():
    w = R.edge_width([0.1, 0.001, 0.0], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(w, [0.25, 0.05, 0.001])


def test_edge_score_is_one_at_calibrated_means_and_hand_value_off_them():
    rng = np.random.default_rng(2)
    x = torch.as_tensor(rng.uniform(-1, 1, size=(2, 3, 32, 32)), dtype=torch.float32)
    f = R.edge_features(x)
    calib = {"mean": f[0].tolist(), "width": [0.1] * 8}
    got = R.edge_score(x, calib)
    assert got[0].item() == pytest.approx(1.0, abs=1e-6)
    want = (1 / (1 + ((f[1] - f[0]) / 0.1) ** 2)).mean()
    assert got[1].item() == pytest.approx(want.item(), rel=1e-6)
    with pytest.raises(ValueError, match="8 means"):
        R.edge_score(x, {"mean": [0.0] * 7, "width": [1.0] * 7})


# ---------------------------------------------------------------- Digit7 structure


def ink_image(rows, cols):
    img = np.ones((1, 3, 32, 32))  # white paper, zero ink
    img[0, :, rows[0] : rows[1], cols[0] : cols[1]] = 0.0  # black ink
    return image01(img)


def coord(j):
    return -1 + 2 * j / 31


def hand_T(rows, cols):
    n = (rows[1] - rows[0]) * (cols[1] - cols[0])
    m = n / 1024
    cx = np.mean([coord(j) for j in range(*cols)])
    cy = np.mean([coord(i) for i in range(*rows)])
    ink = np.zeros((32, 32))
    ink[rows[0] : rows[1], cols[0] : cols[1]] = 1.0
    border = np.ones((32, 32), bool)
    border[3:29, 3:29] = False
    b = ink[border].mean() / (m + 1e-6)
    std = math.sqrt(m * (1 - m))  # (1 - I) is a 0/1 image with a fraction m of zeros
    factors = {
        "occupancy": math.exp(-(((m - 0.18) / 0.12) ** 2)),
        "centroid": math.exp(-(cx**2 + cy**2) / 0.55**2),
        "border": math.exp(-b / 0.10),
        "contrast": min(std / 0.5, 1.0),
    }
    return factors, {"m": m, "cx": cx, "cy": cy, "b": b, "std": std}


@pytest.mark.parametrize(
    "rows,cols", [((12, 20), (12, 20)), ((4, 12), (20, 28)), ((0, 8), (0, 8)), ((8, 24), (10, 22))]
)
def test_digit7_structure_factors_match_hand_computation(rows, cols):
    got = R.digit7_structure_factors(ink_image(rows, cols))
    factors, stats = hand_T(rows, cols)
    for k, v in {**factors, **stats}.items():
        assert got[k].item() == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert R.digit7_structure(ink_image(rows, cols)).item() == pytest.approx(math.prod(factors.values()), rel=1e-5)


def test_digit7_structure_orders_centred_offcentre_border():
    centred = R.digit7_structure(ink_image((8, 24), (10, 22))).item()
    off = R.digit7_structure(ink_image((4, 12), (20, 28))).item()
    border = R.digit7_structure(ink_image((0, 8), (0, 8))).item()
    assert centred > off > border
    assert hand_T((12, 20), (12, 20))[1]["cx"] == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------- SimCLR formula


def test_simclr_score_matches_numpy_hand_computation():
    rng = np.random.default_rng(3)
    cos = rng.uniform(-1, 1, size=(5, 10))
    tau = 0.08
    want = []
    for row in cos:
        others = np.delete(row, 1)
        lse = tau * np.log(np.mean(np.exp(others / tau)))
        want.append(1 / (1 + np.exp(-(row[1] - lse) / tau)))
    got = R.simclr_score(torch.as_tensor(cos), target=1, tau=tau).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert R.simclr_score(torch.full((1, 10), 0.3)).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="target"):
        R.simclr_score(torch.zeros(2, 10), target=10)


# ---------------------------------------------------------------- OpenCLIP paths (tiny random model)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    d = tmp_path_factory.mktemp("tinyclip")
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 48, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (d / "tiny-test-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(str(d))
    torch.manual_seed(0)
    model = open_clip.create_model("tiny-test-clip")
    weights = d / "tiny-test-clip.pt"
    torch.save(model.state_dict(), weights)
    return "tiny-test-clip", weights


def manual_clip_reference(model, tokenizer, x):
    x01 = F.interpolate(((x + 1) / 2).clamp(0, 1), size=(48, 48), mode="bicubic", align_corners=False).clamp(0, 1)
    mean = torch.tensor(R.OPENAI_CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(R.OPENAI_CLIP_STD).view(1, 3, 1, 1)
    img = F.normalize(model.encode_image((x01 - mean) / std), dim=-1)
    return img


def test_clip_reward_loads_local_file_and_matches_manual_formula(tiny_clip):
    name, weights = tiny_clip
    reward = R.make_reward("clip", clip_model=name, clip_pretrained=str(weights))
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    got = reward(x)
    assert got.shape == (3,) and got.dtype == torch.float32
    assert ((got >= 0) & (got <= 1)).all()
    model, tokenizer = R.load_openclip(name, str(weights))
    with torch.no_grad():
        protos = []
        for c in R.CIFAR10_CLASSES:
            t = F.normalize(model.encode_text(tokenizer([tpl.format(c) for tpl in R.CLIP_TEMPLATES])), dim=-1)
            protos.append(F.normalize(t.mean(0), dim=-1))
        cos = manual_clip_reference(model, tokenizer, x) @ torch.stack(protos).T
        want = torch.softmax(20 * cos, dim=1)[:, 1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert len(R.CLIP_TEMPLATES) == 5


def test_digit7_reward_combines_semantic_and_structure(tiny_clip):
    name, weights = tiny_clip
    backend = R.load_openclip(name, str(weights))
    reward = R.make_reward("digit7", clip_backend=backend)
    x = torch.cat([ink_image((8, 24), (10, 22)), torch.rand(2, 3, 32, 32) * 2 - 1])
    got = reward(x)
    model, tokenizer = backend
    with torch.no_grad():
        text = F.normalize(model.encode_text(tokenizer([R.DIGIT7_POSITIVE, *R.DIGIT7_NEGATIVES])), dim=-1)
        cos = manual_clip_reference(model, tokenizer, x) @ text.T
        c = torch.sigmoid(12 * (cos[:, 0] - cos[:, 1:].mean(1)))
    want = 0.75 * c + 0.25 * R.digit7_structure(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert len(R.DIGIT7_NEGATIVES) == 5


def test_clip_requires_explicit_weights(tiny_clip, tmp_path):
    name, _ = tiny_clip
    with pytest.raises(ValueError, match="clip_pretrained"):
        R.make_reward("clip", clip_model=name)
    with pytest.raises(ValueError, match="neither a local file nor an open_clip tag"):
        R.make_reward("digit7", clip_model=name, clip_pretrained=str(tmp_path / "missing.pt"))


# ---------------------------------------------------------------- shipped backends and factory


def test_shipped_backends_load_and_score_in_unit_interval():
    torch.manual_seed(0)
    x = torch.rand(4, 3, 32, 32) * 2 - 1
    for name in ("auto-a35", "mixed", "simclr", "edge", *R.PIXEL_REWARDS):
        out = R.make_reward(name)(x)
        assert out.shape == (4,) and out.dtype == torch.float32, name
        assert torch.isfinite(out).all() and ((out >= 0) & (out <= 1)).all(), name
    clf = R.load_classifier()
    assert clf(x).shape == (4, 10) and not clf.training
    enc, protos = R.load_simclr()
    assert protos.shape == (10, enc.dim)
    torch.testing.assert_close(protos.norm(dim=1), torch.ones(10))
    calib = R.load_edge_calibration()
    assert len(calib["mean"]) == 8 and all(a >= 0.001 for a in calib["width"])


def test_auto_reward_is_classifier_confidence_times_attribute():
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    clf = R.load_classifier()
    with torch.no_grad():
        want = torch.softmax(clf(x), 1)[:, 1] * R.red_patch_attribute(x)
        want_mixed = torch.softmax(clf(2 * R.gaussian_blur(R.to01(x)) - 1), 1)[:, 1] * R.mixed_texture_attribute(x)
    torch.testing.assert_close(R.make_reward("auto-a35")(x), want)
    torch.testing.assert_close(R.make_reward("mixed")(x), want_mixed)


def _cifar_folder():
    for p in (pathlib.Path("/work/shared/data/cifar10"), ROOT.parent / "shared" / "data" / "cifar10"):
        if (p / "test.zip").is_file():
            return p
    return None


@pytest.mark.slow
@pytest.mark.skipif(_cifar_folder() is None, reason="CIFAR-10 test split not available on this machine")
def test_shipped_classifier_and_encoder_are_trained():
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from cifar10 import load_cifar10

    images, labels = load_cifar10(_cifar_folder(), "test")
    idx = np.random.default_rng(0).choice(len(labels), 500, replace=False)
    x = torch.as_tensor(images[idx]).permute(0, 3, 1, 2).float() / 127.5 - 1
    y = torch.as_tensor(labels[idx])
    with torch.no_grad():
        assert (R.load_classifier()(x).argmax(1) == y).float().mean().item() > 0.85
        enc, protos = R.load_simclr()
        assert ((F.normalize(enc(x), dim=1) @ protos.T).argmax(1) == y).float().mean().item() > 0.5


def test_bad_names_and_inputs_raise():
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        R.make_reward("nope")
    with pytest.raises(ValueError, match="unknown pixel reward"):
        R.pixel_proxy_reward("auto-a35")
    reward = R.make_reward("red-patch")
    with pytest.raises(ValueError, match=r"\(N, 3, 32, 32\)"):
        reward(torch.zeros(2, 3, 16, 16))
    with pytest.raises(ValueError, match="floating-point"):
        reward(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(FileNotFoundError, match="classifier weights"):
        R.load_classifier("/nonexistent/classifier.safetensors")


# ---------------------------------------------------------------- rewards.py copied out alone

COPIED_OUT = """
import json, sys
import torch
import rewards
assert rewards.__file__.startswith(sys.argv[1]), rewards.__file__  # the copy, not the project's file
try:
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    print(json.dumps({name: rewards.make_reward(name)(x).tolist() for name in ("auto-a35", "edge", "simclr")}))
except FileNotFoundError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(4)
"""


def run_copied_out(tmp_path, weights_env=None):
    """rewards.py copied alone into `tmp_path` and run there, with FPO_WEIGHTS_DIR set or unset."""
    (tmp_path / "rewards.py").write_bytes((ROOT / "rewards.py").read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("FPO_WEIGHTS_DIR", "PYTHONPATH")}
    if weights_env is not None:
        env["FPO_WEIGHTS_DIR"] = str(weights_env)
    cmd = [sys.executable, "-c", COPIED_OUT, str(tmp_path)]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_copied_out_alone_finds_the_weights_through_the_environment(tmp_path):
    proc = run_copied_out(tmp_path, ROOT / "weights")
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(proc.stdout)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    for name in ("auto-a35", "edge", "simclr"):  # the same scores as the project's own file
        np.testing.assert_allclose(scores[name], R.make_reward(name)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_copied_out_alone_without_weights_says_where_it_looked_in_one_line(tmp_path):
    proc = run_copied_out(tmp_path)
    assert proc.returncode == 4 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    looked = tmp_path / "weights" / R.CLASSIFIER_FILE
    assert line.startswith(f"error: classifier weights not found at {looked} ") and "FPO_WEIGHTS_DIR" in line


def test_weights_dir_argument_and_environment_variable(tmp_path, monkeypatch):
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    for name in ("auto-a35", "edge", "simclr"):
        torch.testing.assert_close(R.make_reward(name, weights_dir=ROOT / "weights")(x), R.make_reward(name)(x))
    shipped_simclr = R.make_reward("simclr")(x)
    monkeypatch.setenv("FPO_WEIGHTS_DIR", str(tmp_path))
    for name, file in (("auto-a35", R.CLASSIFIER_FILE), ("edge", R.EDGE_CALIBRATION_FILE), ("simclr", R.SIMCLR_FILE)):
        with pytest.raises(FileNotFoundError) as err:
            R.make_reward(name)
        assert f"not found at {tmp_path / file} (weights folder from FPO_WEIGHTS_DIR;" in str(err.value)
        assert "\n" not in str(err.value)
    # the argument goes before the variable (the shipped folder, given as text)
    torch.testing.assert_close(R.make_reward("simclr", weights_dir=str(ROOT / "weights"))(x), shipped_simclr)
    with pytest.raises(FileNotFoundError, match="weights folder from the weights_dir argument; pass classifier_path"):
        R.make_reward("auto-a35", weights_dir=tmp_path / "elsewhere")
