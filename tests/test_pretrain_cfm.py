"""scripts/pretrain_cfm.py: tiny CPU runs on a fake dataset: the saved folder, the paper preset's layout, exact
resume, the portable state, quality rows, signals and bad input."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fpo_utils import unet as cf
from fpo_utils.runfolder import cli

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import pretrain_cfm  # noqa: E402

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


@pytest.mark.slow
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


def tiny(tmp_path, **kw) -> pretrain_cfm.Args:
    """In-process settings of a tiny CPU run on fake_cifar(tmp_path / "data")."""
    base = pretrain_cfm.Args(
        data=str(tmp_path / "data"),
        out_dir=str(tmp_path / "out"),
        block_out_channels=(8, 16),
        norm_num_groups=4,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        log_every=100,
        num_samples=0,
        sample_steps=2,
        eval_images=0,
        device="cpu",
        compile=False,
        save_every_minutes=1e9,
    )
    return replace(base, **kw)


def test_short_run_end_to_end(tmp_path):
    """Two steps in-process: weights, samples, a quality row, the summary and a full state, nothing temporary."""
    fake_cifar(tmp_path / "data")
    args = tiny(tmp_path, max_steps=2, eval_every=2, eval_samples=4, num_samples=4, eval_images=16)
    summary = pretrain_cfm.main(args)
    out = tmp_path / "out"
    assert summary["status"] == "finished" and summary["steps"] == 2 and summary["final_ema_loss"] > 0
    assert cf.load_unet(out).convention == "sigma" and (out / "samples.png").stat().st_size > 0
    (row,) = pretrain_cfm.read_jsonl(out / "quality.jsonl")
    assert row["step"] == 2 and row["images_seen"] == 16 and row["loss_steps"] == 2 and row["frechet"] > 0
    assert load_state(out)["step"] == 2 and not list(out.glob("*.tmp"))
    assert json.loads((out / "train_summary.json").read_text())["args"]["eval_every"] == 2


def test_paper_preset_is_the_paper_layout_and_torchcfm_recipe():
    paper = pretrain_cfm.PRESETS["paper"]
    config = pretrain_cfm.unet_config(paper)
    net = cf.UNet2D.from_config({**config, "dropout": paper.dropout})
    assert sum(p.numel() for p in net.parameters()) == 35_746_307 and len(net.state_dict()) == 328
    assert config["down_block_types"] == ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"]
    assert config["up_block_types"] == ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"]
    assert config["dropout"] == 0.0 and net.config["dropout"] == 0.1
    got = (paper.batch_size, paper.lr, paper.warmup_steps, paper.grad_clip, paper.ema_decay, paper.weight_decay)
    assert got == (128, 2e-4, 5000, 1.0, 0.9999, 0.0)
    assert pretrain_cfm.PRESETS["small"] == pretrain_cfm.Args()  # the small preset is the plain defaults


def load_state(folder: Path) -> dict:
    return torch.load(folder / "train_state.pt", weights_only=False)


def assert_same_training(a: dict, b: dict):
    assert a["step"] == b["step"] and a["pos"] == b["pos"] and torch.equal(a["perm"], b["perm"])
    for key in ("model", "ema"):
        assert all(torch.equal(a[key][k], b[key][k]) for k in a[key]), key
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in ("exp_avg", "exp_avg_sq", "step"))
    assert torch.equal(a["cpu_rng"], b["cpu_rng"])


@pytest.mark.slow
def test_full_resume_reproduces_the_uninterrupted_run_and_writes_quality_rows(tmp_path):
    fake_cifar(tmp_path / "data")
    # dropout and mid-run quality rows both run between the steps: neither may change the random stream
    kw = dict(dropout=0.1, eval_every=3, eval_samples=4)
    pretrain_cfm.main(tiny(tmp_path, out_dir=str(tmp_path / "straight"), max_steps=6, **kw))
    pretrain_cfm.main(tiny(tmp_path, out_dir=str(tmp_path / "split"), max_steps=3, **kw))
    pretrain_cfm.main(tiny(tmp_path, out_dir=str(tmp_path / "split"), max_steps=6, resume=True, **kw))
    straight, split = load_state(tmp_path / "straight"), load_state(tmp_path / "split")
    assert straight["step"] == 6 and straight["format"] == "full" and split["rewarm_from"] is None
    assert_same_training(straight, split)
    # the run moved: the model is not its initial copy and Adam has taken 6 steps
    assert not all(torch.equal(straight["model"][k], straight["ema"][k]) for k in straight["model"])
    rows = [pretrain_cfm.read_jsonl(tmp_path / f / "quality.jsonl") for f in ("straight", "split")]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] == [3, 6]
    for a, b in zip(*rows):
        assert a["frechet"] == b["frechet"] and a["loss"] == b["loss"] and a["images_seen"] == b["images_seen"]
    row = rows[0][-1]
    assert row["frechet"] > 0 and row["loss"] > 0 and row["loss_steps"] == 3 and row["eval_samples"] == 4
    assert abs(sum(row["class_histogram"].values()) - 1) < 1e-3 and len(row["class_histogram"]) == 10
    assert row["smallest_class_share"] <= row["largest_class_share"] and row["train_seconds"] >= 0
    # the saved weights are for sampling: dropout 0, the training value kept under _fpo_pretrain
    config = json.loads((tmp_path / "split" / "config.json").read_text())
    assert config["dropout"] == 0.0 and config["_fpo_pretrain"]["dropout"] == 0.1
    assert config["_fpo_pretrain"]["steps"] == 6


def test_portable_round_trip_within_fp16_offset_precision():
    torch.manual_seed(0)
    config = pretrain_cfm.unet_config(pretrain_cfm.Args(block_out_channels=(8, 16), norm_num_groups=4))
    net, ema = cf.UNet2D.from_config(config), cf.UNet2D.from_config(config)
    with torch.no_grad():  # a model near its EMA, as in training
        for p, q in zip(net.parameters(), ema.parameters()):
            q.copy_(p + 1e-3 * torch.randn_like(p))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    packed = pretrain_cfm.pack_weights(net, ema, opt, "portable", "none")
    assert packed["moments"] is None and all(v.dtype == torch.float16 for v in packed["ema16"].values())
    net2, ema2 = cf.UNet2D.from_config(config), cf.UNet2D.from_config(config)
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-3)
    assert pretrain_cfm.unpack_weights(packed, net2, ema2, opt2, reset_optimizer=False) is False
    worst_model, worst_half = 0.0, 0.0
    for (k, m), m2, e, e2 in zip(
        net.state_dict().items(), net2.state_dict().values(), ema.state_dict().values(), ema2.state_dict().values()
    ):
        e16 = e.half().float()
        assert torch.equal(e2, e16), k  # the EMA is exactly its fp16 rounding
        bound = (m - e16).abs() * 2.0**-11 + m.abs() * 2.0**-23 + 2.0**-24
        assert ((m2 - m).abs() <= bound).all(), k
        worst_model = max(worst_model, (m2 - m).abs().max().item())
        worst_half = max(worst_half, (m.half().float() - m).abs().max().item())
    assert worst_model < worst_half / 50  # far finer than storing the model in fp16
    with_moments = pretrain_cfm.pack_weights(net, ema, opt, "portable", "bf16")
    assert pretrain_cfm.unpack_weights(with_moments, net2, ema2, opt2, reset_optimizer=False) is True
    for a, b in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert a["step"] == b["step"] and b["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(b["exp_avg_sq"], a["exp_avg_sq"], rtol=2**-7, atol=0)
    assert pretrain_cfm.unpack_weights(with_moments, net2, ema2, opt2, reset_optimizer=True) is False


@pytest.mark.slow
def test_portable_resume_and_reset_optimizer_restart_adam_with_a_rewarmup(tmp_path, capsys):
    fake_cifar(tmp_path / "data")
    pretrain_cfm.main(tiny(tmp_path, max_steps=4, state_format="portable"))
    portable = load_state(tmp_path / "out")
    assert portable["format"] == "portable" and "optimizer" not in portable and "model" not in portable
    pretrain_cfm.main(tiny(tmp_path, max_steps=6, resume=True, rewarmup_steps=3))
    assert "(portable) at step 4; Adam's moments restarted" in capsys.readouterr().out
    full = load_state(tmp_path / "out")
    assert full["format"] == "full" and full["step"] == 6 and full["rewarm_from"] == 4
    # Adam restarted at step 4: 2 steps of moments, not 6
    assert all(s["step"].item() == 2 for s in full["optimizer"]["state"].values())
    pretrain_cfm.main(tiny(tmp_path, max_steps=7, resume=True))
    kept = load_state(tmp_path / "out")
    assert kept["rewarm_from"] == 4 and all(s["step"].item() == 3 for s in kept["optimizer"]["state"].values())
    pretrain_cfm.main(tiny(tmp_path, max_steps=8, resume=True, reset_optimizer=True))
    reset = load_state(tmp_path / "out")
    assert reset["rewarm_from"] == 7 and all(s["step"].item() == 1 for s in reset["optimizer"]["state"].values())


def cli_error(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        cli(pretrain_cfm.main, pretrain_cfm.Args, presets=pretrain_cfm.PRESETS, argv=argv)
    return exit_.value.code, capsys.readouterr().err


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, capsys):
    fake_cifar(tmp_path / "data")
    common = ["--data", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out"), *TINY]
    cases = [
        (["--preset", "huge"], "--preset 'huge' is not one of small, paper"),
        ([*common, "--eval-every", "-1"], "--eval-every -1 must be >= 0"),
        ([*common, "--attention-level", "2"], "--attention-level 2 must be in [0, 1]"),
        ([*common, "--resume"], "--resume: no "),
        ([*common, "--state-format", "zip"], "--state-format 'zip' is not one of full, portable"),
    ]
    for argv, message in cases:
        code, err = cli_error(argv, capsys)
        assert code != 0 and message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    pretrain_cfm.main(tiny(tmp_path, max_steps=1))
    code, err = cli_error([*common, "--resume", "--block-out-channels", "8", "8"], capsys)
    assert code != 0 and "another architecture (block_out_channels=[8, 16])" in err and err.count("\n") == 1


@pytest.mark.slow
def test_sigterm_saves_the_finished_steps_and_exits_130(tmp_path):
    fake_cifar(tmp_path / "data")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "scripts" / "pretrain_cfm.py"), "--data", str(tmp_path / "data")]
    cmd += ["--out-dir", str(out), *TINY, "--log-every", "1", "--num-samples", "0", "--max-steps", "100000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while "step 5 " not in log.read_text() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, log.read_text()[-2000:]
    text = log.read_text()
    last = max(int(line.split()[1]) for line in text.splitlines() if line.startswith("step "))
    state = torch.load(out / "train_state.pt", weights_only=False)
    assert state["step"] >= last >= 5 and "SIGTERM: stopped at step" in text
    assert json.loads((out / "config.json").read_text())["_fpo_pretrain"]["steps"] == state["step"]
    assert json.loads((out / "train_summary.json").read_text())["status"] == "interrupted"
    assert not list(out.glob("*.tmp"))


LEASE_SH = ROOT / "benchmarks" / "pretrain_lease.sh"


def lease(*args, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["bash", str(LEASE_SH), *map(str, args)], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r


def test_lease_give_carry_data_restore_round_trip(tmp_path):
    """The state leaves one machine in parts (`give`), is carried (`carry`) and joined on the next (`restore`)."""
    rng = np.random.default_rng(0)
    ended = tmp_path / "ended"  # LEASE of the machine whose lease ends
    (ended / "run").mkdir(parents=True)
    state = rng.integers(0, 256, 250_000, dtype=np.uint8).tobytes()
    (ended / "run" / "train_state.pt").write_bytes(state)
    (ended / "run" / "quality.jsonl").write_text('{"step": 1}\n')
    (ended / "run" / "train.log").write_text("step 1\n")
    sizes = {"PART_BYTES": "60000", "CARRY_BYTES": "130000"}
    landed = tmp_path / "lease1"  # where the parts land here (benchmarks/pretrain_results/data/leaseN/)
    landed.mkdir()
    for first in (0, 3):
        out = tmp_path / f"out{first}"
        lease("give", out, first, 3, env={"LEASE": ended, **sizes})
        assert len(list(out.iterdir())) <= 8
        for f in out.iterdir():
            (landed / f.name).write_bytes(f.read_bytes())
        # a state the run saves in between (atomic rename) does not mix into the parts given from the snapshot
        new = ended / "run" / "train_state.pt.tmp"
        new.write_bytes(b"a newer state")
        os.replace(new, ended / "run" / "train_state.pt")
    names = sorted(p.name for p in landed.iterdir())
    assert names == sorted(
        ["quality.jsonl", "train.log", "train_state.sha256"] + [f"train_state.pt.0{i}" for i in range(5)]
    )
    lease("give", tmp_path / "x", 5, 1, env={"LEASE": ended, **sizes}, ok=False)  # past the last part

    whl, cifar, carried = tmp_path / "whl", tmp_path / "cifar", tmp_path / "carry"
    whl.mkdir()  # no wheels: nothing to install here
    cifar.mkdir()
    zips = {
        name: rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for name, n in (("train.zip", 200_000), ("test.zip", 50_000))
    }
    for name, blob in zips.items():
        (cifar / name).write_bytes(blob)
    r = lease("carry", carried, landed, env={"WHEELS": whl, "CIFAR": cifar, **sizes})
    data, parts = sorted(carried.glob("data*")), sorted(carried.glob("state*"))
    assert len(data) == 2 and len(parts) == 3 and r.stdout.count("one call") == 5
    assert all(sum(f.stat().st_size for f in d.iterdir()) <= 130_000 for d in data + parts)

    fresh = {"LEASE": tmp_path / "fresh"}  # the next machine
    assert "1 of 2 pieces kept" in lease("data", data[0], env=fresh).stdout
    assert "0 wheels" in lease("data", data[1], env=fresh).stdout
    assert all((tmp_path / "fresh" / "cifar10" / n).read_bytes() == b for n, b in zips.items())
    for folder in parts[:-1]:
        assert "parts kept; carry the next" in lease("restore", folder, env=fresh).stdout
    assert "matches train_state.sha256" in lease("restore", parts[-1], env=fresh).stdout
    assert (tmp_path / "fresh" / "run" / "train_state.pt").read_bytes() == state

    # a damaged part is refused here and there
    damaged = parts[0] / "train_state.pt.00"
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    for folder in parts:
        r = lease("restore", folder, env={"LEASE": tmp_path / "other"}, ok=folder != parts[-1])
    assert "do not match" in r.stderr and r.stderr.count("\n") == 1
    (landed / "train_state.pt.01").write_bytes(b"short")
    r = lease("carry", carried, landed, env={"WHEELS": whl, "CIFAR": cifar, **sizes}, ok=False)
    assert "damaged" in r.stderr


def test_lease_hand_rolls_snapshots_and_collect_keeps_the_newest_whole_one(tmp_path):
    """`hand` gives a rolling snapshot's parts call by call; `collect` keeps the newest snapshot that came whole."""
    run = tmp_path / "m" / "run"
    run.mkdir(parents=True)
    env = {"LEASE": tmp_path / "m", "PART_BYTES": "1000"}
    rng = np.random.default_rng(1)
    states = [rng.integers(0, 256, 4500, dtype=np.uint8).tobytes() for _ in range(3)]  # 5 parts each

    def save(blob: bytes) -> None:  # the trainer's atomic rename
        (run / "train_state.pt.tmp").write_bytes(blob)
        os.replace(run / "train_state.pt.tmp", run / "train_state.pt")

    assert "no state saved yet" in lease("hand", tmp_path / "c0", env=env).stdout
    calls = []
    for i, blob in enumerate([states[0], None, states[1], None, None, states[2]]):  # None: no new save
        if blob is not None:
            save(blob)
        calls.append(tmp_path / f"c{i + 1}")
        lease("hand", calls[-1], 2, env=env)
    # calls 1-3 hand state 0 (2 + 2 + 1 parts); call 4 starts state 1's snapshot; call 6 finishes it
    assert sorted(p.name for p in calls[2].glob("train_state.pt.*")) == ["train_state.pt.04"]
    dest = tmp_path / "lease1"
    assert "whole" in lease("collect", dest, *calls[:5], env=env).stdout
    assert b"".join(p.read_bytes() for p in sorted(dest.glob("train_state.pt.*"))) == states[0]  # state 1 not whole
    lease("collect", dest, *calls, env=env)
    assert b"".join(p.read_bytes() for p in sorted(dest.glob("train_state.pt.*"))) == states[1]
    r = lease("collect", tmp_path / "none", calls[4], env=env, ok=False)
    assert "no snapshot came back whole" in r.stderr and r.stderr.count("\n") == 1


