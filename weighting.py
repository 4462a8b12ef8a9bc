"""Timestep-weighting profiles, time sampling, loss calibration and data-driven rules.

Small, pure functions shared by the trainers (``cifar_fpo.py``, ``robot_fpo.py``) and the
analysis tools; every result is a function of its arguments. The one exception is
:class:`WeightingRule`, the image trainer's weighting state: it asks the pure functions for the
profile and plan at update ``k`` and is told what each coherence fit measured.

Conventions
-----------
* Flow time ``t`` runs from noise (``t = 0``) to data (``t = 1``):
  ``x_t = (1 - t) eps + t x`` and the velocity target is ``u = x - eps``.
* A *timestep weighting* ``w(t) >= 0`` is a coefficient on the per-dimension velocity loss
  ``l_v = |v - u|^2 / d`` (eq:targets). Named prediction targets are special cases:
  ``w_v = 1``, ``w_x0 = (1 - t)^2``, ``w_eps = t^2``.
* Discrete image profiles live on ``B`` equal bins of ``[0, 1)``; bin ``b`` (0-based here)
  covers ``[b / B, (b + 1) / B)`` and has midpoint ``(b + 1/2) / B``. Index 0 is the noisiest
  bin and index ``B - 1`` the cleanest. Profiles are *mean-one* (``mean_b w_b = 1``), so the
  sampling probabilities are ``q_b = w_b / B`` (app:measure-equivalence).
* Profile constructors return float64 numpy arrays. Functions of ``t`` accept a numpy array
  or a torch tensor and return the same kind (tensors keep their dtype and device).
* Invalid arguments raise a one-line ``ValueError`` naming the value and what is allowed.

Contents
--------
Profiles
    :func:`meanone`, :func:`bin_midpoints`, :func:`alpha_profile`, :func:`target_profile`,
    :func:`target_loss_factor`, :func:`continuous_alpha_weight`.
Sampling and estimators
    :func:`profile_probs`, :func:`sample_bin_times`, :func:`bin_index`, :data:`ESTIMATORS`,
    :class:`Plan`, :func:`estimator_plan`, :func:`draw_multipliers`.
Whole-loss calibration (eq:calibration)
    :func:`calibration_S`, :func:`calibration_scale`, :func:`calibrated_bank_losses`.
Schedules (app:schedules)
    :class:`Schedule`, :data:`SCHEDULES`, :func:`linear_schedule`.
Output-signal coherence and coherence-driven profiles (eq:coherence, eq:static, eq:online)
    :func:`output_signals`, :func:`coherence_moments`, :func:`coherence_from_moments`,
    :func:`coherence`, :func:`pooled_coherence`, :func:`static_softmax`, :func:`static_direct`,
    :class:`EMAState`, :func:`ema_moments_update`, :func:`ema_coherence`,
    :func:`online_ema_profile`, :func:`refit_profile`.
Robotics profiles (app:robotics, eq:fpo-effective)
    :func:`fpo_profile`, :func:`fpo_effective_velocity_profile`, :func:`fpo_weight_at`,
    :func:`fpopp_weight`.
ELBO view (app:augmentation)
    :func:`log_snr`, :func:`kingma_gao_W`, :func:`satisfies_elbo_condition`.
The rule object (fixed, target, schedule, static, online EMA, refit; calibration bank)
    :data:`WEIGHTINGS`, :class:`WeightingRule`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------
# Constants
# ----------------------------------------------------------------------------------------------

BINS = 12  # eq:discrete-alpha: twelve equal time bins for image training
DISCRETE_STABILISER = 1e-12  # eq:discrete-alpha: added before the log of the x0 profile
CONTINUOUS_EPS0 = 1e-12
"""Stabiliser ``eps0`` of the continuous power family (app:discrete-alpha). The paper names
``eps0`` without giving a value; the default reuses the discrete construction's ``1e-12``."""
C_X0_PAPER = 0.12348001494617646  # app:cifar: S(q_x0) on the paper's 512-example bank
CALIBRATION_BANK_SIZE = 512  # app:cifar: frozen examples in the calibration bank
ALPHA_GRID = (-3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
"""Fixed-exponent grid. app:method-settings states eleven exponents spanning -3 (fig:landscape,
app:schedules) to 2 without listing them; this is the evenly spaced grid of step .5 on that range,
which has exactly eleven members."""
SHAPE_SCALE_ALPHAS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)  # app:cifar-results: 7-profile grid
SCALE_GRID = (0.5, 0.75, 1.0, 1.5, 2.0)  # app:cifar-results: calibrated whole-loss scales g
ETA_GRID = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # app:method-settings: static eta_norm grid
EMA_DECAY = 0.8  # app:online-analysis: decay of the online coherence moments
ONLINE_KAPPA = 300.0  # eq:online: concentration on raw (unstandardised) coherence
ONLINE_FIT = {"batch": 64, "group": 16, "draws": 4, "sampling_steps": 20}  # app:method-settings
REFIT_WINDOW = 20  # app:online-analysis: completed fit batches pooled per full refit
REFIT_EVERY = 20  # app:online-analysis: updates between full-profile replacements
REFIT_FLOOR = 1e-6  # app:online-analysis: probability floor before renormalisation
ETA_RAW_GRID = (0.25, 0.5, 0.75, 1.0, 1.25)  # app:online-analysis: full-refit concentrations
ETA_RAW_SELECTED = {"auto_a35": 0.5, "clip": 0.25, "digit7": 1.0}  # tab:full-refit-summary
COHERENCE_DELTA = 1e-12
"""Denominator stabiliser ``delta`` of eq:coherence. The paper does not state its value; ``1e-12``
is negligible next to ``E|z|^2`` of the per-dimension signals and only guards 0/0."""
FPO_S_GRID = tuple(round(0.1 * k, 1) for k in range(1, 11))  # app:robotics: s = 1 - t grid
FPOPP_T_MIN = 0.005  # app:robotics: FPO++ flow-time interval
FPOPP_T_MAX = 0.995  # app:robotics
CIFAR_DIM = 3072  # app:cifar: per-dimension normalisation of the image velocity loss
TARGETS = ("v", "x0", "eps")  # eq:targets


