"""Packed runs (cifar_fpo_pack.py, halving.py cifar-grid --pack) against the same runs alone.

A pack of runs that differ in weighting, seed, reward and stopping point must write, run by run, the
folders the single-run loop of cifar_fpo.py writes: the same files, metrics rows, summaries and
checkpoints. Everything that is not a floating-point number must be equal; numbers may differ by
float32 rounding (a batched kernel adds in another order): metrics, summaries, validation histories and
weighting states within RTOL = 1e-4 and ATOL = 1e-5 (measured on the CPU: at most 3e-6 absolute),
Adam's moments within MOMENT_ATOL = 1e-5 (measured: 1e-7 on the CPU; on an H100, whose kernels do not
give the same sums from one try to the next, once above 1e-6 in three tries). Parameters: where a gradient
is at rounding level, Adam's normalised step (up to the learning rate in size) has a direction set by
rounding, so the two runs may step such a parameter apart by up to twice the learning rate per update.
All but PARAM_OFF = 0.1% of the parameters must lie within PARAM_ATOL = the learning rate, and none beyond
that bound (measured after two updates at learning rate 1e-3: on the CPU at most 1.7e-4 apart; on an H200,
one weight of the tiny network 1.04e-3 apart in one try, and all 11 tries of this check passed; a wrong
seed, weighting or step moves most parameters by about twice the learning rate).
"""

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jsonl_records import read_jsonl, strip_times  # noqa: E402

import cifar_fpo  # noqa: E402
import cifar_fpo_pack as cifar_pack  # noqa: E402
import halving  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
MOMENT_ATOL = 1e-5
PARAM_ATOL = 1e-3  # the learning rate of the tiny_train fixture
PARAM_OFF, PARAM_MAX = 1e-3, 2 * PARAM_ATOL * 4  # opposite steps at each of the longest run's 4 updates

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU case runs in CI)"),
    ),
]

# Four runs that differ in what a grid varies and more: weighting profile, seed, reward, budget and stopping.
RUNS = {
    "fixed": dict(alpha=-2.0, seed=1, num_updates=4),
    "online": dict(weighting="online-ema", seed=2, reward="mixed-texture", num_updates=4),
    "explicit": dict(target="eps", estimator="explicit", seed=3, num_updates=2),
    "stop": dict(alpha=1.0, seed=4, early_stop=True, min_updates_before_stop=2, stop_patience=1, stop_min_delta=10.0),
}


def run_args(tiny_train, runs_dir, name, device="cpu", **kw):
    # adv_eps 0.01: with the paper's 1e-6, two nearly tied rewards in a group of two (the tiny model's
    # saturated images tie often) make the advantages a ratio of rounding errors, in any two executions
    return replace(
        tiny_train, runs_dir=str(runs_dir), run_name=name, device=device, save_samples=True, adv_eps=0.01, **kw
    )


