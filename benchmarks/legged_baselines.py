"""Reference points for the legged joystick tasks: what an evaluation of a policy that has learned nothing gives.

For each task, the trainer's own evaluation (``robot_fpo.evaluate``: ``--episodes`` environments seeded
``eval_seed + i``, the mean return of each one's first episode) of

* ``standing``: the action 0 after the squash (tanh(0) = 0), which these tasks map to motor targets at the
  robot's default ("home") pose: it holds its pose and tracks nothing;
* ``untrained``: the fpopp-locomotion preset's actor as the trainer builds it (seeded with ``--seed``) before any
  update, sampled from x0 = 0 (``zero``) and from x0 drawn from ``eval_seed`` (``random``): the trainer's
  update-0 evaluation;

with the command-tracking errors ``eval_track_lin`` (m/s), ``eval_track_yaw`` (rad/s) and the mean first-episode
length ``eval_track_len`` (``fpo_utils/legged.py``). Prints a markdown table; ``--out`` also writes JSON.
Runs on the CPU with envpool; an episode is at most 1,000 steps. Example:

    python benchmarks/legged_baselines.py --tasks SpotFlatTerrainJoystick-v1 --episodes 4 --out /tmp/base.json

With ``--checkpoint`` (a run's ``checkpoints/last.pt`` or a collected ``portable/NAME.pt``; one task), the same
evaluation of that run's networks instead: the ``live`` actor that collects the training data and its ``ema``
copy that the trainer evaluates, each from x0 = 0 and from random x0 (float32 on the CPU, whatever the run's
``--bf16``):

    python benchmarks/legged_baselines.py --tasks G1JoystickFlatTerrain-v1 --checkpoint RUN/checkpoints/last.pt

With ``--terms``, each row also holds where its return came from: ``term_<name>``, each reward term of the task
summed over a first episode (envpool's ``info["reward_<name>"]``, scaled by the task's weight) times the control
step (0.02 s), the mean over the episodes, and ``term_clip``, what the task's clip of a step's reward at 0 added
(Go1 and Spot clip; G1 does not). The terms add up to ``eval_return``; the script checks that they do.

With ``--reward-scales TERM=WEIGHT ...``, the tasks' reward terms are weighted as a run's ``--reward-scales``
weights them (the returns and terms of a run trained with other weights; the tracking errors do not depend on
them).

With ``--response``, each row also holds how the measured velocity follows the command (``command_response``):
per axis (``vx``, ``vy``, ``yaw``), over the first episodes' stretches of at least 1 s with one command, the slope
and correlation of the stretch's mean velocity on its command (1 and 1: it follows; 0: it ignores the command),
the error of that mean (``err``) beside the error of not moving (``still``), the swing about it (RMS) and the
RMS change from one step to the next (``step``); and how the actions move: mean |a| and their RMS change a step.

With ``--spread``, each row also holds how wide the policy's actions are (``action_spread``): at states that the
evaluation visited, the std of the action over 32 initial noises x0 (an untrained flow keeps x0's 1; a policy
that has settled on its action, near 0), and the std over the states of the action from x0 = 0.

With ``--ppo PARAMS.npz`` (a run folder's ``params.npz`` of ``benchmarks/playground_ppo.py``; one task), the same
evaluation of Playground's own PPO policy: its deterministic action, tanh of the Gaussian's mean, from its own
observation statistics (one row; the flow's x0 does not apply, nor ``--spread``).

With ``--action-filter B`` (0 <= B < 1), the task receives ``B a_prev + (1 - B) a`` for each action ``a`` after the
squash, where ``a_prev`` is the action it received a step earlier (0 at an episode's first step): the same policy
with its actions smoothed (``Smoothed``). Not something the trainer does; it shows how the robot moves when the
policy's step-to-step changes are damped. ``--response`` then records the smoothed actions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import robot_fpo as R  # noqa: E402
from fpo_utils import legged  # noqa: E402
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.envs import env_settings, parse_reward_scales  # noqa: E402
from fpo_utils.runfolder import RunError  # noqa: E402

TASKS = ("SpotFlatTerrainJoystick-v1", "Go1JoystickFlatTerrain-v1", "G1JoystickFlatTerrain-v1")
PRESET = "fpopp-locomotion"
COLUMNS = ("eval_return", *legged.TRACK_KEYS)
CONTROL_DT = 0.02  # seconds per step of the joystick tasks (Playground's ctrl_dt); reward = dt * sum of the terms


def standing(obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
    """The sampler of the standing policy: x = 0 whatever the observation."""
    return torch.zeros_like(x0)


POLICIES = (("standing", "-", standing), ("untrained", "zero", None), ("untrained", "random", None))  # name, x0
X0 = ("zero", "random")


def task_args(task: str, episodes: int, seed: int, threads: int, scales=()) -> R.Args:
    """The preset's settings for ``task`` on the CPU, one training environment, ``episodes`` evaluation ones, the
    reward terms' weights ``scales`` (``--reward-scales``) set."""
    args = replace(R.PRESETS[PRESET], env_id=task, num_envs=1, eval_episodes=episodes, seed=seed, cuda=False)
    args = replace(args, env_threads=threads, backend="envpool", reward_scales=tuple(scales))
    return replace(args, **env_settings(args.env_id, args.backend, args.obs_actor, args.obs_critic, args.physics))


