"""Algorithm 1 (cifar_fpo.py): hand computations of its pieces and tiny end-to-end runs on the CPU."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jsonl_records import read_jsonl, strip_times  # noqa: E402

import cifar_fpo  # noqa: E402

TINY_UNET = {
    "_class_name": "UNet2DModel",
    "sample_size": 32,
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": [16, 32],
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
    "up_block_types": ["AttnUpBlock2D", "UpBlock2D"],
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "norm_eps": 1e-5,
    "attention_head_dim": None,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "downsample_padding": 1,
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_unet")
    torch.manual_seed(0)
    net = cifar_fpo.UNet2D.from_config(TINY_UNET)
    cifar_fpo.save_unet(net, folder, dtype=torch.float32)
    return folder


TINY_FLAGS = [
    "--preset",
    "quick",
    "--reward",
    "red-patch",
    "--device",
    "cpu",
    "--batch-size",
    "4",
    "--group-size",
    "2",
    "--mc-draws",
    "2",
    "--sample-steps",
    "2",
    "--val-every",
    "2",
    "--val-banks",
    "1",
    "--val-bank-size",
    "4",
    "--calib-bank-size",
    "8",
    "--fit-batch-size",
    "4",
    "--learning-rate",
    "1e-3",
    "--no-verbose",
]


def run_script(args, cwd, timeout=300, check=True):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "cifar_fpo.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"cifar_fpo.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# ------------------------------------------------------------------------------------------------
# pieces against hand computations
# ------------------------------------------------------------------------------------------------
def test_group_advantages_use_sample_sd_and_epsilon():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 10.0])
    a = cifar_fpo.group_advantages(r, group_size=4, eps=1e-6)
    g = np.array([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(((g - g.mean()) ** 2).sum() / 3)  # (G-1) denominator, app:cifar
    np.testing.assert_allclose(a[:4].numpy(), (g - g.mean()) / (sd + 1e-6), rtol=1e-6)
    assert torch.all(a[4:] == 0)  # a constant group has zero advantage, no division by zero


def test_fpo_loss_matches_hand_computation():
    l_old = torch.tensor([[0.30, 0.50], [0.20, 0.40], [0.10, 0.10]])
    l_new = torch.tensor([[0.10, 0.30], [0.60, 0.40], [0.10, 0.10]])
    adv = torch.tensor([1.0, -2.0, 0.5])
    a = 2.0
    loss, ratio = cifar_fpo.fpo_loss(l_old, l_new, adv, a, clip_ratio=0.08, log_ratio_clip=20.0)
    d = a * (l_old - l_new).mean(dim=1)  # eq:rl-mc
    r = torch.exp(d)
    expect = -torch.minimum(r * adv, r.clamp(0.92, 1.08) * adv).mean()  # eq:rl-ppo
    assert torch.allclose(ratio, r)
    assert torch.allclose(loss, expect)
    # sample 0: r = e^0.4 > 1.08 with A > 0 -> clipped term 1.08 A is the minimum
    assert math.isclose(
        float(-(1.08 * 1.0 + torch.minimum(r[1] * -2, r[1].clamp(0.92, 1.08) * -2) + 0.5) / 3),
        float(loss),
        rel_tol=1e-6,
    )


def test_fpo_loss_clamps_log_surrogate_and_weights_draws():
    l_old = torch.tensor([[100.0, 100.0]])
    l_new = torch.zeros(1, 2)
    _, ratio = cifar_fpo.fpo_loss(l_old, l_new, torch.ones(1), 1.0, log_ratio_clip=20.0)
    assert math.isclose(float(ratio), math.exp(20.0), rel_tol=1e-6)
    mult = torch.tensor([[2.0, 0.0]])  # explicit estimator: per-draw multipliers
    _, ratio = cifar_fpo.fpo_loss(torch.tensor([[0.3, 5.0]]), torch.tensor([[0.1, 0.0]]), torch.ones(1), mult)
    assert math.isclose(float(ratio), math.exp(2.0 * 0.2 / 2), rel_tol=1e-6)


class AffineVelocity(torch.nn.Module):
    """net(x, timestep) = c * x + timestep/1000: a model whose losses can be written by hand."""

    def __init__(self, c=0.5):
        super().__init__()
        self.c = torch.nn.Parameter(torch.tensor(c))

    def forward(self, x, timestep):
        return self.c * x + (timestep / 1000.0).view(-1, 1, 1, 1)


@pytest.mark.parametrize("convention", ["sigma", "t"])
def test_velocity_losses_by_hand(convention):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 32, 32, generator=g)
    t = torch.rand(3, 2, generator=g)
    eps = torch.randn(3, 2, 3, 32, 32, generator=g)
    net = AffineVelocity()
    with torch.no_grad():
        losses = cifar_fpo.velocity_losses(net, x, t, eps, convention)
    for i in range(3):
        for m in range(2):
            tt = float(t[i, m])
            x_t = (1 - tt) * eps[i, m] + tt * x[i]
            u = x[i] - eps[i, m]
            if convention == "sigma":  # timestep 1000 (1-t), output negated
                v = -(0.5 * x_t + (1 - tt))
            else:
                v = 0.5 * x_t + tt
            assert math.isclose(float(losses[i, m]), float(((v - u) ** 2).mean()), rel_tol=1e-5)
    # and its gradient in the network's parameter c: d l_v / dc = mean(2 (v - u) dv/dc), dv/dc = +-x_t
    net.zero_grad()
    cifar_fpo.velocity_losses(net, x, t, eps, convention).sum().backward()
    tt = t.view(3, 2, 1, 1, 1)
    x_t = (1 - tt) * eps + tt * x.unsqueeze(1)
    sign = -1.0 if convention == "sigma" else 1.0
    v = sign * (0.5 * x_t + (1 - tt if convention == "sigma" else tt))
    grad = (2 * (v - (x.unsqueeze(1) - eps)) * sign * x_t).flatten(2).mean(2).sum()
    assert math.isclose(float(net.c.grad), float(grad), rel_tol=1e-4)


def test_algorithm_pieces_are_defined_in_the_trainer():
    # Algorithm 1 reads from cifar_fpo.py and weighting.py alone: its sampler and losses live here
    for fn in (cifar_fpo.sample_images, cifar_fpo.velocity_losses, cifar_fpo.fpo_loss, cifar_fpo.group_advantages):
        assert fn.__module__ == "cifar_fpo", fn.__name__


def test_support_modules_do_not_import_a_trainer():
    # imports point down only: fpo_utils never imports a trainer, the reference never imports its variant
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    up = [m for m in ('cifar_fpo', 'cifar_fpo_pack') if m in sys.modules and m != name]\n"
        "    if up:\n"
        "        sys.exit(f'{name} imports {up}')\n"
    )
    mods = ["fpo_utils.devices", "fpo_utils.unet", "fpo_utils.cifar_graphs", "fpo_utils.cifar_metrics", "cifar_fpo"]
    proc = subprocess.run([sys.executable, "-c", code, *mods], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_euler_sampler_integrates_a_known_field():
    # v(x, t) = 1 everywhere ('t' convention with c=0 and timestep 1000 t gives v = t): x1 = x0 + 1/2
    net = AffineVelocity(c=0.0)
    x0 = torch.zeros(2, 3, 32, 32)
    x1 = cifar_fpo.sample_images(net, x0, steps=4, convention="t")
    # Euler on v = t with 4 steps: sum_j (j/4) * 1/4 = (0+1+2+3)/16
    assert torch.allclose(x1, torch.full_like(x1, 6 / 16))


def test_stopping_rule():
    args = cifar_fpo.resolve_args(
        cifar_fpo.Args(model="unused", min_updates_before_stop=40, stop_patience=3, stop_degrade_nodes=2, val_every=20)
    )
    rising = [{"update": 20 * i, "val_reward": 0.1 * i} for i in range(6)]
    assert cifar_fpo.should_stop(rising, args) is None
    flat = [{"update": 20 * i, "val_reward": v} for i, v in enumerate([0.1, 0.5, 0.5, 0.5, 0.5])]
    assert cifar_fpo.should_stop(flat, args) == "plateau"
    falling = [{"update": 20 * i, "val_reward": v} for i, v in enumerate([0.1, 0.9, 0.8, 0.3, 0.2])]
    assert cifar_fpo.should_stop(falling, args) == "degradation"
    early = [{"update": 20 * i, "val_reward": v} for i, v in enumerate([0.1, 0.9, 0.2])]
    assert cifar_fpo.should_stop(early, args) is None  # before min_updates_before_stop


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(weighting="magic"), "--weighting 'magic'"),
        (dict(batch_size=30, group_size=16), "not divisible"),
        (dict(alpha=float("nan")), "--alpha is nan"),
        (dict(estimator="q+x"), "--estimator"),
        (dict(target="z"), "--target"),
        (dict(preset="fast"), "--preset"),
    ],
)
def test_bad_arguments_raise_one_line_errors(bad, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+").replace("(", r"\(")) as err:
        cifar_fpo.resolve_args(cifar_fpo.Args(model="unused", **bad))
    assert "\n" not in str(err.value)


def test_cli_reports_bad_input_in_one_line(tmp_path):
    proc = run_script(["--model", str(tmp_path / "missing"), "--reward", "red-patch"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "missing" in last
    proc = run_script(["--reward", "no-such-reward", "--model", str(tmp_path)], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "no-such-reward" in proc.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------
# whole-algorithm checks on a tiny U-Net
# ------------------------------------------------------------------------------------------------
def _tiny_args(tiny_model, tmp_path, **kw):
    return replace(
        cifar_fpo.PRESETS["quick"],
        model=str(tiny_model),
        reward="red-patch",
        device="cpu",
        batch_size=4,
        group_size=2,
        mc_draws=2,
        sample_steps=2,
        calib_bank_size=8,
        val_banks=1,
        val_bank_size=4,
        learning_rate=1e-3,
        verbose=False,
        save_samples=False,
        runs_dir=str(tmp_path),
        **kw,
    )


def test_first_update_has_unit_ratio_and_moves_the_model(tiny_model, tmp_path):
    cifar_fpo.main(_tiny_args(tiny_model, tmp_path, num_updates=1, run_name="one"))
    recs = read_jsonl(tmp_path / "one/metrics.jsonl")
    m = [r for r in recs if r["kind"] == "update"][0]
    # old and current losses use the same endpoints, times and noises and start from equal weights
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["ratio_max_dev"] < 1e-6
    assert m["a_k"] == pytest.approx(1.0, rel=1e-9)  # alpha = 0 is the x0 anchor itself: a(q_x0, 1) = 1
    assert m["grad_norm"] > 0
    before = cifar_fpo.load_unet(tiny_model).state_dict()
    after = torch.load(tmp_path / "one/checkpoints/last.pt", weights_only=False)["model"]
    assert any(not torch.equal(before[k], after[k]) for k in before)
    cal = [r for r in recs if r["kind"] == "calibration"]
    assert len(cal) == 1 and np.isfinite(cal[0]["c_x0"]) and cal[0]["bank_size"] == 8


def test_frozen_copy_is_theta_old(tiny_model, tmp_path):
    # theta_old is a copy of its own (evaluation mode, no gradients) that a parameter change leaves alone
    run = cifar_fpo.setup(_tiny_args(tiny_model, tmp_path, run_name="copy"))
    old, net = run.old_net, run.net
    assert net.training and not old.training and not any(p.requires_grad for p in old.parameters())
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(0.5)
    assert all(not torch.equal(p, q) for p, q in zip(old.parameters(), net.parameters()) if p.abs().sum() > 0)
    assert cifar_fpo.setup(_tiny_args(tiny_model, tmp_path, run_name="nocopy", reuse_old_losses=True)).old_net is None


@pytest.mark.parametrize(
    "weighting, extra",
    [
        ("fixed", ["--alpha", "-2", "--estimator", "q+Z"]),
        ("fixed", ["--target", "eps", "--estimator", "explicit"]),
        ("schedule", ["--alpha-early", "-3", "--alpha-late", "1", "--k0", "1", "--k1", "3"]),
        ("static-softmax", ["--eta", "1.0"]),
        ("static-direct", []),
        pytest.param("online-ema", [], marks=pytest.mark.slow),
        pytest.param("online-refit", ["--refit-every", "2"], marks=pytest.mark.slow),
    ],
)
def test_every_weighting_runs(tiny_model, tmp_path, weighting, extra):
    import tyro

    flags = [
        *TINY_FLAGS,
        "--model",
        str(tiny_model),
        "--num-updates",
        "4",
        "--weighting",
        weighting,
        *extra,
        "--run-name",
        "w",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--no-save-samples",
    ]
    cifar_fpo.main(tyro.cli(cifar_fpo.Args, default=cifar_fpo.PRESETS["quick"], args=flags))  # in-process
    recs = [r for r in read_jsonl(tmp_path / "runs/w/metrics.jsonl") if r["kind"] == "update"]
    assert [r["update"] for r in recs] == [0, 1, 2, 3]
    for r in recs:
        assert np.isclose(sum(r["q"]), 1.0, atol=1e-4) and len(r["q"]) == 12
        assert np.isfinite(r["loss"]) and r["a_k"] > 0
    if weighting == "schedule":
        assert [r["alpha"] for r in recs] == [-3.0, -3.0, -1.0, 1.0]
    if weighting == "online-refit":  # profile replaced after update 1 (k+1 = 2): from x0 to the refit
        assert recs[1]["q"] == recs[0]["q"] and recs[2]["q"] != recs[1]["q"]
    if weighting == "online-ema":  # starts uniform, deploys the first fit at the next update
        assert np.allclose(recs[0]["q"], 1 / 12, atol=1e-6) and recs[1]["q"] != recs[0]["q"]


def test_end_to_end_outputs(tiny_model, tmp_path):
    proc = run_script(
        [*TINY_FLAGS, "--model", str(tiny_model), "--num-updates", "4", "--run-name", "e2e", "--verbose"], cwd=tmp_path
    )
    assert "C_x0" in proc.stdout
    folder = tmp_path / "runs" / "e2e"
    recs = read_jsonl(folder / "metrics.jsonl")
    cal = [r for r in recs if r["kind"] == "calibration"]
    ups = [r for r in recs if r["kind"] == "update"]
    vals = [r for r in recs if r["kind"] == "validation"]
    assert len(cal) == 1 and cal[0]["c_x0"] > 0
    assert [r["update"] for r in ups] == [0, 1, 2, 3]
    assert [r["update"] for r in vals] == [0, 2, 4]
    for key in (
        "train_reward_mean",
        "train_reward_std",
        "loss",
        "ratio_mean",
        "ratio_max_dev",
        "clip_frac",
        "grad_norm",
        "alpha",
        "q",
        "a_k",
    ):
        assert key in ups[0], key
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["updates_done"] == 4
    assert summary["peak"] == max(v["val_reward"] for v in vals)  # eq:peak
    assert summary["peak_update"] in (0, 2, 4)
    assert sorted(p.name for p in (folder / "samples").glob("*.png")) == [
        "update_00000.png",
        "update_00002.png",
        "update_00004.png",
    ]
    ckpt = torch.load(folder / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["k"] == 4 and "optimizer" in ckpt and "rng" in ckpt
    args = json.loads((folder / "args.json").read_text())
    assert args["batch_size"] == 4 and args["reward"] == "red-patch"
    # TensorBoard scalars under CleanRL-style tags, and the learning curve
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"charts/val_reward", "charts/train_reward", "losses/loss", "losses/clip_frac"} <= tags
    assert {"charts/val_div_cos", "charts/val_div_classes"} <= tags  # sample diversity (tests/test_diversity.py)
    assert [e.step for e in events.Scalars("charts/val_reward")] == [0, 2, 4]
    assert [round(e.value, 6) for e in events.Scalars("charts/val_reward")] == [round(v["val_reward"], 6) for v in vals]
    assert (folder / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second start without --resume must not overwrite finished work
    proc = run_script(
        [*TINY_FLAGS, "--model", str(tiny_model), "--num-updates", "4", "--run-name", "e2e"], cwd=tmp_path, check=False
    )
    assert proc.returncode == 2 and "--resume" in proc.stderr.strip().splitlines()[-1]
    # --resume with a setting that changes the run is refused, naming the setting and both values
    proc = run_script(
        [
            *TINY_FLAGS,
            "--model",
            str(tiny_model),
            "--num-updates",
            "4",
            "--run-name",
            "e2e",
            "--resume",
            "--alpha",
            "-2",
        ],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and "alpha: 0.0 -> -2.0" in proc.stderr.strip().splitlines()[-1]
    # a truncated checkpoint: one line naming it and the bad-file exit code, the folder left as it was
    ckpt_path = folder / "checkpoints" / "last.pt"
    ckpt_path.write_bytes(ckpt_path.read_bytes()[:1000])
    before = sorted(p.name for p in folder.rglob("*"))
    proc = run_script(
        [*TINY_FLAGS, "--model", str(tiny_model), "--num-updates", "4", "--run-name", "e2e", "--resume"],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 4 and len(proc.stderr.strip().splitlines()) == 1 and "last.pt" in proc.stderr
    assert sorted(p.name for p in folder.rglob("*")) == before


def test_truncated_model_is_a_bad_file_error_and_leaves_no_folder(tiny_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = model / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2000])
    proc = run_script([*TINY_FLAGS, "--model", str(model), "--run-name", "bad"], cwd=tmp_path, check=False)
    assert proc.returncode == 4 and proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert str(weights) in proc.stderr and not (tmp_path / "runs" / "bad").exists()


def test_default_run_name_says_what_the_run_is():
    name = lambda **kw: cifar_fpo.resolve_args(replace(cifar_fpo.PRESETS["quick"], **kw)).run_name  # noqa: E731
    assert name() == "auto-a35__alpha0__quick__20260724"
    assert name(alpha=-2.0, reward="clip", seed=3) == "clip__alpha-2__quick__3"
    assert name(target="x0") == "auto-a35__x0__quick__20260724"
    assert name(weighting="static-softmax", eta=1.0) == "auto-a35__static-softmax-eta1__quick__20260724"
    assert cifar_fpo.resolve_args(cifar_fpo.Args()).run_name == "auto-a35__alpha0__paper__20260724"


@pytest.mark.parametrize(
    "flag", ["preset", "weighting", "target", "estimator", "precision", "reward", "online-init", "convention"]
)
def test_closed_choices_reject_bad_values_in_one_line(flag, capsys):
    from fpo_utils.runfolder import cli

    with pytest.raises(SystemExit) as exc:
        cli(lambda args: {"status": "finished"}, cifar_fpo.Args, presets=cifar_fpo.PRESETS, argv=[f"--{flag}", "bogus"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: --{flag} 'bogus' is not one of ")


def test_cli_bad_weighting_is_one_line(tmp_path):
    proc = run_script(["--weighting", "bogus"], cwd=tmp_path, check=False)
    allowed = "fixed, schedule, static-softmax, static-direct, online-ema, online-refit"
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: --weighting 'bogus' is not one of {allowed}"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(tiny_model, tmp_path):
    flags = [
        *TINY_FLAGS,
        "--model",
        str(tiny_model),
        "--num-updates",
        "8",
        "--checkpoint-every",
        "1",
        "--weighting",
        "online-ema",
    ]
    run_script([*flags, "--run-name", "straight"], cwd=tmp_path)
    straight = strip_times(read_jsonl(tmp_path / "runs/straight/metrics.jsonl"))

    proc = signal_run_at(flags, "killed", tmp_path, signal.SIGKILL, 3, subprocess.DEVNULL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    run_script([*flags, "--run-name", "killed", "--resume"], cwd=tmp_path)
    resumed = strip_times(read_jsonl(tmp_path / "runs/killed/metrics.jsonl"))
    assert resumed == straight
    a = json.loads((tmp_path / "runs/straight/summary.json").read_text())
    b = json.loads((tmp_path / "runs/killed/summary.json").read_text())
    assert a["validation"] == b["validation"] and b["status"] == "finished"

    # Ctrl-C: the finished updates are checkpointed, summary says interrupted, exit 130, resume is exact
    proc = signal_run_at(flags, "int", tmp_path, signal.SIGINT, 2, subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    c = json.loads((tmp_path / "runs/int/summary.json").read_text())
    assert c["status"] == "interrupted" and c["updates_done"] < 8
    assert torch.load(tmp_path / "runs/int/checkpoints/last.pt", weights_only=False)["k"] == c["updates_done"]
    run_script([*flags, "--run-name", "int", "--resume"], cwd=tmp_path)
    assert strip_times(read_jsonl(tmp_path / "runs/int/metrics.jsonl")) == straight


def signal_run_at(flags, name, cwd, sig, update, stderr):
    """Start cifar_fpo.py as run ``name`` and send it ``sig`` once its log shows ``update`` finished updates."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cifar_fpo.py"), *flags, "--run-name", name],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )
    log, deadline = cwd / f"runs/{name}/metrics.jsonl", time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and any(r.get("kind") == "update" and r["update"] >= update for r in read_jsonl_safe(log)):
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    return proc


