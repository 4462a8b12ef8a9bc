"""Raw results apart from the code: main's tree stays small, every raw file a results page names is on the
results-data commit that benchmarks/results_data.py fetches, and fetch and publish work in real clones."""

import json
import os
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "results_data.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import results_data  # noqa: E402

COMMIT = json.loads((ROOT / "benchmarks" / "results_data.json").read_text())["commit"]
FETCH = "results_data.py fetch"  # the documented command every page that names a raw file carries
MAX_TREE_BYTES = 40_000_000


def ignored_in_main(paths) -> set:
    """The repository paths among `paths` that main's .gitignore ignores (whether or not they exist)."""
    r = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin", "-z"],
        input="\0".join(paths) + "\0",
        capture_output=True,
        text=True,
    )
    return {p for p in r.stdout.split("\0") if p}


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def have_commit() -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{COMMIT}^{{commit}}"], capture_output=True)
    return r.returncode == 0


needs_commit = pytest.mark.skipif(
    not (ROOT / ".git").exists() or not have_commit(),
    reason="the results-data commit is not in this clone (a shallow clone or an unpacked archive)",
)


def tracked() -> list[str]:
    return [p for p in git("ls-files", "-z").split("\0") if p]


def test_main_tracks_no_raw_file_and_stays_small():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    files = tracked()
    assert [p for p in files if results_data.is_raw(p)] == []
    size = sum((ROOT / p).stat().st_size for p in files if (ROOT / p).is_file())
    assert size <= MAX_TREE_BYTES, f"main's tree is {size / 1e6:.1f} MB (at most {MAX_TREE_BYTES / 1e6:.0f})"


def test_raw_patterns_match_by_path_as_gitignore_does():
    assert results_data.is_raw("benchmarks/robot_results/legged/data/partG1/study.tar.gz.00")
    assert results_data.is_raw("benchmarks/data/x.tar.gz")  # **/ spans no folder too
    assert results_data.is_raw("benchmarks/halving_results/rungs_20_40_80/arms/a/metrics.jsonl")
    assert results_data.is_raw("benchmarks/robot_results/blocks_split/WalkerRun_after.metrics.jsonl")
    assert not results_data.is_raw("benchmarks/halving_results/a/b/arms/x")  # * stays within one folder
    assert not results_data.is_raw("benchmarks/robot_results/playground/blocks/blocks_h200_run_a.json")
    assert not results_data.is_raw("benchmarks/robot_results/legged/README.md")
    assert not results_data.is_raw("weights/data/x")
    assert results_data.is_raw("weights/cfm-cifar10-35m/diffusion_pytorch_model.safetensors")
    assert not results_data.is_raw("weights/cfm-cifar10-small/diffusion_pytorch_model.safetensors")  # shipped
    assert not results_data.is_raw("weights/cfm-cifar10-35m/config.json")


def test_gitignore_ignores_the_raw_weights_and_not_the_shipped_ones():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    paths = {
        "weights/cfm-cifar10-35m/diffusion_pytorch_model.safetensors": True,
        "weights/cfm-cifar10-35m/config.json": False,
        "weights/cfm-cifar10-small/diffusion_pytorch_model.safetensors": False,
        "benchmarks/pretrain_results/data/lease1/train_state.pt.00": True,
        "benchmarks/pretrain_results/README.md": False,
    }
    ignored = ignored_in_main(paths)
    assert {p for p, raw in paths.items() if raw} == ignored
    assert all(results_data.is_raw(p) == raw for p, raw in paths.items())


@needs_commit
def test_every_raw_file_is_ignored_in_main_and_nothing_else_is():
    # .gitignore and the script's RAW say the same thing: fetched files never show up as untracked, and no file
    # of the results-data tree that is ignored in main is left behind by fetch.
    paths = [p for p in git("ls-tree", "-r", "--name-only", "-z", COMMIT, "--", "benchmarks").split("\0") if p]
    ignored = ignored_in_main(paths)
    raw = {p for p in paths if results_data.is_raw(p)}
    assert raw and raw == ignored, sorted(raw ^ ignored)[:10]