class PassThrough:
    """The evaluation environments ``envs``, passed through: the base of the wrappers below, which each change or
    record one thing."""

    def __init__(self, envs):
        self.envs = envs

    def __getattr__(self, name):
        return getattr(self.envs, name)


class FirstEpisodes(PassThrough):
    """The evaluation environments ``envs``, passed through, that tell which steps belong to each environment's
    first episode: the steps ``R.evaluate`` counts in its return."""

    def __init__(self, envs):
        super().__init__(envs)
        self.finished = None

    def reset(self, seed: int):
        self.finished = None
        return self.envs.reset(seed)

    def first(self, done):
        """Per environment, whether this step is in its first episode; ``done`` (a bool array or tensor) marks the
        steps that end an episode."""
        if self.finished is None:
            self.finished = done & False  # all False, of done's type and shape
        alive = ~self.finished
        self.finished = self.finished | done
        return alive


class TermSums(FirstEpisodes):
    """The envpool evaluation environments ``envs``, recording each reward term (the pool's
    ``info["reward_<name>"]``) summed over every environment's first episode, and ``clip``: what the task's clip
    of a step's reward at 0 added (Go1 and Spot clip, G1 does not)."""

    def __init__(self, envs, dt: float = CONTROL_DT):
        super().__init__(envs)
        self.dt, self.sums = dt, {}

    def reset(self, seed: int):
        obs = super().reset(seed)  # (re)makes the pool: wrap the one that steps now
        self.sums, pool = {}, self.envs._pool
        self.envs._pool = SimpleNamespace(
            step=lambda a: self._record(*pool.step(a)), reset=pool.reset, close=pool.close
        )
        return obs

    def _record(self, obs, reward, term, trunc, info):
        alive = self.first(np.asarray(term) | np.asarray(trunc))
        parts = {k: np.asarray(info[k], np.float64) * self.dt for k in info if k.startswith("reward_")}
        step = sum(parts.values())
        # Go1's and Spot's tasks clip each step's reward at 0: where that made a negative sum 0, it adds -sum
        parts["reward_clip"] = np.where((np.asarray(reward) == 0) & (step < 0), -step, 0.0)
        for key, value in parts.items():
            self.sums[key] = self.sums.get(key, 0.0) + np.where(alive, value, 0.0)
        return obs, reward, term, trunc, info

    def means(self) -> dict:
        """``term_<name>``: the mean over the episodes of each term's sum."""
        return {f"term_{k.removeprefix('reward_')}": float(v.mean()) for k, v in self.sums.items()}


AXES = ("vx", "vy", "yaw")
STRETCH = 50  # steps (1 s) a command must hold for its stretch to count in command_response