def read_jsonl_safe(path):
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


@pytest.mark.slow
def test_nonfinite_loss_stops_with_status_and_keeps_checkpoint(tiny_model, tmp_path):
    # a huge learning rate drives the tiny model to non-finite losses within a few updates
    proc = run_script(
        [
            *TINY_FLAGS,
            "--model",
            str(tiny_model),
            "--num-updates",
            "30",
            "--run-name",
            "nan",
            "--learning-rate",
            "1e30",
            "--max-grad-norm",
            "1e30",
            "--clip-ratio",
            "0.99",
            "--checkpoint-every",
            "1",
        ],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    folder = tmp_path / "runs/nan"
    text = (folder / "metrics.jsonl").read_text()
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON token {c}")) for line in text.splitlines()]
    assert any(r["kind"] == "update" and (r["loss"] is None or r["grad_norm"] is None) for r in rows)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "nonfinite"
    ckpt = torch.load(folder / "checkpoints" / "last.pt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert ckpt["k"] <= summary["updates_done"]


# ------------------------------------------------------------------------------------------------
# the fast path: reused old losses and bf16 against the FP32 reference
# ------------------------------------------------------------------------------------------------
def test_reused_old_losses_give_the_same_update(tiny_model, tmp_path):
    # theta_old = theta when the old losses are computed, so taking them from the current forward
    # (detached) must reproduce Algorithm 1 as written: same metrics, same parameters afterwards
    for flag in (False, True):
        cifar_fpo.main(
            _tiny_args(
                tiny_model, tmp_path, num_updates=2, val_every=10, reuse_old_losses=flag, run_name=f"reuse{flag}"
            )
        )
    ms = [
        [r for r in read_jsonl(tmp_path / f"reuse{flag}/metrics.jsonl") if r["kind"] == "update"]
        for flag in (False, True)
    ]
    for a, b in zip(*ms):
        for key in ("train_reward_mean", "loss", "ratio_mean", "ratio_max_dev", "velocity_loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    ckpts = [
        torch.load(tmp_path / f"reuse{flag}/checkpoints/last.pt", weights_only=False)["model"] for flag in (False, True)
    ]
    for k in ckpts[0]:
        torch.testing.assert_close(ckpts[1][k], ckpts[0][k], rtol=1e-5, atol=1e-7)


def test_compile_does_not_imply_reused_old_losses():
    assert cifar_fpo.Args().reuse_old_losses is False
    for compiled in (False, True):
        args = cifar_fpo.resolve_args(cifar_fpo.Args(compile=compiled))
        assert args.compile is compiled and args.reuse_old_losses is False
        assert cifar_fpo.resolve_args(replace(args, reuse_old_losses=True)).reuse_old_losses is True


@pytest.mark.parametrize(
    "module, shown",
    [(torch.nn.Dropout(0.1), "Dropout(p=0.1"), (torch.nn.BatchNorm2d(3), "BatchNorm2d(3")],
)
def test_reused_old_losses_refuse_a_network_whose_modes_differ(module, shown):
    # train-mode l_theta (detached) stands in for the eval-mode frozen copy's l_old only if the two agree
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), module)
    with pytest.raises(ValueError, match="--reuse-old-losses") as err:
        cifar_fpo.check_reuse_old_losses(net)
    assert "\n" not in str(err.value) and shown in str(err.value)
    cifar_fpo.check_reuse_old_losses(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.Dropout(0.0)))


