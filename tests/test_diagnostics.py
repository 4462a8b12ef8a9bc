"""diagnostics.py and its pieces (the statistics in fpo_utils/gram.py, the display in fpo_utils/heatmaps.py):
Gram statistics on synthetic gradients with known structure, the display, the local reward response, phase
averaging, and tiny end-to-end runs of the gram and robot-gram commands."""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_cifar_fpo import TINY_UNET  # noqa: E402

import cifar_fpo  # noqa: E402
import diagnostics as D  # noqa: E402
from fpo_utils import gram as GR  # noqa: E402
from fpo_utils import heatmaps as HM  # noqa: E402


def gram_of(vectors: np.ndarray) -> np.ndarray:
    """vectors (B, bins, P) -> Gram in the batch-major layout used by diagnostics."""
    flat = vectors.reshape(-1, vectors.shape[-1]).astype(np.float64)
    return flat @ flat.T


@pytest.mark.parametrize("module", ["fpo_utils.gram", "fpo_utils.heatmaps"])
def test_gram_statistics_and_heatmaps_import_without_the_trainers(module):
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert module in loaded and "numpy" in loaded
    assert not loaded & {"cifar_fpo", "cifar_fpo_pack", "robot_fpo", "robot_fpo_fast", "diagnostics", "halving"}
    assert not loaded & {"torch", "matplotlib"}  # torch when a Gram is streamed, matplotlib when a panel is drawn


# ------------------------------------------------------------------------------------------------
# Gram statistics (eq:pairwise-cosines, eq:fluctuation)
# ------------------------------------------------------------------------------------------------
def test_cross_cosines_converge_to_normalised_mean_products():
    rng = np.random.default_rng(0)
    P, B, sigma = 4000, 60, 0.02
    mu = np.zeros((3, P))
    mu[0, 0], mu[1, 0], mu[1, 1], mu[2, 2] = 1.0, 0.6, 0.8, 1.0  # cos(mu0,mu1)=.6, mu2 orthogonal
    G = mu[None] + sigma * rng.standard_normal((B, 3, P))
    st = GR.gram_statistics(gram_of(G), B, 3)
    energy = (mu**2).sum(1) + P * sigma**2  # E|G_b|^2
    expected = (mu @ mu.T) / np.sqrt(np.outer(energy, energy))  # E[U_b].E[U_c] for concentrated norms
    np.testing.assert_allclose(st["C_cross"], expected, atol=0.02)
    assert st["C_cross"][0, 1] > 0.15 and abs(st["C_cross"][0, 2]) < 0.02
    # within-batch cosines keep the shared noise energy on the diagonal only: diag is exactly 1
    np.testing.assert_allclose(np.diag(st["C_within"]), 1.0, atol=1e-12)
    # the cross diagonal is the measured reproducibility, not 1
    assert np.all(np.diag(st["C_cross"]) < 0.9)


def test_raw_gram_decomposition_matches_hand_formulas():
    rng = np.random.default_rng(1)
    B, nb, P = 5, 4, 30
    G = rng.standard_normal((B, nb, P)) + rng.standard_normal((1, nb, P))
    st = GR.gram_statistics(gram_of(G), B, nb)
    W = np.einsum("ibp,icp->bc", G, G) / B
    K = sum(G[i] @ G[j].T for i in range(B) for j in range(B) if i != j) / (B * (B - 1))
    centred = G - G.mean(axis=0, keepdims=True)
    cov = np.einsum("ibp,icp->bc", centred, centred) / (B - 1)
    np.testing.assert_allclose(st["W"], W, rtol=1e-10)
    np.testing.assert_allclose(st["K"], K, rtol=1e-10)
    np.testing.assert_allclose(st["N"], cov, rtol=1e-9, atol=1e-9)  # N = centred covariance Gram
    np.testing.assert_allclose(st["W"], st["K"] + st["N"], rtol=1e-12)
    assert np.all(np.abs(st["C_fluct"]) <= 1 + 1e-12)
    np.testing.assert_allclose(np.diag(st["C_fluct"]), 1.0)
    assert st["S"] == pytest.approx(np.trace(K) / np.trace(cov), rel=1e-10)
    norms = np.linalg.norm(G, axis=2)
    assert st["rms"] == pytest.approx(math.sqrt((norms**2).sum() / (nb * B)), rel=1e-12)
    # within and cross cosines by their definitions
    U = G / norms[..., None]
    within = np.mean([U[i] @ U[i].T for i in range(B)], axis=0)
    cross = np.mean([U[i] @ U[j].T for i in range(B) for j in range(B) if i != j], axis=0)
    np.testing.assert_allclose(st["C_within"], within, rtol=1e-10)
    np.testing.assert_allclose(st["C_cross"], cross, rtol=1e-10)