class Schedule(NamedTuple):
    """Linear exponent schedule of app:schedules (``k`` counts updates or robot blocks)."""

    alpha_early: float
    alpha_late: float
    k0: int
    k1: int


SCHEDULES = {
    # app:method-settings (CIFAR, k = update index)
    "mixed": Schedule(-3.0, -0.5, 160, 260),
    "clip": Schedule(-3.0, 0.0, 160, 260),
    "digit7": Schedule(-2.0, 1.0, 200, 400),
    "digit7_to0": Schedule(-2.0, 0.0, 200, 400),
    # app:robotics-dynamic (FPO native alpha_eps, k = training block of 983,040 steps)
    "robot_a20": Schedule(1.0, 0.25, 12, 36),
    "robot_w5": Schedule(1.0, 0.5, 12, 36),
}
ROBOT_SCHEDULE_HORIZON = 244  # app:robotics-dynamic: blocks in the scheduled robot runs

# ----------------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------------


def _finite_scalar(name: str, value) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number; expected a finite real") from None
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} is not allowed; expected a finite real")
    return x


def _check_bins(bins) -> int:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins={bins!r} is not allowed; expected a positive integer")
    return int(bins)


def _to_numpy(name: str, x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; expected finite values")
    return arr


def _profile(name: str, w) -> np.ndarray:
    arr = _to_numpy(name, w)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} has shape {arr.shape}; expected a non-empty 1-D profile")
    if np.any(arr < 0):
        raise ValueError(f"{name}={arr.tolist()} has negative entries; expected weights >= 0")
    if not arr.sum() > 0:
        raise ValueError(f"{name}={arr.tolist()} sums to zero; expected positive total weight")
    return arr


def _check_finite_t(name: str, t) -> None:
    ok = bool(torch.isfinite(t).all()) if isinstance(t, torch.Tensor) else bool(np.isfinite(t).all())
    if not ok:
        raise ValueError(f"{name} contains NaN or inf; expected finite times")


def _range(t) -> tuple[float, float]:
    if isinstance(t, torch.Tensor):
        return (float(t.min()), float(t.max())) if t.numel() else (0.5, 0.5)
    return (float(np.min(t)), float(np.max(t))) if np.size(t) else (0.5, 0.5)


def _as_t(t):
    """Tensors pass through; anything else becomes a float64 numpy array."""
    return t if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# Profiles
# ----------------------------------------------------------------------------------------------


def meanone(z):
    """Divide ``z`` by its mean along the last axis, so each profile averages one.

    Accepts numpy arrays or torch tensors and returns the same kind. The mean must be
    positive and finite.
    """
    if isinstance(z, torch.Tensor):
        m = z.mean(dim=-1, keepdim=True)
        if not bool(torch.isfinite(z).all()) or not bool((m > 0).all()):
            raise ValueError("meanone needs finite values with a positive mean")
        return z / m
    arr = np.asarray(z, dtype=np.float64)
    m = arr.mean(axis=-1, keepdims=True)
    if not np.all(np.isfinite(arr)) or not np.all(m > 0):
        raise ValueError("meanone needs finite values with a positive mean")
    return arr / m


def bin_midpoints(bins: int = BINS) -> np.ndarray:
    """Bin midpoints ``t_b = (b - 1/2) / B`` for ``b = 1..B`` (eq:discrete-alpha), noisiest first."""
    b = _check_bins(bins)
    return (np.arange(b, dtype=np.float64) + 0.5) / b


def alpha_profile(alpha: float, bins: int = BINS) -> np.ndarray:
    """Mean-one discrete power profile ``w_alpha,b`` of eq:discrete-alpha.

    ``x = meanone((1 - t_b)^2)`` at the bin midpoints, then
    ``w = meanone(exp((1 - alpha) log(x + 1e-12)))``; the velocity term is constant and cancels.
    ``alpha = 0`` is the clean-target (x0) profile, ``alpha = 1`` uniform (velocity); smaller
    ``alpha`` puts more weight on the noisy bins. Index 0 is the noisiest bin.
    """
    a = _finite_scalar("alpha", alpha)
    t = bin_midpoints(bins)
    x = meanone((1.0 - t) ** 2)
    return meanone(np.exp((1.0 - a) * np.log(x + DISCRETE_STABILISER)))


def target_loss_factor(name: str, t):
    """Target factor of eq:targets: ``l_target = factor(t) * l_v``.

    ``"v"`` gives 1, ``"x0"`` gives ``(1 - t)^2`` and ``"eps"`` gives ``t^2``. ``t`` is a tensor
    or array; the result has the same kind and shape.
    """
    t = _as_t(t)
    if name == "v":
        return t * 0 + 1
    if name == "x0":
        return (1 - t) ** 2
    if name == "eps":
        return t**2
    raise ValueError(f"target={name!r} is unknown; expected one of {TARGETS}")


def target_profile(name: str, bins: int = BINS) -> np.ndarray:
    """Mean-one target factors of eq:targets evaluated at the bin midpoints."""
    if name not in TARGETS:
        raise ValueError(f"target={name!r} is unknown; expected one of {TARGETS}")
    return meanone(np.asarray(target_loss_factor(name, bin_midpoints(bins))))


def _log_mean_power(p: float, eps0: float) -> float:
    """``log of int_0^1 (s^2 + eps0)^p ds`` (the mean under uniform base time), in float64.

    Uses ``s = sqrt(eps0) sinh(u)``, which turns the integrand into the smooth
    ``eps0^(p + 1/2) cosh(u)^(2p + 1)``, and Simpson's rule in the log domain.
    """
    if eps0 == 0.0:
        return -math.log(2.0 * p + 1.0)
    upper = math.asinh(1.0 / math.sqrt(eps0))
    n = 20000  # even number of Simpson intervals
    u = np.linspace(0.0, upper, n + 1)
    log_cosh = u + np.log1p(np.exp(-2.0 * u)) - math.log(2.0)
    log_f = (2.0 * p + 1.0) * log_cosh
    coef = np.ones(n + 1)
    coef[1:-1:2], coef[2:-1:2] = 4.0, 2.0
    m = log_f.max()
    log_int = m + math.log(float(np.sum(coef * np.exp(log_f - m))) * (upper / n) / 3.0)
    return (p + 0.5) * math.log(eps0) + log_int


