"""The run folder both trainers write: one format, one set of names, one contract.

    runs/<run_name>/
        args.json            every resolved setting of the run
        metrics.jsonl        one strict-JSON row per update / validation (non-finite values as null)
        events.out.tfevents* the same scalars for TensorBoard (`tensorboard --logdir runs`)
        summary.json         status, updates done, the per-run peak (eq:peak) and where it was
        curve.png            validation reward (CIFAR) or evaluation return (robots) so far
        samples/*.png        image grids (CIFAR)
        checkpoints/last.pt  model, optimiser, run state and every RNG state, written atomically

The contract: a folder that holds a checkpoint is never written over without ``--resume``;
``--resume`` refuses settings that differ from the folder's ``args.json`` (except those a trainer
lists as free to change, such as the budget); a failed start leaves no folder behind; a failed
checkpoint write leaves the previous checkpoint and no temporary file; Ctrl-C or SIGTERM asks the
trainer to stop at its next safe point; and every failure a user can meet ends in one line on
stderr and one of these exit codes:

    0    finished, paused at --until, or stopped early by the stopping rule
    2    bad argument (unknown value, unknown environment, refused overwrite, settings differ)
    3    the run went non-finite (its last good checkpoint is kept)
    4    a model or checkpoint file is missing or corrupt (``--resume`` of a run that has none included)
    5    the output directory is not writable or full
    130  interrupted by Ctrl-C or SIGTERM (resume with --resume)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Optional

import numpy as np
import torch

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3
EXIT_BAD_FILE = 4
EXIT_IO = 5
EXIT_INTERRUPTED = 130
STATUS_EXIT = {
    "finished": EXIT_OK,
    "paused": EXIT_OK,
    "stopped": EXIT_OK,
    "nonfinite": EXIT_NONFINITE,
    "interrupted": EXIT_INTERRUPTED,
}

CHECKPOINT = "checkpoints/last.pt"
ARGS, METRICS, SUMMARY, CURVE = "args.json", "metrics.jsonl", "summary.json", "curve.png"
# What a fresh start clears from a folder that holds no checkpoint (the leftovers of a failed start).
LEFTOVERS = (ARGS, METRICS, SUMMARY, CURVE, "samples", "checkpoints")


class RunError(Exception):
    """A failure the user can act on: `str(err)` is one line, `err.code` the exit code."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


class NonFiniteLoss(RuntimeError):
    """Raised by a trainer's update when a loss or gradient is not finite (the run ends with status ``nonfinite``)."""


# ---------------------------------------------------------------------------------------------
# Strict JSON and atomic files
# ---------------------------------------------------------------------------------------------
def strict(obj: Any) -> Any:
    """`obj` as plain JSON values: non-finite floats become None, numpy/torch scalars Python ones."""
    if isinstance(obj, Mapping):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return strict(obj.tolist())
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        obj = obj.item()
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def dumps(obj: Any, **kwargs) -> str:
    return json.dumps(strict(obj), allow_nan=False, **kwargs)


def _io_error(what: Path, err: BaseException) -> RunError:
    reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
    return RunError(f"cannot write {what}: {reason}; free space or choose another --runs-dir", EXIT_IO)


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') bytes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)`, fsync tmp, rename it over `path` and fsync the folder: after a crash or power loss
    `path` holds the old file or the new one, whole. On failure tmp is removed and the old file kept."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as RuntimeError
        tmp.unlink(missing_ok=True)
        raise _io_error(path, err) from err


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics.jsonl file ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# RNG state
# ---------------------------------------------------------------------------------------------
def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())  # map_location may have moved it to a GPU
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def resume_mode(args: Any) -> bool | Literal["or-start"]:
    """RunFolder's `resume` from a trainer's `--resume` and `--resume-or-start` flags."""
    return "or-start" if getattr(args, "resume_or_start", False) else bool(args.resume)


def nothing_to_resume(runs_dir: Path, run_name: str) -> str:
    """The one line for `--resume` of a run that has no checkpoint: where it looked, what is there."""
    names = sorted(p.parent.parent.name for p in runs_dir.glob(f"*/{CHECKPOINT}")) if runs_dir.is_dir() else []
    close = difflib.get_close_matches(run_name, names, n=5, cutoff=0.0)
    there = f"runs that can be resumed there: {', '.join(close)}" if close else "no run there has a checkpoint"
    return f"--resume: {runs_dir / run_name} has no checkpoint to continue ({there}); --resume-or-start starts it"


