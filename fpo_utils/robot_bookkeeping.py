"""The robot trainers' run bookkeeping (robot_fpo.py, robot_fpo_fast.py): argument checks, what a checkpoint
holds, the default run name, the rollout's episode statistics and the update's statistics."""

from __future__ import annotations

import math

import numpy as np
import torch

from fpo_utils.envs import make_envs, parse_reward_scales, resolve_backend
from fpo_utils.runfolder import NonFiniteLoss, RunError
from fpo_utils.settings import check_literals

# A minibatch step's row; ``skipped``: its loss or gradient was not finite, so it changed nothing.
STAT_KEYS = ("pg_loss", "v_loss", "ratio_mean", "ratio_min", "ratio_max", "clipfrac", "grad_norm", "skipped")
TAGS = {k: f"losses/{k}" for k in STAT_KEYS[:-1] + ("lr", "minibatch_steps", "skipped_steps")}  # TensorBoard
EPISODE_KEYS = ("episodic_return", "episodic_length", "episodes", "action_abs_mean", "action_abs_max")


def seed_and_device(args) -> torch.device:
    """Seed torch and numpy, set torch's threads, cuDNN determinism and TF32; the device the networks use."""
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


def task_envs(args, num_envs: int, seed: int, device: torch.device, random_start: bool = False):
    """``num_envs`` environments of the run's task, the actor's and the critic's observation keys routed (the
    training ones with ``--random-start``; evaluation episodes always run from their start to the limit)."""
    where, keys = (args.backend, device, args.env_threads, args.episode_length), (args.obs_actor, args.obs_critic)
    resets = (random_start, args.env_reset)
    return make_envs(args.env_id, num_envs, seed, *where, keys, args.physics, *resets, args.reward_scales)


def resumed_curve(rf, update: int) -> tuple[list, list]:
    """A resumed run's metrics cut back to its checkpoint's ``update``; its evaluation curve so far."""
    rf.truncate_metrics(lambda r: r["update"] <= update)
    evals = [r for r in rf.read_metrics() if r.get("eval_return") is not None]
    return [r["global_step"] for r in evals], [r["eval_return"] for r in evals]


def episode_stats(ep: torch.Tensor, x: torch.Tensor) -> dict:
    """The rollout's finished episodes (mean return and length) and the magnitude of its stored actions."""
    ep_n, (ep_ret, ep_len) = int(ep[2]), (ep[:2] / max(float(ep[2]), 1.0)).tolist()
    return {
        "episodes": ep_n,
        "episodic_return": ep_ret if ep_n else None,
        "episodic_length": ep_len if ep_n else None,
        "action_abs_mean": float(x.abs().mean()),
        "action_abs_max": float(x.abs().max()),
    }


def chunks(n: int, size: int = 65536) -> list[slice]:
    """Row slices for no-grad passes over a whole batch (983,040 rows x draws at the fpo preset)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def optimiser_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters, then every tensor of their optimiser state (moments, step counts)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return params + [v for p in params for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v)]


def finite_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> torch.Tensor:
    """``optimizer.step()`` where ``loss`` and every gradient are finite, else nothing: the step is taken, then undone
    with ``torch.where`` (no host sync, so a captured CUDA graph skips alike); optimiser state that a skipped first
    step creates restarts from zero. Finite gradients are applied even where their norm overflows. Returns ``ok``."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    ok = torch.stack([torch.isfinite(g).all() for g in grads] + [torch.isfinite(loss.detach())]).all()
    with torch.no_grad():
        before = [t.clone() for t in optimiser_tensors(optimizer)]
        optimizer.step()
        for i, t in enumerate(optimiser_tensors(optimizer)):
            t.copy_(torch.where(ok.to(t.device), t, before[i] if i < len(before) else torch.zeros_like(t)))
    return ok


def update_stats(table: torch.Tensor, update: int) -> dict:
    """Means of the (steps, STAT_KEYS) table over the steps taken, the ratio's extremes, and how many steps were
    skipped (non-finite loss or gradient). :class:`NonFiniteLoss` when every step was skipped (or a step taken had a
    non-finite loss). A gradient norm that overflows float32 while every gradient is finite averages to inf."""
    stats = table.cpu().numpy().astype(np.float64)  # the update's one host read
    skipped = stats[:, 7] > 0
    taken = stats[~skipped]
    if skipped.all() or not np.isfinite(taken[:, :2]).all():
        raise NonFiniteLoss(f"non-finite loss at update {update + 1}")
    out = {"minibatch_steps": stats.shape[0], **{k: float(taken[:, c].mean()) for c, k in enumerate(STAT_KEYS[:-1])}}
    out["ratio_min"], out["ratio_max"] = float(taken[:, 3].min()), float(taken[:, 4].max())
    out["skipped_steps"] = int(skipped.sum())
    return out


