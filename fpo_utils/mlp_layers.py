"""The flow actor's MLP read as a list of layers another implementation can mirror (NumPy, Triton, JAX).

``FlowActor.net`` (robot_fpo.py) is an ``nn.Sequential`` whose first Linear reads
``[obs, x_t, cos(freqs t), sin(freqs t)]``. :func:`mlp_layers` gives its modules as ``nn.Linear`` objects and
activation names, and refuses, in one line naming it, any module whose function it does not know (a LayerNorm,
a Dropout, a subclass of a known module, a custom module), so that a copy of the sampler never computes
something other than the actor.
"""

from __future__ import annotations

import torch.nn as nn

from fpo_utils.runfolder import RunError

# Exact module types (a subclass may change ``forward``) -> activation names.
ACTIVATIONS = {nn.SiLU: "silu", nn.Tanh: "tanh", nn.ReLU: "relu", nn.GELU: "gelu"}


def activation_name(m: nn.Module) -> str | None:
    """``silu``, ``tanh``, ``relu``, ``gelu`` (erf) or ``gelu_tanh`` for those modules, else None."""
    name = ACTIVATIONS.get(type(m))
    if name == "gelu" and m.approximate == "tanh":
        return "gelu_tanh"
    return name


def mlp_layers(actor: nn.Module, who: str, names: tuple[str, ...] = ("silu", "tanh", "relu", "gelu", "gelu_tanh")):
    """``actor.net`` as a list of ``nn.Linear`` modules and activation names (those in ``names``); a one-line
    RunError, ``who`` cannot mirror ..., for any other module, or for a net that does not start with a Linear."""
    net = getattr(actor, "net", None)
    if type(net) is not nn.Sequential:
        raise RunError(f"{who} cannot mirror actor.net of type {type(net).__name__}; it takes an nn.Sequential")
    known = ", ".join(["Linear", *sorted({_module_name(n) for n in names})])
    layers = []
    for i, m in enumerate(net):
        name = activation_name(m)
        if type(m) is nn.Linear:
            layers.append(m)
        elif name in names:
            layers.append(name)
        else:
            what = "GELU(approximate='tanh')" if name == "gelu_tanh" else type(m).__name__
            raise RunError(f"{who} cannot mirror actor.net[{i}] ({what}); it mirrors {known} layers")
    if not layers or not isinstance(layers[0], nn.Linear):
        raise RunError(f"{who} cannot mirror this actor: actor.net must start with the Linear that reads [obs, x_t, t]")
    return layers


def _module_name(name: str) -> str:
    return {"silu": "SiLU", "tanh": "Tanh", "relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU"}[name]
