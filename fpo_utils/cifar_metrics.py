"""The numbers an image-trainer update logs: read back in one host sync (`update_values`), turned into the
metrics row (`update_row`), the status line (`update_line`) and TensorBoard tags (`TAGS`); and the
learning curve of the validation nodes with their sample diversity (`plot_validation`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from fpo_utils.runfolder import CURVE, atomic_write

# TensorBoard tags of the metrics (CleanRL's charts/ and losses/ groups); other keys go under charts/.
TAGS = {
    "train_reward_mean": "charts/train_reward",
    **{k: f"losses/{k}" for k in ("loss", "clip_frac", "ratio_mean", "ratio_max_dev", "grad_norm", "velocity_loss")},
    **{k: f"weighting/{k}" for k in ("a_k", "alpha", "c_x0")},
    **{k: f"perf/{k}" for k in ("time_s", "unix_time")},
    **{k: f"charts/{k}" for k in ("val_reward", "val_div_cos", "val_div_classes")},
}


def update_values(rewards, loss, ratio, l_new, grad_norm, clip_ratio: float) -> torch.Tensor:
    """The numbers an update logs, as one tensor so that one host sync reads them all (`update_row`)."""
    r = ratio.detach()
    return torch.stack(
        [
            rewards.mean(),
            rewards.std(),
            loss.detach(),
            r.mean(),
            (r - 1).abs().max(),
            ((r - 1).abs() > clip_ratio).float().mean(),
            l_new.detach().mean(),
            torch.isfinite(rewards).all().float(),
            grad_norm.float(),
        ]
    )


def update_row(k: int, values: List[float], rule, plan) -> Tuple[Dict[str, Any], bool]:
    """The metrics row of update k from `update_values` (`rule`: the weighting rule, `plan` its plan at k),
    and whether its Adam step may be taken (a non-finite loss, reward or gradient ends the run instead)."""
    finite_loss = math.isfinite(values[2]) and values[7] == 1.0
    row = {
        "kind": "update",
        "update": k,
        "train_reward_mean": values[0],
        "train_reward_std": values[1],
        "loss": values[2],
        "ratio_mean": values[3],
        "ratio_max_dev": values[4],
        "clip_frac": values[5],
        "velocity_loss": values[6],
        "alpha": rule.alpha(k),
        "a_k": float(plan.scale),
        "q": [round(float(v), 6) for v in plan.q],
        "grad_norm": values[8] if finite_loss else float("nan"),
    }
    return row, finite_loss and math.isfinite(values[8])


def update_line(m: Dict[str, Any]) -> str:
    """The status line printed after an update."""
    return (
        f"update {m['update']:4d}  reward {m['train_reward_mean']:.4f}  loss {m['loss']:+.5f}  |r-1|max "
        f"{m['ratio_max_dev']:.4f}  clip {m['clip_frac']:.2f}  gnorm {m['grad_norm']:.3f}  a_k {m['a_k']:.3f}  "
        f"{m['time_s']:.2f}s"
    )


def plot_validation(folder: Path, history: List[Dict[str, Any]], reward: str) -> Path:
    """curve.png of the run folder: the validation reward above, the sample diversity of the same
    validation nodes below (mean pairwise SimCLR cosine distance on the left axis, distinct predicted
    classes on the right), against the update. `history` holds one dict per validation node."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def series(key):
        return [np.nan if h.get(key) is None else h[key] for h in history]

    updates = [h["update"] for h in history]
    fig = Figure(figsize=(5.5, 5.0), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.plot(updates, series("val_reward"), marker="o", markersize=3)
    top.set_ylabel(f"validation reward ({reward})")
    top.set_title(Path(folder).name, fontsize=8)
    bottom.plot(updates, series("val_div_cos"), marker="o", markersize=3, color="tab:green")
    bottom.set_ylabel("cosine distance", color="tab:green", fontsize=8)
    classes = bottom.twinx()
    classes.plot(updates, series("val_div_classes"), marker="s", markersize=3, color="tab:purple")
    classes.set_ylabel("classes", color="tab:purple", fontsize=8)
    classes.set_ylim(0, 10.5)
    classes.set_yticks(range(0, 11, 2))
    bottom.set_xlabel("update")
    bottom.set_title("sample diversity (SimCLR features, classifier)", fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(folder) / CURVE
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path