def test_S_hand_value():
    # one bin, two batches: G1 = (2, 0), G2 = (1, 1): W = (4 + 2)/2 = 3, K = (2 + 2)/2 = 2, N = 1, S = 2
    st = GR.gram_statistics(gram_of(np.array([[[2.0, 0.0]], [[1.0, 1.0]]])), 2, 1)
    assert (st["W"][0, 0], st["K"][0, 0], st["N"][0, 0], st["S"]) == pytest.approx((3.0, 2.0, 1.0, 2.0))
    assert st["C_cross"][0, 0] == pytest.approx(2 / (2 * math.sqrt(2)))


def test_zero_norm_pairs_are_skipped_and_counted():
    rng = np.random.default_rng(2)
    G = rng.standard_normal((3, 2, 5))
    G[1, 0] = 0.0  # batch 1, bin 0 has a zero gradient
    st = GR.gram_statistics(gram_of(G), 3, 2)
    assert st["zero_norm_vectors"] == 1
    assert st["cross_counts"][0, 0] == 2  # of 6 ordered pairs only (0,2),(2,0) remain
    assert st["cross_counts"][0, 1] == 4 and st["cross_counts"][1, 1] == 6
    assert st["within_counts"][0, 1] == 2 and st["within_counts"][1, 1] == 3
    U = G / np.maximum(np.linalg.norm(G, axis=2, keepdims=True), 1e-300)
    assert st["C_cross"][0, 0] == pytest.approx(U[0, 0] @ U[2, 0])
    assert np.all(np.isfinite(st["C_cross"])) and np.all(np.isfinite(st["C_within"]))


def test_paired_control_uses_only_batch_zero_and_the_control():
    rng = np.random.default_rng(3)
    G = rng.standard_normal((4, 3, 20))  # batches 0..2 and the control (index 3)
    full = gram_of(G)
    c_paired, counts = GR.paired_control_cosines(full, 3, 3)
    U = G / np.linalg.norm(G, axis=2, keepdims=True)
    np.testing.assert_allclose(c_paired, (U[0] @ U[3].T + U[3] @ U[0].T) / 2, rtol=1e-10)
    assert np.all(counts == 2)
    # the independent statistics ignore the control, and a changed batch 1 leaves the control alone
    st = GR.gram_statistics(full[:9, :9], 3, 3)
    np.testing.assert_allclose(st["C_cross"], GR.gram_statistics(gram_of(G[:3]), 3, 3)["C_cross"])
    G2 = G.copy()
    G2[1] = rng.standard_normal((3, 20))
    np.testing.assert_allclose(GR.paired_control_cosines(gram_of(G2), 3, 3)[0], c_paired)


def test_block_summary_means():
    m = np.arange(144, dtype=float).reshape(12, 12)
    s = GR.block_summary(m)
    high = m[:4, :4][~np.eye(4, dtype=bool)].mean()
    assert s["high"] == pytest.approx(high)
    assert s["high-low"] == pytest.approx(np.concatenate([m[:4, 8:].ravel(), m[8:, :4].ravel()]).mean())
    assert s["diag_mean"] == pytest.approx(np.diag(m).mean())
    assert s["offdiag_mean"] == pytest.approx(m[~np.eye(12, dtype=bool)].mean())


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="at least 2 batches"):
        GR.gram_statistics(np.eye(3), 1, 3)
    with pytest.raises(ValueError, match="expected"):
        GR.gram_statistics(np.eye(5), 2, 3)
    with pytest.raises(ValueError, match="multiple of --batch-size"):
        D.run_gram(D.Gram(checkpoint="x", draws_per_bin=10, batch_size=4, group_size=2))
    with pytest.raises(ValueError, match="--windows"):
        D.parse_windows("0-10,abc")