# A page names a raw file as a path, mostly in backticks: `data/partN.tar.gz`, `../data/partP.tar.gz`, `data/partG1/`,
# `landscape_{edge,mixed}_s20260724.tar.gz` (in its data/ folder), a command's arguments.
RAWISH = re.compile(r"(^|/)data/|\.tar\.gz(\.\d+)?$|/arms/|\.metrics\.jsonl$")


def braces(token: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [x for alt in m.group(1).split(",") for x in braces(token[: m.start()] + alt + token[m.end() :])]


def page_tokens(page: Path):
    for token in page.read_text().split():
        token = token.strip("`").lstrip("(").rstrip(",.;:)").strip("`")
        if RAWISH.search(token) and not any(c in token for c in "$<>=") and not token.startswith("/tmp"):
            yield token


def resolve(page: Path, token: str, files: list[str]) -> bool:
    """Whether ``token`` on ``page`` names a file (or a folder of files) in ``files``."""
    here = PurePosixPath(page.parent.relative_to(ROOT).as_posix())
    for t in braces(token):
        t = t.rstrip("/")
        candidates = {os.path.normpath(here / t), os.path.normpath(t)}
        for c in candidates:
            if any(fnmatchcase(f, c) or fnmatchcase(f, c + "/*") for f in files):
                return True
        # a bare name (or a data/... tail) inside the page's own folder tree
        inside = [f for f in files if f.startswith(f"{here}/")]
        if any(fnmatchcase(f, f"*/{t}") or fnmatchcase(f, f"*/{t}/*") for f in inside):
            return True
    return False


def pages() -> list[Path]:
    return [ROOT / p for p in tracked() if p.endswith(".md") and (p.startswith("benchmarks/") or p == "README.md")]


@needs_commit
def test_every_raw_file_a_page_names_is_reachable_by_the_fetch_command():
    raw = [p for p, _, _ in results_data.raw_files(COMMIT, [])]
    main = tracked()
    missing, unexplained, named = [], [], 0
    for page in pages():
        on_branch = False
        for token in page_tokens(page):
            if resolve(page, token, raw):
                on_branch = True
                named += 1
            elif not resolve(page, token, main):
                missing.append(f"{page.relative_to(ROOT)}: {token}")
        if on_branch and FETCH not in page.read_text():
            unexplained.append(str(page.relative_to(ROOT)))
    assert named > 40  # the parser finds the pages' raw files at all
    assert missing == [], "raw files named by a page but on neither branch:\n" + "\n".join(missing)
    assert unexplained == [], f"pages naming raw files without saying how to fetch them ({FETCH}): {unexplained}"


def test_the_page_checker_can_fail(tmp_path):
    page = ROOT / "benchmarks" / "robot_results" / "legged" / "README.md"
    files = ["benchmarks/robot_results/legged/data/partN.tar.gz", "benchmarks/cifar_results/data/a_s1.tar.gz"]
    assert resolve(page, "data/partN.tar.gz", files) and resolve(page, "partN.tar.gz", files)
    assert not resolve(page, "data/partX.tar.gz", files)
    assert not resolve(page, "a_s1.tar.gz", files)  # another page's folder
    cifar = ROOT / "benchmarks" / "cifar_results" / "README.md"
    assert resolve(cifar, "benchmarks/cifar_results/data/*.tar.gz", files)
    assert resolve(cifar, "{a,b}_s1.tar.gz", files) and not resolve(cifar, "{a,c}_s2.tar.gz", files)


def clone(src: Path, dest: Path, *flags: str) -> Path:
    subprocess.run(["git", "clone", "-q", *flags, f"file://{src}", str(dest)], check=True, timeout=300)
    # The clone runs this checkout's script and pin (the committed ones may be older while they are edited).
    for p in (SCRIPT, ROOT / "benchmarks" / "results_data.json", ROOT / ".gitignore"):
        shutil.copy2(p, dest / p.relative_to(ROOT))
    return dest


def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(repo / "benchmarks" / "results_data.py"), *args]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_commit
def test_fetch_into_a_shallow_clone_puts_the_raw_files_where_the_pages_name_them(tmp_path):
    repo = clone(ROOT, tmp_path / "shallow", "--depth", "1", "--single-branch", "--no-local")
    asked = ["benchmarks/robot_results/legged/data/partN.tar.gz", "benchmarks/halving_results"]
    want = {p: (b, s) for p, b, s in results_data.raw_files(COMMIT, asked)}
    assert len(want) > 10
    r = run(repo, "fetch", *asked)
    assert r.returncode == 0, r.stderr
    assert f"{len(want)} raw files" in r.stdout and f"{len(want)} written" in r.stdout
    for p, (blob, size) in want.items():
        assert (repo / p).stat().st_size == size
        assert git("hash-object", str(repo / p), cwd=repo).strip() == blob
    assert not (repo / "benchmarks" / "cifar_results" / "data").exists()  # only what was asked for
    assert git("status", "--porcelain", "--", "benchmarks/halving_results", cwd=repo).strip() == ""

    # Never over a file that differs from the recorded one, unless asked to.
    changed = next(repo / p for p in want if p.endswith("summary.json"))
    changed.write_text("mine")
    r = run(repo, "fetch", "benchmarks/halving_results")
    assert r.returncode == 1 and "kept" in r.stderr and changed.read_text() == "mine"
    assert run(repo, "fetch", "--force", "benchmarks/halving_results").returncode == 0
    assert changed.read_text() != "mine"

    r = run(repo, "list", "benchmarks/robot_results/legged/data")
    assert r.returncode == 0 and "partG1/study.tar.gz.00" in r.stdout
    r = run(repo, "fetch", "benchmarks/nothing_here")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "benchmarks/nothing_here" in r.stderr


