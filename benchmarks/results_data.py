"""The raw results behind the results pages, kept apart from the code.

The results pages (tables, figures, commands) are in the main branch; the raw files they name (run
tarballs, checkpoints, per-run folders and metrics) are on the branch ``results-data``, at the same
paths. This script puts them where the pages name them, or records new ones there.

    python benchmarks/results_data.py fetch                  # every raw file (`list` gives sizes)
    python benchmarks/results_data.py fetch benchmarks/robot_results/legged/data/partG1   # one folder
    python benchmarks/results_data.py list [PATH ...]        # what there is, with sizes
    python benchmarks/results_data.py publish -m "G1, seed 1"  # record new raw files (then push both branches)

``fetch`` reads the commit named in ``benchmarks/results_data.json``; in a clone without it (e.g. a
shallow one) it first runs ``git fetch --depth 1 origin <commit>``, which needs the network. It never
writes over a file that differs from the recorded one (``--force`` does). ``publish`` commits every raw
file of the working tree that is new or changed onto ``results-data``, records the new commit in
``results_data.json``, and commits that on the current branch with the data commit as a second parent,
so that main's history holds the raw files while main's tree does not.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = ROOT / "benchmarks" / "results_data.json"
FETCH = "python benchmarks/results_data.py fetch"
# What counts as raw: the same patterns as .gitignore's "raw results" block (tests check that they agree).
RAW = (
    "benchmarks/**/data/**",  # run tarballs and checkpoints
    "benchmarks/halving_results/*/arms/**",  # per-run folders
    "benchmarks/robot_results/playground/blocks/*/**",
    "benchmarks/**/*.metrics.jsonl",  # per-run metrics kept beside a page
    "weights/cfm-cifar10-35m/diffusion_pytorch_model.safetensors",  # the paper-layout weights (71.5 MB)
)


def pattern(glob: str) -> re.Pattern:
    """A .gitignore-style glob as a regex: ``**/`` spans folders (or none), ``*`` stays within one."""
    parts = re.split(r"(\*\*/|\*\*|\*)", glob)
    spans = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*"}
    return re.compile("".join(spans.get(s, re.escape(s)) for s in parts))


PATTERNS = [pattern(g) for g in RAW]


def is_raw(path: str) -> bool:
    """Whether a repository path (``/``-separated, relative to the root) is a raw results file."""
    return any(p.fullmatch(path) for p in PATTERNS)


def require(path: str | Path) -> Path:
    """``path``, or exit with the one command that fetches it when it is a raw file that is not here."""
    p = Path(path)
    if p.exists():
        return p
    rel = os.path.relpath(p.resolve(), ROOT).replace(os.sep, "/")
    if rel.startswith("..") or not is_raw(rel):
        sys.exit(f"error: {path} not found")
    sys.exit(f"error: {path} not found; it is on the results-data branch: {FETCH} {rel}")


def git(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, **kw)
    if check and r.returncode != 0:
        err = r.stderr.decode() if isinstance(r.stderr, bytes) else r.stderr
        sys.exit(f"error: git {' '.join(args)} failed: {err.strip().splitlines()[-1] if err.strip() else r.returncode}")
    return r


def pinned() -> dict:
    """``{"branch": ..., "commit": ...}`` from results_data.json."""
    try:
        pin = json.loads(PIN.read_text())
        return {"branch": str(pin["branch"]), "commit": str(pin["commit"])}
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {PIN} is missing or malformed ({e}); it names the results-data branch and commit")


def have(commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0


def ensure_commit(remote: str) -> str:
    """The pinned commit, fetched from ``remote`` (one commit, no history) when this clone lacks it."""
    pin = pinned()
    commit = pin["commit"]
    if have(commit):
        return commit
    if git("rev-parse", "--git-dir", check=False).returncode != 0:
        sys.exit(f"error: {ROOT} is not a git clone; clone the repository to fetch its results data")
    print(f"fetching {pin['branch']} at {commit[:12]} from {remote} ...", flush=True)
    r = git("fetch", "--depth", "1", remote, commit, check=False, text=True)
    if r.returncode != 0:  # a server that refuses to serve a commit by name still serves the branch
        r = git("fetch", remote, f"refs/heads/{pin['branch']}", check=False, text=True)
    if r.returncode != 0 or not have(commit):
        why = (r.stderr or "").strip().splitlines()
        sys.exit(f"error: could not fetch {pin['branch']} ({commit[:12]}) from {remote}: {why[-1] if why else '?'}")
    return commit


def raw_files(commit: str, paths: list[str]) -> list[tuple[str, str, int]]:
    """(path, blob, size) of every raw file of ``commit`` under ``paths`` (all of them when empty)."""
    args = ["ls-tree", "-r", "-l", "-z", commit, "--", *paths]
    out = git(*args).stdout.decode()
    files = []
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        _, kind, blob, size = meta.split()
        if kind == "blob" and is_raw(path):
            files.append((path, blob, int(size)))
    return files


def repo_paths(paths: list[str]) -> list[str]:
    """Command-line paths (relative to the current folder or absolute) as repository paths."""
    out = []
    for p in paths:
        rel = os.path.relpath(Path(p).resolve(), ROOT)
        if rel.startswith(".."):
            sys.exit(f"error: {p} is outside the repository {ROOT}")
        out.append("." if rel == "." else rel.replace(os.sep, "/"))
    return out


def blobs(paths: list[str], write: bool = False) -> list[str]:
    """Git's blob ids of the files at ``paths`` (repository paths), stored in the repository when ``write``."""
    args = ["hash-object", *(["-w"] if write else []), "--stdin-paths"]
    return git(*args, input="".join(f"{p}\n" for p in paths), text=True).stdout.split()