def continuous_alpha_weight(t, alpha: float, eps0: float = CONTINUOUS_EPS0):
    """Stabilised continuous power weight of app:discrete-alpha under uniform base time.

    ``w(t) = [(1 - t)^2 + eps0]^(1 - alpha) / E_{t ~ U[0,1]}[((1 - t)^2 + eps0)^(1 - alpha)]``,
    so the weight averages one over ``[0, 1]``. The normaliser is computed once in float64
    (closed form ``1 / (3 - 2 alpha)`` when ``eps0 = 0``, which needs ``alpha < 1.5``).
    The image trainer uses :func:`alpha_profile` instead; this is the continuous idealisation.
    """
    a = _finite_scalar("alpha", alpha)
    e = _finite_scalar("eps0", eps0)
    if e < 0:
        raise ValueError(f"eps0={eps0!r} is negative; expected eps0 >= 0")
    if e == 0 and a >= 1.5:
        raise ValueError(f"alpha={alpha!r} with eps0=0 is not integrable; expected alpha < 1.5 or eps0 > 0")
    t = _as_t(t)
    _check_finite_t("t", t)
    lo, hi = _range(t)
    if lo < 0 or hi > 1:
        raise ValueError(f"t spans [{lo}, {hi}]; expected times in [0, 1]")
    p = 1.0 - a
    log_norm = _log_mean_power(p, e)
    return ((1 - t) ** 2 + e) ** p * math.exp(-log_norm)


# ----------------------------------------------------------------------------------------------
# Sampling and estimators
# ----------------------------------------------------------------------------------------------


def profile_probs(w) -> np.ndarray:
    """Bin sampling probabilities ``q = w / sum(w)`` of a non-negative profile (float64)."""
    arr = _profile("w", w)
    return arr / arr.sum()


def bin_index(t, bins: int = BINS):
    """Index of the bin ``[b/B, (b+1)/B)`` containing each ``t``; ``t = 1`` maps to ``B - 1``.

    Tensors give a long tensor on the same device; arrays give an int64 array.
    """
    b = _check_bins(bins)
    t = _as_t(t)
    _check_finite_t("t", t)
    lo, hi = _range(t)
    if lo < 0 or hi > 1:
        raise ValueError(f"t spans [{lo}, {hi}]; expected times in [0, 1]")
    if isinstance(t, torch.Tensor):
        return torch.clamp(torch.floor(t.double() * b).long(), 0, b - 1)
    return np.clip(np.floor(t * b).astype(np.int64), 0, b - 1)


