"""Pins every direct dependency of this project, the extras that `dev` pulls in included, to the lowest version
its requirement allows, so that `.ci/run` can test the floors `pyproject.toml` promises.

    python .ci/lowest.py > lowest.txt && pip install -e '.[dev]' -c lowest.txt

A requirement without a lower bound (`>=`, `==` or `~=`) is refused: its floor could not be tested.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements(project: dict, extra: str | None = None, seen: set | None = None) -> list[str]:
    """The direct requirements of the base install, or of `extra` with the extras it names, expanded."""
    seen = set() if seen is None else seen
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    out = []
    for req in reqs:
        own = re.fullmatch(rf"{re.escape(project['name'])}\[([\w,\s-]+)\]", req.strip())
        if own:
            for name in (e.strip() for e in own.group(1).split(",")):
                if name not in seen:
                    seen.add(name)
                    out += requirements(project, name, seen)
        else:
            out.append(req)
    return out


def floor(req: str) -> str:
    """`name[extras]>=x,<y` -> `name==x`; SystemExit for a requirement without a floor."""
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", req)
    name, spec = m.group(1), m.group(3)
    low = re.search(r"(?:>=|==|~=)\s*([0-9][^,;\s]*)", spec)
    if not low:
        sys.exit(f"error: requirement {req!r} has no lower bound (>=, == or ~=); give it one that is tested")
    return f"{name}=={low.group(1)}"


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = requirements(project) + requirements(project, "dev")
    pins = {}
    for req in reqs:
        name, version = floor(req).split("==")
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in pins and pins[key][1] != version:  # one package asked for twice: the higher floor holds
            version = max(pins[key][1], version, key=lambda v: [int(x) if x.isdigit() else 0 for x in v.split(".")])
        pins[key] = (name, version)
    print("\n".join(f"{name}=={version}" for name, version in sorted(pins.values())))


if __name__ == "__main__":
    main()