@pytest.mark.slow
@needs_commit
def test_publish_records_new_raw_files_on_the_branch_and_in_mains_history(tmp_path):
    origin = clone(ROOT, tmp_path / "origin")  # a full clone (hard links), standing for the published repository
    git("add", "-A", cwd=origin)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "this checkout", cwd=origin)
    git("branch", "-f", "results-data", COMMIT, cwd=origin)
    new = origin / "benchmarks" / "robot_results" / "legged" / "data" / "partNEW" / "study.tar.gz.00"
    new.parent.mkdir(parents=True)
    new.write_bytes(os.urandom(1000))
    weights = origin / "weights" / "cfm-cifar10-35m" / "diffusion_pytorch_model.safetensors"  # raw outside benchmarks/
    weights.parent.mkdir(parents=True)
    weights.write_bytes(os.urandom(1000))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    cmd = [sys.executable, str(origin / "benchmarks" / "results_data.py"), "publish", "-m", "partNEW"]
    r = subprocess.run(cmd, cwd=origin, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "published benchmarks/robot_results/legged/data/partNEW/study.tar.gz.00" in r.stdout
    assert "published weights/cfm-cifar10-35m/diffusion_pytorch_model.safetensors" in r.stdout
    data = git("rev-parse", "results-data", cwd=origin).strip()
    assert data != COMMIT and git("rev-parse", f"{data}^", cwd=origin).strip() == COMMIT
    assert json.loads((origin / "benchmarks" / "results_data.json").read_text())["commit"] == data
    parents = git("rev-list", "--parents", "-n", "1", "HEAD", cwd=origin).split()
    assert parents[2] == data  # main's new commit: the pin, with the data commit as its second parent
    assert git("status", "--porcelain", cwd=origin).strip() == ""  # the new file is ignored, the pin committed
    assert "partNEW" not in git("ls-files", cwd=origin)
    assert run(origin, "publish", "-m", "again").stdout.startswith("nothing to publish")

    # A shallow clone of the new main fetches the new file with the documented command.
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{origin}", str(tmp_path / "user")], check=True)
    r = run(tmp_path / "user", "fetch", "benchmarks/robot_results/legged/data/partNEW")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "user" / new.relative_to(origin)).read_bytes() == new.read_bytes()
