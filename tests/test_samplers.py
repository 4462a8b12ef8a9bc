"""The rollout samplers (fpo_utils/samplers.py, the JAX sampler of fpo_utils/playground_env.py) against
``FlowActor.sample``: each computes the same actions for every activation it mirrors, or refuses at construction
in one line naming the module it cannot mirror; ``check_sampler`` catches a sampler that differs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn

import robot_fpo as R
from fpo_utils.playground_env import ScanRollout, jax_sampler
from fpo_utils.runfolder import RunError
from fpo_utils.samplers import (
    NumpySampler,
    check_sampler,
    fused_forward,
    fused_supported,
    pick_sampler,
    why_not_fused,
    why_not_numpy,
)

HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
OBS, D, STEPS = 7, 3, 10
ACTIVATIONS = {
    "SiLU": nn.SiLU,
    "Tanh": nn.Tanh,
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "GELU-tanh": lambda: nn.GELU(approximate="tanh"),
}
if importlib.util.find_spec("scipy") is None:  # NumPy's exact GELU needs scipy's erf
    ACTIVATIONS.pop("GELU")


class SiLUVariant(nn.SiLU):  # a subclass may change forward: not mirrored
    pass


class Scale(nn.Module):
    def forward(self, h):
        return 2 * h


def actor_with(make_act=nn.SiLU, hidden: int = 32, layers: int = 3) -> R.FlowActor:
    torch.manual_seed(0)
    actor = R.FlowActor(OBS, D, hidden, layers, 8, 0.5, 1.0)
    for i, m in enumerate(actor.net):
        if not isinstance(m, nn.Linear):
            actor.net[i] = make_act()
    return actor


def probe(n: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, OBS, generator=g), torch.randn(n, D, generator=g)


def inserted(module: nn.Module) -> R.FlowActor:
    """A SiLU actor with ``module`` after its second Linear layer."""
    actor = actor_with()
    actor.net = nn.Sequential(*actor.net[:3], module, *actor.net[3:])
    return actor


def assert_one_line_naming(err: pytest.ExceptionInfo, name: str) -> None:
    assert name in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_numpy_sampler_equals_the_actors_sampler(act):
    actor = actor_with(ACTIVATIONS[act])
    obs, x0 = probe()
    want = actor.sample(obs, x0, STEPS)
    sampler = pick_sampler(actor, torch.device("cpu"), False, False, False)
    assert isinstance(sampler, NumpySampler) and why_not_numpy(actor) == ""
    torch.testing.assert_close(sampler(obs, x0, STEPS), want, atol=1e-5, rtol=1e-5)
    assert check_sampler(sampler, actor, OBS, D, STEPS, "cpu", 1e-5) <= 1e-5


def test_numpy_sampler_follows_an_activation_swapped_after_construction():
    actor = actor_with(nn.SiLU)
    sampler = NumpySampler(actor)
    obs, x0 = probe()
    actor.net[1] = nn.Tanh()  # one layer changed in place: refresh reads the layers again
    sampler.refresh()
    torch.testing.assert_close(sampler(obs, x0, STEPS), actor.sample(obs, x0, STEPS), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "module, name",
    [(nn.LayerNorm(32), "LayerNorm"), (nn.Dropout(0.1), "Dropout"), (Scale(), "Scale"), (SiLUVariant(), "SiLUVariant")],
)
def test_numpy_sampler_refuses_a_module_it_cannot_mirror_at_construction(module, name):
    actor = inserted(module)
    with pytest.raises(RunError) as err:
        NumpySampler(actor)
    assert_one_line_naming(err, name)
    assert "actor.net[3]" in str(err.value)
    assert name in why_not_numpy(actor)
    # the trainer's choice on the CPU falls back to the actor's own sampler, which computes the same thing
    assert pick_sampler(actor, torch.device("cpu"), False, False, False) == actor.sample


def test_a_refresh_after_an_unmirrorable_edit_refuses():
    actor = actor_with()
    sampler = NumpySampler(actor)
    actor.net[1] = nn.ELU()
    with pytest.raises(RunError) as err:
        sampler.refresh()
    assert_one_line_naming(err, "ELU")


class ShiftedTime(R.FlowActor):
    """A FlowActor whose time embedding reads 1 - t: no module type changes, so only a probe can tell."""

    def forward(self, obs, x_t, t):
        return super().forward(obs, x_t, 1.0 - t)

    @torch.no_grad()
    def sample(self, obs, x0, steps):
        x = x0
        for k in range(steps):
            x = x + self(obs, x, torch.full(x.shape[:-1], k / steps)) / steps
        return x


def test_check_sampler_catches_a_sampler_that_no_longer_mirrors_the_actor():
    torch.manual_seed(0)
    actor = ShiftedTime(OBS, D, 32, 3, 8, 0.5, 1.0)
    with pytest.raises(RunError) as err:
        check_sampler(NumpySampler(actor), actor, OBS, D, STEPS, "cpu", 1e-4)
    assert_one_line_naming(err, "NumpySampler differs from FlowActor.sample")
    # a sampler that computes what the actor computes passes
    assert check_sampler(lambda o, x, s: actor.sample(o, x, s).clone(), actor, OBS, D, STEPS, "cpu", 0.0) == 0.0


def test_check_sampler_refuses_a_wrong_shape():
    actor = actor_with()
    with pytest.raises(RunError) as err:
        check_sampler(lambda o, x, s: x[:, :1], actor, OBS, D, STEPS, "cpu", 1e-4)
    assert_one_line_naming(err, "shape")


def test_the_triton_path_says_why_it_does_not_apply():
    silu, tanh = actor_with(nn.SiLU), actor_with(nn.Tanh)
    assert fused_supported(silu) == HAS_TRITON
    assert not fused_supported(tanh) and fused_forward(tanh, True) is None
    reason = why_not_fused(tanh)
    assert "\n" not in reason
    if not HAS_TRITON:
        assert "Triton" in reason
        return
    assert "Tanh" in reason
    assert "64" in why_not_fused(actor_with(nn.SiLU, hidden=64))  # computable, but torch's path is used there
    assert "hidden-to-hidden" in why_not_fused(actor_with(nn.SiLU, layers=1))
    assert "power-of-two" in why_not_fused(actor_with(nn.SiLU, hidden=24))
    assert "LayerNorm" in why_not_fused(inserted(nn.LayerNorm(32)))
    from fpo_utils.flow_triton import FusedSampler

    with pytest.raises(RunError) as err:
        FusedSampler(tanh)
    assert_one_line_naming(err, "Tanh")


@pytest.mark.parametrize(
    "module, name", [(nn.LayerNorm(32), "LayerNorm"), (nn.Dropout(0.1), "Dropout"), (SiLUVariant(), "SiLUVariant")]
)
def test_the_scanned_rollout_refuses_a_module_it_cannot_mirror_at_construction(module, name):
    actor = inserted(module)
    with pytest.raises(RunError) as err:  # before any environment or JAX is touched
        ScanRollout(None, actor, None, STEPS, "tanh", 0.0, 1.0)
    assert_one_line_naming(err, name)
    with pytest.raises(RunError):
        jax_sampler(actor, STEPS)


@pytest.mark.skipif(not HAS_JAX, reason="needs jax (pip install -e '.[playground]')")
@pytest.mark.parametrize("act", ["SiLU", "Tanh", "ReLU", "GELU-tanh", "exact GELU"])
def test_the_scanned_rollouts_jax_sampler_equals_the_actors_sampler(act):
    import jax
    import jax.numpy as jnp

    actor = actor_with(nn.GELU if act == "exact GELU" else ACTIVATIONS[act])
    obs, x0 = probe()
    sample = jax.jit(jax_sampler(actor, STEPS))
    cpu = jax.devices("cpu")[0]
    put = lambda t: jax.device_put(jnp.asarray(t.detach().numpy()), cpu)  # noqa: E731
    ws = [(put(m.weight), put(m.bias)) for m in actor.net if isinstance(m, nn.Linear)]

    def jax_sampled(o, x, steps):
        assert steps == STEPS
        return torch.from_numpy(jax.device_get(sample(ws, put(actor.freqs), put(o), put(x))).copy())

    torch.testing.assert_close(jax_sampled(obs, x0, STEPS), actor.sample(obs, x0, STEPS), atol=1e-5, rtol=1e-5)
    assert check_sampler(jax_sampled, actor, OBS, D, STEPS, "cpu", 1e-5) <= 1e-5