def test_lease_start_wait_stop_a_detached_run(tmp_path):
    fake = tmp_path / "python"  # stands in for the trainer: prints its arguments, saves and exits 130 on SIGTERM
    fake.write_text('#!/bin/bash\necho "args: $*"\ntrap "echo saved; exit 130" TERM\nwhile true; do sleep 0.1; done\n')
    fake.chmod(0o755)
    where = tmp_path / "lease"
    env = {"LEASE": where, "PYTHON": fake}
    lease("start", env=env, ok=False)  # no data yet
    (where / "cifar10").mkdir(parents=True)
    (where / "cifar10" / "train.zip").write_bytes(b"zip")
    (where / "run").mkdir()
    (where / "run" / "train_state.pt").write_bytes(b"state")
    try:
        assert "started pid" in lease("start", "--max-minutes", 20, env=env).stdout
        assert "a run is going" in lease("start", env=env, ok=False).stderr
        r = lease("wait", 1, env=env)
        assert r.stdout.startswith("running") and "--preset paper" in r.stdout and "--state-format portable" in r.stdout
        assert "--resume --max-minutes 20" in r.stdout
        r = lease("stop", 20, env=env)
        assert r.stdout.startswith("exited 130") and "saved" in r.stdout
    finally:
        pid = (where / "pid").read_text().strip() if (where / "pid").exists() else ""
        if pid:
            subprocess.run(["kill", pid], capture_output=True)


