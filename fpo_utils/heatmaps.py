"""Heatmaps of cosine matrices (app:approved-heatmaps): the signed colour scale, one panel, a PNG of
one matrix and an atlas of many (rows = profiles, columns = checkpoints or phases). numpy and
matplotlib only; matplotlib is imported when a panel is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

DISPLAY_TAU = 0.1  # app:approved-heatmaps: z(c) = asinh(c/.1)/asinh(10)
NEG_RGB = (33, 102, 172)  # -1
ZERO_RGB = (255, 255, 255)  # 0
POS_RGB = (178, 24, 43)  # +1
NAN_RGB = (170, 170, 170)  # undefined entry (no valid pair)
TICKS = (-1.0, -0.5, -0.2, -0.1, 0.0, 0.1, 0.2, 0.5, 1.0)


def display_transform(c, tau: float = DISPLAY_TAU):
    """Colour coordinate ``z(c) = asinh(c/tau)/asinh(1/tau)`` (tau = .1: asinh(c/.1)/asinh(10)),
    used for colour only; z(+-1) = +-1 and z(0) = 0."""
    if not tau > 0:
        raise ValueError(f"tau={tau}; must be > 0")
    return np.arcsinh(np.asarray(c, dtype=np.float64) / tau) / np.arcsinh(1.0 / tau)


def cosine_colour(c: float, tau: float = DISPLAY_TAU) -> Tuple[int, int, int]:
    """RGB of a raw cosine on the signed range [-1, 1]: blue (-1), white (0), red (+1),
    interpolated linearly in the display coordinate z(c)."""
    if not np.isfinite(c):
        return NAN_RGB
    z = float(display_transform(np.clip(c, -1.0, 1.0), tau))
    end = POS_RGB if z >= 0 else NEG_RGB
    a = abs(z)
    return tuple(int(round((1 - a) * z0 + a * e)) for z0, e in zip(ZERO_RGB, end))


def cosine_cmap(tau: float = DISPLAY_TAU):
    """The colour map over the display coordinate z in [-1, 1]: `cosine_colour` of the raw cosine at each
    z, so colours interpolate linearly in z (grey for undefined entries)."""
    from matplotlib.colors import ListedColormap

    raw = np.sinh(np.linspace(-1.0, 1.0, 513) * np.arcsinh(1.0 / tau)) * tau  # invert the display transform
    cmap = ListedColormap([np.array(cosine_colour(float(c), tau)) / 255 for c in raw], name="cosine")
    return cmap.with_extremes(bad=np.array(NAN_RGB) / 255)


def draw_panel(ax, matrix: np.ndarray, labels: Sequence[str], title: str = "", tau: float = DISPLAY_TAU):
    """One heatmap on the matplotlib axes `ax`. ``matrix`` and ``labels`` are in storage order (bin 0 =
    noisiest); the panel shows them reversed, clean at the upper left and noisy at the lower right.
    Colour is z(c) (`display_transform`); returns the image (its array holds z in display order)."""
    m = np.asarray(matrix, dtype=np.float64)
    n = m.shape[0]
    if m.shape != (n, n) or len(labels) != n:
        raise ValueError(
            f"matrix shape {m.shape} and {len(labels)} labels do not match; expected a square n x n matrix"
        )
    order = list(range(n - 1, -1, -1))
    z = np.ma.masked_invalid(display_transform(np.clip(m[np.ix_(order, order)], -1.0, 1.0), tau))
    im = ax.imshow(z, cmap=cosine_cmap(tau), vmin=-1.0, vmax=1.0, interpolation="nearest")
    names = [str(labels[i]) for i in order]
    ax.set_xticks(range(n), names, fontsize=6, rotation=90)
    ax.set_yticks(range(n), names, fontsize=6)
    ax.set_title(title, fontsize=7)
    ax.set_xlabel("clean -> noisy", fontsize=6)
    return im


def save_atlas(
    path: Union[str, Path],
    panels: Sequence[Sequence[Optional[Tuple[np.ndarray, str]]]],
    labels: Sequence[str],
    row_titles: Sequence[str] = (),
    col_titles: Sequence[str] = (),
    title: str = "",
    cell: int = 16,
    tau: float = DISPLAY_TAU,
) -> Path:
    """A grid of panels (rows = profiles, columns = phases or checkpoints) with one colour bar whose
    ticks are raw cosines placed at their display coordinate. ``panels[r][c]`` is (matrix, panel
    title) or None for an empty cell; ``cell`` is the size of one matrix entry in points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = len(panels)
    cols = max(len(r) for r in panels) if rows else 0
    if rows == 0 or cols == 0:
        raise ValueError("panels is empty; expected at least one (matrix, title) panel")
    side = max(2.0, len(labels) * cell / 72 + 0.9)  # inches per panel
    fig = Figure(figsize=(cols * side + 1.2, rows * side + (0.4 if title else 0.1)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    for r in range(rows):
        for c in range(cols):
            ax, panel = axes[r][c], panels[r][c] if c < len(panels[r]) else None
            if panel is None:
                ax.axis("off")
                continue
            head = f"{col_titles[c]}\n" if r == 0 and c < len(col_titles) else ""
            im = draw_panel(ax, panel[0], labels, head + panel[1], tau)
            if c == 0 and r < len(row_titles):
                ax.set_ylabel(str(row_titles[r]), fontsize=7)
    ticks = [float(v) for v in TICKS]
    bar = fig.colorbar(im, ax=axes, ticks=display_transform(ticks, tau), fraction=0.04, pad=0.02)
    bar.ax.set_yticklabels([f"{v:g}" for v in ticks], fontsize=6)
    bar.set_label("raw cosine (colour: asinh scale)", fontsize=6)
    if title:
        fig.suptitle(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def save_heatmap(
    path: Union[str, Path],
    matrix: np.ndarray,
    labels: Sequence[str],
    title: str = "",
    cell: int = 20,
    tau: float = DISPLAY_TAU,
) -> Path:
    """One panel with its colour bar as a PNG."""
    return save_atlas(path, [[(matrix, title)]], labels, cell=cell, tau=tau)


def cifar_labels(n_bins: int) -> List[str]:
    return [f"b{b}" for b in range(n_bins)]