def sample_bin_times(q, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw ``n`` times: a bin from the categorical ``q``, then uniform inside that bin.

    ``q`` holds the ``B`` bin probabilities (summing to one, noisiest bin first). All randomness
    comes from ``generator`` (a CPU ``torch.Generator``; the global torch RNG when ``None``), so
    a seeded generator reproduces the draws. Returns a float32 CPU tensor of shape ``(n,)``;
    every time lies in ``[b/B, (b+1)/B)`` of its drawn bin ``b`` (float32 rounding is corrected
    so that :func:`bin_index` recovers ``b``).
    """
    qa = _profile("q", q)
    if abs(qa.sum() - 1.0) > 1e-6:
        raise ValueError(f"q sums to {qa.sum()}; expected probabilities summing to 1 (use profile_probs)")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r} is not allowed; expected a positive integer")
    B = qa.size
    probs = torch.as_tensor(qa, dtype=torch.float64)
    b = torch.multinomial(probs, int(n), replacement=True, generator=generator)
    u = torch.rand(int(n), generator=generator, dtype=torch.float64)
    return _times_in_bins(b, u, B)


def _times_in_bins(b: torch.Tensor, u: torch.Tensor, bins: int) -> torch.Tensor:
    """float32 times ``(b + u) / bins`` nudged so that float32 rounding never leaves bin ``b``."""
    t = ((b.double() + u.double()) / bins).float()
    for _ in range(8):
        got = bin_index(t, bins)
        if bool((got == b).all()):
            break
        t = torch.where(got > b, torch.nextafter(t, torch.zeros_like(t)), t)
        t = torch.where(got < b, torch.nextafter(t, torch.ones_like(t)), t)
    return t


ESTIMATORS = ("q+a", "q+Z", "explicit")


@dataclass(frozen=True, eq=False)
class Plan:
    """How one update applies a profile (eq:weight-sampling, app:sampling).

    Attributes:
        q: ``(B,)`` bin sampling probabilities for the auxiliary training times.
        scale: scalar multiplying the whole (aggregated) loss difference.
        draw_weights: ``(B,)`` per-draw multipliers indexed by each draw's bin, or ``None``
            when the profile is carried by sampling alone.
    """

    q: np.ndarray
    scale: float
    draw_weights: np.ndarray | None


def estimator_plan(w, estimator: str, bank_losses=None, q_ref=None, g: float = 1.0) -> Plan:
    """Turn a profile ``w`` (``B`` bin weights) into sampling law and multipliers.

    * ``"q+a"`` (calibrated, default of the image trainer): sample bins with ``q = w / sum w`` and
      multiply the loss by ``a(q, g) = g S(q_ref) / S(q)`` only (eq:calibration). Needs the
      frozen ``bank_losses`` ``(N, B)``; ``q_ref`` defaults to the x0 profile, the paper's anchor.
    * ``"q+Z"``: sample with ``q = w / sum w`` and multiply by ``Z = mean_b w_b`` (app:halving),
      times ``g``.
    * ``"explicit"``: uniform bins, each draw multiplied by ``w`` of its bin, whole loss times
      ``g``. The paper's explicit comparison (app:sampling) predates the whole-loss calibration
      and used no scale factor, i.e. ``g = 1``; ``g`` here is a plain multiplier, not a calibration.

    With ``g = 1`` the uncalibrated estimators share the population value
    ``E_{q0}[w f]`` (eq:weight-sampling); ``"q+a"`` has ``(a / Z) E_{q0}[w f]``.
    """
    wa = _profile("w", w)
    gg = _finite_scalar("g", g)
    if gg <= 0:
        raise ValueError(f"g={g!r} is not allowed; expected a positive scale")
    B = wa.size
    if estimator == "q+a":
        if bank_losses is None:
            raise ValueError("estimator='q+a' needs bank_losses of shape (N, B); got None")
        q = profile_probs(wa)
        ref = profile_probs(target_profile("x0", B)) if q_ref is None else q_ref
        return Plan(q=q, scale=calibration_scale(bank_losses, q, ref, gg), draw_weights=None)
    if estimator == "q+Z":
        return Plan(q=profile_probs(wa), scale=gg * float(wa.mean()), draw_weights=None)
    if estimator == "explicit":
        return Plan(q=np.full(B, 1.0 / B), scale=gg, draw_weights=wa.copy())
    raise ValueError(f"estimator={estimator!r} is unknown; expected one of {ESTIMATORS}")


def draw_multipliers(plan: Plan, t: torch.Tensor) -> torch.Tensor:
    """Per-draw loss multipliers of ``plan`` at sampled times ``t`` (same shape and device).

    Equals ``plan.scale`` everywhere for the sampling estimators and
    ``plan.scale * draw_weights[bin(t)]`` for the explicit one.
    """
    t = torch.as_tensor(t)
    if plan.draw_weights is None:
        return torch.full_like(t, plan.scale, dtype=t.dtype if t.is_floating_point() else torch.float32)
    dw = torch.as_tensor(plan.draw_weights * plan.scale, device=t.device)
    out = dw[bin_index(t, len(plan.draw_weights))]
    return out.to(t.dtype) if t.is_floating_point() else out.float()


# ----------------------------------------------------------------------------------------------
# Whole-loss calibration
# ----------------------------------------------------------------------------------------------


def _bank(bank_losses, q) -> tuple[np.ndarray, np.ndarray]:
    L = _to_numpy("bank_losses", bank_losses)
    if L.ndim != 2:
        raise ValueError(f"bank_losses has shape {L.shape}; expected (N, B)")
    qa = _profile("q", q)
    if qa.size != L.shape[1]:
        raise ValueError(f"q has {qa.size} bins but bank_losses has {L.shape[1]}; expected equal")
    return L, qa


def calibration_S(bank_losses, q) -> float:
    """``S(q) = sqrt(mean_i F_i(q)^2)`` with ``F_i(q) = sum_b q_b L_ib`` (eq:calibration)."""
    L, qa = _bank(bank_losses, q)
    F = L @ qa
    return float(np.sqrt(np.mean(F**2)))


def calibration_scale(bank_losses, q, q_ref=None, g: float = 1.0, s_ref: float | None = None) -> float:
    """Calibration scalar ``a(q, g) = g S(q_ref) / S(q)`` (eq:calibration).

    ``q`` and ``q_ref`` are bin probabilities (summing to one; ``S`` is homogeneous, so a mean-one
    profile in their place would change ``a`` by the factor ``B``). ``q_ref`` is the anchor
    profile (the paper uses ``q_x0``), so ``a(q_ref, 1) = 1``. Give
    ``s_ref`` instead to anchor on a fixed value (e.g. :data:`C_X0_PAPER`, or one reference scale
    shared by banks written in different target coordinates, eq:coordinate-invariance).
    """
    gg = _finite_scalar("g", g)
    if gg <= 0:
        raise ValueError(f"g={g!r} is not allowed; expected a positive scale")
    if (q_ref is None) == (s_ref is None):
        raise ValueError("calibration needs exactly one of q_ref and s_ref; got both or neither")
    for name, probs in (("q", q), ("q_ref", q_ref)):
        if probs is not None and abs(float(_profile(name, probs).sum()) - 1.0) > 1e-6:
            raise ValueError(f"{name} does not sum to 1; expected bin probabilities (use profile_probs)")
    s = calibration_S(bank_losses, q)
    if not s > 0:
        raise ValueError("S(q) is zero on this bank; expected a bank with non-zero weighted losses")
    if s_ref is None:
        ref = calibration_S(bank_losses, q_ref)
    else:
        ref = _finite_scalar("s_ref", s_ref)
        if ref <= 0:
            raise ValueError(f"s_ref={s_ref!r} is not allowed; expected a positive reference scale")
    return gg * ref / s


def calibrated_bank_losses(bank_losses, q, q_ref=None, g: float = 1.0, s_ref: float | None = None) -> np.ndarray:
    """Calibrated per-example bank losses ``a(q, g) F_i(q)`` (eq:coordinate-invariance).

    ``q`` may be any non-negative profile: the product does not depend on its overall mass, so
    proportional effective profiles give identical results. The root mean square of the result
    is ``g S(q_ref)`` (or ``g s_ref``).
    """
    L, qa = _bank(bank_losses, q)
    qa = qa / qa.sum()  # the product is invariant to the overall mass of q
    return calibration_scale(L, qa, q_ref, g, s_ref) * (L @ qa)


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


def linear_schedule(k, alpha_early: float, alpha_late: float, k0, k1) -> float:
    """``alpha_k = a_early + (a_late - a_early) clip((k - k0) / (k1 - k0), 0, 1)`` (app:schedules).

    Constant before ``k0`` and after ``k1``. ``k0 == k1`` is a step to ``alpha_late`` at ``k0``.
    """
    kk = _finite_scalar("k", k)
    ae = _finite_scalar("alpha_early", alpha_early)
    al = _finite_scalar("alpha_late", alpha_late)
    a0, a1 = _finite_scalar("k0", k0), _finite_scalar("k1", k1)
    if a1 < a0:
        raise ValueError(f"k1={k1!r} < k0={k0!r}; expected k1 >= k0")
    if a1 == a0:
        return al if kk >= a0 else ae
    frac = min(max((kk - a0) / (a1 - a0), 0.0), 1.0)
    return ae + (al - ae) * frac


# ----------------------------------------------------------------------------------------------
# Output-signal coherence
# ----------------------------------------------------------------------------------------------


def output_signals(advantages, v, u, d: int | None = None):
    """Reward-weighted output-space descent signals ``z_i = -2 A_i (v_i - u_i) / d`` (eq:coherence).

    ``advantages`` has shape ``(N,)``, ``v`` and ``u`` shape ``(N, ...)``; returns ``(N, D)`` with
    the trailing dimensions flattened. ``d`` defaults to the number of dimensions per example.
    """
    diff = v - u
    n = diff.shape[0]
    flat = diff.reshape(n, -1)
    dd = flat.shape[1] if d is None else d
    a = advantages.reshape(n, 1)
    return -2.0 * a * flat / dd


def coherence_moments(z):
    """Pairwise finite-sample moments ``(U, V)`` of signals ``z`` of shape ``(..., M, D)``.

    ``U = (|sum_j z_j|^2 - sum_j |z_j|^2) / (M (M - 1))`` is unbiased for ``|E z|^2`` and
    ``V = mean_j |z_j|^2`` for ``E|z|^2`` (app:methods). Leading axes (e.g. bins) are kept.
    Tensors are reduced in float64 and returned as float64 tensors.
    """
    if isinstance(z, torch.Tensor):
        zz = z.double()
        M = zz.shape[-2] if zz.dim() >= 2 else 0
        total = zz.sum(dim=-2)
        sq = (zz * zz).sum(dim=-1)
        s2 = (total * total).sum(dim=-1)
        ssum = sq.sum(dim=-1)
    else:
        zz = np.asarray(z, dtype=np.float64)
        M = zz.shape[-2] if zz.ndim >= 2 else 0
        total = zz.sum(axis=-2)
        s2 = (total * total).sum(axis=-1)
        ssum = (zz * zz).sum(axis=(-2, -1))
    if M < 2:
        raise ValueError(f"z has shape {tuple(zz.shape)}; expected (..., M, D) with M >= 2 signals")
    return (s2 - ssum) / (M * (M - 1)), ssum / M


def coherence_from_moments(U, V, delta: float = COHERENCE_DELTA):
    """Coherence ``max(U, 0) / (V + delta)`` from (possibly averaged) moments."""
    dl = _finite_scalar("delta", delta)
    if dl < 0:
        raise ValueError(f"delta={delta!r} is negative; expected delta >= 0")
    if isinstance(U, torch.Tensor):
        return torch.clamp(U, min=0) / (V + dl)
    return np.maximum(np.asarray(U, dtype=np.float64), 0.0) / (np.asarray(V, dtype=np.float64) + dl)


def coherence(z, delta: float = COHERENCE_DELTA):
    """Finite-sample output coherence ``max(U, 0) / (V + delta)`` of ``z`` ``(..., M, D)``.

    Lies in ``[0, 1]``: ``U <= V`` by Cauchy-Schwarz. See :func:`coherence_moments`.
    """
    U, V = coherence_moments(z)
    return coherence_from_moments(U, V, delta)


def pooled_coherence(batches, delta: float = COHERENCE_DELTA):
    """Pairwise coherence of one bin over a window of fit batches (app:online-analysis).

    ``batches`` is a sequence of ``(M_k, D)`` signal arrays; they are pooled into one sample.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("batches is empty; expected at least one (M, D) batch of signals")
    if isinstance(batches[0], torch.Tensor):
        return coherence(torch.cat([b.double() for b in batches], dim=0), delta)
    return coherence(np.concatenate([np.asarray(b, dtype=np.float64) for b in batches], axis=0), delta)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _coherence_profile(c) -> np.ndarray:
    arr = _to_numpy("c", c)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"c has shape {arr.shape}; expected a non-empty 1-D coherence profile")
    return arr


