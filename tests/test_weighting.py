"""Tests for weighting.py against closed forms, hand computations and the paper's identities."""

import math

import numpy as np
import pytest
import torch

import weighting as W

B = W.BINS


def _bin_integrals(F, bins):
    """Integral of f over each bin [b/B, (b+1)/B) from an antiderivative F."""
    edges = np.arange(bins + 1) / bins
    return F(edges[1:]) - F(edges[:-1])


# f(t) = t^2 + sin(3t): a smooth, non-constant integrand with a known antiderivative.
def _f(t):
    lib = torch if isinstance(t, torch.Tensor) else np
    return t**2 + lib.sin(3 * t)


def _F(t):
    return t**3 / 3 - np.cos(3 * t) / 3


# ----------------------------------------------------------------------------------------------
# Targets and profiles
# ----------------------------------------------------------------------------------------------


def test_target_identities_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    n, d = 16, 3 * 4 * 4
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    eps = torch.randn(n, d, generator=g, dtype=torch.float64)
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    t = torch.rand(n, 1, generator=g, dtype=torch.float64)
    x_t = (1 - t) * eps + t * x
    u = x - eps
    x_hat = x_t + (1 - t) * v
    eps_hat = x_t - t * v
    l_v = ((v - u) ** 2).sum(1) / d
    l_x0 = ((x_hat - x) ** 2).sum(1) / d
    l_eps = ((eps_hat - eps) ** 2).sum(1) / d
    tt = t.squeeze(1)
    torch.testing.assert_close(l_x0, (1 - tt) ** 2 * l_v)
    torch.testing.assert_close(l_eps, tt**2 * l_v)
    torch.testing.assert_close(l_x0, W.target_loss_factor("x0", tt) * l_v)
    torch.testing.assert_close(l_eps, W.target_loss_factor("eps", tt) * l_v)
    torch.testing.assert_close(l_v, W.target_loss_factor("v", tt) * l_v)
    assert isinstance(W.target_loss_factor("x0", tt), torch.Tensor)


def test_bin_midpoints():
    np.testing.assert_allclose(W.bin_midpoints(4), [0.125, 0.375, 0.625, 0.875])
    assert W.bin_midpoints().shape == (12,)
    assert W.bin_midpoints()[0] == pytest.approx(0.5 / 12)


def test_meanone_numpy_and_torch():
    np.testing.assert_allclose(W.meanone(np.array([1.0, 3.0])), [0.5, 1.5])
    out = W.meanone(torch.tensor([2.0, 2.0, 8.0]))
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, torch.tensor([0.5, 0.5, 2.0]))


def test_alpha_profile_anchors_and_order():
    t = (np.arange(B) + 0.5) / B
    x0_hand = (1 - t) ** 2 / np.mean((1 - t) ** 2)
    np.testing.assert_allclose(W.target_profile("x0"), x0_hand, rtol=1e-12)
    np.testing.assert_allclose(W.alpha_profile(0.0), W.target_profile("x0"), rtol=1e-9)
    np.testing.assert_allclose(W.alpha_profile(1.0), np.ones(B), rtol=1e-12)
    np.testing.assert_allclose(W.target_profile("v"), np.ones(B))
    eps_hand = t**2 / np.mean(t**2)
    np.testing.assert_allclose(W.target_profile("eps"), eps_hand, rtol=1e-12)
    # alpha = -1 squares the x0 profile (up to the 1e-12 stabiliser) before renormalising
    np.testing.assert_allclose(W.alpha_profile(-1.0), W.meanone(x0_hand**2), rtol=1e-9)
    # first bin's midpoint is 1/24: hand value of the x0 profile's noisiest entry
    assert W.alpha_profile(0.0)[0] == pytest.approx((23 / 24) ** 2 / np.mean((1 - t) ** 2))
    for a in (-3.0, -0.5, 0.0, 0.5, 1.5, 2.0):
        w = W.alpha_profile(a)
        assert w.mean() == pytest.approx(1.0, abs=1e-12)
        diffs = np.diff(w)
        if a < 1:
            assert np.all(diffs < 0), "noisiest bin first: alpha < 1 decreases along the index"
        else:
            assert np.all(diffs > 0)
    # smaller alpha puts more mass on the noisiest bin
    firsts = [W.alpha_profile(a)[0] for a in W.ALPHA_GRID]
    assert np.all(np.diff(firsts) < 0)
    assert len(W.ALPHA_GRID) == 11


def test_profile_probs():
    w = W.alpha_profile(-2.0)
    q = W.profile_probs(w)
    np.testing.assert_allclose(q, w / B, rtol=1e-12)
    np.testing.assert_allclose(W.profile_probs([1.0, 3.0]), [0.25, 0.75])