def test_reused_old_losses_refuse_a_model_with_dropout(tmp_path):
    folder = tmp_path / "dropout_unet"
    cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config({**TINY_UNET, "dropout": 0.1}), folder, dtype=torch.float32)
    args = _tiny_args(folder, tmp_path, reuse_old_losses=True)
    with pytest.raises(ValueError, match=r"--reuse-old-losses .* is Dropout\(p=0\.1") as err:
        cifar_fpo.setup(args)
    assert "\n" not in str(err.value)
    assert cifar_fpo.setup(replace(args, reuse_old_losses=False)).old_net is not None  # the frozen copy is exact


# Stated tolerances of the bf16 fast mode against FP32 on the same inputs (benchmarks/README.md).
BF16_LOSS_RTOL = 5e-3  # per-draw velocity losses l_v, relative (measured ~3e-4)
BF16_RATIO_ATOL = 2e-3  # ratios r_i = exp(D_i), absolute (measured ~4e-4)
BF16_GRAD_COSINE = 0.995  # cosine (measured ~0.9997) between the bf16 and FP32 gradients of the clipped objective


def test_bf16_fast_mode_matches_fp32_on_the_same_inputs(tiny_model):
    torch.manual_seed(1)
    net = cifar_fpo.load_unet(tiny_model)
    old = cifar_fpo.load_unet(tiny_model)
    with torch.no_grad():  # a current model one small step away from the old one: ratios != 1
        for p in net.parameters():
            p.add_(0.15 * p.abs().mean() * torch.randn_like(p))
    n, m = 8, 2
    x = torch.rand(n, 3, 32, 32) * 2 - 1
    t = torch.rand(n, m)
    eps = torch.randn(n, m, 3, 32, 32)
    adv = cifar_fpo.group_advantages(torch.randn(n), group_size=4)

    def evaluate(autocast):
        net.zero_grad(set_to_none=True)
        with torch.no_grad():
            l_old = cifar_fpo.velocity_losses(old, x, t, eps, "sigma", autocast)
        l_new = cifar_fpo.velocity_losses(net, x, t, eps, "sigma", autocast)
        loss, ratio = cifar_fpo.fpo_loss(l_old, l_new, adv, 1.0, clip_ratio=0.08)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        return l_new.detach(), ratio.detach(), loss.detach(), grad

    l32, r32, loss32, g32 = evaluate(None)
    l16, r16, loss16, g16 = evaluate(torch.bfloat16)
    assert l16.dtype == torch.float32 and r16.dtype == torch.float32  # the objective itself stays FP32
    assert (r32 - 1).abs().max() > 4 * BF16_RATIO_ATOL  # not vacuous: a ratio stuck at one would fail
    torch.testing.assert_close(l16, l32, rtol=BF16_LOSS_RTOL, atol=0)
    torch.testing.assert_close(r16, r32, rtol=0, atol=BF16_RATIO_ATOL)
    assert abs(float(loss16 - loss32)) <= BF16_RATIO_ATOL * float(adv.abs().mean())
    cosine = float(torch.nn.functional.cosine_similarity(g16, g32, dim=0))
    assert cosine >= BF16_GRAD_COSINE
    # and the tolerances are tight enough to catch a real numerical error, e.g. a wrong cast
    assert not torch.allclose(l32 * 1.05, l32, rtol=BF16_LOSS_RTOL, atol=0)


def test_cuda_graph_sampler_replays_the_euler_loop():
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU (the fast path's sampler); CPU runs use the plain sampler")
    torch.manual_seed(0)
    net = cifar_fpo.UNet2D.from_config(TINY_UNET).cuda()
    from fpo_utils.cifar_graphs import GraphSampler

    sampler = GraphSampler(cifar_fpo.sample_images, net, net, steps=3, convention="sigma")
    for _ in range(2):
        lat = torch.randn(4, 3, 32, 32, device="cuda")
        torch.testing.assert_close(sampler(lat), cifar_fpo.sample_images(net, lat, 3, "sigma"))
    with torch.no_grad():  # the graph reads the parameters in place
        for p in net.parameters():
            p.mul_(0.5)
    torch.testing.assert_close(sampler(lat), cifar_fpo.sample_images(net, lat, 3, "sigma"))
