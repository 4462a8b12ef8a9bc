"""robot_fpo.py with its rollout, update and evaluation swapped for faster phases that compute the same thing.

It imports the reference's flags, networks, losses, GAE and loop (``robot_fpo.main``) and replaces three phases:

* the rollout: each step's torch work on fixed buffers (``policy_half`` before the environment, ``record_half``
  after it), replayed as two captured CUDA graphs; on the CPU the Euler sampler as float32 NumPy; with
  ``--fused`` the flow MLP and its sampler as Triton kernels; on Playground with ``--scan-rollout`` all steps as
  one JAX ``lax.scan``; the batch is then made by the reference's ``make_batch``;
* the update: the reference's minibatch step (``minibatch_losses`` + ``gradient_step``, with ``--compile`` its
  losses compiled first) captured once as a CUDA graph and replayed for every minibatch;
* evaluation: the reference's, with the fast sampler.

Each sampler is checked against ``FlowActor.sample`` on a probe batch at setup and a mismatch stops the run with one
line, so an edit to the reference's actor that a fast path cannot mirror is never trained silently. Tests:
tests/test_robot_fpo_fast.py (one update and one rollout equal the reference's). Flags: robot_fpo.py's, plus the
five below. The ``fpo`` preset turns on the first four, ``fpopp-locomotion`` compiled losses. ``--bf16`` is the one
flag that changes the numbers (the trained actor's products in bfloat16; its update lands within bfloat16 rounding
of the float32 one, tested): it is never a preset's default.

    python robot_fpo_fast.py --preset fpo --backend playground --env-id WalkerRun --alpha-eps 0.5
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import partial

import torch

import robot_fpo as R
from fpo_utils import robot_bookkeeping as book
from fpo_utils.envs import normalize_obs
from fpo_utils.graphs import GraphedCall, GraphedStep, rollout_tensors
from fpo_utils.runfolder import RunError, cli
from fpo_utils.samplers import check_sampler, fused_forward, pick_sampler, why_not_fused


@dataclass
class Args(R.Args):
    cuda_graph: bool = True  # on CUDA, replay each rollout step's torch work and each minibatch step as captured graphs
    compile: bool = False  # with the captured minibatch step, ``torch.compile`` its losses first (fpo preset)
    fused: bool = False  # on CUDA, the flow MLP and its Euler sampler as Triton kernels (fpo preset)
    scan_rollout: bool = False  # Playground: the rollout's steps as one JAX scan with a JAX sampler (fpo preset)
    bf16: bool = False  # on CUDA, the trained actor's products in bfloat16 (autocast); its output and losses float32


PRESETS = {name: Args(**asdict(preset)) for name, preset in R.PRESETS.items()}
PRESETS["fpo"] = Args(**{**asdict(R.PRESETS["fpo"]), "compile": True, "fused": True, "scan_rollout": True})
PRESETS["fpopp-locomotion"] = Args(**{**asdict(R.PRESETS["fpopp-locomotion"]), "compile": True})
MAY_CHANGE = R.MAY_CHANGE + ("cuda_graph", "compile", "fused", "scan_rollout")  # bf16 changes the numbers: fixed


@dataclass
class State(R.State):
    sampler: object = None  # (obs, x0, steps) -> x in the rollout (fpo_utils.samplers.pick_sampler)
    eval_sampler: object = None  # the same for the evaluated actor (the EMA copy if any)
    roll: dict = None  # the rollout's tensors at fixed addresses (buffers, the environment's outputs, step ``k``)
    act: object = None  # () -> None: rollout step k before the environment (policy_half, graphed on CUDA)
    record: object = None  # () -> None: rollout step k after the environment (record_half, graphed on CUDA)
    graph: GraphedStep | None = None  # the captured minibatch step, built on first use
    graph_moments: list | None = None  # which optimiser moments the graph steps (a checkpoint load replaces them)
    scan: object = None  # (roll, T) -> None: the rollout's T steps as one JAX program (--scan-rollout)


def build_state(args: Args, device: torch.device) -> State:
    """The reference's state, its observations and return accumulator moved into the fixed rollout tensors, the
    samplers chosen and checked, and on CUDA the fused optimiser (it steps inside a captured graph)."""
    ref = R.build_state(args, device)
    state = State(**{f.name: getattr(ref, f.name) for f in fields(R.State)})
    cuda = device.type == "cuda"
    graphs, actor = args.cuda_graph and cuda, state.actor
    if cuda:
        g = state.optimizer.param_groups[0]
        params = [p for group in state.optimizer.param_groups for p in group["params"]]
        kw = dict(lr=g["lr"], eps=g["eps"], weight_decay=g["weight_decay"])
        state.optimizer = torch.optim.AdamW(params, **kw, fused=True)
    obs_dim, evaluated = state.envs.route.actor_dim, state.ema if state.ema is not None else actor
    if args.bf16 and (not cuda or args.fused and not why_not_fused(actor)):
        raise RunError("--bf16 needs CUDA and torch's actor (--no-fused): the Triton kernels compute in float32")
    if args.bf16:  # one function everywhere the trained actor runs: rollout, old losses, update
        actor.forward = partial(bf16_forward, actor)
    if args.fused and cuda and why_not_fused(actor):
        print(f"--fused: the actor keeps torch's forward and sampler ({why_not_fused(actor)})", flush=True)
    elif args.fused and cuda:  # Triton kernels for the same function, checked on a probe batch
        actor.forward = partial(fused_forward(actor, True), actor)
        float32_probe(check_forward, actor, obs_dim, device)
    state.sampler = pick_sampler(actor, device, graphs, True, args.fused)
    state.eval_sampler = pick_sampler(evaluated, device, graphs, False, args.fused)
    for sampler, net in ((state.sampler, actor), (state.eval_sampler, evaluated)):
        float32_probe(check_sampler, sampler, net, obs_dim, actor.act_dim, args.flow_steps, device, rows=37)
    n, o, d = args.num_envs, state.obs.shape[1], actor.act_dim
    state.roll = rollout_tensors(n, args.num_steps, o, d, device)
    state.obs, state.ret_acc = state.roll["obs_in"], state.roll["ret_acc"]  # the reference's names, same memory
    state.act, state.record = partial(policy_half, state, args), partial(record_half, state, args)
    if graphs:  # each half replays as one captured graph; capturing restores what its warm-up touched

        def touched() -> list:
            rms = [v for m in (state.obs_rms, state.ret_rms) if m for v in vars(m).values()]
            return [*state.roll.values(), *rms]

        state.act, state.record = GraphedCall(state.act, touched), GraphedCall(state.record, touched)
    if args.scan_rollout and hasattr(state.envs, "scan_rollout"):  # None where statistics move during a rollout
        noise = args.fpopp_action_noise if args.objective == "fpopp" else 0.0
        squash_args = (args.action_squash, args.action_bound, args.reward_scale, noise)
        state.scan = state.envs.scan_rollout(actor, state.obs_rms, state.ret_rms, args.flow_steps, *squash_args)
    if state.scan is not None and args.bf16:
        raise RunError("--bf16 needs the per-step rollout (--no-scan-rollout): the JAX sampler computes in float32")
    if state.scan is not None:  # its JAX sampler, probed like the others at full float32 precision
        import jax

        with jax.default_matmul_precision("highest"):
            probe = (state.scan.sample, actor, obs_dim, actor.act_dim, args.flow_steps, device)
            float32_probe(check_sampler, *probe, rows=37)
    return state


def float32_probe(check, *args, **kw):
    """Run a setup-time probe with TF32 off, so that a difference it finds is the code's, not TF32's rounding."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return check(*args, **kw)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def bf16_forward(actor, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """FlowActor.forward with its matrix products in bfloat16 (the time embedding and the output in float32)."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return R.FlowActor.forward(actor, obs, x_t, t).float()


