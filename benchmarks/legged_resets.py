"""What an ended episode restarts with on the playground backend: `--env-reset first` against `full`.

Drives `--envs` environments of a Playground joystick task (CPU or GPU JAX) for `--windows` rollouts of 24
steps (the fpopp-locomotion preset's), with the standing policy (action 0) or, with `--checkpoint`, a run's
live actor as its training rollouts do (x0 and the action noise drawn fresh each step, its observation
statistics frozen, float32). Each window logs how many episodes ended, their mean length and, over the
episodes that ended by a fall or the time limit, how many restarted with the command they ended with
(the task's `info["command"]` in the simulator state before and after the step). JSON lines on stdout;
`--out` writes them as JSON.

    python benchmarks/legged_resets.py --task G1JoystickFlatTerrain --env-reset first --envs 8 --windows 9
    python benchmarks/legged_resets.py --task G1JoystickFlatTerrain --env-reset full --envs 64 --windows 100 \\
        --checkpoint RUN/checkpoints/last.pt --out /tmp/full.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from legged_baselines import load_networks  # noqa: E402

import robot_fpo as R  # noqa: E402
from fpo_utils import legged  # noqa: E402
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.envs import env_settings  # noqa: E402
from fpo_utils.playground_env import ENV_RESETS  # noqa: E402


def build(task: str, envs: int, env_reset: str, seed: int, checkpoint: Path | None) -> tuple[R.Args, R.State]:
    """The preset's state on ``envs`` Playground environments (random initial lengths, as in training) on the
    CPU, with a checkpoint's networks and statistics loaded if one is given."""
    preset = R.PRESETS["fpopp-locomotion"]
    args = replace(preset, env_id=task, backend="playground", num_envs=envs, cuda=False, seed=seed)
    args = replace(args, random_start=True, env_reset=env_reset)
    args = replace(args, **env_settings(args.env_id, args.backend, args.obs_actor, args.obs_critic, args.physics))
    state = R.build_state(args, book.seed_and_device(args))
    if checkpoint is not None:
        load_networks(state, checkpoint, task)  # networks and statistics; fresh environments
    return args, state


def command(envs) -> torch.Tensor:
    """Each environment's command (the task's ``info["command"]``) in the simulator state the next step starts from."""
    return torch.tensor(np.asarray(envs._unpack_state(envs._state).info["command"]))


def windows(args: R.Args, state: R.State, count: int, policy: str) -> list[dict]:
    envs, n, d = state.envs, args.num_envs, state.envs.act_dim
    obs, rows, t0 = state.obs, [], time.perf_counter()
    for w in range(count):
        ended, kept, lengths = 0, 0, []
        for _ in range(args.num_steps):
            if policy == "standing":
                x = torch.zeros(n, d)
            else:
                o = R.normalize_obs(obs, state.obs_rms)
                x = state.actor.sample(o[:, state.obs_actor], torch.randn(n, d), args.flow_steps)
                x = x + args.fpopp_action_noise * torch.randn_like(x)
            before = command(envs)
            obs, _, term, trunc, info = envs.step(R.squash(x, args.action_squash))
            done = term | trunc
            after = command(envs)
            ended += int(done.sum())
            kept += int((torch.isclose(before, after).all(dim=1) & done).sum())
            lengths += info["episode_length"][done].tolist()
        mean = sum(lengths) / len(lengths) if lengths else None
        row = dict(window=w, ended=ended, command_kept=kept, mean_length=mean, s=round(time.perf_counter() - t0, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="G1JoystickFlatTerrain", help="a Playground joystick task")
    p.add_argument("--env-reset", choices=ENV_RESETS, default="first", help="robot_fpo.py's --env-reset")
    p.add_argument("--envs", type=int, default=64, help="environments")
    p.add_argument("--windows", type=int, default=50, help="rollouts of 24 steps")
    p.add_argument("--seed", type=int, default=1, help="seed of the environments and the noise")
    p.add_argument("--checkpoint", type=Path, help="a run's checkpoint: drive its live actor (else: stand still)")
    p.add_argument("--out", type=Path, help="also write the protocol and the rows here as JSON")
    a = p.parse_args()
    if a.checkpoint is not None and not a.checkpoint.is_file():
        p.error(f"--checkpoint {a.checkpoint}: no such file")
    args, state = build(a.task, a.envs, a.env_reset, a.seed, a.checkpoint)
    if legged.tracking_columns(state.envs) is None:
        p.error(f"--task {a.task}: no command in its observation; pick a joystick task")
    policy = "standing" if a.checkpoint is None else "live actor"
    rows = windows(args, state, a.windows, policy)
    if a.out:
        protocol = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
        a.out.write_text(json.dumps({"protocol": dict(protocol, policy=policy), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
