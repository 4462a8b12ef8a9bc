"""A strip of frames of a trained robot policy, rendered offline with MuJoCo's renderer (Playground tasks).

    MUJOCO_GL=egl python benchmarks/render_legged.py runs/NAME --out spot.png --frames 8 --every 60

It rebuilds the run from its folder (args.json and checkpoints/last.pt: networks, the EMA actor, the frozen
observation statistics) and runs robot_fpo.py's own evaluation (``robot_fpo.evaluate``: the evaluated actor, the
run's evaluation init, the seed ``eval_seed``) on ``--episodes`` Playground environments (one unless asked; the
run's own evaluation uses ``eval_episodes``), recording the first one's physics state after every step. Every
``--every``-th state (``--frames`` of them, from step ``--every``) is drawn by ``mujoco.Renderer`` from the task's
tracking camera where it has one, side by side in one PNG. It prints the episodes' mean return and, for a joystick
task, their command-tracking errors (fpo_utils/legged.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import robot_fpo as R  # noqa: E402
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.envs import resolve_backend  # noqa: E402

STATE_KEYS = ("qpos", "qvel", "mocap_pos", "mocap_quat", "xfrc_applied")  # what the renderer reads


class Recording:
    """The environments, each step's physics state of environment 0 kept (host copies) as the step returns, up to
    the end of environment 0's first episode."""

    def __init__(self, envs):
        self.envs, self.states, self.ended = envs, [], False

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        out = self.envs.step(actions)
        if not self.ended:
            data = self.envs._unpack_state(self.envs._state).data
            self.states.append({k: np.asarray(getattr(data, k))[0] for k in STATE_KEYS})
            self.ended = bool(out[2][0] or out[3][0])  # terminated or truncated
        return out


def load_run(folder: Path, device: torch.device) -> tuple[R.State, R.Args]:
    """The run's state with one evaluation environment, from its settings and last checkpoint (without the
    training environments' state)."""
    saved = json.loads((folder / "args.json").read_text())
    args = R.Args(**{f.name: saved[f.name] for f in fields(R.Args) if f.name in saved})
    if resolve_backend(args.env_id, args.backend) != "playground":
        raise SystemExit(f"error: {folder} ran {args.env_id!r} on {args.backend}; rendering needs a Playground task")
    args = replace(args, num_envs=1, random_start=False, cuda=device.type == "cuda")
    state = R.build_state(args, device)
    payload = torch.load(folder / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    book.load_checkpoint({**payload, "envs": None}, state)
    return state, args


def render_strip(mj_model, states: list[dict], size: int, camera) -> np.ndarray:
    import mujoco

    renderer = mujoco.Renderer(mj_model, height=size, width=size)
    data, images = mujoco.MjData(mj_model), []
    for s in states:
        for k, v in s.items():
            getattr(data, k)[...] = v
        mujoco.mj_forward(mj_model, data)
        renderer.update_scene(data, camera=camera)
        images.append(np.asarray(renderer.render()))
    renderer.close()
    return np.concatenate(images, axis=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a run folder of robot_fpo.py or robot_fpo_fast.py on a Playground task")
    p.add_argument("--out", type=Path, default=Path("frames.png"))
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--every", type=int, default=60, help="environment steps between frames")
    p.add_argument("--size", type=int, default=240, help="pixels per frame (square)")
    p.add_argument("--camera", default="track", help="the model's camera to draw from (-1: the free camera)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--episodes", type=int, default=1, help="evaluation episodes (the run's own: eval_episodes)")
    a = p.parse_args()
    if a.frames < 1 or a.every < 1 or a.size < 16 or a.episodes < 1:
        p.error(f"--frames {a.frames}, --every {a.every}, --size {a.size}, --episodes {a.episodes}: need at least 1")
    state, args = load_run(a.run, torch.device(a.device))
    envs = Recording(book.task_envs(args, a.episodes, args.eval_seed, state.device))
    result = R.evaluate(state, envs, args, book.eval_inits(args)[0])  # eval_return's initial noise
    picked = envs.states[a.every - 1 :: a.every][: a.frames]
    if not picked:
        raise SystemExit(f"error: the episode ended after {len(envs.states)} steps, before step {a.every}")
    mj_model = envs._env.unwrapped.mj_model
    names = {mj_model.camera(i).name for i in range(mj_model.ncam)}
    camera = a.camera if a.camera in names else -1
    Image.fromarray(render_strip(mj_model, picked, a.size, camera)).save(a.out)
    extra = {k: round(v, 4) for k, v in getattr(result, "metrics", {}).items()}
    steps = len(envs.states)  # the first episode's, the one drawn
    print(f"{a.out}: {len(picked)} frames, every {a.every} of the first episode's {steps} steps")
    print(f"{float(result):.6g}: the mean return of {a.episodes} episode(s) {extra}")


if __name__ == "__main__":
    main()
