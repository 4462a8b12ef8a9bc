"""Where a pack's time goes: the shipped generator's two hot calls, timed per run in several forms.

A CIFAR update is dominated by two calls of the network: the sampler's forward (64 images, 20 times
an update) and the loss's forward and backward (64 samples x 4 draws = 256 images, once). This times
each call for K runs with their own parameters in the forms a pack could take:

* ``alone``: one run's call, eager (what `cifar_fpo.py` does), divided by nothing;
* ``alone-graph``: the same call replayed as a CUDA graph;
* ``vmap``: K runs through `torch.func.vmap` (today's pack: convolutions become grouped ones);
* ``vmap-graph``: the same replayed as a CUDA graph;
* ``loop``: K runs' calls one after another, eager;
* ``loop-graph``: the K calls replayed as one CUDA graph (each run's kernels are the run-alone ones,
  launched by the graph instead of by Python);
* ``-cl`` suffix: the inputs in channels-last layout;
* ``vmap-compile``: the mapped call through ``torch.compile`` (fused normalisation and activations).

Every row is ms per run per call, so "alone / row" is the speed-up a pack of that form can give those
calls (the update also has the sampler's Euler arithmetic, the rewards and Adam).

    python benchmarks/bench_pack_forms.py --packs 8 32 --json forms.json
    python benchmarks/bench_pack_forms.py --quick             # checks the script on a CPU
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch
import tyro
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cifar_update import sync  # noqa: E402

from fpo_utils.devices import pick_device, set_precision  # noqa: E402
from fpo_utils.unet import DEFAULT_MODEL, load_unet  # noqa: E402

FORMS = ("alone", "alone-graph", "vmap", "vmap-graph", "loop", "loop-graph", "loop-cl", "loop-graph-cl", "vmap-compile")


@dataclass
class Args:
    packs: Tuple[int, ...] = (8, 32)
    """Pack sizes K to time."""
    forms: Tuple[str, ...] = FORMS[:-1]
    """Forms to time (see the top of the file; vmap-compile, minutes of compiling, only when named)."""
    precision: str = "tf32"
    """fp32 or tf32."""
    sample_batch: int = 64
    """Images of a sampler call (app:cifar: 64)."""
    loss_batch: int = 256
    """Images of a loss call (64 samples x 4 draws)."""
    reps: int = 10
    """Timed repetitions of each call."""
    device: str = "auto"
    """auto, cpu or cuda."""
    quick: bool = False
    """Tiny sizes to check the script on a CPU."""
    json: Optional[str] = None
    """Write the rows to this JSON file."""


def timed(fn: Callable, reps: int, device) -> float:
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def graphed(fn: Callable, device) -> Callable:
    """`fn` (static inputs and outputs) captured once as a CUDA graph; the replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def calls(net, params, k: int, batch: int, backward: bool, form: str, device):
    """The call of `form` for K runs (one for the alone forms) on static inputs."""
    runs = 1 if form.startswith("alone") else k
    x = torch.randn(runs, batch, 3, 32, 32, device=device)
    if form.endswith("-cl"):
        x = torch.stack([xi.contiguous(memory_format=torch.channels_last) for xi in x])
    t = torch.rand(runs, batch, device=device)
    stacked = {n: p.detach().unsqueeze(0).repeat(runs, *[1] * p.dim()).requires_grad_(backward) for n, p in params}
    one = lambda p, xi, ti: functional_call(net, p, (xi, ti)).square().mean()  # noqa: E731

    mapped = torch.compile(vmap(one)) if form == "vmap-compile" else vmap(one)

    def run():
        if form.startswith("vmap"):  # as the pack: PyTorch's math attention where fused kernels refuse a mapped batch
            math = backward or device.type == "cpu"
            with sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext():
                losses = mapped(stacked, x, t)
        else:
            per_run = [{n: v[i] for n, v in stacked.items()} for i in range(runs)]
            losses = torch.stack([one(p, x[i], t[i]) for i, p in enumerate(per_run)])
        if backward:
            torch.autograd.grad(losses.sum(), list(stacked.values()))
        return losses

    return run, runs


def main(args: Args):
    device = pick_device(args.device)
    if args.quick:
        args.packs, args.sample_batch, args.loss_batch, args.reps = (2,), 2, 4, 1
        args.forms = tuple(f for f in args.forms if "graph" not in f)
    bad = [f for f in args.forms if f not in FORMS]
    if bad:
        raise ValueError(f"--forms {bad[0]!r} is not one of {', '.join(FORMS)}")
    set_precision(args.precision)
    torch.backends.cudnn.benchmark = device.type == "cuda"
    net = load_unet(DEFAULT_MODEL).to(device).eval()
    params = list(net.named_parameters())
    rows = []
    for k in args.packs:
        for call, batch, backward in (("sample", args.sample_batch, False), ("loss", args.loss_batch, True)):
            for form in args.forms:
                if "graph" in form and device.type != "cuda":
                    continue
                if form.startswith("alone") and k != args.packs[0]:
                    continue
                try:
                    with torch.set_grad_enabled(backward):
                        fn, runs = calls(net, params, k, batch, backward, form, device)
                        fn = graphed(fn, device) if "graph" in form else fn
                        ms = 1e3 * timed(fn, args.reps, device) / runs
                except Exception as err:  # a form the device or PyTorch cannot take: report, go on
                    print(f"K={k} {call} {form}: failed ({type(err).__name__}: {str(err)[:120]})", flush=True)
                    continue
                rows.append({"K": k if runs > 1 else 1, "call": call, "form": form, "ms_per_run": ms})
                print(f"K={rows[-1]['K']:>3} {call:>6} {form:>14}: {ms:8.3f} ms per run", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    for r in rows:
        alone = next((a["ms_per_run"] for a in rows if a["call"] == r["call"] and a["form"] == "alone"), None)
        r["vs_alone"] = alone / r["ms_per_run"] if alone else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\ndevice: {name}  torch {torch.__version__}  precision {args.precision}")
    for r in rows:
        vs = f"{r['vs_alone']:.2f}x" if r["vs_alone"] else "-"
        print(f"{r['call']:>6} | {r['form']:>14} | K {r['K']:>3} | {r['ms_per_run']:8.3f} ms/run | {vs}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