def check_forward(actor, obs_dim: int, device, tol: float = 1e-4) -> None:
    """The actor's (fused) forward against FlowActor.forward on a probe batch; one line if they differ."""
    g = torch.Generator().manual_seed(0)
    obs, x_t = torch.randn(37, obs_dim, generator=g), torch.randn(37, actor.act_dim, generator=g)
    inputs = [v.to(device) for v in (obs, x_t, torch.rand(37, generator=g))]
    with torch.no_grad():
        err = float((actor(*inputs) - R.FlowActor.forward(actor, *inputs)).abs().max())
    if not err <= tol:
        raise RunError(f"--fused: the Triton forward differs from FlowActor.forward by {err:.3g} (tolerance {tol:g})")


def policy_half(state: State, args: Args) -> None:
    """Rollout step k before the environment, on fixed tensors in place (one captured graph on CUDA): statistics,
    normalised observation and sampled x stored at k, the squashed action in ``roll["action"]``."""
    r, k = state.roll, state.roll["k"]
    if state.obs_rms is not None and args.obs_stats == "step":
        state.obs_rms.update(r["obs_in"])
    o = normalize_obs(r["obs_in"], state.obs_rms)
    x = state.sampler(o[:, state.obs_actor], r["noise"].index_select(0, k)[0], args.flow_steps).to(o.device)
    if args.objective == "fpopp" and args.fpopp_action_noise > 0:
        x = x + args.fpopp_action_noise * r["act_noise"].index_select(0, k)[0]
    if args.action_bound > 0:
        x = x.clamp(-args.action_bound, args.action_bound)
    r["obs"].index_copy_(0, k, o[None])
    r["x"].index_copy_(0, k, x[None])
    r["action"].copy_(R.squash(x, args.action_squash))