class Responses(FirstEpisodes):
    """The evaluation environments ``envs``, recording each step's command and measured velocity (v_x, v_y, w_z:
    the columns of ``legged.tracking_columns``, looked up once), the action the task received, and whether the
    step belongs to its environment's first episode."""

    def __init__(self, envs):
        super().__init__(envs)
        self.cols, self.steps = legged.tracking_columns(envs), []  # command x, y, yaw, then v_x, v_y, w_z
        if self.cols is None:
            raise SystemExit(f"error: --response needs a joystick task's command; {envs.env_id} has none routed")

    def reset(self, seed: int):
        self.steps = []
        return super().reset(seed)

    def step(self, action):
        obs, reward, term, trunc, info = self.envs.step(action)
        sel = info["final_obs"][:, self.cols].cpu()
        self.steps.append((sel[:, :3], sel[:, 3:], action.cpu(), self.first((term | trunc).cpu())))
        return obs, reward, term, trunc, info

    def means(self) -> dict:
        cmd, vel, act, alive = (torch.stack(x) for x in zip(*self.steps))
        return command_response(cmd, vel, alive) | action_change(act, alive)


class Smoothed(PassThrough):
    """The evaluation environments ``envs``, handed ``b a_prev + (1 - b) a`` for each action ``a``: a first-order
    low-pass filter of the actions, ``a_prev`` being what they received a step earlier, 0 where an episode starts
    (the home pose, which the tasks' last action starts at)."""

    def __init__(self, envs, b: float):
        super().__init__(envs)
        self.b, self.prev = b, None

    def reset(self, seed: int):
        self.prev = None
        return self.envs.reset(seed)

    def step(self, action):
        a = (1.0 - self.b) * action + (0.0 if self.prev is None else self.b * self.prev)
        obs, reward, term, trunc, info = self.envs.step(a)
        self.prev = torch.where(torch.as_tensor(term | trunc, device=a.device)[:, None], 0.0, a)
        return obs, reward, term, trunc, info


def command_response(cmd: torch.Tensor, vel: torch.Tensor, alive: torch.Tensor, min_steps: int = STRETCH) -> dict:
    """How the measured velocity ``vel`` [T, N, 3] follows the command ``cmd`` [T, N, 3] over the steps where
    ``alive`` [T, N] (each environment's first episode). A stretch is a run of steps with one command; those of at
    least ``min_steps`` count, each step weighted alike. Per axis ``a`` of :data:`AXES`, with ``mean`` the measured
    velocity's mean over the step's stretch: ``resp_a_slope`` and ``resp_a_corr``, the least-squares slope and the
    correlation of ``mean`` on the command; ``resp_a_err``, mean |command - mean|; ``resp_a_still``, mean |command|
    (the error of not moving); ``resp_a_swing``, the RMS of the velocity about ``mean``; ``resp_a_step``, the RMS
    of the velocity's change from one step to the next within a stretch. ``resp_steps`` counts the steps used."""
    cmds, means, vels, steps = [], [], [], []
    for e in range(alive.shape[1]):
        c, v = cmd[alive[:, e], e].double(), vel[alive[:, e], e].double()
        if len(c) == 0:
            continue
        new = torch.ones(len(c), dtype=torch.bool)
        new[1:] = (c[1:] != c[:-1]).any(1)
        seg = new.long().cumsum(0) - 1
        n = torch.bincount(seg).double()
        mean = torch.zeros(len(n), 3, dtype=torch.float64).index_add_(0, seg, v) / n[:, None]
        keep = n[seg] >= min_steps
        cmds.append(c[keep])
        means.append(mean[seg][keep])
        vels.append(v[keep])
        steps.append((v[1:] - v[:-1])[keep[1:] & (seg[1:] == seg[:-1])])
    c, m, v, dv = (torch.cat(x) if x else torch.zeros(0, 3, dtype=torch.float64) for x in (cmds, means, vels, steps))
    out = {"resp_steps": len(c)}
    for i, axis in enumerate(AXES):
        ci, mi = c[:, i] - c[:, i].mean(), m[:, i] - m[:, i].mean()
        var, cov = float(ci @ ci), float(ci @ mi)
        spread = var * float(mi @ mi)
        out[f"resp_{axis}_slope"] = cov / var if var > 0 else float("nan")
        out[f"resp_{axis}_corr"] = cov / spread**0.5 if spread > 0 else float("nan")
        out[f"resp_{axis}_err"] = float((c[:, i] - m[:, i]).abs().mean())
        out[f"resp_{axis}_still"] = float(c[:, i].abs().mean())
        out[f"resp_{axis}_swing"] = float((v[:, i] - m[:, i]).pow(2).mean().sqrt())
        out[f"resp_{axis}_step"] = float(dv[:, i].pow(2).mean().sqrt())
    return out


