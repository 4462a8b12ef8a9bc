"""Equivalence of fpo_utils.unet.UNet2D with diffusers' UNet2DModel, and the checkpoint helpers.

A randomly initialised diffusers model is saved in its own format, loaded with `load_unet`, and
both networks must agree on random images and random fractional timesteps.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from fpo_utils import unet as cf

SMALL = dict(
    sample_size=16,
    block_out_channels=(32, 64),
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    layers_per_block=1,
    norm_num_groups=8,
    attention_head_dim=16,
)
# Settings that change outputs but not shapes, each away from diffusers' default.
VARIANT = dict(
    flip_sin_to_cos=False,
    freq_shift=1,
    norm_eps=0.1,
    downsample_padding=0,
    attention_head_dim=None,
    mid_block_scale_factor=math.sqrt(2.0),
    center_input_sample=True,
)
DDPM_CIFAR10 = dict(
    sample_size=32,
    block_out_channels=(128, 256, 256, 256),
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    layers_per_block=2,
    attention_head_dim=None,
    flip_sin_to_cos=False,
    freq_shift=1,
    downsample_padding=0,
    norm_eps=1e-6,
)


def diffusers_unet(**cfg):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    ref = diffusers.UNet2DModel(**cfg).eval()
    # Random, non-zero GroupNorm affines so a misplaced norm cannot hide behind weight=1, bias=0.
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.GroupNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.2)
    return ref


def inputs(size, n=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.rand(n, generator=g) * 1000.0


def assert_same(out, ref):
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@torch.no_grad()
@pytest.mark.parametrize(
    "extra",
    [
        {},
        VARIANT,
        dict(add_attention=False, time_embedding_dim=96, attn_norm_num_groups=4, dropout=0.3),
        dict(mid_block_type=None, layers_per_block=2, attention_head_dim=8),
        dict(
            block_out_channels=(16, 32, 32),
            down_block_types=("AttnDownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D", "AttnUpBlock2D"),
            norm_num_groups=4,
        ),
    ],
    ids=["small", "variant", "no-mid-attn", "no-mid", "three-levels"],
)
def test_matches_diffusers(tmp_path, extra):
    ref = diffusers_unet(**{**SMALL, **extra})
    ref.save_pretrained(tmp_path)
    net = cf.load_unet(tmp_path)
    assert list(net.state_dict()) == list(ref.state_dict())
    assert not net.training
    x, t = inputs(16)
    assert_same(net(x, t), ref(x, t).sample)
    # A 0-d timestep is broadcast over the batch.
    assert_same(net(x, t[0]), ref(x, t[0]).sample)


@torch.no_grad()
@pytest.mark.parametrize("key", sorted(VARIANT))
def test_misread_config_is_detected(tmp_path, key):
    """Building the network with one setting at its diffusers default must change the output,
    so the equivalence test above would catch a loader that ignored that setting."""
    ref = diffusers_unet(**{**SMALL, **VARIANT})
    ref.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[key] = cf.UNET_DEFAULTS[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    x, t = inputs(16)
    want = ref(x, t).sample
    got = cf.load_unet(tmp_path)(x, t)
    assert (got - want).abs().max() > 1e-3 * want.abs().max()


@torch.no_grad()
def test_ddpm_cifar10_layout(tmp_path):
    """The generator architecture of app:cifar in google/ddpm-cifar10-32's diffusers layout."""
    ref = diffusers_unet(**DDPM_CIFAR10)
    ref.save_pretrained(tmp_path)
    net = cf.load_unet(tmp_path)
    assert sum(p.numel() for p in net.parameters()) == 35_746_307
    assert len(net.state_dict()) == 328
    x, t = inputs(32)
    assert_same(net(x, t), ref(x, t).sample)


@torch.no_grad()
def test_bin_legacy_names_and_unet_subfolder(tmp_path):
    ref = diffusers_unet(**SMALL)
    ref.save_pretrained(tmp_path / "bin", safe_serialization=False)
    assert (tmp_path / "bin" / "diffusion_pytorch_model.bin").is_file()
    x, t = inputs(16)
    want = ref(x, t).sample
    assert_same(cf.load_unet(tmp_path / "bin")(x, t), want)
    # Old diffusers checkpoints name the attention projections query/key/value/proj_attn.
    old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    state = {}
    for k, v in ref.state_dict().items():
        for new, legacy in old.items():
            k = k.replace(f".{new}.", f".{legacy}.")
        state[k] = v
    assert any(".proj_attn." in k for k in state)
    pipe = tmp_path / "pipe" / "unet"
    pipe.mkdir(parents=True)
    (pipe / "config.json").write_text((tmp_path / "bin" / "config.json").read_text())
    torch.save(state, pipe / "diffusion_pytorch_model.bin")
    assert_same(cf.load_unet(tmp_path / "pipe")(x, t), want)