def static_softmax(c, eta: float) -> np.ndarray:
    """Static softmax profile ``w_b = B softmax(eta d)_b`` (eq:static), mean-one.

    ``d = (c - mean c) / std_pop(c)``; a constant ``c`` (zero spread) gives ``d = 0`` and hence the
    uniform profile, as does ``eta = 0``.
    """
    arr = _coherence_profile(c)
    e = _finite_scalar("eta", eta)
    if e < 0:
        raise ValueError(f"eta={eta!r} is negative; expected a concentration eta >= 0")
    sd = arr.std()
    d = np.zeros_like(arr) if not sd > 1e-300 else (arr - arr.mean()) / sd
    return arr.size * _softmax(e * d)


def static_direct(c) -> np.ndarray:
    """Static direct profile: the non-negative coherence itself, normalised to mean one."""
    arr = _coherence_profile(c)
    if np.any(arr < 0):
        raise ValueError(f"c={arr.tolist()} has negative entries; expected coherence >= 0")
    if not arr.sum() > 0:
        raise ValueError("c is all zero; expected some positive coherence")
    return meanone(arr)


@dataclass(frozen=True, eq=False)
class EMAState:
    """Exponential moving averages of the per-bin coherence moments (eq:online).

    ``U`` and ``V`` are the raw (zero-initialised) averages; ``steps`` counts updates, used for
    the bias correction ``1 - decay**steps``.
    """

    U: np.ndarray
    V: np.ndarray
    steps: int
    decay: float


def ema_moments_update(state: EMAState | None, U, V, decay: float = EMA_DECAY) -> EMAState:
    """Fold one fit batch's per-bin moments ``(U, V)`` into the EMA; ``state=None`` starts fresh."""
    dc = _finite_scalar("decay", decay)
    if not 0 <= dc < 1:
        raise ValueError(f"decay={decay!r} is not allowed; expected 0 <= decay < 1")
    Ua, Va = _to_numpy("U", U), _to_numpy("V", V)
    if Ua.shape != Va.shape:
        raise ValueError(f"U has shape {Ua.shape} but V has {Va.shape}; expected equal shapes")
    if state is None:
        state = EMAState(np.zeros_like(Ua), np.zeros_like(Va), 0, dc)
    if state.decay != dc:
        raise ValueError(f"decay={decay!r} differs from the state's {state.decay}; expected the same")
    if state.U.shape != Ua.shape:
        raise ValueError(f"U has shape {Ua.shape} but the state holds {state.U.shape}")
    return EMAState(dc * state.U + (1 - dc) * Ua, dc * state.V + (1 - dc) * Va, state.steps + 1, dc)