def test_streamed_gram_slices_equal_one_pass():
    torch.manual_seed(0)
    params = [torch.zeros(7, 3), torch.zeros(5)]
    vecs = [[torch.randn(7, 3), torch.randn(5)] for _ in range(6)]
    vecs[2][1] = None  # an unused parameter counts as zero
    direct = np.array(
        [
            [sum(float((a * b).sum()) for a, b in zip(u, v) if a is not None and b is not None) for v in vecs]
            for u in vecs
        ]
    )
    one, info1 = GR.streamed_gram(lambda k: vecs[k], params, 6, 10**9, torch.device("cpu"))
    many, info2 = GR.streamed_gram(lambda k: vecs[k], params, 6, 4 * 6 * 4, torch.device("cpu"))
    assert info1["passes"] == 1 and info2["passes"] == math.ceil(26 / 4)
    np.testing.assert_allclose(one, direct, rtol=1e-5, atol=1e-5)  # direct sums are fp32
    np.testing.assert_allclose(many, one, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# Display (app:approved-heatmaps)
# ------------------------------------------------------------------------------------------------
def test_display_transform_values():
    assert HM.display_transform(0.0) == 0.0
    assert HM.display_transform(1.0) == pytest.approx(1.0)
    assert HM.display_transform(-1.0) == pytest.approx(-1.0)
    assert HM.display_transform(0.1) == pytest.approx(math.asinh(1.0) / math.asinh(10.0))
    assert HM.display_transform(-0.3) == pytest.approx(-math.asinh(3.0) / math.asinh(10.0))


def test_colours_at_minus_one_zero_plus_one_and_ticks():
    assert HM.cosine_colour(-1.0) == HM.NEG_RGB
    assert HM.cosine_colour(0.0) == (255, 255, 255)
    assert HM.cosine_colour(1.0) == HM.POS_RGB
    assert HM.cosine_colour(5.0) == HM.POS_RGB  # clipped to the signed range
    assert HM.cosine_colour(float("nan")) == HM.NAN_RGB
    # +.1 sits at z = .294 of the way from white to red
    a = math.asinh(1) / math.asinh(10)
    assert HM.cosine_colour(0.1) == tuple(int(round((1 - a) * 255 + a * p)) for p in HM.POS_RGB)
    # the colour map is the same colours over the display coordinate z
    cmap = HM.cosine_cmap()
    for c in (-1.0, -0.1, 0.0, 0.1, 0.3, 1.0):
        got = tuple(int(round(255 * v)) for v in cmap((float(HM.display_transform(c)) + 1) / 2)[:3])
        assert max(abs(g - e) for g, e in zip(got, HM.cosine_colour(c))) <= 2, c


def test_panel_places_clean_upper_left_and_noisy_lower_right(tmp_path):
    from matplotlib.figure import Figure

    m = np.zeros((4, 4))
    m[3, 3], m[0, 0], m[3, 2] = 1.0, -1.0, float("nan")  # bin 3 is the cleanest, bin 0 the noisiest
    ax = Figure().subplots()
    im = HM.draw_panel(ax, m, HM.cifar_labels(4), "t")
    z = im.get_array()
    assert z[0, 0] == 1.0 and z[3, 3] == -1.0 and z[0, 1] is np.ma.masked and z[1, 0] == 0.0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b3", "b2", "b1", "b0"]
    assert im.origin == "upper" and (im.norm.vmin, im.norm.vmax) == (-1.0, 1.0)
    # a saved atlas with an empty cell and its colour bar labelled in raw cosines
    out = HM.save_atlas(
        tmp_path / "a.png", [[(m, "x"), None]], HM.cifar_labels(4), ["alpha=1"], ["k=0", "k=1"], title="t"
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------
# Local reward response (app:mechanisms)
# ------------------------------------------------------------------------------------------------
def test_response_stats_hand_values():
    dp = np.array([[0.2], [-0.1], [-0.3]])
    dm = np.array([[-0.4], [-0.2], [0.1]])
    s = D.response_stats(dp, dm)
    assert s["M"] == pytest.approx(np.mean([0.4 / 2, 0.3 / 2, 0.3 / 2]))
    assert s["C"] == pytest.approx(np.mean([-0.1, -0.15, -0.1]))
    assert s["O"] == pytest.approx(np.mean([0.2, 0.0, 0.1]))
    assert s["DD"] == pytest.approx(1 / 3)


def test_band_noise_stays_in_its_band():
    gen = torch.Generator().manual_seed(0)
    for band, (lo, hi) in D.BANDS.items():
        d = D.band_noise(3, band, gen)
        assert torch.allclose(d.flatten(1).abs().amax(1), torch.ones(3, dtype=d.dtype))
        power = torch.fft.fft2(d).abs() ** 2
        outside = ~D.band_mask(32, lo, hi)
        assert float(power[..., outside].sum()) < 1e-20 * float(power.sum()) + 1e-18


def test_linear_reward_has_zero_signed_response_and_quadratic_is_double_decrease():
    torch.manual_seed(0)
    anchors = 0.5 * torch.rand(6, 3, 32, 32) - 0.25  # far from the clip boundary
    w = torch.randn(3, 32, 32)
    linear = lambda x: (x * w).flatten(1).sum(1)  # noqa: E731
    res = D.local_response(linear, anchors, directions=2)
    for band in res.values():
        for s in band.values():
            assert abs(s["C"]) < 1e-4 * s["O"]  # zero up to fp32 rounding of the reward
            assert s["DD"] == 0.0 and s["M"] == pytest.approx(s["O"] / 2, rel=1e-4)
            assert s["O"] > 0
    quad = lambda x: -((x - anchors) ** 2).flatten(1).sum(1)  # noqa: E731  maximised at the anchors
    res = D.local_response(quad, anchors, bands=("fine",), amplitudes=(4 / 255,))
    s = res["fine"]["4/255"]
    assert s["DD"] == 1.0 and s["C"] < 0 and s["O"] == 0.0


# ------------------------------------------------------------------------------------------------
# Robot phases
# ------------------------------------------------------------------------------------------------
def test_phase_average_weights_seeds_equally():
    recs = [{"seed": 1, "position": p, "matrix": np.full((2, 2), v)} for p, v in ((10, 0.0), (20, 0.3), (30, 0.6))]
    recs.append({"seed": 2, "position": 15, "matrix": np.full((2, 2), 1.0)})
    recs.append({"seed": 2, "position": 500, "matrix": np.full((2, 2), 9.0)})
    out = GR.phase_average(recs, [(0, 40), (100, 200), (400, 600)])
    np.testing.assert_allclose(out[0]["matrix"], (0.3 + 1.0) / 2)  # seed means .3 and 1, not the pooled .475
    assert out[0]["seeds"] == 2 and out[0]["checkpoints"] == 4
    assert out[1]["matrix"] is None and out[2]["seeds"] == 1


# ------------------------------------------------------------------------------------------------
# End to end on the CPU
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("diag")
    torch.manual_seed(0)
    cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config(TINY_UNET), root / "model", dtype=torch.float32)
    args = replace(
        cifar_fpo.PRESETS["quick"],
        reward="red-patch",
        device="cpu",
        batch_size=4,
        group_size=2,
        mc_draws=2,
        sample_steps=2,
        val_every=1,
        val_banks=1,
        val_bank_size=4,
        calib_bank_size=4,
        fit_batch_size=4,
        learning_rate=1e-3,
        num_updates=1,
        verbose=False,
        save_samples=False,
        model=str(root / "model"),
        run_name="tiny",
        runs_dir=str(root / "runs"),
        alpha=-2.0,
    )
    cifar_fpo.main(args)
    return root / "runs" / "tiny"


def test_paired_control_batches_share_batch_zero(tiny_run):
    net, _ = D.load_cifar_checkpoint(str(tiny_run), "cpu")
    reward = cifar_fpo.make_reward("red-patch")
    bs = D.make_cifar_batches(net, reward, "sigma", 2, 4, 2, 1, 3, 1, seed=0, device="cpu")
    assert len(bs) == 3
    ctrl, b0, b1 = bs[2], bs[0], bs[1]
    for name in ("latents", "x", "rewards", "adv"):
        assert torch.equal(getattr(ctrl, name), getattr(b0, name))
        assert not torch.equal(getattr(b1, name), getattr(b0, name)) or name == "adv"
    assert not torch.equal(ctrl.t, b0.t) and not torch.equal(ctrl.eps, b0.eps)
    # equal-bin draws: bin b's times lie in [b/3, (b+1)/3)
    for b in range(3):
        assert torch.all((b0.t[b] >= b / 3) & (b0.t[b] < (b + 1) / 3))


def test_gram_command_end_to_end(tiny_run):
    info = D.main(
        [
            "gram",
            "--checkpoint",
            str(tiny_run),
            "--batches",
            "2",
            "--bins",
            "3",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--draws-per-bin",
            "2",
            "--sample-steps",
            "1",
            "--device",
            "cpu",
            "--grad-memory-gb",
            "0.0005",
        ]
    )
    out = tiny_run / "diagnostics" / "gram_k00001"
    for f in ("gram.npz", "gram.json", "cross.png", "within.png", "fluct.png", "paired.png"):
        assert (out / f).is_file(), f
    arrays, saved = D.read_result(out / "gram.npz")
    assert saved["alpha"] == -2.0 and saved["k"] == 1 and info["layout"]["passes"] > 1
    assert arrays["gram"].shape == (9, 9) and arrays["C_cross"].shape == (3, 3)
    st = GR.gram_statistics(arrays["gram"][:6, :6], 2, 3)
    np.testing.assert_allclose(st["C_cross"], arrays["C_cross"])
    assert saved["S"] == pytest.approx(st["S"])
    assert max(saved["ratio_max_dev"]) == 0.0  # old policy = the checkpoint: r = 1
    png = D.run_heatmap(D.Heatmap(result=str(out / "gram.npz"), matrix="C_within"))
    atlas = D.run_atlas(D.Atlas(results=(str(out / "gram.npz"),), out=str(out / "atlas.png")))
    assert png.is_file() and atlas.is_file()


def test_cli_lists_commands():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "diagnostics.py"), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0
    for name in ("gram", "robot-gram", "robot-phases", "coherence", "response", "heatmap", "atlas"):
        assert name in proc.stdout