def action_change(act: torch.Tensor, alive: torch.Tensor) -> dict:
    """How the actions ``act`` [T, N, A] that the task received (after the squash, in [-1, 1]) move over the steps
    where ``alive`` [T, N]: ``act_abs``, their mean |a| (1: every joint at its limit), and ``act_step``, the RMS of
    their change from one step to the next within an episode, over the joints."""
    pairs = alive[1:] & alive[:-1]
    return {
        "act_abs": float(act[alive].double().abs().mean()),
        "act_step": float((act[1:] - act[:-1])[pairs].double().pow(2).mean().sqrt()),
    }


SPREAD_STATES, SPREAD_DRAWS = 400, 32  # action_spread: states spread over the evaluation, noises at each


@torch.no_grad()
def action_spread(sample, obs: torch.Tensor, act_dim: int, steps: int, draws=SPREAD_DRAWS, squash="tanh") -> dict:
    """How wide the policy's actions are at one state, over the actor observations ``obs`` [S, D]: ``spread_x``,
    the std of x over ``draws`` initial noises x0 ~ N(0, I) (seeded) at each state, the mean over the states and
    the action's dimensions (an untrained flow keeps x0's 1); ``spread_a``, the same after ``R.squash``;
    ``state_x``, the std over the states of x from x0 = 0: how much the action follows the state."""
    gen = torch.Generator().manual_seed(0)
    o = obs.repeat_interleave(draws, 0)
    x = sample(o, torch.randn(len(o), act_dim, generator=gen), steps).view(len(obs), draws, act_dim)
    x_zero = sample(obs, torch.zeros(len(obs), act_dim), steps)
    spread = {"spread_x": x.std(1), "spread_a": R.squash(x, squash).std(1), "state_x": x_zero.std(0)}
    return {k: float(v.mean()) for k, v in spread.items()}


def evaluate_policies(
    task: str, args: R.Args, state: R.State, policies, terms=False, response=False, spread=False, smooth=0.0
) -> list[dict]:
    """One row per (name, x0, sampler) of ``policies``: the trainer's evaluation on fresh evaluation environments;
    with ``terms``, also each reward term's share of the return (``TermSums``); with ``response``, how the
    velocity follows the command (``Responses``); with ``spread``, how wide the actions are at the states that the
    evaluation visited (``action_spread``, at ``SPREAD_STATES`` of them, evenly spaced); with ``smooth`` > 0, the
    actions low-pass filtered (``Smoothed``)."""
    envs = book.task_envs(args, args.eval_episodes, args.eval_seed, state.device)
    if terms:
        envs = sums = TermSums(envs)
    if response:
        envs = responses = Responses(envs)
    if smooth > 0:  # outermost: Responses records what the task receives
        envs = Smoothed(envs, smooth)
    rows = []
    for policy, init, sample in policies:
        t0, seen = time.perf_counter(), []
        sample = sample or (state.ema if state.ema is not None else state.actor).sample  # R.evaluate's default

        def recording(o, x0, steps, sample=sample):  # the sampler, keeping the observations it is given
            seen.append(o)
            return sample(o, x0, steps)

        result = R.evaluate(state, envs, args, "zero" if init == "-" else init, sample=recording if spread else sample)
        row = dict(task=task, policy=policy, init=init, **legged.eval_row(result))
        if smooth > 0:
            row["action_filter"] = smooth
        if spread:
            obs = torch.cat(seen)
            pick = torch.linspace(0, len(obs) - 1, min(SPREAD_STATES, len(obs))).long()
            row.update(action_spread(sample, obs[pick], envs.act_dim, args.flow_steps, squash=args.action_squash))
        if response:
            row.update(responses.means())
        if terms:
            row.update(sums.means())
            total = sum(v for k, v in row.items() if k.startswith("term_"))
            if abs(total - row["eval_return"]) > 1e-3 * max(1.0, abs(row["eval_return"])):
                raise SystemExit(f"error: the reward terms add up to {total:.6f}, the return is {row['eval_return']}")
        rows.append(dict(row, seconds=round(time.perf_counter() - t0, 2)))
        print(json.dumps(rows[-1]), flush=True)
    envs.close()
    return rows