def ema_coherence(state: EMAState, delta: float = COHERENCE_DELTA) -> np.ndarray:
    """Bias-corrected EMA coherence ``c_hat = max(U_hat, 0) / (V_hat + delta)``."""
    if state is None or state.steps < 1:
        raise ValueError("the EMA state has no updates yet; expected at least one ema_moments_update")
    corr = 1.0 - state.decay**state.steps
    return coherence_from_moments(state.U / corr, state.V / corr, delta)


def online_ema_profile(c_hat, kappa: float = ONLINE_KAPPA) -> np.ndarray:
    """EMA-online profile ``w = B softmax(kappa c_hat)`` on raw coherence (eq:online), mean-one."""
    arr = _coherence_profile(c_hat)
    k = _finite_scalar("kappa", kappa)
    if k < 0:
        raise ValueError(f"kappa={kappa!r} is negative; expected kappa >= 0")
    return arr.size * _softmax(k * arr)


def refit_profile(c, eta_raw: float, floor: float = REFIT_FLOOR) -> np.ndarray:
    """Full-refit profile (app:online-analysis), returned mean-one.

    ``q = max(softmax(eta_raw c), floor) / sum(...)`` on the window's raw coherence ``c`` in
    ``[0, 1]``; the result is ``w = B q``. See :data:`REFIT_WINDOW`, :data:`REFIT_EVERY`,
    :data:`ETA_RAW_GRID` and :data:`ETA_RAW_SELECTED`.
    """
    arr = _coherence_profile(c)
    e = _finite_scalar("eta_raw", eta_raw)
    if e < 0:
        raise ValueError(f"eta_raw={eta_raw!r} is negative; expected eta_raw >= 0")
    fl = _finite_scalar("floor", floor)
    if fl < 0:
        raise ValueError(f"floor={floor!r} is negative; expected floor >= 0")
    p = np.maximum(_softmax(e * arr), fl)
    return arr.size * p / p.sum()


# ----------------------------------------------------------------------------------------------
# Robotics profiles
# ----------------------------------------------------------------------------------------------


def _fpo_grid(s) -> np.ndarray:
    arr = np.asarray(FPO_S_GRID, dtype=np.float64) if s is None else _to_numpy("s", s)
    if arr.ndim != 1 or arr.size == 0 or np.any(arr <= 0) or np.any(arr > 1):
        raise ValueError(f"s={arr.tolist()} is not allowed; expected a 1-D grid of values in (0, 1]")
    return arr


def fpo_profile(alpha_eps: float, s=None) -> np.ndarray:
    """Native FPO weights ``s^(2 (1 - alpha_eps))``, mean-one on the grid ``s`` (app:robotics).

    ``s = 1 - t`` is the noise coefficient; the default grid is ``{.1, ..., 1}``.
    ``alpha_eps = 1`` is the native noise-prediction loss (uniform).
    """
    a = _finite_scalar("alpha_eps", alpha_eps)
    return meanone(_fpo_grid(s) ** (2.0 * (1.0 - a)))


def fpo_effective_velocity_profile(alpha_eps: float, s=None) -> np.ndarray:
    """Velocity-coordinate profile of native FPO, ``s^p / E[s^p] (1 - s)^2`` (eq:fpo-effective).

    The ``(1 - s)^2 = t^2`` factor comes from the noise target; it vanishes at ``s = 1``.
    """
    grid = _fpo_grid(s)
    return fpo_profile(alpha_eps, grid) * (1.0 - grid) ** 2


def fpo_weight_at(s, alpha_eps: float, grid=None):
    """FPO weight at noise coefficients ``s`` (tensor or array), mean-one over ``grid``.

    ``s^(2 (1 - alpha_eps)) / mean_{s' in grid} s'^(2 (1 - alpha_eps))`` with the default grid
    :data:`FPO_S_GRID`; values must lie in ``(0, 1]``.
    """
    a = _finite_scalar("alpha_eps", alpha_eps)
    p = 2.0 * (1.0 - a)
    norm = float(np.mean(_fpo_grid(grid) ** p))
    s = _as_t(s)
    _check_finite_t("s", s)
    lo, hi = _range(s)
    if lo <= 0 or hi > 1 + 1e-6:
        raise ValueError(f"s spans [{lo}, {hi}]; expected noise coefficients in (0, 1]")
    return s**p / norm


def _fpopp_log_norm(p: float, t_min: float, t_max: float) -> float:
    """log of the mean of ``(1 - t)^p`` over ``U[t_min, t_max]``, exact (the ``p = -1`` log case
    is the continuous limit of the same expression)."""
    lo, hi = 1.0 - t_max, 1.0 - t_min  # range of s = 1 - t
    k = p + 1.0
    L = math.log(hi / lo)
    # int_lo^hi s^p ds = lo^k (exp(k L) - 1) / k, which tends to L as k -> 0.
    ratio = L if k == 0.0 else math.expm1(k * L) / k
    if k * L > 700:  # avoid overflow: exp(kL) - 1 ~ exp(kL)
        log_int = k * math.log(lo) + k * L - math.log(k)
    else:
        log_int = k * math.log(lo) + math.log(ratio)
    return log_int - math.log(t_max - t_min)


def fpopp_weight(t, alpha: float, t_min: float = FPOPP_T_MIN, t_max: float = FPOPP_T_MAX):
    """FPO++ weight ``(1 - t)^(2 (1 - alpha))`` with analytic mean-one normalisation on
    ``U[t_min, t_max]`` (app:robotics). Tensor or array in, same kind out.

    The normaliser is ``((1-t_min)^(p+1) - (1-t_max)^(p+1)) / ((p + 1)(t_max - t_min))`` with
    ``p = 2 (1 - alpha)``, and ``log((1-t_min)/(1-t_max)) / (t_max - t_min)`` when ``p = -1``.
    """
    a = _finite_scalar("alpha", alpha)
    lo_t, hi_t = _finite_scalar("t_min", t_min), _finite_scalar("t_max", t_max)
    if not 0 <= lo_t < hi_t < 1:
        raise ValueError(f"(t_min, t_max)=({t_min}, {t_max}) is not allowed; expected 0 <= t_min < t_max < 1")
    t = _as_t(t)
    _check_finite_t("t", t)
    lo, hi = _range(t)
    if lo < lo_t - 1e-6 or hi > hi_t + 1e-6:
        raise ValueError(f"t spans [{lo}, {hi}]; expected times in [t_min, t_max] = [{t_min}, {t_max}]")
    p = 2.0 * (1.0 - a)
    return (1 - t) ** p * math.exp(-_fpopp_log_norm(p, lo_t, hi_t))