def assert_close(a, b, where="", rtol=RTOL, atol=ATOL):
    """Equal structure and non-float values; floats within rtol/atol."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_close(a[k], b[k], f"{where}.{k}", rtol, atol)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{where}[{i}]", rtol, atol)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"{where}: {a} vs {b}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_params_close(a: dict, b: dict, where: str):
    """All but PARAM_OFF of the parameters within PARAM_ATOL, none beyond PARAM_MAX."""
    diffs = torch.cat([(b[k].float() - a[k].float()).abs().flatten() for k in a])
    off = int((diffs > PARAM_ATOL).sum())
    assert off <= PARAM_OFF * diffs.numel(), f"{where}: {off} of {diffs.numel()} parameters beyond {PARAM_ATOL}"
    assert float(diffs.max()) <= PARAM_MAX, f"{where}: a parameter {float(diffs.max()):.3g} apart"


def assert_same_folder(alone: Path, packed: Path, sessions: int = 1):
    """The run folder a packed run wrote against the one the run wrote alone; the packed run was
    started `sessions` times (each writes its own TensorBoard file)."""
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if "tfevents" not in p.name)  # noqa: E731
    assert files(packed) == files(alone)
    assert len(list(alone.glob("events.out.tfevents.*"))) == 1
    assert len(list(packed.glob("events.out.tfevents.*"))) == sessions
    settings = [json.loads((d / "args.json").read_text()) for d in (alone, packed)]
    for folder_settings in settings:  # where the folder is, and whether this session resumed it
        del folder_settings["runs_dir"], folder_settings["resume"]
    assert settings[1] == settings[0]
    rows_a, rows_p = strip_times(read_jsonl(alone / "metrics.jsonl")), strip_times(read_jsonl(packed / "metrics.jsonl"))
    assert [(r["kind"], r["update"]) for r in rows_p] == [(r["kind"], r["update"]) for r in rows_a]
    assert_close(rows_a, rows_p, f"{alone.name} metrics")
    assert_close(json.loads((alone / "summary.json").read_text()), json.loads((packed / "summary.json").read_text()))
    ca, cp = (torch.load(d / "checkpoints/last.pt", weights_only=False) for d in (alone, packed))
    assert ca.keys() == cp.keys() and list(ca["model"]) == list(cp["model"])
    for key in ("k", "status", "history", "weighting"):
        assert_close(ca[key], cp[key], f"{alone.name} checkpoint {key}")
    assert cp["optimizer"]["param_groups"] == ca["optimizer"]["param_groups"]
    assert_params_close(ca["model"], cp["model"], f"{alone.name} model")
    assert_close(ca["optimizer"]["state"], cp["optimizer"]["state"], f"{alone.name} Adam", atol=MOMENT_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_packed_runs_equal_the_runs_alone(tiny_train, tmp_path, device, monkeypatch):
    monkeypatch.setattr(cifar_pack, "LOSS_IMAGES", 16)  # 2 runs per backward pass: chunks of 2, then 2 and 1
    monkeypatch.setattr(cifar_pack, "FIT_IMAGES", 80)  # the online run's 12 bins of 16 images: 5, 5, then 2
    alone = [run_args(tiny_train, tmp_path / "alone", name, device, **kw) for name, kw in RUNS.items()]
    for args in alone:
        cifar_fpo.main(args)
    statuses = {a.run_name: json.loads((tmp_path / "alone" / a.run_name / "summary.json").read_text()) for a in alone}
    # not vacuous: the runs end at different updates, one of them by the stopping rule
    assert [statuses[n]["updates_done"] for n in RUNS] == [4, 4, 2, 2]
    assert statuses["stop"]["status"] == "stopped" and statuses["fixed"]["status"] == "finished"

    summaries = cifar_pack.main([replace(a, runs_dir=str(tmp_path / "packed")) for a in alone])
    assert [s["run_name"] for s in summaries] == list(RUNS)
    for name in RUNS:
        assert_same_folder(tmp_path / "alone" / name, tmp_path / "packed" / name)
        assert_same_diversity(tmp_path / "alone" / name, tmp_path / "packed" / name)


def assert_same_diversity(alone: Path, packed: Path):
    """Each packed run logs the sample diversity of its own validation images, as it does alone: the
    distinct classes exactly, the cosine distance within float32 rounding, and the same values at the peak."""
    rows = [[r for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "validation"] for d in (alone, packed)]
    keys = ("val_div_cos", "val_div_classes")
    assert rows[0] and all(set(keys) <= r.keys() for r in rows[0] + rows[1]), f"{alone.name}: no diversity"
    assert [r["val_div_classes"] for r in rows[1]] == [r["val_div_classes"] for r in rows[0]]
    assert_close([r["val_div_cos"] for r in rows[0]], [r["val_div_cos"] for r in rows[1]], f"{alone.name} div")
    peak = [json.loads((d / "summary.json").read_text()) for d in (alone, packed)]
    assert peak[1]["div_classes_at_peak"] == peak[0]["div_classes_at_peak"] is not None
    assert_close(peak[0]["div_cos_at_peak"], peak[1]["div_cos_at_peak"], f"{alone.name} div at peak")


def test_written_out_group_norm_equals_torchs_and_serves_a_pack(tiny_train, tmp_path, monkeypatch):
    """Where vmap cannot map torch's group_norm (PyTorch 2.11's CPU kernel), a pack writes it out: the same
    values as nn.GroupNorm for the U-Net's 3-d and 4-d inputs, and a packed run still equals the run alone."""
    torch.manual_seed(0)
    for shape in ((4, 32, 64), (4, 32, 8, 8)):
        ref = torch.nn.GroupNorm(8, 32, eps=1e-6)
        torch.nn.init.normal_(ref.weight), torch.nn.init.normal_(ref.bias)
        out = cifar_pack.WrittenOutGroupNorm(8, 32, eps=1e-6)
        out.load_state_dict(ref.state_dict())
        x = torch.randn(shape) * 3 + 1
        torch.testing.assert_close(out(x), ref(x), rtol=1e-5, atol=1e-5)

    monkeypatch.setattr(cifar_pack, "group_norm_maps", lambda device: False)
    runs = {"a": dict(seed=2, alpha=-1.0), "b": dict(seed=3, alpha=1.0)}
    alone = [run_args(tiny_train, tmp_path / "alone", name, num_updates=2, **kw) for name, kw in runs.items()]
    for args in alone:
        cifar_fpo.main(args)
    cifar_pack.main([replace(a, runs_dir=str(tmp_path / "packed")) for a in alone])
    for name in runs:
        assert_same_folder(tmp_path / "alone" / name, tmp_path / "packed" / name)


