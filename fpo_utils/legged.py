"""Command tracking of MuJoCo Playground's legged joystick tasks (Spot, Go1, G1), read from the flat observation.

A joystick task samples a command (base velocity x, y in m/s and yaw rate in rad/s, body frame) per episode and
rewards tracking it: ``exp(-|command_xy - v_xy|^2 / sigma)`` with the body-frame linear velocity ``v`` and
``exp(-(command_yaw - w_z)^2 / sigma)`` with the gyro's (body-frame angular velocity's) ``w_z``. The command sits
in ``state`` (what the actor sees) and the true (noise-free) velocities in ``privileged_state``, which starts with a
copy of ``state``; :data:`LAYOUTS` gives their columns (read from Playground's ``joystick.py``; envpool's ports
have the same layout and put the command in their step info; tests/test_legged_eval.py checks both backends against
the tasks' own commands and tracking rewards).

The trainer's evaluation reports, for these tasks only, beside ``eval_return``:

* ``eval_track_lin``: mean over the steps of the first episodes (terminal step included) of ``|command_xy - v_xy|``
  (m/s);
* ``eval_track_yaw``: the same mean of ``|command_yaw - w_z|`` (rad/s);
* ``eval_track_len``: the mean first-episode length, i.e. the steps each episode adds to those means.

The velocities are those after each step (``info["final_obs"]``). Tasks without a command, or runs whose
observation routing leaves ``privileged_state`` out, get none of these keys.
"""

from __future__ import annotations

import torch

# Columns of the command in ``state``, and of the gyro (3) and the linear velocity (3) in ``privileged_state``.
LAYOUTS = {
    "SpotFlatTerrainJoystick": (78, 81, 90),
    "Go1JoystickFlatTerrain": (45, 48, 57),
    "Go1JoystickRoughTerrain": (45, 48, 57),
    "G1JoystickFlatTerrain": (9, 103, 112),
    "G1JoystickRoughTerrain": (9, 103, 112),
}
TRACK_KEYS = ("eval_track_lin", "eval_track_yaw", "eval_track_len")


def task_name(env_id: str) -> str:
    """Playground's name of an envpool or Playground id (``MuJoCoPlayground/Go1JoystickFlatTerrain-v1`` -> ...)."""
    name = env_id.removeprefix("MuJoCoPlayground/")
    return name.removesuffix("-v1")


def tracking_columns(envs) -> list[int] | None:
    """Columns of the flat observation of ``envs`` holding the command (x, y, yaw) then the measured velocity
    (v_x, v_y, w_z); None when the task has no command or ``privileged_state`` is not routed."""
    env_id = getattr(envs, "env_id", None) or getattr(envs, "env_name", "")
    layout, route = LAYOUTS.get(task_name(env_id)), getattr(envs, "route", None)
    if layout is None or route is None or "privileged_state" not in route.columns:
        return None
    cols = route.columns
    at = sum(route.sizes[k] for k in cols[: cols.index("privileged_state")])
    cmd, gyro, vel = (at + c for c in layout)
    return [cmd, cmd + 1, cmd + 2, vel, vel + 1, gyro + 2]


def command_velocity(envs, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(command [N, 3], measured velocity [N, 3]: v_x, v_y, w_z) from a flat observation of ``envs``, or None."""
    cols = tracking_columns(envs)
    if cols is None:
        return None
    sel = obs[:, cols].double()
    return sel[:, :3], sel[:, 3:]


def tracking_errors(command: torch.Tensor, velocity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: ``|command_xy - v_xy|`` (L2) and ``|command_yaw - w_z|``."""
    diff = command - velocity
    return diff[:, :2].norm(dim=1), diff[:, 2].abs()


class Tracker:
    """Sums of the tracking errors over the steps of the episodes still running, for one evaluation."""

    def __init__(self, cols: list[int] | None, num_envs: int):
        self.cols, self.num_envs = cols, num_envs
        self.sums = torch.zeros(3, dtype=torch.float64)  # lin, yaw, steps

    @classmethod
    def of(cls, envs) -> Tracker:
        """A tracker for ``envs``' task; for a task without a command it records nothing."""
        return cls(tracking_columns(envs), envs.num_envs)

    def add(self, obs: torch.Tensor, alive: torch.Tensor) -> None:
        """Add a step's errors where ``alive`` (a CPU bool [N]); ``obs`` the observation the step produced."""
        if self.cols is None:
            return
        sel = obs[:, self.cols].cpu().double()
        lin, yaw = tracking_errors(sel[:, :3], sel[:, 3:])
        w = alive.double()
        self.sums += torch.stack([lin @ w, yaw @ w, w.sum()])

    def metrics(self) -> dict:
        if self.cols is None:
            return {}
        lin, yaw, steps = self.sums.tolist()
        n = max(steps, 1.0)
        return {"eval_track_lin": lin / n, "eval_track_yaw": yaw / n, "eval_track_len": steps / self.num_envs}


class EvalReturn(float):
    """An evaluation's mean return (a float) with its tracking ``metrics`` (:data:`TRACK_KEYS`)."""

    metrics: dict

    def __new__(cls, value: float, metrics: dict):
        out = super().__new__(cls, value)
        out.metrics = metrics
        return out


def eval_result(total: float, tracker: Tracker | None) -> float:
    """``total`` as a plain float for a task without a command, else as :class:`EvalReturn` with the metrics."""
    metrics = tracker.metrics() if tracker is not None else {}
    return EvalReturn(total, metrics) if metrics else float(total)


def eval_row(result: float, suffix: str = "") -> dict:
    """A metrics row's ``eval_return<suffix>`` and, for a task with a command, ``eval_track_*<suffix>``."""
    extra = getattr(result, "metrics", {})
    return {f"eval_return{suffix}": float(result), **{f"{k}{suffix}": v for k, v in extra.items()}}