def record_half(state: State, args: Args) -> None:
    """Rollout step k after the environment (its outputs copied into ``roll["env_in"]``): finished episodes' sums,
    the reward (scaled, normalised by the running return std), the buffers at k; k += 1."""
    r, k = state.roll, state.roll["k"]
    done = torch.maximum(r["term_in"], r["trunc_in"]).double()
    r["ep"].add_(torch.stack([r["ep_ret_in"].double(), r["ep_len_in"].double(), done]) @ done)
    reward = r["rew_in"].double() * args.reward_scale
    if state.ret_rms is not None:
        r["ret_acc"].mul_(args.gamma).add_(reward)
        state.ret_rms.update(r["ret_acc"])
        reward = (reward / torch.sqrt(state.ret_rms.var + 1e-8)).clamp(-10.0, 10.0)
        r["ret_acc"].mul_(1.0 - done)
    final = normalize_obs(r["final_in"], state.obs_rms)
    for key, v in (("rew", reward.float()), ("term", r["term_in"]), ("trunc", r["trunc_in"]), ("final", final)):
        r[key].index_copy_(0, k, v[None])
    k.add_(1)


def collect_rollout(state: State, args: Args) -> dict:
    """The reference's rollout on the fixed tensors (noise drawn in the reference's order), then its batch."""
    r, T = state.roll, args.num_steps
    r["noise"].normal_()
    if args.objective == "fpopp" and args.fpopp_action_noise > 0:
        r["act_noise"].normal_()
    for key in ("ep", "k"):  # finished episodes' sums, the step counter
        r[key].zero_()
    if hasattr(state.sampler, "refresh"):  # the NumPy copy of the actor takes the current weights
        state.sampler.refresh()
    if state.scan is not None:  # the same steps, one XLA program (fpo_utils/playground_env.py: ScanRollout)
        state.scan(r, T)
    else:
        for _ in range(T):
            state.act()
            state.envs.step_into(r["action"], r["env_in"])  # one copy of the step's outputs into roll["env_in"]
            state.record()
    state.global_step += T * state.envs.num_envs
    return R.make_batch(state, args, *(r[k] for k in ("obs", "x", "final", "rew", "term", "trunc", "ep")))


def update(state: State, batch: dict, args: Args, alpha: float) -> dict:
    """The reference's update; on CUDA its minibatch steps as replays of one captured graph, fed by the same
    ``torch.randperm`` calls (``--compile``: the losses compiled before capture)."""
    if not (args.cuda_graph and state.device.type == "cuda"):
        return R.update(state, batch, args, alpha)
    src = R.update_source(batch, args, alpha)
    n = src["obs"].shape[0]
    mb, steps = n // args.num_minibatches, args.update_epochs * args.num_minibatches
    # The graph reads the optimiser's moments at fixed addresses: loading a checkpoint replaces them, so recapture.
    if state.graph is None or state.graph.key != (n, steps, mb) or state.graph_moments != moment_ids(state.optimizer):
        losses = partial(R.minibatch_losses, state, args=args)
        losses = torch.compile(losses, dynamic=False) if args.compile else losses
        step_fn = lambda s, idx: R.gradient_step(state, *losses(s, idx), args)  # noqa: E731
        state.graph = GraphedStep(step_fn, src, steps, mb, len(book.STAT_KEYS), state.optimizer, (n, steps, mb))
    table = state.graph.run(src, [torch.randperm(n, device=state.device) for _ in range(args.update_epochs)])
    state.graph_moments = moment_ids(state.optimizer)  # created by the first capture
    return book.update_stats(table, state.update)


def moment_ids(optimizer) -> list[int]:
    """Which tensors hold the optimiser's state (moments, step counts): ``load_state_dict`` replaces them."""
    return [id(v) for group in optimizer.state.values() for v in group.values()]


def evaluate(state: State, envs, args: Args, init: str) -> float:
    """The reference's evaluation with the evaluated actor's fast sampler."""
    if hasattr(state.eval_sampler, "refresh"):
        state.eval_sampler.refresh()
    return R.evaluate(state, envs, args, init, sample=state.eval_sampler)


def main(args: Args) -> dict:
    """robot_fpo.main with these phases; the same run folder, checkpoints and summary."""
    phases = dict(build=build_state, rollout=collect_rollout, learn=update, evaluator=evaluate)
    return R.main(args, **phases, may_change=MAY_CHANGE)


if __name__ == "__main__":
    cli(main, Args, presets=PRESETS)