def fetch(paths: list[str], remote: str, force: bool) -> int:
    commit = ensure_commit(remote)
    files = raw_files(commit, repo_paths(paths))
    if not files:
        sys.exit(f"error: no raw results under {' '.join(paths) or 'the repository'} in {commit[:12]}")
    wrote = same = kept = 0
    batch = ["git", "-C", str(ROOT), "cat-file", "--batch"]
    with subprocess.Popen(batch, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as cat:
        for path, blob, size in files:
            dest = ROOT / path
            if dest.exists():
                if dest.stat().st_size == size and blobs([path]) == [blob]:
                    same += 1
                    continue
                if not force:
                    print(f"kept {path}: it differs from the recorded file (--force writes over it)", file=sys.stderr)
                    kept += 1
                    continue
            cat.stdin.write(f"{blob}\n".encode())
            cat.stdin.flush()
            header = cat.stdout.readline().split()
            data = cat.stdout.read(int(header[2]))
            cat.stdout.read(1)  # the newline after the contents
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            tmp.write_bytes(data)
            tmp.replace(dest)
            wrote += 1
    total = sum(s for _, _, s in files) / 1e6
    print(f"{len(files)} raw files ({total:.1f} MB) from {commit[:12]}: ", end="")
    print(f"{wrote} written, {same} already there, {kept} kept")
    return 1 if kept else 0


def list_files(paths: list[str], remote: str) -> int:
    commit = ensure_commit(remote)
    files = raw_files(commit, repo_paths(paths))
    for path, _, size in files:
        here = "here" if (ROOT / path).exists() else "-"
        print(f"{size:>12,}  {here:>4}  {path}")
    print(f"{len(files)} files, {sum(s for _, _, s in files) / 1e6:.1f} MB, commit {commit[:12]}")
    return 0


def publish(message: str, remote: str) -> int:
    """Commit the working tree's new or changed raw files onto the results-data branch and record it."""
    pin = pinned()
    base = ensure_commit(remote)
    if git("diff", "--cached", "--quiet", check=False).returncode != 0:
        sys.exit("error: the index holds staged changes; commit or unstage them first (publish makes its own commit)")
    recorded = {p: b for p, b, _ in raw_files(base, [])}
    tops = sorted({glob.split("/")[0] for glob in RAW})  # the folders raw files live under
    out = git("ls-files", "--others", "--ignored", "--exclude-standard", "-z", "--", *tops).stdout.decode()
    new = [p for p in filter(None, out.split("\0")) if is_raw(p) and not p.endswith(".part")]
    changed = [p for p, b in zip(new, blobs(new)) if recorded.get(p) != b]
    if not changed:
        print("nothing to publish: every raw file here is already recorded")
        return 0
    with tempfile.TemporaryDirectory() as tmp:  # a private index: the working tree's own index is untouched
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git("read-tree", base, env=env)
        for p, blob in zip(changed, blobs(changed, write=True)):
            git("update-index", "--add", "--cacheinfo", f"100644,{blob},{p}", env=env)
        tree = git("write-tree", env=env, text=True).stdout.strip()
    data = git("commit-tree", tree, "-p", base, "-m", message, text=True).stdout.strip()
    git("update-ref", f"refs/heads/{pin['branch']}", data)
    # The pin's commit gets the data commit as a second parent, so main's history holds the raw files.
    git("merge", "-s", "ours", "--no-ff", "--no-commit", data)
    PIN.write_text(json.dumps({"branch": pin["branch"], "commit": data}, indent=2) + "\n")
    git("add", "--", str(PIN.relative_to(ROOT)))
    git("commit", "-q", "-m", f"Results data: {message}")
    for p in changed:
        print(f"published {p}")
    print(f"{pin['branch']} is now {data[:12]}; publish both with: git push {remote} {pin['branch']} HEAD")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="put the raw files where the pages name them")
    f.add_argument("paths", nargs="*", help="only the raw files under these paths (default: all)")
    f.add_argument("--force", action="store_true", help="write over a local file that differs from the recorded one")
    ls = sub.add_parser("list", help="the raw files, their sizes and whether they are here")
    ls.add_argument("paths", nargs="*")
    pub = sub.add_parser("publish", help="record the working tree's new raw files on the results-data branch")
    pub.add_argument("-m", "--message", required=True, help="what the new files are")
    for s in (f, ls, pub):
        s.add_argument("--remote", default="origin", help="where to fetch the results-data commit from")
    a = p.parse_args(argv)
    if a.command == "fetch":
        return fetch(a.paths, a.remote, a.force)
    if a.command == "list":
        return list_files(a.paths, a.remote)
    return publish(a.message, a.remote)


if __name__ == "__main__":
    sys.exit(main())