def test_robot_gram_and_phases_end_to_end(tmp_path):
    os.environ.setdefault("MUJOCO_GL", "disable")
    import robot_fpo as R

    args = replace(
        R.Args(),
        env_id="InvertedPendulum-v5",
        num_envs=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=1,
        num_draws=2,
        flow_steps=2,
        actor_hidden=8,
        actor_layers=1,
        critic_hidden=8,
        critic_layers=1,
        eval_every=1,
        eval_episodes=1,
        num_updates=1,
        cuda=False,
        runs_dir=str(tmp_path),
        run_name="fpo",
        seed=3,
    )
    R.main(args)
    info = D.run_robot_gram(D.RobotGram(checkpoint=str(tmp_path / "fpo"), batches=2, num_steps=8))
    # FPO's s = 1 bin (t = 0) has an identically zero loss: it is dropped, leaving sigma = .1 ... .9
    assert info["labels"] == [f"{s:.1f}" for s in np.arange(9, 0, -1) / 10]
    out = tmp_path / "fpo" / "diagnostics" / "robot_gram_u000001"
    assert (out / "cross.png").is_file()
    res = D.run_robot_phases(
        D.RobotPhases(results=(str(out),), windows="0-5,6-10", unit="update", out=str(tmp_path / "phases"))
    )
    assert (tmp_path / "phases" / "atlas.png").is_file()
    assert res["phases"]["alpha=1"][0]["seeds"] == 1 and res["phases"]["alpha=1"][1]["seeds"] == 0
