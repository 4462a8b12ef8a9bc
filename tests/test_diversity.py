"""Sample diversity at validation (rewards.py `make_diversity_features`, `sample_diversity`; cifar_fpo.py
`validate`): closed forms of the statistics and the numbers a tiny run writes."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jsonl_records import read_jsonl  # noqa: E402

import cifar_fpo  # noqa: E402
import rewards  # noqa: E402

BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def diversity_features():
    return rewards.make_diversity_features("cpu")


def test_orthogonal_features_are_at_cosine_distance_one():
    assert float(rewards.mean_pairwise_cosine_distance(torch.eye(2))) == pytest.approx(1.0, abs=1e-12)
    # the scale of a feature does not count; opposite rows are at distance 2
    assert float(rewards.mean_pairwise_cosine_distance(torch.tensor([[3.0, 0.0], [-0.5, 0.0]]))) == pytest.approx(2.0)
    # three rows: pairs (a, b) = 1, (a, c) = 0, (b, c) = 1 -> mean 2/3, each distinct pair once
    f = torch.tensor([[1.0, 0.0], [0.0, 2.0], [5.0, 0.0]])
    assert float(rewards.mean_pairwise_cosine_distance(f)) == pytest.approx(2 / 3)


def test_identical_images_have_no_diversity(diversity_features):
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    cos, classes = rewards.sample_diversity(*diversity_features(image.expand(16, -1, -1, -1)))
    assert abs(cos) < 1e-6 and classes == 1


def test_distinct_images_are_diverse(diversity_features):
    images = torch.rand(32, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    images[16:] = torch.linspace(-1, 1, 16).view(16, 1, 1, 1)  # flat images from black to white
    features, classes = diversity_features(images)
    assert features.shape == (32, 256) and classes.shape == (32,) and classes.dtype == torch.int64
    cos, n = rewards.sample_diversity(features, classes)
    assert 0.0 < cos <= 2.0 and 2 <= n <= 10


def test_diversity_leaves_the_global_rng_alone():
    images = torch.rand(4, 3, 32, 32) * 2 - 1
    state = torch.random.get_rng_state()
    fn = rewards.make_diversity_features("cpu")  # building the networks would draw initial weights
    fn(images)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_tiny_run_logs_diversity_and_carries_it_to_the_peak(tiny_train, tmp_path):
    args = replace(tiny_train, runs_dir=str(tmp_path), run_name="div", num_updates=4, save_samples=True)
    summary = cifar_fpo.main(args)
    folder = tmp_path / "div"
    vals = [r for r in read_jsonl(folder / "metrics.jsonl") if r["kind"] == "validation"]
    assert [r["update"] for r in vals] == [0, 2, 4]
    for r in vals:
        assert 0.0 <= r["val_div_cos"] <= 2.0, r
        assert isinstance(r["val_div_classes"], int) and 1 <= r["val_div_classes"] <= 10, r
    # the values at the validation node that set the peak (eq:peak: the first best node)
    best = max(vals, key=lambda r: r["val_reward"])
    assert summary == json.loads((folder / "summary.json").read_text())
    assert summary["peak_update"] == best["update"]
    assert summary["div_cos_at_peak"] == best["val_div_cos"]
    assert summary["div_classes_at_peak"] == best["val_div_classes"]
    assert [h["val_div_cos"] for h in summary["validation"]] == [r["val_div_cos"] for r in vals]
    # the logged value is the statistic of the validation images: recompute it from the samples at update 4
    run = cifar_fpo.setup(replace(args, resume=True), _Resumed(folder))
    _, _, again = cifar_fpo.validate(run)
    assert again == {k: vals[-1][k] for k in ("val_div_cos", "val_div_classes")}
    # TensorBoard and the two-panel curve
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    logged = [round(e.value, 5) for e in events.Scalars("charts/val_div_cos")]
    assert logged == [round(r["val_div_cos"], 5) for r in vals]
    assert [e.value for e in events.Scalars("charts/val_div_classes")] == [r["val_div_classes"] for r in vals]
    from PIL import Image

    assert Image.open(folder / "curve.png").size == (550, 500)


class _Resumed:
    """The part of a RunFolder that `cifar_fpo.setup` reads to restore a run from its checkpoint."""

    def __init__(self, folder: Path):
        self.folder, self.resuming = folder, True

    def load_checkpoint(self, map_location="cpu"):
        return torch.load(self.folder / "checkpoints" / "last.pt", map_location=map_location, weights_only=False)


def test_grid_script_measures_a_saved_sample_grid(tiny_train, tmp_path, diversity_features):
    sys.path.insert(0, str(BENCH))
    import cifar_diversity

    from fpo_utils.runfolder import RunFolder

    images = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1
    images[6:] = images[:1]  # half of the grid repeats one image
    rf = RunFolder(tmp_path, "grid", {}, resume=False)
    path = rf.save_images(images, "grid", nrow=5)  # 3 rows, the last one part full
    cells = cifar_diversity.read_grid(path, rows=3, cols=5, padding=2)
    assert cells.shape == (15, 3, 32, 32)
    # the PNG holds 8-bit pixels: compare with the images rounded the same way
    rounded = ((images.clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1
    torch.testing.assert_close(cells[:12], rounded, atol=1e-6, rtol=0)
    stats = cifar_diversity.measure(cells[:12], diversity_features)
    assert stats == dict(zip(("div_cos", "div_classes"), rewards.sample_diversity(*diversity_features(rounded))))
    assert cifar_diversity.main([str(path), "--rows", "3", "--cols", "5", "--count", "12"]) == stats
