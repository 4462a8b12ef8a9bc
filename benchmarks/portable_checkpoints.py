"""A study's robot runs carried to another machine and resumed there.

A run's checkpoint holds its environments' simulator state, so that ``--resume`` continues every episode
exactly. That state is large (tens of MB for thousands of Playground environments) and tied to the machine's
physics library, so a run that must continue elsewhere leaves it behind: ``pack`` writes each run's last
checkpoint without it, ``unpack`` puts the runs back together on the next machine, and ``--resume`` then restarts
the environments (fresh episodes seeded from the seed and the update, as after ``--restart-every``). Networks,
optimiser, statistics, counters and random states continue exactly; the episodes do not.

    python benchmarks/portable_checkpoints.py pack DIR        # DIR/runs/NAME/checkpoints/last.pt: DIR/portable/NAME.pt
    python benchmarks/portable_checkpoints.py unpack SRC DIR  # SRC/runs/NAME, SRC/portable/NAME.pt -> DIR/runs/NAME

A run folder of ``benchmarks/playground_ppo.py`` (Brax's PPO) travels whole: its ``params.npz`` is small and holds
no simulator state, and ``unpack`` copies it as it is.

``bash benchmarks/robot_study.sh collect`` packs them when ``CHECKPOINTS=1`` is set, and
``bash benchmarks/robot_study.sh restore PARTS DIR`` unpacks what it collected; then a plan line with
``--resume --runs-dir $RUN_DIR --run-name NAME --num-updates N`` continues run NAME to update N.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

LAST = Path("checkpoints") / "last.pt"
PPO_PARAMS = "params.npz"  # benchmarks/playground_ppo.py's run folders keep what they resume from here


def pack(study: Path) -> list[str]:
    """Write study/portable/NAME.pt for every run with a checkpoint; returns the run names."""
    out, names = study / "portable", []
    for ckpt in sorted((study / "runs").glob(f"*/{LAST}")):
        name = ckpt.parent.parent.name
        payload = torch.load(ckpt, map_location="cpu", weights_only=False)
        if "rng" not in payload or "update" not in payload:
            raise SystemExit(f"error: {ckpt} is not a robot run's checkpoint (no rng or update)")
        out.mkdir(exist_ok=True)
        torch.save({**payload, "envs": None}, out / f"{name}.pt")
        names.append(name)
    return names


def unpack(src: Path, study: Path) -> list[str]:
    """Copy each run folder src/runs/NAME (its logs, settings, summary) into study/runs/NAME with its portable
    checkpoint as checkpoints/last.pt, and each run folder that holds a ``params.npz`` (``playground_ppo.py``'s,
    which resumes from it) as it is; returns the run names. An existing run folder there is never written over."""
    ckpts = {ckpt.stem: ckpt for ckpt in (src / "portable").glob("*.pt")}
    ppo = {run.parent.name: None for run in (src / "runs").glob(f"*/{PPO_PARAMS}")}
    for name, ckpt in sorted({**ppo, **ckpts}.items()):
        run, dest = src / "runs" / name, study / "runs" / name
        if not (run / "args.json").is_file():
            raise SystemExit(f"error: {run} has no args.json: not a run folder to resume")
        if dest.exists():
            raise SystemExit(f"error: {dest} exists; unpack into a new study folder")
        shutil.copytree(run, dest)
        if ckpt is not None:
            (dest / LAST).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ckpt, dest / LAST)
    return sorted({**ppo, **ckpts})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack").add_argument("study", type=Path)
    u = sub.add_parser("unpack")
    u.add_argument("src", type=Path)
    u.add_argument("study", type=Path)
    a = p.parse_args()
    names = pack(a.study) if a.cmd == "pack" else unpack(a.src, a.study)
    print(f"{a.cmd}: {len(names)} run(s){': ' + ', '.join(names) if names else ''}")


if __name__ == "__main__":
    main()