@pytest.mark.slow
def test_interrupted_pack_keeps_finished_runs_and_resumes_either_way(tiny_train, tmp_path, monkeypatch):
    runs = {"short": dict(seed=1, num_updates=2), "a": dict(seed=2, alpha=-1.0), "b": dict(seed=3, alpha=1.0)}
    alone = [run_args(tiny_train, tmp_path / "alone", name, **{"num_updates": 6, **kw}) for name, kw in runs.items()]
    for args in alone:
        cifar_fpo.main(args)

    row, sent = cifar_fpo.update_row, []

    def ctrl_c_at_update_3(k, *rest):  # one Ctrl-C while update 3 is being computed
        if k == 3 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return row(k, *rest)

    monkeypatch.setattr(cifar_fpo, "update_row", ctrl_c_at_update_3)
    packed = [replace(a, runs_dir=str(tmp_path / "packed")) for a in alone]
    summaries = {s["run_name"]: s for s in cifar_pack.main(packed)}
    monkeypatch.undo()
    assert summaries["short"]["status"] == "finished" and summaries["short"]["updates_done"] == 2
    for name in ("a", "b"):  # the update in progress finishes, then every run stops and checkpoints
        assert summaries[name]["status"] == "interrupted" and summaries[name]["updates_done"] == 4
        ckpt = torch.load(tmp_path / "packed" / name / "checkpoints/last.pt", weights_only=False)
        assert ckpt["k"] == 4
    assert_same_folder(tmp_path / "alone" / "short", tmp_path / "packed" / "short")

    # a packed run's checkpoint resumes in the single-run loop, and in a pack
    cifar_fpo.main(replace(packed[1], resume=True))
    cifar_pack.main([replace(packed[2], resume=True)])
    for name in ("a", "b"):
        assert_same_folder(tmp_path / "alone" / name, tmp_path / "packed" / name, sessions=2)


def test_runs_pack_only_with_the_shared_settings(tiny_train):
    runs = [replace(tiny_train, run_name=f"r{i}", seed=i) for i in range(5)]
    runs[1] = replace(runs[1], batch_size=8)
    runs[3] = replace(runs[3], reward="mixed-texture", alpha=-2.0, num_updates=3)  # may differ within a pack
    assert cifar_pack.groups(runs, 2) == [[0, 2], [3, 4], [1]]
    resolved = [cifar_fpo.resolve_args(a) for a in runs]
    with pytest.raises(ValueError, match="r0 and r1 cannot share a pack: batch_size: 4 vs 8") as err:
        cifar_pack.check_packable(resolved)
    assert "\n" not in str(err.value)
    cifar_pack.check_packable([resolved[i] for i in (0, 2, 3, 4)])


def test_bf16_packs_are_refused_on_cuda(tiny_train, monkeypatch):
    monkeypatch.setattr(cifar_pack, "pick_device", lambda name: torch.device("cuda"))
    args = cifar_fpo.resolve_args(replace(tiny_train, precision="bf16", device="auto"))
    with pytest.raises(ValueError, match="--precision bf16 cannot be packed on CUDA.*use fp32 or tf32"):
        cifar_pack.check_packable([args])
    cifar_pack.check_packable([replace(args, precision="tf32")])


def grid(tiny_train, out_dir, pack):
    spec = halving.CifarGrid(
        alphas=(0.0, -1.0),
        seeds=(5, 6),
        rewards=("red-patch",),
        out_dir=str(out_dir),
        name="g",
        ray=False,
        threads=1,
        pack=pack,
        train=replace(tiny_train, num_updates=4, adv_eps=0.01),  # adv_eps: see run_args
    )
    return halving.run_grid(spec)


@pytest.mark.slow
def test_grid_with_packs_equals_the_grid_without(tiny_train, tmp_path):
    one = grid(tiny_train, tmp_path / "one", 1)
    packed = grid(tiny_train, tmp_path / "packed", 3)  # a pack of 3 runs and a pack of 1
    assert packed["run_info"]["pack"] == 3 and packed["failures"] == []
    assert_close(
        [{k: r[k] for k in r if k != "run"} for r in one["runs"]],
        [{k: r[k] for k in r if k != "run"} for r in packed["runs"]],
    )
    assert_close(one["table"], packed["table"])
    for r in one["runs"]:
        assert_same_folder(Path(r["run"]), tmp_path / "packed" / "g" / "arms" / Path(r["run"]).name)
    stamp = (tmp_path / "packed/g/arms" / Path(one["runs"][0]["run"]).name / "metrics.jsonl").stat().st_mtime_ns
    again = grid(tiny_train, tmp_path / "packed", 3)  # every run has ended: nothing to train
    assert again["runs"] == packed["runs"]
    assert (tmp_path / "packed/g/arms" / Path(one["runs"][0]["run"]).name / "metrics.jsonl").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "abc"])
def test_bad_pack_values_are_one_line_errors(value, tmp_path):
    with pytest.raises(ValueError, match=f"--pack '{value}' is not allowed: .*whole number >= 1"):
        halving.main(["cifar-grid", "--pack", value, "--out-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--pack 0 is not allowed"):
        halving.run_grid(halving.CifarGrid(pack=0, out_dir=str(tmp_path)))
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_pack_value_on_the_command_line(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "halving.py"), "cifar-grid", "--pack", "two"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --pack 'two' is not allowed: give the runs per pack, a whole number >= 1 (1: no packs)"
    ]