def new_state(task: str, episodes: int, seed: int, threads: int, scales=()) -> tuple[R.Args, R.State]:
    args = task_args(task, episodes, seed, threads, scales)
    device = book.seed_and_device(args)  # seeds torch as the trainer does before it builds the networks
    state = R.build_state(args, device)
    state.envs.close()  # its one training environment; evaluations make their own
    return args, state


def baselines(task: str, episodes: int, seed: int, threads=0, scales=(), **measures) -> list[dict]:
    """The rows of one task: standing, untrained from x0 = 0, untrained from random x0; ``measures``: what
    ``evaluate_policies`` records beside the return (``terms``, ``response``, ``spread``, ``smooth``)."""
    args, state = new_state(task, episodes, seed, threads, scales)
    return evaluate_policies(task, args, state, POLICIES, **measures)


def load_networks(state: R.State, path: Path, task: str) -> int:
    """A run checkpoint's networks, statistics and counters into ``state`` (its simulator state stays behind);
    returns its update. A file that is not such a checkpoint, or one of another task's networks, exits in a line."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("ema") is None:
        raise SystemExit(f"error: {path} is not a robot run's checkpoint with an EMA actor (--actor-ema > 0)")
    try:
        book.load_checkpoint({**ckpt, "envs": None}, state)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[-1].strip()
        raise SystemExit(f"error: {path} does not fit {task}'s {PRESET} networks ({first})") from None
    return int(ckpt["update"])


def checkpoint_rows(task: str, path: Path, episodes: int, seed: int, threads=0, scales=(), **measures) -> list[dict]:
    """The rows of a run's checkpoint: its live actor and its EMA copy, each from x0 = 0 and from random x0."""
    args, state = new_state(task, episodes, seed, threads, scales)
    update = load_networks(state, path, task)
    live, ema = f"live, update {update}", f"ema, update {update}"
    policies = [(name, init, net.sample) for name, net in ((live, state.actor), (ema, state.ema)) for init in X0]
    return evaluate_policies(task, args, state, policies, **measures)