@torch.no_grad()
def test_save_unet_round_trip(tmp_path):
    torch.manual_seed(0)
    net = cf.UNet2D.from_config({**SMALL, "fpo_convention": "t"}).eval()
    x, t = inputs(16)
    cf.save_unet(net, tmp_path / "fp32", dtype=torch.float32)
    back = cf.load_unet(tmp_path / "fp32")
    assert back.convention == "t"
    assert torch.equal(back(x, t), net(x, t))
    cf.save_unet(net, tmp_path / "fp16")
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "fp16" / "diffusion_pytorch_model.safetensors"))
    assert all(v.dtype == torch.float16 for v in state.values())
    half = cf.load_unet(tmp_path / "fp16")
    assert next(half.parameters()).dtype == torch.float32
    ref = net(x, t)
    assert (half(x, t) - ref).abs().max() < 1e-2 * ref.abs().max()
    # diffusers itself reads the saved folder and computes the same function.
    diffusers = pytest.importorskip("diffusers")
    theirs = diffusers.UNet2DModel.from_pretrained(tmp_path / "fp32").eval()
    assert_same(theirs(x, t).sample, ref)


class Oracle(torch.nn.Module):
    """Stands in for a perfect network: records the timestep and returns a fixed answer."""

    def __init__(self, answer):
        super().__init__()
        self.answer, self.seen = answer, None

    def forward(self, x, timestep):
        self.seen = timestep
        return self.answer


def test_velocity_conventions_hand_formulas():
    g = torch.Generator().manual_seed(0)
    x, eps = torch.randn(3, 3, 4, 4, generator=g), torch.randn(3, 3, 4, 4, generator=g)
    t = torch.tensor([0.1, 0.5, 0.9])
    x_t = (1 - t)[:, None, None, None] * eps + t[:, None, None, None] * x
    # "sigma": a perfect checkpoint outputs noise - data at timestep 1000 * (1 - t).
    sig = Oracle(eps - x)
    torch.testing.assert_close(cf.velocity(sig, x_t, t, "sigma"), x - eps)
    torch.testing.assert_close(sig.seen, torch.tensor([900.0, 500.0, 100.0]))
    # "t": a perfect checkpoint outputs data - noise at timestep 1000 * t.
    tee = Oracle(x - eps)
    torch.testing.assert_close(cf.velocity(tee, x_t, t, "t"), x - eps)
    torch.testing.assert_close(tee.seen, torch.tensor([100.0, 500.0, 900.0]))
    with pytest.raises(ValueError, match="convention"):
        cf.velocity(sig, x_t, t, "eps")


@torch.no_grad()
def test_velocity_reads_stored_convention():
    torch.manual_seed(0)
    x, _ = inputs(16)
    t = torch.tensor([0.25, 0.75])
    net = cf.UNet2D.from_config(SMALL).eval()
    assert net.convention == "sigma"
    torch.testing.assert_close(cf.velocity(net, x, t), -net(x, 1000 * (1 - t)))
    net.config["fpo_convention"] = "t"
    torch.testing.assert_close(cf.velocity(net, x, t), net(x, 1000 * t))


@torch.no_grad()
def test_sigma_convention_matches_diffusers_flow_sampler():
    """Euler in flow time with `velocity(..., "sigma")` reproduces diffusers'
    FlowMatchEulerDiscreteScheduler driving the same checkpoint."""
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers_unet(**SMALL)
    net = cf.UNet2D.from_config(dict(ref.config)).eval()
    net.load_state_dict(ref.state_dict())
    sched = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    sched.set_timesteps(5)
    noise, _ = inputs(16)
    x_ref = noise.clone()
    for ts in sched.timesteps:
        x_ref = sched.step(ref(x_ref, ts).sample, ts, x_ref).prev_sample
    ts_flow = 1.0 - sched.sigmas  # flow times 0 -> 1
    x = noise.clone()
    for t0, t1 in zip(ts_flow[:-1], ts_flow[1:]):
        x = x + (t1 - t0) * cf.velocity(net, x, t0, "sigma")
    assert_same(x, x_ref)


