"""Running a Triton check script in a subprocess (for tests/test_flow_triton.py): on the CPU through Triton's
interpreter (TRITON_INTERPRET=1), on a GPU directly."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def run_check(code: str, device: str, tol: float, interpret: bool) -> str:
    """The script's standard output; it reads the device and the tolerance from its arguments."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1" if interpret else "0")
    out = subprocess.run(
        [sys.executable, "-c", code, device, str(tol)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
