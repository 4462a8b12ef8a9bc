"""Tests for robot_fpo_fast.py against the reference (robot_fpo.py): from the same state and batch, one update of the
fast variant equals the reference's to float tolerance (CPU here, CUDA graphs, compiled losses and Triton kernels on
a GPU); one rollout stores what the reference's stores; the run folder and resume are the reference's; an actor
edit that a fast sampler cannot mirror stops the fast variant at setup. Also its pieces: the CUDA-graph step
(fpo_utils/graphs.py), the captured and NumPy samplers (fpo_utils/samplers.py), the one-copy environment step."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict, fields, replace
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_robot_fpo import strip_time, tiny_args  # noqa: E402

import robot_fpo as R  # noqa: E402
import robot_fpo_fast as F  # noqa: E402
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.env_layout import env_out_size, env_out_views, unpack_step  # noqa: E402
from fpo_utils.envs import make_envs  # noqa: E402
from fpo_utils.graphs import GraphedCall, GraphedStep  # noqa: E402
from fpo_utils.runfolder import RunError, cli, read_jsonl  # noqa: E402
from fpo_utils.samplers import GraphedSampler, NumpySampler  # noqa: E402

CPU = torch.device("cpu")
FAST_FLAGS = ("cuda_graph", "compile", "fused", "scan_rollout", "bf16")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def fast_args(tmp_path, **kw) -> F.Args:
    """tiny_args (tests/test_robot_fpo.py) as the fast variant's flags; its five flags may be given too."""
    flags = {k: kw.pop(k) for k in FAST_FLAGS if k in kw}
    return F.Args(**asdict(tiny_args(tmp_path, **kw)), **flags)


def ref_args(args: F.Args) -> R.Args:
    """The same run as the reference's flags (without the fast variant's five)."""
    return R.Args(**{f.name: getattr(args, f.name) for f in fields(R.Args)})


def params(state) -> list[torch.Tensor]:
    return list(state.actor.parameters()) + list(state.critic.parameters())


def assert_same_networks(a, b, **tol):
    for p, q in zip(params(a), params(b), strict=True):
        torch.testing.assert_close(q, p, **tol)