# ---------------------------------------------------------------------------------------------
# The run folder
# ---------------------------------------------------------------------------------------------
class RunFolder:
    """`runs_dir/run_name` for one run. Use it as a context manager around the training loop.

    `config` is the run's resolved settings (written to args.json), a mapping or the trainer's Args
    dataclass. `resume`: True continues the folder's checkpoint (and refuses a folder that has none),
    "or-start" continues it where there is one and starts the run where not. `may_change` names the
    settings that `--resume` accepts with a new value (the budget,
    logging and device flags): any other difference is refused with one line listing the names and
    both values. With an Args dataclass, a setting that the folder's args.json lacks (one the trainer
    gained after the run started) is accepted at its default value.
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike,
        run_name: str,
        config: Mapping[str, Any],
        resume: bool | Literal["or-start"],
        may_change: Iterable[str] = (),
        track: bool = False,
        wandb_project_name: str = "fpo",
        wandb_entity: Optional[str] = None,
    ):
        if not run_name or run_name in (".", "..") or "/" in run_name or os.sep in run_name:
            raise RunError(f"--run-name {run_name!r} is not a folder name; use letters, digits, '-', '_', '.'")
        self.path = Path(runs_dir) / run_name
        self.ckpt_path = self.path / CHECKPOINT
        is_args = dataclasses.is_dataclass(config)
        fields = dataclasses.fields(config) if is_args else ()
        self.defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        self.config = strict(dataclasses.asdict(config) if is_args else dict(config))
        self.track, self.wandb_project_name, self.wandb_entity = track, wandb_project_name, wandb_entity
        self.stop_requested = False
        self.signal_name: Optional[str] = None
        self._writer = None
        self._wandb = None
        self._summary: Optional[dict] = None
        self._handlers: dict = {}
        has_ckpt = self.ckpt_path.exists()
        if resume is True and not has_ckpt:
            raise RunError(nothing_to_resume(Path(runs_dir), run_name), EXIT_BAD_FILE)
        if has_ckpt and not resume:
            raise RunError(
                f"run folder {self.path} already holds a checkpoint: pass --resume to continue it, "
                f"or --run-name to start another run"
            )
        self.resuming = has_ckpt
        self._created = not self.path.exists()
        if self.resuming:
            self._check_same_settings(set(may_change))

    def _check_same_settings(self, may_change: set) -> None:
        try:
            saved = json.loads((self.path / ARGS).read_text())
        except (OSError, ValueError) as err:
            raise RunError(
                f"cannot read {self.path / ARGS} ({type(err).__name__}); it records the run's "
                f"settings, which --resume needs",
                EXIT_BAD_FILE,
            ) from err

        def shown(d, k):
            return repr(d[k]) if k in d else "(unset)"

        def differs(k):  # a setting args.json lacks is accepted at its default (the trainer gained it since)
            if k in may_change:
                return False
            if k not in saved:
                return not (k in self.defaults and self.config[k] == strict(self.defaults[k]))
            return k not in self.config or saved[k] != self.config[k]

        diffs = [
            f"{k}: {shown(saved, k)} -> {shown(self.config, k)}"
            for k in sorted(set(saved) | set(self.config))
            if differs(k)
        ]
        if diffs:
            raise RunError(
                f"--resume: settings differ from {self.path / ARGS}: {'; '.join(diffs)} "
                f"(pass the folder's values, or --run-name to start another run)"
            )

    # --- context: signals, cleanup ---------------------------------------------------------------
    def __enter__(self) -> "RunFolder":
        """Create the folder (a fresh start clears a failed start's leftovers), write args.json and
        turn SIGINT / SIGTERM into `stop_requested`."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not self.resuming:
                for name in LEFTOVERS:
                    p = self.path / name
                    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
                for p in self.path.glob("events.out.tfevents.*"):
                    p.unlink()
            atomic_write_text(self.path / ARGS, json.dumps(self.config, indent=2))
        except OSError as err:
            self._remove_failed_start()
            raise _io_error(self.path, err) from err
        except RunError:
            self._remove_failed_start()
            raise
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        if self.stop_requested:  # a second signal stops at once
            raise KeyboardInterrupt
        self.stop_requested = True
        self.signal_name = signal.Signals(signum).name
        print(
            f"\n{self.signal_name}: stopping at the next safe point (send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, exc_type, exc, tb) -> bool:
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers = {}
        self.close()
        if exc_type is not None:
            if not self.ckpt_path.exists():
                self._remove_failed_start()
            elif self._summary is not None:
                status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
                reason = str(exc).splitlines()[0] if str(exc) else exc_type.__name__
                try:
                    self.write_summary({**self._summary, "status": status, "stop_reason": reason})
                except RunError:
                    pass
        return False

    def _remove_failed_start(self) -> None:
        """A start that failed before its first checkpoint leaves nothing behind."""
        if self._created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for p in [self.path / name for name in LEFTOVERS] + list(self.path.glob("events.out.tfevents.*")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        try:
            self.path.rmdir()  # only if nothing else is in it
        except OSError:
            pass

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    # --- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, payload: Mapping[str, Any], keep_as: Optional[str] = None) -> None:
        """Atomically write `payload` plus every RNG state to checkpoints/last.pt (and to checkpoints/`keep_as`)."""
        state = {**payload, "rng": rng_state()}
        for path in [self.ckpt_path] + ([self.ckpt_path.with_name(keep_as)] if keep_as else []):
            atomic_write(path, lambda tmp: torch.save(state, tmp))

    def load_checkpoint(self, map_location: Any = "cpu") -> dict:
        """Read checkpoints/last.pt and restore the RNG states it holds."""
        try:
            payload = torch.load(self.ckpt_path, map_location=map_location, weights_only=False)
            if not isinstance(payload, dict) or "rng" not in payload:
                raise ValueError("not a run checkpoint")
        except Exception as err:  # truncated, foreign or unreadable file: all end the same way
            raise RunError(
                f"checkpoint {self.ckpt_path} is unreadable ({type(err).__name__}); restore a copy, "
                f"or delete the folder to start over",
                EXIT_BAD_FILE,
            ) from err
        set_rng_state(payload["rng"])
        return payload

    # --- metrics ---------------------------------------------------------------------------------
    def truncate_metrics(self, keep: Callable[[dict], bool]) -> None:
        """Keep only the rows for which keep(row) holds (on resume: drop rows after the checkpoint)."""
        rows = [r for r in read_jsonl(self.path / METRICS) if keep(r)]
        atomic_write_text(self.path / METRICS, "".join(dumps(r) + "\n" for r in rows))

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.path / METRICS)

    def _tensorboard(self):
        if self._writer is None:
            if self.track and self._wandb is None:
                try:
                    import wandb
                except ImportError as err:
                    raise RunError("--track sends scalars to Weights & Biases: pip install wandb") from err
                self._wandb = wandb.init(
                    project=self.wandb_project_name,
                    entity=self.wandb_entity,
                    name=self.path.name,
                    config=self.config,
                    sync_tensorboard=True,
                    save_code=True,
                )
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.path))
        return self._writer

    def log(self, row: Mapping[str, Any], step: int, tags: Optional[Mapping[str, str]] = None) -> None:
        """Append `row` to metrics.jsonl and its numbers to TensorBoard (tag `charts/<key>` unless
        `tags` names another, e.g. {"loss": "losses/loss"}) at x = `step`."""
        line = dumps(row) + "\n"
        try:
            with open(self.path / METRICS, "a") as f:
                f.write(line)
        except OSError as err:
            raise _io_error(self.path / METRICS, err) from err
        writer = self._tensorboard()
        for key, value in row.items():
            if key in ("update", "global_step", "kind") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float, np.number)) and math.isfinite(value):
                writer.add_scalar((tags or {}).get(key, f"charts/{key}"), float(value), step)

    # --- summary and pictures --------------------------------------------------------------------
    def write_summary(self, summary: Mapping[str, Any]) -> dict:
        summary = strict(dict(summary))
        atomic_write_text(self.path / SUMMARY, json.dumps(summary, indent=2))
        self._summary = summary
        return summary

    def save_images(self, images: torch.Tensor, name: str, nrow: int = 8) -> Path:
        """Images in [-1, 1], shape (N, 3, H, W), as one PNG grid samples/<name>.png."""
        from PIL import Image

        x = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
        n, h, w, _ = x.shape
        rows = (n + nrow - 1) // nrow
        grid = np.full((rows * (h + 2) + 2, nrow * (w + 2) + 2, 3), 255, dtype=np.uint8)
        for i in range(n):
            r, c = divmod(i, nrow)
            grid[2 + r * (h + 2) : 2 + r * (h + 2) + h, 2 + c * (w + 2) : 2 + c * (w + 2) + w] = x[i]
        path = self.path / "samples" / f"{name}.png"
        atomic_write(path, lambda tmp: Image.fromarray(grid).save(tmp, format="PNG"))
        return path

    def plot_curve(self, x: Iterable[float], y: Iterable[float], xlabel: str, ylabel: str) -> Path:
        """curve.png: `y` against `x` (the learning curve so far)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(5.5, 3.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax.plot(list(x), [np.nan if v is None else v for v in y], marker="o", markersize=3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(self.path.name, fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = self.path / CURVE
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
        return path

    def progress(self, total: int, initial: int = 0, unit: str = "update"):
        """A progress bar with rate and time left; silent when stderr is not a terminal."""
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, disable=not sys.stderr.isatty())


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def exit_code(status: Optional[str]) -> int:
    return STATUS_EXIT.get(status or "finished", EXIT_OK)


def flag_values(argv: list[str], name: str) -> list[str]:
    """Values given to --name (either spelling, `--flag v` or `--flag=v`) in argv."""
    flags = {"--" + name.replace("_", "-"), "--" + name}
    out = []
    for i, tok in enumerate(argv):
        head, eq, value = tok.partition("=")
        if head in flags:
            if eq:
                out.append(value)
            elif i + 1 < len(argv):
                out.append(argv[i + 1])
    return out


def _literal_choices(tp) -> Optional[tuple]:
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if typing.get_origin(arg) is typing.Literal:
                return typing.get_args(arg)
    return None


def check_choices(args_type: type, argv: list[str]) -> None:
    """One-line error for a closed choice (a `Literal` field) given a value it does not allow."""
    for name, tp in typing.get_type_hints(args_type).items():
        choices = _literal_choices(tp)
        if choices is None:
            continue
        allowed = [str(c) for c in choices]
        for value in flag_values(argv, name):
            if value not in allowed and not (value == "None" and type(None) in typing.get_args(tp)):
                raise RunError(f"--{name.replace('_', '-')} {value!r} is not one of {', '.join(allowed)}")


def cli(
    main: Callable[[Any], Any],
    args_type: type,
    presets: Optional[Mapping[str, Any]] = None,
    argv: Optional[list[str]] = None,
) -> None:
    """Parse the command line into `args_type` (defaults from `--preset NAME` when presets are given),
    run `main(args)`, and exit with the code of the returned summary's status. Every RunError or
    ValueError ends as one line on stderr and its exit code."""
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        default = None
        if presets:
            names = flag_values(argv, "preset")
            name = names[-1] if names else getattr(args_type, "preset", next(iter(presets)))
            if name not in presets:
                raise RunError(f"--preset {name!r} is not one of {', '.join(presets)}")
            default = presets[name]
        check_choices(args_type, argv)
        args = tyro.cli(args_type, default=default, args=argv)
        summary = main(args)
    except RunError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.code)
    except ValueError as err:  # bad input found while building the run
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except FileNotFoundError as err:  # a file the settings name (weights, a reward's model) is missing
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_FILE)
    except KeyboardInterrupt:
        print("error: interrupted; continue with --resume", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    status = summary.get("status") if isinstance(summary, Mapping) else None
    code = exit_code(status)
    if code != EXIT_OK:
        what = {
            "nonfinite": "the run went non-finite; its last good checkpoint is kept",
            "interrupted": "interrupted; continue with --resume",
        }[status]
        print(f"error: {what} ({summary.get('stop_reason') or status})", file=sys.stderr)
    sys.exit(code)