def no_network(monkeypatch):
    """Offline mode for huggingface_hub (already imported or not) and a guard that fails any connection."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("this test allows no network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = pytest.importorskip("huggingface_hub", reason="the hub look-ups need huggingface_hub (diffusers brings it)")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    return hub


def test_resolve_model(tmp_path, monkeypatch):
    hub = no_network(monkeypatch)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        cf.resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"download someone/no-such-model-x1 into ./weights/no-such-model-x1") as err:
        cf.resolve_model("someone/no-such-model-x1")
    # one line, naming why the hub gave nothing
    assert "\n" not in str(err.value) and "LocalEntryNotFoundError" in str(err.value)
    folder = tmp_path / "weights" / "no-such-model-x1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert cf.resolve_model("someone/no-such-model-x1") == str(folder)
    assert cf.resolve_model(str(folder)) == str(folder)


def test_resolve_model_reads_the_hugging_face_cache_offline(tmp_path, monkeypatch):
    """A model already in the local Hugging Face cache resolves and loads with HF_HUB_OFFLINE=1 and no network."""
    hub = no_network(monkeypatch)
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    net = cf.UNet2D.from_config(SMALL).eval()
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someone--tiny-cached-unet"
    cf.save_unet(net, repo / "snapshots" / rev, dtype=torch.float32)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    folder = cf.resolve_model("someone/tiny-cached-unet")
    assert Path(folder) == repo / "snapshots" / rev
    x, t = inputs(16)
    with torch.no_grad():
        assert torch.equal(cf.load_unet(folder)(x, t), net(x, t))
    with pytest.raises(ValueError, match="someone/not-cached") as err:
        cf.resolve_model("someone/not-cached")
    assert "\n" not in str(err.value) and "./weights/not-cached" in str(err.value)


def test_weights_folder_without_weights_names_the_fetch_command(tmp_path):
    """A weights/<name> folder whose weights file is kept on the results-data branch says how to fetch it."""
    from fpo_utils.runfolder import EXIT_BAD_FILE, RunError

    folder = tmp_path / "weights" / "cfm-big"
    cf.save_unet(cf.UNet2D.from_config(SMALL), folder)
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(RunError) as err:
        cf.load_unet(folder)
    assert err.value.code == EXIT_BAD_FILE and "\n" not in str(err.value)
    assert str(err.value).endswith("fetch them with: python benchmarks/results_data.py fetch weights/cfm-big")
    elsewhere = tmp_path / "mine"
    cf.save_unet(cf.UNet2D.from_config(SMALL), elsewhere)
    (elsewhere / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(RunError, match="no weights in") as err:
        cf.load_unet(elsewhere)
    assert "results_data.py" not in str(err.value)


def test_save_unet_leaves_no_temporary_file_and_overrides_config(tmp_path):
    net = cf.UNet2D.from_config({**SMALL, "dropout": 0.1})
    cf.save_unet(net, tmp_path, dropout=0.0, _fpo_pretrain={"dropout": 0.1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dropout"] == 0.0 and config["_fpo_pretrain"] == {"dropout": 0.1}
    assert cf.load_unet(tmp_path).config["dropout"] == 0.0


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(down_block_types=("DownBlock2D", "CrossAttnDownBlock2D")), "down_block_types"),
        (dict(up_block_types=("AttnSkipUpBlock2D", "UpBlock2D")), "up_block_types"),
        (dict(class_embed_type="timestep"), "class_embed_type"),
        (dict(num_class_embeds=10), "num_class_embeds"),
        (dict(resnet_time_scale_shift="scale_shift"), "resnet_time_scale_shift"),
        (dict(time_embedding_type="fourier"), "time_embedding_type"),
        (dict(upsample_type="resnet"), "upsample_type"),
        (dict(act_fn="gelu"), "act_fn"),
        (dict(mid_block_type="UNetMidBlock2DCrossAttn"), "mid_block_type"),
        (dict(block_out_channels=(32, 64, 64)), "block_out_channels"),
        (dict(cross_attention_dim=64), "cross_attention_dim"),
        (dict(_class_name="UNet2DConditionModel"), "_class_name"),
        (dict(fpo_convention="eps"), "fpo_convention"),
        (dict(attention_head_dim=128), "attention_head_dim"),
    ],
)
def test_unsupported_config(bad, key):
    with pytest.raises(ValueError, match=key) as err:
        cf.UNet2D.from_config({**SMALL, **bad})
    assert "\n" not in str(err.value)


def test_harmless_config_keys_are_ignored():
    torch.manual_seed(0)
    a = cf.UNet2D.from_config(SMALL)
    torch.manual_seed(0)
    extra = {
        "_diffusers_version": "0.35.1",
        "_name_or_path": "x",
        "sample_size": 64,
        "num_train_timesteps": 1000,
        "option_from_a_later_release": None,
    }
    b = cf.UNet2D.from_config({**SMALL, **extra})
    x, t = inputs(16)
    with torch.no_grad():
        assert torch.equal(a(x, t), b(x, t))


def test_cifar_fpo_reexports_the_loader_and_saver():
    import cifar_fpo

    assert cifar_fpo.load_unet is cf.load_unet and cifar_fpo.save_unet is cf.save_unet


@pytest.mark.parametrize("damage", ["truncate", "no-config", "bad-config"])
def test_damaged_model_folder_is_a_one_line_bad_file_error(tmp_path, damage):
    from fpo_utils.runfolder import EXIT_BAD_FILE, RunError

    cf.save_unet(cf.UNet2D.from_config(SMALL), tmp_path, dtype=torch.float32)
    weights = tmp_path / "diffusion_pytorch_model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "no-config":
        (tmp_path / "config.json").unlink()
    else:
        (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RunError) as err:
        cf.load_unet(tmp_path)
    assert err.value.code == EXIT_BAD_FILE and "\n" not in str(err.value) and str(tmp_path) in str(err.value)