def quality_rows(folder: Path, steps, frechet) -> Path:
    folder.mkdir(parents=True)
    rows = [
        dict(step=s, images_seen=128 * s, frechet=f, largest_class_share=0.2, smallest_class_share=0.05, loss=1 / s)
        for s, f in zip(steps, frechet)
    ]
    (folder / "quality.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "quality.jsonl"


def test_plot_pretrain_joins_leases_draws_and_judges_flattening(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import plot_pretrain

    a = quality_rows(tmp_path / "lease1", [1000, 2000, 3000], [50.0, 20.0, 99.0])
    b = quality_rows(tmp_path / "lease2", [3000, 4000, 5000], [12.0, 10.0, 9.8])  # step 3000 again: this row wins
    rows = plot_pretrain.load([str(a), str(b)])
    assert [r["step"] for r in rows] == [1000, 2000, 3000, 4000, 5000]
    assert [r["lease"] for r in rows] == ["lease1", "lease1", "lease2", "lease2", "lease2"]
    assert rows[2]["frechet"] == 12.0
    flat, why = plot_pretrain.flattened(rows)  # 10.0 at step 4000 -> 9.8: 2% better
    assert flat is True and "2.0% better" in why
    steep = plot_pretrain.load([str(quality_rows(tmp_path / "lease3", [1000, 2000, 4000, 5000], [50, 30, 20, 10]))])
    flat, why = plot_pretrain.flattened(steep)  # 20 at step 4000 -> 10: 50% better
    assert flat is False and "still improving" in why and "50.0% better" in why
    mid = plot_pretrain.flattened(steep[:3] + [dict(steep[3], step=5000, frechet=19.5)])  # 20 at 4000 -> 19.5
    assert mid[0] is True
    late = plot_pretrain.load([str(quality_rows(tmp_path / "lease4", [9000, 10000], [20, 10]))])
    assert plot_pretrain.flattened(late)[0] is None  # no row as early as step 8000
    out = tmp_path / "curve.png"
    assert plot_pretrain.main([str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.stat().st_size > 1000 and "| 5,000 | 640,000 | 9.800 | 0.200 / 0.050 | 0.0002 | lease2 |" in printed
    assert "flattened: Frechet 10.000 at step 4000" in printed