# ----------------------------------------------------------------------------------------------
# ELBO view
# ----------------------------------------------------------------------------------------------


def _open_unit(name: str, t) -> None:
    _check_finite_t(name, t)
    lo, hi = _range(t)
    if lo <= 0 or hi >= 1:
        raise ValueError(f"{name} spans [{lo}, {hi}]; expected times strictly inside (0, 1)")


def log_snr(t):
    """Log signal-to-noise ratio ``gamma = 2 log(t / (1 - t))`` (app:augmentation)."""
    t = _as_t(t)
    _open_unit("t", t)
    lib = torch if isinstance(t, torch.Tensor) else np
    return 2 * lib.log(t / (1 - t))


def kingma_gao_W(t, w, q0=None, d: int = CIFAR_DIM):
    """Converted coefficient ``W(gamma(t)) = q0(t) w(t) (1 - t) / (d t)`` (eq:augmentation-coordinate).

    ``w`` and ``q0`` are callables of ``t`` or values at ``t``; ``q0`` defaults to the uniform
    base density (one).
    """
    t = _as_t(t)
    _open_unit("t", t)
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d={d!r} is not allowed; expected a positive integer dimension")
    wv = w(t) if callable(w) else w
    qv = 1.0 if q0 is None else (q0(t) if callable(q0) else q0)
    return qv * wv * (1 - t) / (d * t)


def satisfies_elbo_condition(
    w: Callable | np.ndarray | torch.Tensor,
    q0: Callable | None = None,
    t_lo: float = 1e-3,
    t_hi: float = 1 - 1e-3,
    n: int = 4001,
    rtol: float = 1e-9,
) -> bool:
    """Whether a profile meets the Kingma-Gao ELBO condition: ``W`` non-increasing in ``t``.

    ``w`` is either a callable ``w(t)`` (checked on ``n`` points of ``[t_lo, t_hi]``, with an
    optional base density ``q0``), or a ``(B,)`` bin profile read as piecewise constant on equal
    bins (noisiest first) with uniform base time. For a bin profile ``W`` decreases inside each
    bin and jumps by the factor ``w_{b+1} / w_b`` at each edge, so the condition holds exactly
    when ``w`` is non-increasing from the noisiest to the cleanest bin (app:augmentation).
    """
    if callable(w):
        lo, hi = _finite_scalar("t_lo", t_lo), _finite_scalar("t_hi", t_hi)
        if not 0 < lo < hi < 1:
            raise ValueError(f"(t_lo, t_hi)=({t_lo}, {t_hi}) is not allowed; expected 0 < t_lo < t_hi < 1")
        t = np.linspace(lo, hi, int(n))
        W = np.asarray(kingma_gao_W(t, w, q0, d=1), dtype=np.float64)
        if not np.all(np.isfinite(W)):
            raise ValueError("W is not finite on the grid; expected a finite profile inside (0, 1)")
        if np.any(W < 0):
            raise ValueError("W has negative values; expected a non-negative profile")
        return bool(np.all(np.diff(W) <= rtol * np.abs(W[:-1])))
    if q0 is not None:
        raise ValueError("q0 is only supported with a callable w; bin profiles assume uniform base time")
    arr = _profile("w", w)
    return bool(np.all(np.diff(arr) <= rtol * arr[:-1]))


# ----------------------------------------------------------------------------------------------
# The rule object: the only weighting state a trainer holds
# ----------------------------------------------------------------------------------------------

WEIGHTINGS = ("fixed", "schedule", "static-softmax", "static-direct", "online-ema", "online-refit")
ONLINE_INITS = ("uniform", "x0")  # app:method-settings: five-reward comparison / Digit7 variant