def test_continuous_alpha_weight_is_mean_one_and_matches_power_shape():
    t = np.linspace(0.0, 1.0, 200_001)
    for a in (-3.0, -1.0, 0.0, 0.5, 1.0):
        w = W.continuous_alpha_weight(t, a)
        assert np.trapezoid(w, t) == pytest.approx(1.0, abs=1e-6)
        # unstabilised closed form: (1 - t)^(2(1 - a)) (3 - 2a)
        np.testing.assert_allclose(w[:-1000], (1 - t[:-1000]) ** (2 * (1 - a)) * (3 - 2 * a), rtol=1e-6)
    # large eps0: the normaliser must match direct quadrature of [(1-t)^2 + eps0]^(1-a)
    for a in (2.0, 3.0, -1.0):
        eps0 = 0.05
        w = W.continuous_alpha_weight(t, a, eps0=eps0)
        raw = ((1 - t) ** 2 + eps0) ** (1 - a)
        np.testing.assert_allclose(w, raw / np.trapezoid(raw, t), rtol=1e-6)
    # eps0 = 1e-12, alpha = 2: normaliser atan(1/sqrt(eps0))/sqrt(eps0) (exact for p = -1)
    e = 1e-12
    w = W.continuous_alpha_weight(np.array([0.0]), 2.0, eps0=e)
    norm = math.atan(1 / math.sqrt(e)) / math.sqrt(e)
    assert w[0] == pytest.approx((1 + e) ** -1 / norm, rel=1e-7)
    tt = torch.tensor([0.25, 0.5], dtype=torch.float32)
    out = W.continuous_alpha_weight(tt, 0.0, eps0=0.0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, 3 * (1 - tt) ** 2)


# ----------------------------------------------------------------------------------------------
# Time sampling
# ----------------------------------------------------------------------------------------------


def test_sample_bin_times_frequencies_and_support():
    q = W.profile_probs(W.alpha_profile(-1.0))
    n = 200_000
    t = W.sample_bin_times(q, n, torch.Generator().manual_seed(1))
    assert t.shape == (n,) and t.dtype == torch.float32
    assert float(t.min()) >= 0 and float(t.max()) < 1
    b = W.bin_index(t, B).numpy()
    freq = np.bincount(b, minlength=B) / n
    se = np.sqrt(q * (1 - q) / n)
    assert np.all(np.abs(freq - q) < 5 * se + 1e-12)
    # uniform inside each bin: the fractional position has mean 1/2 and variance 1/12
    frac = t.double().numpy() * B - b
    assert frac.min() >= 0 and frac.max() < 1
    assert frac.mean() == pytest.approx(0.5, abs=5 * math.sqrt(1 / 12 / n))
    assert frac.var() == pytest.approx(1 / 12, abs=2e-3)


def test_sample_bin_times_respects_zero_mass_and_edges():
    for bins in (12, 7):
        for target in range(bins):
            q = np.zeros(bins)
            q[target] = 1.0
            t = W.sample_bin_times(q, 4000, torch.Generator().manual_seed(target))
            assert torch.all(W.bin_index(t, bins) == target)
            lo, hi = target / bins, (target + 1) / bins
            assert float(t.double().min()) >= np.float32(lo) - 1e-7
            assert float(t.double().max()) <= hi
    q = np.array([0.5, 0.0, 0.5, 0.0])
    t = W.sample_bin_times(q, 5000, torch.Generator().manual_seed(3))
    assert set(W.bin_index(t, 4).tolist()) <= {0, 2}


def test_bin_times_stay_in_their_bin_at_float32_edges():
    for bins in (3, 7, 11, 12):
        b = torch.arange(bins).repeat(2)
        u = torch.cat([torch.zeros(bins), torch.full((bins,), 1 - 1e-12)]).double()
        naive = ((b.double() + u) / bins).float()
        assert torch.any(W.bin_index(naive, bins) != b)  # plain float32 rounding crosses edges
        assert torch.equal(W.bin_index(W._times_in_bins(b, u, bins), bins), b)