def validate_args(args) -> None:
    """One line for the first bad value: closed choices, counts, ranges, divisibility, the task id."""
    check_literals(args)  # every Literal field holds one of its choices (programmatic Args are not parsed)
    positive = "num_envs num_steps num_minibatches update_epochs num_draws flow_steps eval_every eval_episodes"
    for name in positive.split() + ["block_size", "episode_length"]:
        if getattr(args, name) < 1:
            raise RunError(f"{name} must be at least 1, got {getattr(args, name)}")
    steps, unroll = args.num_envs * args.num_steps, args.gae_unroll
    schedule = (args.alpha_early, args.alpha_late) != (None, None)
    for bad, message in (
        (steps < args.num_minibatches, f"num_minibatches={args.num_minibatches}: at most num_envs x num_steps"),
        (not 0 <= args.t_min < args.t_max < 1, f"t_min={args.t_min}, t_max={args.t_max}: need 0 <= t_min < t_max < 1"),
        (not math.isfinite(args.action_bound), f"action_bound={args.action_bound}: must be finite (<= 0 disables)"),
        (args.clip_coef <= 0, f"clip_coef={args.clip_coef}: must be > 0"),
        (args.anneal_steps < 0, f"anneal_steps={args.anneal_steps}: must be >= 0"),
        (args.restart_every < 0, f"restart_every={args.restart_every}: must be >= 0 (0: never)"),
        (not 0.0 <= args.actor_ema < 1.0, f"actor_ema={args.actor_ema}: must be in [0, 1)"),
        (unroll < 0 or unroll and args.num_steps % unroll, f"gae_unroll={unroll}: must divide num_steps"),
        (unroll and steps // unroll % args.num_minibatches, "num_minibatches must divide the unrolls"),
        (schedule and args.k1 <= args.k0, f"k1={args.k1}: must be > k0={args.k0}"),
    ):
        if bad:
            raise RunError(message)
    backend = resolve_backend(args.env_id, args.backend)  # unknown id: one line with close matches, before any folder
    if args.random_start and backend != "playground":
        raise RunError(f"--random-start needs the playground backend ({args.env_id!r} runs on {backend})")
    parse_reward_scales(args.env_id, backend, args.reward_scales)  # an unknown term: one line, before any folder


PARTS = ("actor", "critic", "optimizer", "ema", "obs_rms", "ret_rms")  # what a checkpoint holds, with the counters


def checkpoint_payload(state) -> dict:
    envs = state.envs.state_dict()  # None where the backend cannot give its simulator state
    return {
        **{k: None if getattr(state, k) is None else getattr(state, k).state_dict() for k in PARTS},
        "envs": envs and {"sim": envs, "obs_in": state.obs.cpu(), "ret_acc": state.ret_acc.cpu()},
        **{k: getattr(state, k) for k in ("update", "global_step", "peak")},
    }


def load_checkpoint(ckpt, state) -> bool:
    """Restore a checkpoint (a path or a loaded payload) into ``state``, in place. Returns whether the environments'
    state was restored too (else they need a restart)."""
    ckpt = ckpt if isinstance(ckpt, dict) else torch.load(ckpt, map_location="cpu", weights_only=False)
    for key in PARTS:
        if getattr(state, key) is not None and ckpt.get(key) is not None:
            getattr(state, key).load_state_dict(ckpt[key])
    state.update, state.global_step, state.peak = int(ckpt["update"]), int(ckpt["global_step"]), tuple(ckpt["peak"])
    if ckpt.get("envs") is None:
        return False
    state.envs.load_state_dict(ckpt["envs"]["sim"])
    state.obs.copy_(ckpt["envs"]["obs_in"])
    state.ret_acc.copy_(ckpt["envs"]["ret_acc"])
    return True


def default_run_name(args) -> str:
    """``<env>__<objective>__<alpha name><value>__<preset>__<seed>`` unless ``--run-name`` is given."""
    fixed = args.alpha_eps if args.objective == "fpo" else args.alpha
    no_schedule = args.alpha_early is None and args.alpha_late is None
    value = float(fixed) if no_schedule else f"{args.alpha_early}to{args.alpha_late}"
    env = args.env_id.replace("/", "_").replace(":", "_")
    alpha = "alpha_eps" if args.objective == "fpo" else "alpha"
    return args.run_name or f"{env}__{args.objective}__{alpha}{value}__{args.preset}__{args.seed}"


def eval_inits(args) -> tuple[str, ...]:
    """The initial noises of one evaluation point. The first gives ``eval_return`` (``--eval-init``; native: random
    x0 for FPO, x0 = 0 for FPO++); FPO++ also evaluates from the other (unless ``--no-eval-other``), logged with its
    name as a suffix."""
    first = args.eval_init if args.eval_init != "native" else ("random" if args.objective == "fpo" else "zero")
    both = args.objective == "fpopp" and args.eval_other
    return (first, "random" if first == "zero" else "zero") if both else (first,)


def summary_row(state, args, status: str, reason: str) -> dict:
    """summary.json's content: the status, the updates done and the peak evaluation (eq:peak) with its update."""
    peak = dict(peak=state.peak[0] if state.peak[2] >= 0 else None, peak_update=state.peak[2], peak_step=state.peak[1])
    row = dict(status=status, updates_done=state.update, **peak, stop_reason=reason, global_step=state.global_step)
    return dict(row, env_id=args.env_id, objective=args.objective, device=str(state.device))
