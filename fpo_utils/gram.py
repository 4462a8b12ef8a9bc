"""Gradient-geometry statistics from a Gram matrix of per-bin gradients (eq:pairwise-cosines,
eq:fluctuation, app:cifar-gradients, app:robotics-new-geometry), and the Gram itself streamed with
bounded memory. The statistics need numpy alone; `streamed_gram` imports torch when it is called.

Memory layout of the gradient Gram (`streamed_gram`). Every statistic needs only the Gram matrix
``G G^T`` of the (batches+1) x bins gradient vectors (the +1 is the paired control), never the
vectors themselves. The vectors are written into one preallocated fp32 buffer of shape
(vectors, width) on the compute device. When all P parameters fit in the memory budget
(diagnostics.py's ``--grad-memory-gb``; default 40% of the free GPU memory, 2 GB on a CPU) width = P and each
gradient is computed once; otherwise the parameter vector is split into ceil(P / width) column
slices and the gradients are recomputed once per slice, on the same stored draws, each pass
adding its slice's contribution ``G_s G_s^T`` to the Gram (accumulated in float64 in column
blocks of 2^20). Peak extra memory is ``vectors x width x 4`` bytes plus one flat gradient and
one float64 column block. Example: the 35.7M-parameter paper U-Net with 4 batches + control x
12 bins needs 60 x 35.7M x 4 B = 8.6 GB in one pass (fits an 80 GB GPU); with a 4 GB budget it
makes three passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    import torch

BLOCK_NAMES = ("high", "middle", "low")  # app:cifar-gradients: bins 0-3 / 4-7 / 8-11 (noise level)


# ---------------------------------------------------------------------------------------------
# Gram statistics (eq:pairwise-cosines, eq:fluctuation)
# ---------------------------------------------------------------------------------------------
def _mean_with_counts(values: np.ndarray, axis: int) -> Tuple[np.ndarray, np.ndarray]:
    """Mean over ``axis`` ignoring NaNs, with the number of finite entries; NaN where none."""
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return mean, count


def gram_statistics(gram: np.ndarray, n_batches: int, n_bins: int) -> Dict[str, Any]:
    """All gradient-geometry statistics of ``B = n_batches`` independent batches from their Gram.

    ``gram[i*n_bins + b, j*n_bins + c] = G_ib . G_jc``. Returns (arrays are (n_bins, n_bins)):

    - ``C_within``: ``1/B sum_i cos(G_ib, G_ic)``; ``C_cross``: ``1/(B(B-1)) sum_{i!=j} cos(G_ib, G_jc)``
      with the diagonal kept as measured (eq:pairwise-cosines). Pairs with a zero-norm vector are
      skipped; ``within_counts`` / ``cross_counts`` hold the number of valid pairs per entry.
    - ``W = 1/B sum_i G_ib.G_ic``, ``K = 1/(B(B-1)) sum_{i!=j} G_ib.G_jc``, ``N = W - K`` (the
      centred covariance Gram), ``C_fluct = N_bc / sqrt(N_bb N_cc)`` (NaN where a diagonal is
      not positive) and ``S = tr K / tr N`` (eq:fluctuation).
    - ``norms`` (B, n_bins) and ``rms = sqrt(1/(n_bins B) sum |G_ib|^2``.
    """
    gram = np.asarray(gram, dtype=np.float64)
    B, nb = int(n_batches), int(n_bins)
    if B < 2:
        raise ValueError(f"n_batches={n_batches}; cross-batch statistics need at least 2 batches")
    if gram.shape != (B * nb, B * nb):
        raise ValueError(f"gram has shape {gram.shape}; expected ({B * nb}, {B * nb}) for {B} batches x {nb} bins")
    g = gram.reshape(B, nb, B, nb)
    sq = np.einsum("ibib->ib", g)
    norms = np.sqrt(np.maximum(sq, 0.0))
    valid = norms > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = g / (norms[:, :, None, None] * norms[None, None, :, :])
    cos = np.where(valid[:, :, None, None] & valid[None, None, :, :], cos, np.nan)
    same = np.arange(B)
    within = cos[same, :, same, :]  # (B, nb, nb)
    pairs = [(i, j) for i in range(B) for j in range(B) if i != j]
    cross = np.stack([cos[i, :, j, :] for i, j in pairs])
    c_within, n_within = _mean_with_counts(within, 0)
    c_cross, n_cross = _mean_with_counts(cross, 0)
    diag_blocks = g[same, :, same, :]
    W = diag_blocks.mean(axis=0)
    K = (g.sum(axis=(0, 2)) - diag_blocks.sum(axis=0)) / (B * (B - 1))
    N = W - K
    dn = np.diag(N)
    with np.errstate(invalid="ignore", divide="ignore"):
        c_fluct = N / np.sqrt(np.outer(dn, dn))
    c_fluct = np.where((dn[:, None] > 0) & (dn[None, :] > 0), c_fluct, np.nan)
    tr_n = float(np.trace(N))
    return {
        "C_within": c_within,
        "C_cross": c_cross,
        "within_counts": n_within,
        "cross_counts": n_cross,
        "W": W,
        "K": K,
        "N": N,
        "C_fluct": c_fluct,
        "trK": float(np.trace(K)),
        "trN": tr_n,
        "S": float(np.trace(K)) / tr_n if tr_n != 0 else float("nan"),
        "norms": norms,
        "rms": float(np.sqrt(np.mean(sq))),
        "zero_norm_vectors": int((~valid).sum()),
    }


def paired_control_cosines(gram: np.ndarray, n_batches: int, n_bins: int) -> Tuple[np.ndarray, np.ndarray]:
    """Cross cosines between batch 0 and the paired control (the last of ``n_batches + 1`` batches).

    ``C_paired_bc`` averages the two ordered pairs (0, control) and (control, 0), i.e. it is
    `gram_statistics`' ``C_cross`` on those two batches alone. The control never enters W, K, N.
    Returns (C_paired, valid-pair counts).
    """
    gram = np.asarray(gram, dtype=np.float64)
    nb = int(n_bins)
    idx = np.r_[0:nb, n_batches * nb : (n_batches + 1) * nb]
    sub = gram[np.ix_(idx, idx)]
    st = gram_statistics(sub, 2, nb)
    return st["C_cross"], st["cross_counts"]


def _offdiag_mean(m: np.ndarray) -> float:
    m = np.asarray(m, dtype=np.float64)
    mask = ~np.eye(m.shape[0], dtype=bool) & np.isfinite(m)
    return float(m[mask].mean()) if mask.any() else float("nan")


def _diag_mean(m: np.ndarray) -> float:
    d = np.diag(np.asarray(m, dtype=np.float64))
    d = d[np.isfinite(d)]
    return float(d.mean()) if d.size else float("nan")


def block_summary(matrix: np.ndarray, names: Sequence[str] = BLOCK_NAMES) -> Dict[str, float]:
    """Means over noise blocks: bins split into len(names) contiguous blocks in storage order
    (12 bins: high noise 0-3, middle 4-7, low 8-11; app:cifar-gradients). Within-block means omit
    the diagonal; between-block means average both off-diagonal blocks. Also the whole-matrix
    off-diagonal and diagonal means. NaN entries (zero-norm pairs) are skipped."""
    m = np.asarray(matrix, dtype=np.float64)
    parts = np.array_split(np.arange(m.shape[0]), len(names))
    out = {"offdiag_mean": _offdiag_mean(m), "diag_mean": _diag_mean(m)}
    for a, pa in enumerate(parts):
        out[names[a]] = _offdiag_mean(m[np.ix_(pa, pa)]) if len(pa) > 1 else float("nan")
        for b in range(a + 1, len(parts)):
            vals = np.concatenate([m[np.ix_(pa, parts[b])].ravel(), m[np.ix_(parts[b], pa)].ravel()])
            vals = vals[np.isfinite(vals)]
            out[f"{names[a]}-{names[b]}"] = float(vals.mean()) if vals.size else float("nan")
    return out


def summarise(stats: Dict[str, Any], c_paired: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """JSON-ready scalars: S, traces, RMS, block summaries of the cosine matrices and the control."""
    out = {k: stats[k] for k in ("S", "trK", "trN", "rms", "zero_norm_vectors")}
    B, nb = stats["norms"].shape
    out["skipped_pairs_within"] = int(B * nb * nb - stats["within_counts"].sum())  # zero-norm pairs omitted
    out["skipped_pairs_cross"] = int(B * (B - 1) * nb * nb - stats["cross_counts"].sum())
    out["K_negative_diagonals"] = int((np.diag(stats["K"]) < 0).sum())
    for name in ("C_cross", "C_within", "C_fluct"):
        out[name] = block_summary(stats[name])
    if c_paired is not None:
        out["C_paired"] = block_summary(c_paired)
        out["paired_minus_cross_same_bin"] = out["C_paired"]["diag_mean"] - out["C_cross"]["diag_mean"]
    return out


def phase_average(
    records: Sequence[Dict[str, Any]],
    windows: Sequence[Tuple[float, float]],
    key: str = "position",
    matrix: str = "matrix",
) -> List[Dict[str, Any]]:
    """Phase panels: within each window [lo, hi] (inclusive, on ``record[key]``), average the
    checkpoint matrices within each seed, then average seeds with equal weight
    (app:robotics-new-geometry). Each record has ``seed``, ``key`` and ``matrix``. Returns per window
    ``{"matrix", "seeds", "checkpoints"}`` (matrix None when the window is empty)."""
    out = []
    for lo, hi in windows:
        by_seed: Dict[Any, List[np.ndarray]] = {}
        for r in records:
            if lo <= r[key] <= hi:
                by_seed.setdefault(r["seed"], []).append(np.asarray(r[matrix], dtype=np.float64))
        if not by_seed:
            out.append({"matrix": None, "seeds": 0, "checkpoints": 0})
            continue
        per_seed = [np.nanmean(np.stack(ms), axis=0) for ms in by_seed.values()]
        out.append(
            {
                "matrix": np.nanmean(np.stack(per_seed), axis=0),
                "seeds": len(per_seed),
                "checkpoints": sum(len(v) for v in by_seed.values()),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Streaming Gram of flattened gradients with bounded memory
# ---------------------------------------------------------------------------------------------
def default_memory_bytes(device: torch.device) -> int:
    """40% of the free memory of a CUDA device, else 2 GB."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(0.4 * free)
    return 2 * 1024**3


def streamed_gram(
    grad_fn: Callable[[int], Sequence[Optional[torch.Tensor]]],
    params: Sequence[torch.Tensor],
    n_vectors: int,
    memory_bytes: int,
    device: torch.device,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """Gram matrix ``G G^T`` (float64, n_vectors^2) of flattened gradients ``G_k = grad_fn(k)``.

    ``grad_fn(k)`` returns one gradient per parameter (None = zero) and must be deterministic in
    k (it is called once per column slice). See the module docstring for the layout.
    """
    import torch

    if n_vectors < 1:
        raise ValueError(f"n_vectors={n_vectors}; need at least one gradient")
    sizes = [p.numel() for p in params]
    total = int(sum(sizes))
    width = int(max(1, min(total, memory_bytes // (4 * n_vectors))))
    slices = [(lo, min(total, lo + width)) for lo in range(0, total, width)]
    gram = torch.zeros((n_vectors, n_vectors), dtype=torch.float64, device=device)
    buf = torch.empty((n_vectors, width), dtype=torch.float32, device=device)
    step = 1 << 20
    for lo, hi in slices:
        for k in range(n_vectors):
            grads = grad_fn(k)
            flat = torch.cat(
                [(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params)]
            )
            buf[k, : hi - lo] = flat[lo:hi]
            del flat, grads
        for s in range(0, hi - lo, step):
            blk = buf[:, s : min(hi - lo, s + step)].double()
            gram += blk @ blk.T
    info = {
        "parameters": total,
        "vectors": n_vectors,
        "slice_width": width,
        "passes": len(slices),
        "buffer_bytes": 4 * n_vectors * width,
    }
    return gram.cpu().numpy(), info