def test_sample_bin_times_uses_only_the_generator():
    q = W.profile_probs(W.alpha_profile(-2.0))
    torch.manual_seed(123)
    a = W.sample_bin_times(q, 500, torch.Generator().manual_seed(7))
    torch.manual_seed(456)
    b = W.sample_bin_times(q, 500, torch.Generator().manual_seed(7))
    c = W.sample_bin_times(q, 500, torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_bin_index():
    t = torch.tensor([0.0, 1 / 12 - 1e-9, 1 / 12, 0.5, 0.999, 1.0], dtype=torch.float64)
    idx = W.bin_index(t, 12)
    assert idx.dtype == torch.long
    assert idx.tolist() == [0, 0, 1, 6, 11, 11]
    assert W.bin_index(np.array([0.3]), 4).tolist() == [1]


# ----------------------------------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------------------------------


def _bank(seed=0, n=64, bins=B):
    rng = np.random.default_rng(seed)
    # per-bin scale trend (noisy bins have larger velocity loss) times per-example variation
    return np.exp(rng.normal(size=(n, bins))) * np.linspace(2.0, 0.5, bins)


def test_calibration_S_hand_value():
    L = np.array([[1.0, 3.0], [2.0, 0.0]])
    q = np.array([0.5, 0.5])
    # F = [2, 1] -> S = sqrt((4 + 1) / 2)
    assert W.calibration_S(L, q) == pytest.approx(math.sqrt(2.5))
    assert W.calibration_S(torch.tensor(L), q) == pytest.approx(math.sqrt(2.5))


def test_calibration_reference_and_linear_in_g():
    L = _bank()
    q_ref = W.profile_probs(W.target_profile("x0"))
    q = W.profile_probs(W.alpha_profile(-2.0))
    assert W.calibration_scale(L, q_ref, q_ref) == pytest.approx(1.0)
    a1 = W.calibration_scale(L, q, q_ref, g=1.0)
    assert a1 == pytest.approx(W.calibration_S(L, q_ref) / W.calibration_S(L, q))
    for g in (0.5, 0.75, 1.5, 2.0):
        assert W.calibration_scale(L, q, q_ref, g=g) == pytest.approx(g * a1)
    cal = W.calibrated_bank_losses(L, q, q_ref, g=1.5)
    assert math.sqrt(np.mean(cal**2)) == pytest.approx(1.5 * W.calibration_S(L, q_ref))
    a_paper = W.calibration_scale(L, q, s_ref=W.C_X0_PAPER)
    assert a_paper == pytest.approx(W.C_X0_PAPER / W.calibration_S(L, q))


def test_calibration_invariance_for_proportional_profiles():
    L = _bank(1)
    q_ref = W.profile_probs(W.target_profile("x0"))
    w = W.alpha_profile(-1.5)
    # the same shape at different overall masses gives identical calibrated losses
    p1 = W.estimator_plan(w, "q+a", bank_losses=L, q_ref=q_ref)
    p2 = W.estimator_plan(7.0 * w, "q+a", bank_losses=L, q_ref=q_ref)
    np.testing.assert_allclose(p1.q, p2.q)
    assert p1.scale == pytest.approx(p2.scale)
    # the same effective profile written in two target coordinates (eq:coordinate-invariance):
    # the x0 bank is k_b L_ib with k = (1 - t_b)^2 and carries the profile h / k; the velocity bank
    # carries h. Unnormalised coefficients differ by a constant, calibrated losses agree.
    t = W.bin_midpoints()
    k = (1 - t) ** 2
    h = W.alpha_profile(-1.0) / B
    L_x0 = L * k
    q_x0_coord = W.profile_probs(h / k)
    cal_v = W.calibrated_bank_losses(L, h, s_ref=W.C_X0_PAPER)
    cal_x0 = W.calibrated_bank_losses(L_x0, q_x0_coord, s_ref=W.C_X0_PAPER)
    np.testing.assert_allclose(cal_v, cal_x0, rtol=1e-10)
    # a profile with a different shape gives different calibrated losses
    cal_other = W.calibrated_bank_losses(L, W.profile_probs(W.alpha_profile(0.5)), s_ref=W.C_X0_PAPER)
    assert np.max(np.abs(cal_other - cal_v)) > 1e-3


# ----------------------------------------------------------------------------------------------
# Estimators and the population identity (eq:weight-sampling)
# ----------------------------------------------------------------------------------------------


def _plans(w, L, q_ref):
    return {e: W.estimator_plan(w, e, bank_losses=L, q_ref=q_ref) for e in W.ESTIMATORS}


def test_estimator_plans_fields():
    w = 3.0 * W.alpha_profile(-1.0)  # deliberately not mean-one: Z = 3
    L = _bank(2)
    q_ref = W.profile_probs(W.target_profile("x0"))
    plans = _plans(w, L, q_ref)
    np.testing.assert_allclose(plans["q+Z"].q, w / w.sum())
    assert plans["q+Z"].scale == pytest.approx(3.0)
    assert plans["q+Z"].draw_weights is None
    assert plans["q+a"].scale == pytest.approx(W.calibration_scale(L, w / w.sum(), q_ref))
    assert plans["q+a"].draw_weights is None
    np.testing.assert_allclose(plans["explicit"].q, np.full(B, 1 / B))
    assert plans["explicit"].scale == 1.0
    np.testing.assert_allclose(plans["explicit"].draw_weights, w)
    # q_ref defaults to the x0 anchor
    assert W.estimator_plan(w, "q+a", bank_losses=L).scale == pytest.approx(plans["q+a"].scale)


def test_uniform_profile_makes_q_z_and_explicit_one_estimator():
    # alpha = 1 (the velocity target) is uniform, so tab:sampling's comparison has nothing to compare there
    w = W.alpha_profile(1.0)
    np.testing.assert_array_equal(w, np.ones(B))
    qz, ex = W.estimator_plan(w, "q+Z"), W.estimator_plan(w, "explicit")
    np.testing.assert_allclose(qz.q, ex.q)
    assert qz.scale == ex.scale == 1.0
    t = torch.rand(64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(W.draw_multipliers(qz, t), W.draw_multipliers(ex, t))


def test_population_identity_exact_enumeration():
    w = 2.5 * W.alpha_profile(-2.0)
    L = _bank(3)
    q_ref = W.profile_probs(W.target_profile("x0"))
    Ib = _bin_integrals(_F, B)  # int_bin f dt
    target = float(np.sum(w * Ib))  # E_{U[0,1]}[w(t) f(t)] for the piecewise-constant w
    Z = w.mean()
    for name, plan in _plans(w, L, q_ref).items():
        dw = np.ones(B) if plan.draw_weights is None else plan.draw_weights
        # E over bins (prob q_b) of scale * draw weight * E[f | bin] (E[f | bin] = B int_bin f)
        value = float(np.sum(plan.q * plan.scale * dw * B * Ib))
        expected = target * (plan.scale / Z if name == "q+a" else 1.0)
        assert value == pytest.approx(expected, rel=1e-12), name


def test_population_identity_monte_carlo():
    w = W.alpha_profile(-1.5)
    L = _bank(4)
    q_ref = W.profile_probs(W.target_profile("x0"))
    target = float(np.sum(w * _bin_integrals(_F, B)))
    n = 200_000
    for i, (name, plan) in enumerate(_plans(w, L, q_ref).items()):
        t = W.sample_bin_times(plan.q, n, torch.Generator().manual_seed(10 + i)).double()
        vals = (W.draw_multipliers(plan, t) * _f(t)).numpy()
        expected = target * (plan.scale / w.mean() if name == "q+a" else 1.0)
        se = vals.std() / math.sqrt(n)
        assert abs(vals.mean() - expected) < 5 * se, name


def test_draw_multipliers():
    w = W.alpha_profile(0.0)
    plan = W.estimator_plan(w, "explicit")
    t = torch.tensor([0.01, 0.5, 0.99])
    torch.testing.assert_close(W.draw_multipliers(plan, t), torch.tensor(w[[0, 6, 11]], dtype=torch.float32))
    plan_z = W.estimator_plan(2 * w, "q+Z")
    torch.testing.assert_close(W.draw_multipliers(plan_z, t), torch.full((3,), 2.0))


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


def test_linear_schedule():
    s = W.SCHEDULES["clip"]
    assert s == (-3.0, 0.0, 160, 260)
    f = lambda k: W.linear_schedule(k, *s)  # noqa: E731
    assert f(0) == -3.0 and f(159) == -3.0 and f(160) == -3.0
    assert f(161) == pytest.approx(-3.0 + 3.0 / 100)
    assert f(210) == pytest.approx(-1.5)
    assert f(259) == pytest.approx(-0.03)
    assert f(260) == 0.0 and f(800) == 0.0
    r = W.SCHEDULES["robot_a20"]
    assert W.linear_schedule(24, *r) == pytest.approx(0.625)
    assert W.linear_schedule(36, *r) == pytest.approx(0.25)
    # k0 == k1 is a step at k0
    assert W.linear_schedule(9, 1.0, 2.0, 10, 10) == 1.0
    assert W.linear_schedule(10, 1.0, 2.0, 10, 10) == 2.0
    with pytest.raises(ValueError):
        W.linear_schedule(5, 1.0, 2.0, 10, 9)
    assert set(W.SCHEDULES) == {"mixed", "clip", "digit7", "digit7_to0", "robot_a20", "robot_w5"}


# ----------------------------------------------------------------------------------------------
# Coherence
# ----------------------------------------------------------------------------------------------


def test_coherence_moments_hand_values():
    z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # |sum|^2 = 8, sum |z|^2 = 4 -> U = 4 / 6; V = 4 / 3
    U, V = W.coherence_moments(z)
    assert U == pytest.approx(4 / 6) and V == pytest.approx(4 / 3)
    assert W.coherence(z, delta=0.0) == pytest.approx(0.5)
    Ut, Vt = W.coherence_moments(torch.tensor(z))
    assert float(Ut) == pytest.approx(4 / 6) and float(Vt) == pytest.approx(4 / 3)


def test_coherence_U_unbiased_for_squared_mean():
    rng = np.random.default_rng(0)
    mu = np.array([0.3, -0.2, 0.1, 0.0, 0.25])
    R, M, D = 40_000, 4, mu.size
    z = mu + rng.normal(size=(R, M, D))  # many independent small samples, batched on axis 0
    U, V = W.coherence_moments(z)
    assert U.shape == (R,)
    truth = float(mu @ mu)
    se = U.std() / math.sqrt(R)
    assert abs(U.mean() - truth) < 5 * se
    # the naive plug-in |mean z|^2 is biased upward by tr(Cov)/M = D/M: the test can tell them apart
    naive = (z.mean(axis=1) ** 2).sum(-1).mean()
    assert naive - truth > 0.9 * D / M
    assert V.mean() == pytest.approx(truth + D, rel=0.02)


def test_coherence_limits():
    z = np.tile(np.array([0.5, -1.0, 2.0]), (6, 1))
    assert W.coherence(z, delta=0.0) == pytest.approx(1.0)
    assert W.coherence(z) == pytest.approx(1.0, abs=1e-9)
    rng = np.random.default_rng(1)
    c = W.coherence(rng.normal(size=(2000, 10)))
    assert 0.0 <= c < 0.01
    # always within [0, 1], also batched over bins
    cb = W.coherence(rng.normal(size=(12, 5, 3)) + rng.normal(size=(12, 1, 3)))
    assert cb.shape == (12,) and np.all((cb >= 0) & (cb <= 1))


def test_pooled_coherence_and_output_signals():
    rng = np.random.default_rng(2)
    batches = [rng.normal(size=(4, 3)) for _ in range(5)]
    assert W.pooled_coherence(batches) == pytest.approx(W.coherence(np.concatenate(batches)))
    adv = torch.tensor([1.0, -2.0])
    v = torch.ones(2, 3, 2, 2)
    u = torch.zeros(2, 3, 2, 2)
    z = W.output_signals(adv, v, u)
    assert z.shape == (2, 12)
    torch.testing.assert_close(z[0], torch.full((12,), -2.0 / 12))
    torch.testing.assert_close(z[1], torch.full((12,), 4.0 / 12))


# ----------------------------------------------------------------------------------------------
# Coherence-driven profiles
# ----------------------------------------------------------------------------------------------


def test_static_softmax():
    c = np.array([0.1, 0.4, 0.2, 0.05, 0.3])
    np.testing.assert_allclose(W.static_softmax(c, 0.0), np.ones(5))
    np.testing.assert_allclose(W.static_softmax(np.full(4, 0.3), 2.0), np.ones(4))  # std = 0 guard
    # hand value: c = [0, 1] -> d = [-1, 1] -> w = 2 softmax([-eta, eta])
    eta = 0.75
    np.testing.assert_allclose(W.static_softmax([0.0, 1.0], eta), 2 * np.exp([-eta, eta]) / np.exp([-eta, eta]).sum())
    for eta in W.ETA_GRID:
        w = W.static_softmax(c, eta)
        assert w.mean() == pytest.approx(1.0)
        assert np.array_equal(np.argsort(w), np.argsort(c))  # monotone in c
    # standardisation makes the profile invariant to affine rescaling of c
    np.testing.assert_allclose(W.static_softmax(c, 1.0), W.static_softmax(3 * c + 1, 1.0))


def test_static_direct():
    np.testing.assert_allclose(W.static_direct([0.1, 0.3, 0.0, 0.4]), [0.5, 1.5, 0.0, 2.0])


def test_ema_moments_bias_correction():
    U1, V1 = np.array([0.2, 0.0]), np.array([1.0, 2.0])
    U2, V2 = np.array([0.4, -0.1]), np.array([2.0, 1.0])
    s1 = W.ema_moments_update(None, U1, V1)
    np.testing.assert_allclose(W.ema_coherence(s1, delta=0.0), np.maximum(U1, 0) / V1)
    s2 = W.ema_moments_update(s1, U2, V2)
    # weights .8 * .2 and .2, renormalised by 1 - .8^2 = .36
    Uh = (0.16 * U1 + 0.2 * U2) / 0.36
    Vh = (0.16 * V1 + 0.2 * V2) / 0.36
    np.testing.assert_allclose(W.ema_coherence(s2, delta=0.0), np.maximum(Uh, 0) / Vh)
    # the correction cancels in the ratio only when delta = 0; with delta > 0 it shows
    np.testing.assert_allclose(W.ema_coherence(s2, delta=0.5), np.maximum(Uh, 0) / (Vh + 0.5))
    assert s2.steps == 2 and s2.decay == W.EMA_DECAY
    with pytest.raises(ValueError):
        W.ema_moments_update(s2, U1, V1, decay=0.5)


def test_online_and_refit_profiles():
    c = np.array([0.0, 0.01, 0.02])
    e = np.exp(300 * c)
    np.testing.assert_allclose(W.online_ema_profile(c), 3 * e / e.sum())
    # refit: softmax entries below 1e-6 are floored, then renormalised, returned mean-one
    c = np.array([0.0, 1.0, 0.5])
    p = np.exp(20 * c) / np.exp(20 * c).sum()
    assert p[0] < 1e-6
    p = np.maximum(p, 1e-6)
    np.testing.assert_allclose(W.refit_profile(c, 20.0), 3 * p / p.sum())
    w = W.refit_profile(c, W.ETA_RAW_SELECTED["clip"])
    assert w.mean() == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------
# Robotics profiles
# ----------------------------------------------------------------------------------------------


def test_fpo_profiles():
    s = np.arange(1, 11) / 10
    for a in (-1.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0):
        w = W.fpo_profile(a)
        assert w.mean() == pytest.approx(1.0)
        np.testing.assert_allclose(w, s ** (2 * (1 - a)) / np.mean(s ** (2 * (1 - a))))
        eff = W.fpo_effective_velocity_profile(a)
        np.testing.assert_allclose(eff, w * (1 - s) ** 2)
        assert eff[-1] == 0.0
        wt = W.fpo_weight_at(torch.tensor(s, dtype=torch.float32), a)
        assert isinstance(wt, torch.Tensor) and wt.dtype == torch.float32
        np.testing.assert_allclose(wt.numpy(), w, rtol=1e-5)
    np.testing.assert_allclose(W.fpo_profile(1.0), np.ones(10))
    np.testing.assert_allclose(W.fpo_profile(0.0), s**2 / np.mean(s**2))


def test_fpopp_weight_integrates_to_one():
    t = np.linspace(W.FPOPP_T_MIN, W.FPOPP_T_MAX, 400_001)
    for a in (-3.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
        w = W.fpopp_weight(t, a)
        mean = np.trapezoid(w, t) / (W.FPOPP_T_MAX - W.FPOPP_T_MIN)
        assert mean == pytest.approx(1.0, abs=1e-5), a
        # shape is the power law
        ratio = w / (1 - t) ** (2 * (1 - a))
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    # the log case (2(1 - alpha) = -1): closed form normaliser by hand
    tt = np.array([0.5])
    norm = math.log(0.995 / 0.005) / 0.99
    assert W.fpopp_weight(tt, 1.5)[0] == pytest.approx(0.5**-1 / norm, rel=1e-12)
    # near (not at) the log case the power formula applies: check it by hand
    k = 1e-4  # = p + 1 with p = 2(1 - alpha)
    a_near = 1.5 - k / 2
    norm_near = (0.995**k - 0.005**k) / (k * 0.99)
    assert W.fpopp_weight(tt, a_near)[0] == pytest.approx(0.5 ** (k - 1) / norm_near, rel=1e-10)
    # continuity through the log case
    assert W.fpopp_weight(tt, 1.5 + 1e-9)[0] == pytest.approx(W.fpopp_weight(tt, 1.5)[0], rel=1e-6)
    out = W.fpopp_weight(torch.tensor([0.1, 0.9], dtype=torch.float32), 0.0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# ELBO view
# ----------------------------------------------------------------------------------------------


def test_log_snr_and_W():
    assert W.log_snr(np.array([0.5]))[0] == pytest.approx(0.0)
    assert W.log_snr(np.array([0.8]))[0] == pytest.approx(2 * math.log(4.0))
    out = W.log_snr(torch.tensor([0.2, 0.8], dtype=torch.float64))
    expected = torch.tensor([-2 * math.log(4.0), 2 * math.log(4.0)], dtype=torch.float64)
    torch.testing.assert_close(out, expected)
    t = np.array([0.25, 0.5])
    np.testing.assert_allclose(W.kingma_gao_W(t, lambda s: s**2, d=3), t**2 * (1 - t) / (3 * t))


def test_elbo_condition():
    assert W.satisfies_elbo_condition(W.target_profile("x0"))
    assert W.satisfies_elbo_condition(W.alpha_profile(1.0))
    assert W.satisfies_elbo_condition(W.alpha_profile(-2.0))
    assert not W.satisfies_elbo_condition(W.alpha_profile(1.5))
    assert not W.satisfies_elbo_condition(np.array([1.0, 0.5, 0.7, 0.2]))
    # continuous: w = t increases yet W = (1 - t)/d decreases; w = t^2 gives W = t(1-t)/d, not monotone
    assert W.satisfies_elbo_condition(lambda t: t)
    assert not W.satisfies_elbo_condition(lambda t: t**2)
    # power family: W ~ (1 - t)^(3 - 2 alpha) / t is non-increasing iff alpha <= 1.5
    assert W.satisfies_elbo_condition(lambda t: (1 - t) ** (2 * (1 - 1.4)))
    assert not W.satisfies_elbo_condition(lambda t: (1 - t) ** (2 * (1 - 2.0)))


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: W.alpha_profile(float("nan")),
        lambda: W.alpha_profile(float("inf")),
        lambda: W.alpha_profile(0.0, bins=0),
        lambda: W.target_profile("score"),
        lambda: W.target_loss_factor("x", np.array([0.5])),
        lambda: W.profile_probs([1.0, -1.0]),
        lambda: W.profile_probs([0.0, 0.0]),
        lambda: W.sample_bin_times(W.alpha_profile(0.0), 10),  # weights, not probabilities
        lambda: W.sample_bin_times(np.full(4, 0.25), 0),
        lambda: W.bin_index(torch.tensor([1.5]), 12),
        lambda: W.estimator_plan(np.ones(B), "importance"),
        lambda: W.estimator_plan(np.ones(B), "q+a"),  # no bank
        lambda: W.estimator_plan(np.ones(B), "q+Z", g=0.0),
        lambda: W.calibration_scale(np.ones((4, 3)), np.ones(12) / 12, np.ones(12) / 12),
        lambda: W.calibration_scale(np.ones((4, 3)), np.ones(3) / 3),  # neither q_ref nor s_ref
        lambda: W.calibration_scale(np.ones((4, 3)), np.ones(3), np.ones(3) / 3),  # weights, not probs
        lambda: W.coherence(np.ones((1, 5))),
        lambda: W.static_softmax([0.1, 0.2], -1.0),
        lambda: W.static_direct([0.1, -0.2]),
        lambda: W.ema_coherence(W.EMAState(np.zeros(2), np.zeros(2), 0, 0.8)),
        lambda: W.continuous_alpha_weight(np.array([0.5]), 2.0, eps0=0.0),
        lambda: W.fpo_weight_at(np.array([0.0]), 0.0),
        lambda: W.fpopp_weight(np.array([0.999]), 0.0),
        lambda: W.log_snr(np.array([0.0])),
        lambda: W.linear_schedule(float("nan"), 0.0, 1.0, 0, 10),
    ],
)
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value)


def test_paper_constants():
    assert W.BINS == 12
    assert W.C_X0_PAPER == 0.12348001494617646
    assert W.ETA_GRID == (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    assert W.EMA_DECAY == 0.8 and W.ONLINE_KAPPA == 300.0
    assert W.FPO_S_GRID == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


# ----------------------------------------------------------------------------------------------
# The rule object a trainer asks for its plan at update k
# ----------------------------------------------------------------------------------------------


def _moments(seed, bins=B):
    g = np.random.default_rng(seed)
    return g.normal(0.5, 1.0, bins), g.uniform(1.0, 2.0, bins)


def test_rule_fixed_target_and_schedule_plans():
    rng = np.random.default_rng(0)
    bank = rng.uniform(0.1, 1.0, (16, B))
    rule = W.WeightingRule("fixed", alpha=-2.0, bank_losses=bank, g=1.5)
    p = rule.plan(7)
    np.testing.assert_allclose(p.q, W.profile_probs(W.alpha_profile(-2.0)))
    q_x0 = W.profile_probs(W.target_profile("x0"))
    assert p.scale == pytest.approx(W.calibration_scale(bank, p.q, q_x0, 1.5))
    assert rule.c_ref == pytest.approx(W.calibration_S(bank, q_x0)) and rule.alpha(7) == -2.0
    assert not rule.wants_fit(-1) and not rule.wants_fit(3)
    rule = W.WeightingRule("fixed", alpha=-2.0, target="eps", estimator="q+Z")
    np.testing.assert_allclose(rule.plan(0).q, W.profile_probs(W.target_profile("eps")))
    assert rule.alpha(0) is None
    rule = W.WeightingRule("schedule", alpha_early=-3.0, alpha_late=1.0, k0=1, k1=3, estimator="explicit")
    assert [rule.alpha(k) for k in range(5)] == [-3.0, -3.0, -1.0, 1.0, 1.0]
    np.testing.assert_allclose(rule.plan(2).draw_weights, W.alpha_profile(-1.0))
    np.testing.assert_allclose(rule.plan(4).draw_weights, np.ones(B), rtol=1e-12)


def test_rule_static_fits_once_on_the_initial_model():
    U, V = _moments(1)
    for name, expect in (
        ("static-softmax", W.static_softmax(W.coherence_from_moments(U, V), 0.5)),
        ("static-direct", W.static_direct(W.coherence_from_moments(U, V))),
    ):
        rule = W.WeightingRule(name, eta=0.5, estimator="q+Z")
        assert rule.wants_fit(-1) and not rule.wants_fit(0)
        with pytest.raises(ValueError, match="observe"):
            rule.plan(0)
        out = rule.observe(-1, U, V)
        np.testing.assert_allclose(out["coherence"], W.coherence_from_moments(U, V))
        np.testing.assert_allclose(rule.plan(0).q, W.profile_probs(expect))
        assert not rule.wants_fit(-1)  # fitted: never again


def test_rule_online_ema_deploys_each_fit_at_the_next_update():
    rule = W.WeightingRule("online-ema", online_kappa=50.0, online_decay=0.8, estimator="q+Z")
    np.testing.assert_allclose(rule.plan(0).q, np.full(B, 1 / B))
    assert W.WeightingRule("online-ema", online_init="x0").profile.tolist() == W.target_profile("x0").tolist()
    state = None
    for k in range(3):
        assert rule.wants_fit(k)
        U, V = _moments(10 + k)
        rule.observe(k, U, V)
        state = W.ema_moments_update(state, U, V, decay=0.8)
        np.testing.assert_allclose(
            rule.plan(k + 1).q, W.profile_probs(W.online_ema_profile(W.ema_coherence(state), 50.0))
        )


def test_rule_online_refit_replaces_the_profile_every_refit_every_updates():
    rule = W.WeightingRule("online-refit", refit_every=2, refit_eta=0.75, estimator="q+Z")
    x0 = W.profile_probs(W.target_profile("x0"))
    (U0, V0), (U1, V1) = _moments(20), _moments(21)
    assert rule.observe(0, U0, V0) == {}
    np.testing.assert_allclose(rule.plan(1).q, x0)
    out = rule.observe(1, U1, V1)
    c = np.clip(W.coherence_from_moments((U0 + U1) / 2, (V0 + V1) / 2), 0, 1)
    np.testing.assert_allclose(out["coherence"], c)
    np.testing.assert_allclose(rule.plan(2).q, W.profile_probs(W.refit_profile(c, 0.75)))
    assert rule.window == []  # the window resets after each refit


@pytest.mark.parametrize("name", W.WEIGHTINGS)
def test_rule_state_dict_is_plain_and_resumes_exactly(name):
    import json

    bank = np.random.default_rng(3).uniform(0.1, 1.0, (8, B))
    kw = dict(refit_every=2, bank_losses=bank)
    a = W.WeightingRule(name, **kw)
    if a.wants_fit(-1):
        a.observe(-1, *_moments(30))
    for k in range(3):
        if a.wants_fit(k):
            a.observe(k, *_moments(31 + k))
    state = json.loads(json.dumps(a.state_dict()))  # plain lists and numbers only
    b = W.WeightingRule(name, refit_every=2)
    b.load_state_dict(state)
    for k in range(3, 6):
        pa, pb = a.plan(k), b.plan(k)
        assert pa.q.tolist() == pb.q.tolist() and pa.scale == pb.scale
        if a.wants_fit(k):
            m = _moments(40 + k)
            assert a.observe(k, *m) == b.observe(k, *m)
    with pytest.raises(ValueError, match="weighting"):
        W.WeightingRule("fixed" if name != "fixed" else "schedule").load_state_dict(state)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(weighting="magic"), "weighting='magic' is not one of"),
        (dict(estimator="q+x"), "estimator="),
        (dict(target="z"), "target='z'"),
        (dict(online_init="eps"), "online_init="),
        (dict(weighting="schedule", k0=5, k1=2), "k1=2 < k0=5"),
    ],
)
def test_rule_rejects_bad_settings_in_one_line(kw, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")) as err:
        W.WeightingRule(**kw)
    assert "\n" not in str(err.value)