def ppo_rows(task: str, path: Path, episodes: int, seed: int, threads=0, scales=(), **measures) -> list[dict]:
    """The row of a Playground PPO policy (``playground_ppo.load_policy``): R.evaluate with the policy's own
    normaliser in place of the flow's, so it reads the raw ``state`` columns."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from playground_ppo import load_policy

    try:
        policy, meta = load_policy(path)
    except RunError as err:
        raise SystemExit(f"error: {err}") from None
    if meta["env_id"] != task.removesuffix("-v1"):
        raise SystemExit(f"error: {path} is a policy for {meta['env_id']}, not {task}")
    args, state = new_state(task, episodes, seed, threads, scales)
    state.obs_rms = None

    def sample(obs, x0, steps):
        return torch.tensor(policy(obs.cpu().numpy()), dtype=x0.dtype)

    name = f"ppo, {meta['env_steps']:,} steps"
    return evaluate_policies(task, args, state, [(name, "-", sample)], **measures)


def markdown(rows: list[dict]) -> str:
    head = ["task", "policy", "x0", *COLUMNS, "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        values = [(f"{r[k]:.1f}" if k == "eval_track_len" else f"{r[k]:.3f}") if k in r else "-" for k in COLUMNS]
        lines.append("| " + " | ".join([r["task"], r["policy"], r["init"], *values, f"{r['seconds']:.1f}"]) + " |")
    terms = [k for k in dict.fromkeys(k for r in rows for k in r if k.startswith("term_")) if any(r[k] for r in rows)]
    if terms:  # the terms that are not zero in every row, one row per evaluation
        lines += ["", "| policy | x0 | " + " | ".join(k.removeprefix("term_") for k in terms) + " |"]
        lines.append("|" + "---|" * (2 + len(terms)))
        lines += ["| " + " | ".join([r["policy"], r["init"], *(f"{r[k]:.3f}" for k in terms)]) + " |" for r in rows]
    if any("resp_steps" in r for r in rows):  # per axis: slope, correlation, error, error standing, swing, step
        stats = ("slope", "corr", "err", "still", "swing", "step")
        keys = [f"resp_{a}_{s}" for a in AXES for s in stats] + ["act_abs", "act_step"]
        head = [k.removeprefix("resp_").replace("_", " ") for k in keys]
        lines += ["", "| policy | x0 | steps | " + " | ".join(head) + " |", "|" + "---|" * (3 + len(head))]
        for r in rows:
            values = [f"{r[k]:.3f}" for k in keys]
            lines.append("| " + " | ".join([r["policy"], r["init"], str(r["resp_steps"]), *values]) + " |")
    if any("spread_x" in r for r in rows):  # how wide the actions are at one state, and across states
        keys = ("spread_x", "spread_a", "state_x")
        lines += ["", "| policy | x0 | spread x | spread a | state x |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join([r["policy"], r["init"], *(f"{r[k]:.3f}" for k in keys)]) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="envpool ids")
    parser.add_argument("--episodes", type=int, default=R.PRESETS[PRESET].eval_episodes, help="evaluation episodes")
    parser.add_argument("--seed", type=int, default=R.PRESETS[PRESET].seed, help="seed of the untrained networks")
    parser.add_argument("--threads", type=int, default=0, help="envpool threads (0: one per core)")
    parser.add_argument("--checkpoint", type=Path, help="evaluate this run checkpoint's live and EMA actors (one task)")
    parser.add_argument("--ppo", type=Path, help="evaluate this playground_ppo.py params.npz instead (one task)")
    parser.add_argument("--terms", action="store_true", help="also each reward term's share of the return")
    parser.add_argument("--response", action="store_true", help="also how the velocity follows the command")
    parser.add_argument("--spread", action="store_true", help="also how wide the actions are at one state")
    parser.add_argument("--reward-scales", nargs="+", default=[], help="reward terms' weights, TERM=WEIGHT")
    parser.add_argument("--action-filter", type=float, default=0.0, help="smooth the actions: B a_prev + (1 - B) a")
    parser.add_argument("--out", default="", help="also write the rows and the protocol here as JSON")
    opts = parser.parse_args()
    if not 0.0 <= opts.action_filter < 1.0:
        parser.error(f"--action-filter {opts.action_filter}: must be in [0, 1) (0: no filter)")
    extra = dict(threads=opts.threads, scales=opts.reward_scales, terms=opts.terms, response=opts.response)
    extra.update(spread=opts.spread, smooth=opts.action_filter)
    for task in opts.tasks:
        try:
            parse_reward_scales(task, "envpool", opts.reward_scales)
        except RunError as err:
            parser.error(str(err))
    if opts.ppo is not None:
        if len(opts.tasks) != 1 or opts.checkpoint is not None or opts.spread:
            parser.error("--ppo evaluates one task's PPO policy, without --checkpoint or --spread")
        if not opts.ppo.is_file():
            parser.error(f"--ppo {opts.ppo}: no such file")
        rows = ppo_rows(opts.tasks[0], opts.ppo, opts.episodes, opts.seed, **extra)
    elif opts.checkpoint is not None:
        if len(opts.tasks) != 1:
            parser.error(f"--checkpoint evaluates one task's run; got --tasks {' '.join(opts.tasks)}")
        if not opts.checkpoint.is_file():
            parser.error(f"--checkpoint {opts.checkpoint}: no such file")
        rows = checkpoint_rows(opts.tasks[0], opts.checkpoint, opts.episodes, opts.seed, **extra)
    else:
        rows = [r for t in opts.tasks for r in baselines(t, opts.episodes, opts.seed, **extra)]
    table = markdown(rows)
    print(table)
    if opts.out:
        preset = R.PRESETS[PRESET]
        protocol = dict(preset=PRESET, episodes=opts.episodes, seed=opts.seed, eval_seed=preset.eval_seed)
        protocol.update(checkpoint=str(opts.checkpoint) if opts.checkpoint else None, terms=opts.terms)
        protocol.update(ppo=str(opts.ppo) if opts.ppo else None)
        protocol.update(response=opts.response, stretch_steps=STRETCH if opts.response else None)
        protocol.update(spread=opts.spread, spread_states=SPREAD_STATES, spread_draws=SPREAD_DRAWS)
        protocol.update(flow_steps=preset.flow_steps, action_squash=preset.action_squash, device="cpu")
        protocol.update(reward_scales=opts.reward_scales, action_filter=opts.action_filter)
        Path(opts.out).write_text(json.dumps({"protocol": protocol, "rows": rows, "markdown": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