def assert_same_optimizer(a, b, **tol):
    for p, q in zip(params(a), params(b), strict=True):
        sa, sb = a.optimizer.state[p], b.optimizer.state[q]
        assert sa.keys() == sb.keys()
        assert float(sa["step"]) == float(sb["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sb[key], sa[key], **tol, msg=key)


def ref_and_fast(args: F.Args, device: torch.device, seed: int = 0):
    """A reference state and a fast state built from the same seed (the same networks, optimiser, statistics)."""
    torch.manual_seed(seed)
    ref = R.build_state(ref_args(args), device)
    torch.manual_seed(seed)
    fast = F.build_state(args, device)
    assert_same_networks(ref, fast, rtol=0, atol=0)
    return ref, fast


def reference_batch(ref, fast, args: F.Args) -> dict:
    """One batch from the reference's rollout; the statistics it moved copied into the fast state."""
    R.reset_envs(ref, args.seed)
    torch.manual_seed(1)
    batch = R.collect_rollout(ref, ref_args(args))
    for name in ("obs_rms", "ret_rms"):
        getattr(fast, name).load_state_dict(getattr(ref, name).state_dict())
    for s in (ref, fast):
        s.envs.close()
    return batch


def assert_same_stats(got: dict, want: dict, rel: float, abs_: float, clip_flips: float = 0.0):
    """The update's statistics; ``clip_flips``: the clip fraction may differ by that much (a ratio within float
    rounding of 1 +- clip_coef counted on the other side)."""
    assert got.keys() == want.keys() and got["minibatch_steps"] == want["minibatch_steps"]
    assert got["skipped_steps"] == want["skipped_steps"]
    for key in book.STAT_KEYS[:-1]:
        tol = abs_ + (clip_flips if key == "clipfrac" else 0.0)
        assert got[key] == pytest.approx(want[key], rel=rel, abs=tol), key


UPDATE_CASES = [("fpo", 0), ("fpopp", 0), ("fpo", 8), ("fpopp", 8)]


# ---------------------------------------------------------------------------- flags and presets


def test_fast_flags_and_presets():
    names = [f.name for f in fields(F.Args)]
    assert names[: len(fields(R.Args))] == [f.name for f in fields(R.Args)] and names[-5:] == list(FAST_FLAGS)
    assert not set(FAST_FLAGS) & set(R.Args.__dataclass_fields__)
    default = F.Args()
    assert default.cuda_graph and not (default.compile or default.fused or default.scan_rollout or default.bf16)
    assert F.PRESETS.keys() == R.PRESETS.keys()
    for name, preset in F.PRESETS.items():
        assert isinstance(preset, F.Args) and ref_args(preset) == R.PRESETS[name], name
        on = name == "fpo"  # the GPU fast paths: the fpo preset, and compiled losses for legged robots
        assert (preset.compile, preset.fused, preset.scan_rollout) == (on or name == "fpopp-locomotion", on, on), name
        assert preset.cuda_graph and not preset.bf16, name  # bf16 changes the numbers: never a preset's default
    assert set(FAST_FLAGS) - {"bf16"} <= set(F.MAY_CHANGE) and set(R.MAY_CHANGE) <= set(F.MAY_CHANGE)
    assert "bf16" not in F.MAY_CHANGE  # a resume may not switch the precision of a run


def test_bf16_is_refused_where_it_cannot_apply(tmp_path):
    # On a CPU (and with the float32 Triton or JAX samplers) --bf16 would be a flag that changes nothing.
    with pytest.raises(RunError, match="--bf16 needs CUDA") as err:
        F.build_state(fast_args(tmp_path, bf16=True), CPU)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- the update (CPU)


@pytest.mark.parametrize("objective,gae_unroll", UPDATE_CASES)
def test_one_update_equals_the_reference_on_cpu(tmp_path, objective, gae_unroll):
    args = fast_args(tmp_path, objective=objective, gae_unroll=gae_unroll, alpha_eps=0.5, alpha=0.5)
    ref, fast = ref_and_fast(args, CPU)
    batch = reference_batch(ref, fast, args)
    before = [p.detach().clone() for p in params(fast)]
    for k in range(2):
        if k == 1:  # an annealed learning rate
            for s in (ref, fast):
                s.optimizer.param_groups[0]["lr"] *= 0.5
        torch.manual_seed(10 + k)
        want = R.update(ref, batch, ref_args(args), 0.5)
        torch.manual_seed(10 + k)
        got = F.update(fast, batch, args, 0.5)
        assert want["minibatch_steps"] == 4
        assert_same_stats(got, want, rel=1e-6, abs_=1e-7)
        assert_same_networks(ref, fast, rtol=1e-6, atol=1e-6)
        assert_same_optimizer(ref, fast, rtol=1e-6, atol=1e-6)
    assert fast.graph is None  # no CUDA: the reference's loop
    assert any(not torch.equal(p, q) for p, q in zip(params(fast), before))  # the update moved the networks


def test_cuda_graph_flag_is_a_no_op_on_cpu(tmp_path):
    args = fast_args(tmp_path)
    torch.manual_seed(0)
    a = F.build_state(replace(args, cuda_graph=False), CPU)
    ref, b = ref_and_fast(replace(args, cuda_graph=True), CPU)
    assert_same_networks(a, b, rtol=0, atol=0)
    batch = reference_batch(ref, a, args)
    b.envs.close()
    assert not isinstance(b.act, GraphedCall) and not isinstance(b.record, GraphedCall)
    for seed in (1, 2):
        torch.manual_seed(seed)
        sa = F.update(a, batch, replace(args, cuda_graph=False), 1.0)
        torch.manual_seed(seed)
        sb = F.update(b, batch, replace(args, cuda_graph=True), 1.0)
        assert sa == sb and sa["minibatch_steps"] == 4
    assert a.graph is None and b.graph is None
    assert_same_networks(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_graphed_step_replayed_eagerly_takes_the_reference_steps(tmp_path, monkeypatch, objective, gae_unroll):
    # The fast update's CUDA branch (GraphedStep: index table, device step counter, statistics table), with each
    # replay run eagerly on the CPU instead of captured, must take exactly the reference's steps.
    args = fast_args(tmp_path, objective=objective, alpha_eps=0.5, alpha=0.5, gae_unroll=gae_unroll)
    ref, fast = ref_and_fast(args, CPU)
    batch = reference_batch(ref, fast, args)
    replays, randperm = [], torch.randperm

    def fake_capture(self):
        def replay():
            replays.append(int(self.counter))
            self._step()

        self.graph = SimpleNamespace(replay=replay)

    monkeypatch.setattr(GraphedStep, "capture", fake_capture)
    for seed in (1, 2):
        torch.manual_seed(seed)
        want = R.update(ref, batch, ref_args(args), 0.5)
        with monkeypatch.context() as m:  # the CUDA branch of F.update, on CPU tensors
            m.setattr(fast, "device", SimpleNamespace(type="cuda"))
            m.setattr(torch, "randperm", lambda n, device=None, **kw: randperm(n, **kw))
            torch.manual_seed(seed)
            got = F.update(fast, batch, args, 0.5)
        assert got == want
    assert isinstance(fast.graph, GraphedStep)
    assert replays == [0, 1, 2, 3] * 2  # one replay per minibatch step, the counter reset per update
    assert_same_networks(ref, fast, rtol=0, atol=0)
    assert_same_optimizer(ref, fast, rtol=0, atol=0)


# ---------------------------------------------------------------------------- the rollout (CPU)


@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_one_rollout_matches_the_reference_on_cpu(tmp_path, objective, gae_unroll):
    args = fast_args(tmp_path, objective=objective, gae_unroll=gae_unroll, action_bound=1.5)
    ref, fast = ref_and_fast(args, CPU)
    assert isinstance(fast.sampler, NumpySampler)
    for s in (ref, fast):
        R.reset_envs(s, args.seed)
    torch.testing.assert_close(fast.obs, ref.obs, rtol=0, atol=0)
    torch.manual_seed(1)
    want = R.collect_rollout(ref, ref_args(args))
    torch.manual_seed(1)
    got = F.collect_rollout(fast, args)
    for s in (ref, fast):
        s.envs.close()
    assert got.keys() == want.keys() and fast.global_step == ref.global_step == args.num_envs * args.num_steps
    for key, v in want.items():
        if torch.is_tensor(v):
            assert got[key].shape == v.shape and got[key].dtype == v.dtype, key
    for key in ("t", "eps"):  # the flow's noise and the draws come from torch's generator in the reference's order
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    T, n = args.num_steps, args.num_envs
    rows = R.unrolls(torch.arange(T * n), T, gae_unroll) if gae_unroll else torch.arange(T * n)
    first = rows < n  # the batch entries of the rollout's first step
    keys = ("obs", "x", "l_old", "rew") if gae_unroll else ("obs", "x", "l_old")
    for key in keys:
        torch.testing.assert_close(got[key][first], want[key][first], rtol=1e-5, atol=1e-5, msg=key)
    assert float(want["x"][first].abs().max()) > 0.1  # the first step's actions are not trivially equal
    for key, v in want.items():  # later steps: the same up to float rounding through a few episodes' dynamics
        if torch.is_tensor(v):
            torch.testing.assert_close(got[key], v, rtol=1e-4, atol=1e-4, msg=key)
        else:
            assert got[key] == pytest.approx(v, rel=1e-4, abs=1e-4), key
    assert float(fast.obs_rms.count) == float(ref.obs_rms.count) and float(fast.ret_rms.count) == float(
        ref.ret_rms.count
    )
    assert set(book.EPISODE_KEYS) <= got.keys() and got["episodes"] == want["episodes"] > 0


# ---------------------------------------------------------------------------- setup refusal, main and resume


def test_the_fast_variant_refuses_an_actor_edit_its_sampler_cannot_mirror(tmp_path, monkeypatch, capsys):
    forward = R.FlowActor.forward

    def reversed_time(self, obs, x_t, t):  # an edited time embedding: t -> 1 - t
        return forward(self, obs, x_t, 1.0 - t)

    monkeypatch.setattr(R.FlowActor, "forward", reversed_time)
    args = fast_args(tmp_path)
    torch.manual_seed(0)
    with pytest.raises(RunError, match="FlowActor.sample") as err:
        F.build_state(args, CPU)
    assert "\n" not in str(err.value)
    torch.manual_seed(0)
    ref = R.build_state(ref_args(args), CPU)  # the reference trains the edited actor
    ref.envs.close()
    actor, steps = ref.actor, args.flow_steps
    obs, x0 = torch.randn(9, ref.obs.shape[1]), torch.randn(9, actor.act_dim)
    x = x0
    with torch.no_grad():
        for k in range(steps):
            x = x + forward(actor, obs, x, torch.full((9,), 1.0 - k / steps)) / steps
    sample = actor.sample(obs, x0, steps)
    torch.testing.assert_close(sample, x, rtol=1e-5, atol=1e-6)  # FlowActor.sample follows the edit
    assert (NumpySampler(actor)(obs, x0, steps) - sample).abs().max() > 1e-3  # the NumPy copy does not
    argv = ["--env-id", "InvertedPendulum-v5", "--num-envs", "2", "--no-cuda", "--runs-dir", str(tmp_path / "cli")]
    with pytest.raises(SystemExit) as exit_info:
        cli(F.main, F.Args, F.PRESETS, argv=argv)
    assert exit_info.value.code == RunError("").code
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "FlowActor.sample" in stderr, stderr


def run_files(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "tfevents" not in p.name}


def test_fast_main_writes_the_reference_run_folder(tmp_path):
    args = fast_args(tmp_path / "fast", num_updates=2, eval_every=1)
    fast_summary = F.main(args)
    ref_summary = R.main(ref_args(replace(args, runs_dir=str(tmp_path / "ref"))))
    fast_run, ref_run = tmp_path / "fast" / "run", tmp_path / "ref" / "run"
    assert run_files(fast_run) == run_files(ref_run)
    assert {"args.json", "metrics.jsonl", "summary.json", "checkpoints/last.pt"} <= run_files(fast_run)
    saved = json.loads((fast_run / "args.json").read_text())
    assert set(saved) == set(F.Args.__dataclass_fields__) and all(k in saved for k in FAST_FLAGS)
    assert set(json.loads((ref_run / "args.json").read_text())) == set(R.Args.__dataclass_fields__)
    assert fast_summary.keys() == ref_summary.keys() and fast_summary["status"] == ref_summary["status"] == "finished"
    assert fast_summary["global_step"] == ref_summary["global_step"] == 2 * args.num_envs * args.num_steps
    fast_rows, ref_rows = (read_jsonl(run / "metrics.jsonl") for run in (fast_run, ref_run))
    assert [r["update"] for r in fast_rows] == [r["update"] for r in ref_rows] == [0, 1, 2]
    assert [r.keys() for r in fast_rows] == [r.keys() for r in ref_rows]
    assert all(np.isfinite(r[k]) for r in fast_rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean", "eval_return"))
    ckpts = [torch.load(run / "checkpoints" / "last.pt", weights_only=False) for run in (fast_run, ref_run)]
    assert ckpts[0].keys() == ckpts[1].keys() and ckpts[0]["update"] == ckpts[1]["update"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["fpo", "fpopp"])
def test_fast_kill_and_resume_reproduces_uninterrupted_run(tmp_path, objective):
    # As the reference's test: restarts at the checkpoints (every 2 updates), a kill after update 3 was logged.
    full = fast_args(tmp_path / "a", objective=objective, num_updates=4, restart_every=2)
    F.main(full)
    ref = read_jsonl(tmp_path / "a" / "run" / "metrics.jsonl")
    part = fast_args(tmp_path / "b", objective=objective, num_updates=2, restart_every=2)
    F.main(part)
    ckpt = tmp_path / "b" / "run" / "checkpoints" / "last.pt"
    shutil.copy(ckpt, tmp_path / "saved.pt")
    F.main(replace(part, num_updates=3, resume=True))
    shutil.copy(tmp_path / "saved.pt", ckpt)
    summary = F.main(replace(part, num_updates=4, resume=True, cuda_graph=False))  # a flag resume may change
    got = read_jsonl(tmp_path / "b" / "run" / "metrics.jsonl")
    assert [r["update"] for r in got] == [0, 1, 2, 3, 4]
    assert strip_time(got) == strip_time(ref)
    assert summary["status"] == "finished" and summary["updates_done"] == 4


# ---------------------------------------------------------------------------- pieces: samplers, environment step


def test_numpy_sampler_is_bit_identical_to_the_plain_expression():
    # The buffered sampler must reproduce, bit for bit, the straightforward float32 NumPy Euler loop
    # (rollout actions, and hence runs, stay identical for a given seed).
    torch.manual_seed(1)
    for layers, n in ((3, 16), (1, 5)):
        actor = R.FlowActor(7, 3, 32, layers, 8, 0.25)
        s = NumpySampler(actor)
        lin = [m for m in actor.net if isinstance(m, torch.nn.Linear)]
        w = [m.weight.detach().numpy().T.copy() for m in lin]  # row-major, as a BLAS call sees them
        b = [m.bias.detach().numpy() for m in lin]
        rng = np.random.default_rng(layers)
        obs = (3 * rng.standard_normal((n, 7))).astype(np.float32)
        x0 = rng.standard_normal((n, 3)).astype(np.float32)
        x0_copy = x0.copy()
        steps = 6
        freqs = actor.freqs.numpy()
        ang = (np.arange(steps, dtype=np.float32) / np.float32(steps))[:, None] * freqs  # float32, as FlowActor
        time_terms = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32) @ w[0][10:]
        x = x0
        for k in range(steps):
            h = (obs @ w[0][:7] + b[0]) + x @ w[0][7:10] + time_terms[k]
            h = h / (1.0 + np.exp(-h))
            for wi, bi in zip(w[1:-1], b[1:-1]):
                h = h @ wi + bi
                h = h / (1.0 + np.exp(-h))
            x = x + np.float32(1 / steps) * np.float32(0.25) * (h @ w[-1] + b[-1])
        got = s.sample_np(obs, x0, steps)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, x)
        np.testing.assert_array_equal(x0, x0_copy)  # the caller's noise is not overwritten
        torch.testing.assert_close(  # and it is the actor's sampler up to float rounding
            torch.from_numpy(got), actor.sample(torch.from_numpy(obs), torch.from_numpy(x0), steps), rtol=0, atol=1e-5
        )


@pytest.mark.parametrize("env_id", ["InvertedPendulum-v5", "CartpoleSwingup-v1"])
def test_step_into_writes_what_step_returns(env_id):
    """The fast rollout's one-copy step (``step_into``) gives what ``step`` gives, episode ends included."""
    pytest.importorskip("envpool")
    a, b = (make_envs(env_id, 3, 11) for _ in range(2))
    a.reset(5), b.reset(5)
    out, gen, ends = torch.full((env_out_size(3, a.obs_dim),), float("nan")), torch.Generator().manual_seed(0), 0
    for _ in range(40 if env_id.startswith("Inverted") else 3):
        act = 2 * torch.rand(3, a.act_dim, generator=gen) - 1
        obs, rew, term, trunc, info = a.step(act)
        b.step_into(act, out)
        parts = env_out_views(out, 3, a.obs_dim)
        want = (
            obs,
            info["final_obs"],
            rew,
            term.float(),
            trunc.float(),
            info["episode_return"],
            info["episode_length"],
        )
        assert all(torch.equal(x, y) for x, y in zip(parts, want))
        o2, _, te2, tr2, _ = unpack_step(out, 3, a.obs_dim)
        assert torch.equal(o2, obs) and torch.equal(te2, term) and torch.equal(tr2, trunc)
        ends += int(term.sum() + trunc.sum())
    assert ends > 0 or not env_id.startswith("Inverted")  # the pendulum falls under random actions: resets covered


# ---------------------------------------------------------------------------- GPU: the same equalities on CUDA


@pytest.fixture
def no_tf32():
    """Full float32 matrix products (torch and the Triton kernels read the same flag) for a tolerance comparison."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@needs_cuda
def test_graphed_sampler_matches_eager_sampler_on_gpu():
    torch.manual_seed(0)
    actor = R.FlowActor(5, 2, 16, 2, 8, 0.25).cuda()
    sampler = GraphedSampler(actor)
    for _ in range(3):
        obs, x0 = torch.randn(7, 5, device="cuda"), torch.randn(7, 2, device="cuda")
        torch.testing.assert_close(sampler(obs, x0, 4), actor.sample(obs, x0, 4), rtol=0, atol=0)
        with torch.no_grad():  # parameters change in place (as an optimiser step does): no recapture needed
            for p in actor.parameters():
                p.add_(0.01 * torch.randn_like(p))
    assert sampler.key == ((7, 5), (7, 2), 4, obs.device)


@needs_cuda
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_fast_rollout_matches_the_reference_on_gpu(tmp_path, no_tf32, objective, gae_unroll, cuda_graph):
    # torch's sampler on both sides (the Triton one is compared with it in test_flow_triton.py).
    args = fast_args(
        tmp_path, objective=objective, cuda=True, tf32=False, gae_unroll=gae_unroll, action_bound=1.5, fused=False
    )
    args = replace(args, cuda_graph=cuda_graph)
    ref, fast = ref_and_fast(args, torch.device("cuda"))
    assert isinstance(fast.act, GraphedCall) == isinstance(fast.record, GraphedCall) == cuda_graph
    out = []
    for state, rollout, a in ((ref, R.collect_rollout, ref_args(args)), (fast, F.collect_rollout, args)):
        R.reset_envs(state, args.seed)
        torch.manual_seed(1)
        batches = []
        for _ in range(2):  # the second rollout replays the captured graphs and continues the episodes
            batch = rollout(state, a)
            batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
        out.append((batches, state.obs_rms.state_dict(), state.ret_rms.state_dict(), state.global_step))
        state.envs.close()
    (want, rms_r, ret_r, gs_r), (got, rms_f, ret_f, gs_f) = out
    assert gs_r == gs_f == 2 * args.num_envs * args.num_steps
    for br, bf in zip(want, got):
        assert br.keys() == bf.keys()
        for key in br:
            if torch.is_tensor(br[key]):
                torch.testing.assert_close(bf[key], br[key], rtol=1e-6, atol=1e-6, msg=key)
            else:
                assert bf[key] == pytest.approx(br[key], rel=1e-6), key
    for r, f in ((rms_r, rms_f), (ret_r, ret_f)):
        for key in r:
            torch.testing.assert_close(f[key], r[key], rtol=1e-9, atol=1e-9)


def gpu_args(tmp_path, **kw) -> F.Args:
    return fast_args(tmp_path, cuda=True, tf32=False, alpha_eps=0.5, alpha=0.5, cuda_graph=True, **kw)


def one_flip(args) -> float:
    """The clip fraction's change when one ratio of one minibatch step lands on the other side of the clip."""
    rows = args.num_envs * args.num_steps // args.num_minibatches
    return 1.0 / (args.update_epochs * args.num_minibatches * rows) + 1e-9


@needs_cuda
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_one_update_equals_the_reference_on_gpu(tmp_path, no_tf32, objective, gae_unroll, compile, fused):
    # The fast update replays the captured minibatch step (cuda_graph) with the fused AdamW, optionally with compiled
    # losses and the Triton flow MLP; the reference runs its eager loop with torch's layers and AdamW.
    args = gpu_args(tmp_path, objective=objective, gae_unroll=gae_unroll, compile=compile, fused=fused)
    ref, fast = ref_and_fast(args, torch.device("cuda"))
    assert not hasattr(ref, "graph") and fast.optimizer.param_groups[0]["fused"]
    batch = reference_batch(ref, fast, args)
    for k in range(3):
        if k == 1:  # an annealed learning rate reaches the captured optimiser step
            for s in (ref, fast):
                s.optimizer.param_groups[0]["lr"] *= 0.5
        torch.manual_seed(k)
        want = R.update(ref, batch, ref_args(args), 0.5)
        torch.manual_seed(k)
        got = F.update(fast, batch, args, 0.5)
        assert isinstance(fast.graph, GraphedStep) and fast.graph.graph is not None
        assert want["minibatch_steps"] == 4
        assert_same_stats(got, want, rel=1e-4, abs_=1e-5, clip_flips=one_flip(args))
        assert_same_networks(ref, fast, rtol=1e-4, atol=1e-5)
        assert_same_optimizer(ref, fast, rtol=1e-4, atol=1e-6)
    group = fast.optimizer.param_groups[0]
    assert isinstance(group["lr"], float) and not group["capturable"] and group["fused"]


@needs_cuda
@pytest.mark.parametrize("fused", [False, True])
def test_a_captured_step_skips_an_overflowing_ratio_as_the_reference_does_on_gpu(tmp_path, no_tf32, fused):
    # One stored action whose D_i overflows exp: the reference skips its minibatch step (a host-visible where), the
    # captured graph must skip the same steps on the device, and both train on from the same state.
    args = gpu_args(tmp_path, objective="fpo", fused=fused)
    ref, fast = ref_and_fast(args, torch.device("cuda"))
    batch = reference_batch(ref, fast, args)
    batch["l_old"][3] += 200.0
    for k in range(2):
        torch.manual_seed(k)
        want = R.update(ref, batch, ref_args(args), 0.5)
        torch.manual_seed(k)
        got = F.update(fast, batch, args, 0.5)
        assert want["skipped_steps"] == args.update_epochs
        assert_same_stats(got, want, rel=1e-4, abs_=1e-5, clip_flips=one_flip(args))
        assert_same_networks(ref, fast, rtol=1e-4, atol=1e-5)
        assert_same_optimizer(ref, fast, rtol=1e-4, atol=1e-6)


@needs_cuda
def test_bf16_actor_is_one_function_in_rollout_and_update_and_near_float32_on_gpu(tmp_path, no_tf32):
    # --bf16 patches the trained actor's forward; the captured update then computes what the reference's eager
    # update computes with the same patched actor, and lands within bfloat16 rounding of the float32 update.
    args = gpu_args(tmp_path, objective="fpopp", bf16=True, actor_ema=0.9)
    ref, fast = ref_and_fast(args, torch.device("cuda"))
    assert "forward" in vars(fast.actor) and "forward" not in vars(fast.ema)  # the evaluated EMA copy: float32
    ref32 = R.build_state(ref_args(args), torch.device("cuda"))
    for p, q in zip(params(ref), params(ref32), strict=True):
        q.data.copy_(p.data)
    ref.actor.forward = partial(F.bf16_forward, ref.actor)
    obs, x_t = torch.randn(64, ref.obs.shape[1], device="cuda"), torch.randn(64, ref.actor.act_dim, device="cuda")
    t = torch.rand(64, device="cuda")
    with torch.no_grad():
        v16, v32 = fast.actor(obs, x_t, t), ref32.actor(obs, x_t, t)
    assert v16.dtype == torch.float32 and 0 < (v16 - v32).abs().max() <= 2e-2 * v32.abs().max()
    batch = reference_batch(ref, fast, args)
    ref32.obs_rms.load_state_dict(ref.obs_rms.state_dict())
    ref32.envs.close()
    before = [p.detach().clone() for p in params(ref32)]
    for k in range(2):
        torch.manual_seed(k)
        want = R.update(ref, batch, ref_args(args), 0.5)
        torch.manual_seed(k)
        got = F.update(fast, batch, args, 0.5)
        torch.manual_seed(k)
        R.update(ref32, batch, ref_args(args), 0.5)
        assert_same_stats(got, want, rel=1e-4, abs_=1e-5, clip_flips=one_flip(args))
        assert_same_networks(ref, fast, rtol=1e-4, atol=1e-5)
    move16 = torch.cat([(p - b).flatten() for p, b in zip(params(fast), before)])
    move32 = torch.cat([(p - b).flatten() for p, b in zip(params(ref32), before)])
    rel = float((move16 - move32).norm() / move32.norm())
    cos = float(torch.nn.functional.cosine_similarity(move16, move32, 0))
    assert 0 < rel < 0.3 and cos > 0.95, (rel, cos)


@needs_cuda
def test_an_update_after_a_checkpoint_load_steps_the_loaded_optimizer_state_on_gpu(tmp_path, no_tf32):
    # A checkpoint loaded into a state whose minibatch step was already captured (load_checkpoint replaces the
    # optimiser's moment tensors): the next update must step the loaded moments, so that the next checkpoint holds
    # what the reference's holds.
    args = gpu_args(tmp_path)
    ref, fast = ref_and_fast(args, torch.device("cuda"))
    batch = reference_batch(ref, fast, args)
    for k in range(2):
        if k == 1:
            for name, s in (("ref", ref), ("fast", fast)):
                torch.save(book.checkpoint_payload(s), tmp_path / f"{name}.pt")
                book.load_checkpoint(str(tmp_path / f"{name}.pt"), s)
        torch.manual_seed(k)
        want = R.update(ref, batch, ref_args(args), 0.5)
        torch.manual_seed(k)
        got = F.update(fast, batch, args, 0.5)
        assert_same_stats(got, want, rel=1e-4, abs_=1e-5, clip_flips=one_flip(args))
        assert_same_networks(ref, fast, rtol=1e-4, atol=1e-5)
        assert_same_optimizer(ref, fast, rtol=1e-4, atol=1e-6)
    saved = [book.checkpoint_payload(s)["optimizer"]["state"] for s in (ref, fast)]
    for a, b in zip(saved[0].values(), saved[1].values(), strict=True):
        torch.testing.assert_close(b["exp_avg"], a["exp_avg"], rtol=1e-4, atol=1e-6)
