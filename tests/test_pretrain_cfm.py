"""scripts/pretrain_cfm.py: a tiny CPU run on a fake dataset, its saved folder, and --resume."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from fpo_utils import unet as cf

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--block-out-channels",
    "8",
    "16",
    "--norm-num-groups",
    "4",
    "--batch-size",
    "16",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "1",
    "--log-every",
    "10",
    "--num-samples",
    "4",
    "--sample-steps",
    "2",
    "--eval-images",
    "32",
    "--device",
    "cpu",
    "--no-compile",
]


def fake_cifar(folder: Path, per_batch: int = 8) -> np.ndarray:
    """cifar-10-batches-py with flat random colours (a distribution a tiny net learns in steps)."""
    rng = np.random.default_rng(0)
    (folder / "cifar-10-batches-py").mkdir(parents=True)
    train = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = np.broadcast_to(rng.integers(0, 256, (per_batch, 1, 1, 3), dtype=np.uint8), (per_batch, 32, 32, 3))
        data = np.concatenate([x[..., c].reshape(per_batch, 1024) for c in range(3)], axis=1)
        with open(folder / "cifar-10-batches-py" / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": [0] * per_batch}, f)
        if name != "test_batch":
            train.append(x)
    return np.concatenate(train)


def run(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pretrain_cfm.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@torch.no_grad()
def flow_loss(net, x, convention):
    """Velocity loss in flow time (t=0 noise, t=1 data), the quantity Algorithm 1 uses."""
    g = torch.Generator().manual_seed(1)
    eps = torch.randn(x.shape, generator=g)
    t = torch.rand(x.shape[0], generator=g)
    x_t = (1 - t)[:, None, None, None] * eps + t[:, None, None, None] * x
    return ((cf.velocity(net, x_t, t, convention) - (x - eps)) ** 2).mean().item()


def test_tiny_run_saves_loadable_sigma_convention_model(tmp_path):
    images = fake_cifar(tmp_path / "data")
    out = tmp_path / "out"
    run(["--data", str(tmp_path / "data"), "--out-dir", str(out), "--max-steps", "60", *TINY])
    net = cf.load_unet(out)
    config = json.loads((out / "config.json").read_text())
    assert config["fpo_convention"] == "sigma" and net.convention == "sigma"
    assert "AttnDownBlock2D" in config["down_block_types"] and "AttnUpBlock2D" in config["up_block_types"]
    assert config["_fpo_pretrain"]["steps"] == 60
    assert (out / "samples.png").is_file()
    x = torch.from_numpy(images[:32]).permute(0, 3, 1, 2).float() / 127.5 - 1
    torch.manual_seed(0)
    untrained = cf.UNet2D.from_config(config).eval()
    trained = flow_loss(net, x, "sigma")
    # Training lowered the flow-time velocity loss, and only when read in the saved convention.
    assert trained < 0.7 * flow_loss(untrained, x, "sigma")
    assert trained < 0.7 * flow_loss(net, x, "t")
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 60 and summary["final_ema_loss"] > 0


def test_resume_continues_the_step_count(tmp_path):
    fake_cifar(tmp_path / "data")
    out = tmp_path / "out"
    common = ["--data", str(tmp_path / "data"), "--out-dir", str(out), *TINY, "--num-samples", "0"]
    run([*common, "--max-steps", "5"])
    state = torch.load(out / "train_state.pt", weights_only=False)
    assert state["step"] == 5
    log = run([*common, "--max-steps", "9", "--resume"])
    assert "resumed from" in log and "at step 5" in log
    assert json.loads((out / "config.json").read_text())["_fpo_pretrain"]["steps"] == 9
    assert torch.load(out / "train_state.pt", weights_only=False)["images_seen"] == 9 * 16