class WeightingRule:
    """The timestep weighting of one image run: the profile ``w_k`` in force at update ``k`` and the
    plan (bin law ``q_k``, calibrated scale ``a_k``) an update samples and scales its draws with.

    * ``fixed``: ``alpha_profile(alpha)`` or, when ``target`` is given, ``target_profile(target)``.
    * ``schedule``: ``alpha_profile(linear_schedule(k, alpha_early, alpha_late, k0, k1))``.
    * ``static-softmax`` / ``static-direct``: fitted once on the initial model (eq:static).
    * ``online-ema``: starts at ``online_init``; after each update the fresh fit batch's moments
      enter an EMA and the profile ``B softmax(kappa c_hat)`` is deployed at the next update (eq:online).
    * ``online-refit``: starts at the x0 profile; every ``refit_every`` updates the profile is
      replaced by ``refit_profile`` of the pooled window of fit batches, which then resets
      (app:online-analysis).

    The calibration bank (``bank_losses``, eq:calibration) sets ``a_k`` for the ``q+a`` estimator,
    anchored at ``q_ref`` (the x0 profile by default).

    A trainer asks ``plan(k)`` before update ``k``; when ``wants_fit(k)`` is true it measures the
    per-bin output-coherence moments ``(U, V)`` (eq:coherence) and tells ``observe(k, U, V)``.
    ``k = -1`` stands for the initial model, before update 0. ``state_dict()`` holds everything
    that changes during a run, as plain lists and numbers.
    """

    def __init__(
        self,
        weighting: str = "fixed",
        *,
        bins: int = BINS,
        alpha: float = 0.0,
        target: str | None = None,
        alpha_early: float = -3.0,
        alpha_late: float = -0.5,
        k0: int = 160,
        k1: int = 260,
        eta: float = 1.0,
        online_kappa: float = ONLINE_KAPPA,
        online_decay: float = EMA_DECAY,
        online_init: str = "uniform",
        refit_eta: float = 1.0,
        refit_every: int = REFIT_EVERY,
        estimator: str = "q+a",
        g: float = 1.0,
        bank_losses=None,
        q_ref=None,
    ):
        for name, value, allowed in (
            ("weighting", weighting, WEIGHTINGS),
            ("estimator", estimator, ESTIMATORS),
            ("online_init", online_init, ONLINE_INITS),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if target is not None and target not in TARGETS:
            raise ValueError(f"target={target!r} is not one of {', '.join(TARGETS)}")
        if weighting == "schedule" and k1 < k0:
            raise ValueError(f"k1={k1!r} < k0={k0!r}; expected k1 >= k0")
        if int(refit_every) < 1:
            raise ValueError(f"refit_every={refit_every!r} must be >= 1")
        self.weighting, self.bins, self.estimator, self.g = weighting, _check_bins(bins), estimator, g
        self.alpha_value, self.target = alpha, target
        self.schedule = Schedule(alpha_early, alpha_late, k0, k1)
        self.eta, self.kappa, self.decay = eta, online_kappa, online_decay
        self.refit_eta, self.refit_every = refit_eta, int(refit_every)
        self.q_ref = (
            profile_probs(target_profile("x0", self.bins)) if q_ref is None else np.asarray(q_ref, dtype=np.float64)
        )
        self.bank_losses = None if bank_losses is None else np.asarray(bank_losses)
        self.coherence: list | None = None  # static rules: the coherence measured on the initial model
        self.ema: EMAState | None = None  # online-ema: moments so far
        self.window: list = []  # online-refit: (U, V) of the fit batches since the last refit
        if weighting in ("static-softmax", "static-direct"):
            self.profile = None  # set by observe(-1, U, V)
        elif weighting == "online-ema" and online_init == "uniform":
            self.profile = np.ones(self.bins)
        elif weighting in ("online-ema", "online-refit"):
            self.profile = target_profile("x0", self.bins)  # app:method-settings, app:online-analysis
        else:
            self.profile = self._data_free_profile(0)

    @property
    def c_ref(self) -> float:
        """``C_ref = S(q_ref)`` on the calibration bank (eq:calibration), the scale anchor."""
        return float(calibration_S(self.bank_losses, self.q_ref))

    def alpha(self, k: int) -> float | None:
        """The exponent in force at update ``k`` (None for target and data-driven profiles)."""
        if self.weighting == "fixed" and self.target is None:
            return float(self.alpha_value)
        if self.weighting == "schedule":
            return float(linear_schedule(k, *self.schedule))
        return None

    def _data_free_profile(self, k: int) -> np.ndarray:
        if self.target is not None and self.weighting == "fixed":
            return target_profile(self.target, self.bins)
        return alpha_profile(self.alpha(k), self.bins)

    def wants_fit(self, k: int) -> bool:
        """Whether the trainer should measure coherence moments now: static rules once on the
        initial model (``k = -1``), online rules after every update ``k >= 0``."""
        if self.weighting.startswith("static-"):
            return k == -1 and self.profile is None
        return self.weighting.startswith("online-") and k >= 0

    def plan(self, k: int) -> Plan:
        """Sampling law and multipliers of update ``k`` (eq:weight-sampling, eq:calibration)."""
        if self.weighting == "schedule":
            self.profile = self._data_free_profile(k)
        if self.profile is None:
            raise ValueError(f"weighting={self.weighting!r} needs observe(-1, U, V) on the initial model first")
        return estimator_plan(self.profile, self.estimator, bank_losses=self.bank_losses, q_ref=self.q_ref, g=self.g)

    def observe(self, k: int, U, V) -> dict:
        """Fold one fit batch's per-bin moments, measured after update ``k`` (``-1``: the initial
        model), into the rule; the new profile is in force from update ``k + 1``. Returns the
        coherence it deployed, if any, as ``{"coherence": [...]}``."""
        if self.weighting.startswith("static-"):
            c = coherence_from_moments(U, V)
            self.coherence = c.tolist()
            self.profile = static_softmax(c, self.eta) if self.weighting == "static-softmax" else static_direct(c)
            return {"coherence": [float(x) for x in c]}
        if self.weighting == "online-ema":
            self.ema = ema_moments_update(self.ema, U, V, decay=self.decay)
            c_hat = ema_coherence(self.ema)
            self.profile = online_ema_profile(c_hat, kappa=self.kappa)
            return {"coherence": [float(x) for x in c_hat]}
        if self.weighting == "online-refit":
            self.window.append((np.asarray(U).tolist(), np.asarray(V).tolist()))
            self.window[:] = self.window[-REFIT_WINDOW:]
            if (k + 1) % self.refit_every == 0:
                uu = np.mean([w[0] for w in self.window], axis=0)
                vv = np.mean([w[1] for w in self.window], axis=0)
                c = np.clip(coherence_from_moments(uu, vv), 0.0, 1.0)
                self.profile = refit_profile(c, self.refit_eta)
                self.window.clear()  # the window resets after each refresh
                return {"coherence": [float(x) for x in c]}
            return {}
        raise ValueError(f"weighting={self.weighting!r} does not fit to data; nothing to observe")

    def state_dict(self) -> dict:
        """Everything that changes during a run (profile, fits, EMA, window) and the bank."""
        ema = (
            None
            if self.ema is None
            else {"U": self.ema.U.tolist(), "V": self.ema.V.tolist(), "steps": self.ema.steps, "decay": self.ema.decay}
        )
        return {
            "weighting": self.weighting,
            "profile": None if self.profile is None else np.asarray(self.profile).tolist(),
            "coherence": self.coherence,
            "ema": ema,
            "window": [list(w) for w in self.window],
            "bank_losses": None if self.bank_losses is None else np.asarray(self.bank_losses).tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["weighting"] != self.weighting:
            raise ValueError(f"the saved state is for weighting={state['weighting']!r}, not {self.weighting!r}")
        self.profile = None if state["profile"] is None else np.asarray(state["profile"], dtype=np.float64)
        self.coherence = state["coherence"]
        e = state["ema"]
        self.ema = (
            None
            if e is None
            else EMAState(
                np.asarray(e["U"], dtype=np.float64),
                np.asarray(e["V"], dtype=np.float64),
                int(e["steps"]),
                float(e["decay"]),
            )
        )
        self.window = [tuple(w) for w in state["window"]]
        self.bank_losses = None if state["bank_losses"] is None else np.asarray(state["bank_losses"], dtype=np.float64)
