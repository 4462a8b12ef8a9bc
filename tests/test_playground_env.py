"""The MuJoCo Playground backend (fpo_utils/playground_env.py), on the CPU with 4 environments.

One environment is compiled for the whole module (compilation dominates: ~10-50 s on 2 cores).
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fpo_utils.envs import env_out_size, env_out_views, unpack_step
from fpo_utils.runfolder import EXIT_BAD_INPUT, RunError, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EPISODE = 5


def test_missing_backend_names_the_extra(monkeypatch):
    from fpo_utils import playground_env

    monkeypatch.setitem(sys.modules, "mujoco_playground", None)  # import fails as if not installed
    with pytest.raises(RunError) as err:
        playground_env.PlaygroundVecEnv("CartpoleSwingup", 4, 0, torch.device("cpu"))
    assert "pip install -e '.[playground]'" in str(err.value) and "\n" not in str(err.value)
    assert err.value.code == EXIT_BAD_INPUT


def test_num_envs_below_one_is_refused():
    from fpo_utils.playground_env import PlaygroundVecEnv

    with pytest.raises(RunError, match="num_envs must be at least 1, got 0"):
        PlaygroundVecEnv("CartpoleSwingup", 0, 0, torch.device("cpu"))


@pytest.mark.parametrize("physics", ["warp", "jax"])
def test_other_backends_refuse_a_physics(physics):
    """--physics names MJX or MuJoCo Warp, which only the playground backend runs; elsewhere auto is kept."""
    from fpo_utils.envs import env_settings, resolve_physics

    with pytest.raises(RunError) as err:
        resolve_physics("Pendulum-v1", "gymnasium", physics)
    msg = str(err.value)
    assert f"--physics {physics!r}" in msg and "playground" in msg and "auto" in msg and "\n" not in msg
    assert err.value.code == EXIT_BAD_INPUT
    assert env_settings("Pendulum-v1", "gymnasium", "", "", "auto")["physics"] == "auto"


pg = pytest.importorskip(
    "mujoco_playground", reason="the playground extra is not installed (pip install -e '.[playground]')"
)
NO_WARP = "--physics warp needs warp-lang (the playground extra installs it)"
needs_warp = pytest.mark.skipif(importlib.util.find_spec("warp") is None, reason=NO_WARP)
NO_WARP_CPU = (
    "--physics warp on the CPU needs warp-lang with its CPU compiler (warp-clang; gpu_bundle.sh leaves it out)"
)


def warp_runs_on_cpu() -> bool:
    if importlib.util.find_spec("warp") is None:
        return False
    import warp

    return warp.is_cpu_available()


needs_warp_cpu = pytest.mark.skipif(not warp_runs_on_cpu(), reason=f"{NO_WARP}; {NO_WARP_CPU}")


def test_unknown_task_lists_close_matches():
    from fpo_utils.playground_env import check_task

    with pytest.raises(RunError) as err:
        check_task("CartPoleSwingUp")
    msg = str(err.value)
    assert "'CartPoleSwingUp'" in msg and "did you mean CartpoleSwingup" in msg and "\n" not in msg


def test_state_packer_round_trips_mixed_dtypes():
    import jax
    import jax.numpy as jnp

    from fpo_utils.playground_env import _state_packer

    state = {
        "q": jnp.arange(6.0).reshape(2, 3),
        "key": jnp.array([[1, 2**32 - 1]], jnp.uint32),
        "n": (jnp.array([3, -4], jnp.int32), jnp.array([True, False])),
        "r": jnp.float32(0.5),
    }
    pack, unpack = _state_packer(jax, jnp, state)
    flat = pack(state)
    assert len(flat) == 4  # one array per dtype: bool, float32, int32, uint32
    back = unpack(flat)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
        assert a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


def test_physics_auto_is_warp_where_it_learned_and_is_faster():
    from fpo_utils.envs import env_settings
    from fpo_utils.playground_env import BLOCK_S, WARP_LEARNS, resolve_physics

    for task, (mjx_s, warp_s) in BLOCK_S.items():
        want = "warp" if task in WARP_LEARNS and warp_s < mjx_s else "jax"
        assert resolve_physics(task, "auto") == want, task
    # MuJoCo Warp (staged graph mode) is slower than MJX on WalkerRun and BallInCup, a little faster on CheetahRun
    auto = [resolve_physics(t, "auto") for t in ("WalkerRun", "BallInCup", "CheetahRun", "AcrobotSwingup")]
    assert auto == ["jax", "jax", "warp", "jax"]
    # not measured: MJX, with or without contacts
    assert {resolve_physics(t, "auto") for t in ("HopperHop", "FingerSpin", "CartpoleSwingup", "FishSwim")} == {"jax"}
    assert resolve_physics("WalkerRun", "jax") == "jax" and resolve_physics("AcrobotSwingup", "warp") == "warp"
    got = env_settings("CheetahRun", "playground", "", "", "auto")
    assert got == {"obs_actor": "", "obs_critic": "", "physics": "warp"}


@pytest.mark.parametrize("bad", ["mjx", "Warp", ""])
def test_bad_physics_is_one_line(bad):
    from fpo_utils.envs import make_envs

    with pytest.raises(RunError) as err:
        make_envs("CartpoleSwingup", 4, 0, "playground", physics=bad)
    msg = str(err.value)
    assert f"--physics {bad!r}" in msg and "auto, jax (MJX), warp (MuJoCo Warp)" in msg and "\n" not in msg


@pytest.fixture(scope="module")
def env():
    from fpo_utils.playground_env import PlaygroundVecEnv

    e = PlaygroundVecEnv("CartpoleSwingup", 4, seed=0, device=torch.device("cpu"), episode_length=EPISODE)
    yield e
    e.close()


def actions(n: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(4, d, generator=g) * 2 - 1 for _ in range(n)]


@pytest.mark.slow
def test_shapes_and_dtypes(env):
    assert (env.obs_dim, env.act_dim) == (5, 1)  # cart position, pole cos/sin, two velocities; one force
    assert torch.equal(env.action_low, -torch.ones(1)) and torch.equal(env.action_high, torch.ones(1))
    obs = env.reset(1)
    assert obs.shape == (4, 5) and obs.dtype == torch.float32 and obs.device.type == "cpu"
    o, r, term, trunc, info = env.step(torch.zeros(4, 1))
    assert o.shape == (4, 5) and o.dtype == torch.float32
    assert r.shape == term.shape == trunc.shape == (4,) and r.dtype == torch.float32
    assert term.dtype == trunc.dtype == torch.bool
    assert info["final_obs"].shape == (4, 5)
    assert info["episode_return"].shape == info["episode_length"].shape == (4,)
    assert torch.isfinite(o).all() and torch.isfinite(r).all()


@pytest.mark.slow
@pytest.mark.parametrize("act", [torch.nn.SiLU, torch.nn.Tanh, torch.nn.ReLU])
def test_scanned_rollouts_sampler_passes_the_setup_probe(env, act):
    """ScanRollout.sample (its JAX sampler through DLPack) equals FlowActor.sample for each activation it mirrors,
    as fpo_utils.samplers.check_sampler probes it at setup."""
    import robot_fpo as R
    from fpo_utils.samplers import check_sampler

    torch.manual_seed(0)
    actor = R.FlowActor(env.route.actor_dim, env.act_dim, 32, 3, 8, 0.5, 1.0)
    for i, m in enumerate(actor.net):
        if not isinstance(m, torch.nn.Linear):
            actor.net[i] = act()
    scan = env.scan_rollout(actor, None, None, 10, "tanh", 0.0, 1.0)
    assert check_sampler(scan.sample, actor, env.route.actor_dim, env.act_dim, 10, env.device, 1e-5) <= 1e-5


@pytest.mark.slow
def test_auto_reset_at_episode_length(env):
    first = env.reset(2).clone()
    ret = torch.zeros(4)
    for k, a in enumerate(actions(2 * EPISODE + 1, env.act_dim, seed=0)):
        o, r, term, trunc, info = env.step(a)
        ret += r
        cut = (k + 1) % EPISODE == 0
        assert not term.any()  # cartpole never fails
        assert trunc.all() if cut else not trunc.any(), k
        if cut:
            assert torch.equal(info["episode_length"], torch.full((4,), float(EPISODE)))
            assert torch.allclose(info["episode_return"], ret, rtol=1e-5, atol=1e-7)
            # each environment restarts from its own first state; the last observation is kept
            assert torch.equal(o, first)
            assert not torch.equal(info["final_obs"], first)
            ret.zero_()
        else:
            assert torch.equal(info["final_obs"], o)
            assert torch.equal(info["episode_length"], torch.full((4,), float(k % EPISODE + 1)))


@pytest.mark.slow
def test_random_start_spreads_the_first_episodes_ends_then_runs_full_episodes():
    # The official FPO++ runner's random initial episode lengths: each environment's first episode is cut at a
    # random step of the limit (drawn from the seed), every later one runs the whole limit.
    from fpo_utils.playground_env import PlaygroundVecEnv

    n, limit = 64, 12
    e = PlaygroundVecEnv(
        "CartpoleSwingup", n, seed=0, device=torch.device("cpu"), episode_length=limit, random_start=True
    )
    first_end = []
    for seed in (3, 3, 4):
        e.reset(seed)
        cuts = torch.stack([e.step(torch.zeros(n, 1))[3] for _ in range(2 * limit)])  # (steps, envs)
        assert (cuts.sum(0) == 2).all()  # every first episode ends within the limit, the next one limit steps later
        ends = cuts.float().argmax(0) + 1  # the step that ended each first episode
        later = [torch.nonzero(cuts[:, i]).flatten() for i in range(n)]
        assert all(len(k) == 2 and int(k[1] - k[0]) == limit for k in later)  # then whole episodes
        first_end.append(ends)
    assert torch.equal(first_end[0], first_end[1]) and not torch.equal(first_end[0], first_end[2])  # seeded
    assert first_end[0].min() >= 1 and first_end[0].max() <= limit and len(set(first_end[0].tolist())) > limit // 2
    e.close()
    plain = PlaygroundVecEnv("CartpoleSwingup", n, seed=0, device=torch.device("cpu"), episode_length=limit)
    plain.reset(3)
    cuts = torch.stack([plain.step(torch.zeros(n, 1))[3] for _ in range(limit)])
    assert cuts[-1].all() and not cuts[:-1].any()  # without it, every first episode runs the whole limit
    plain.close()


def test_random_start_is_refused_off_playground():
    from fpo_utils.envs import make_envs

    with pytest.raises(RunError, match="random_start needs the playground backend"):
        make_envs("InvertedPendulum-v5", 2, 0, "gymnasium", random_start=True)


@pytest.mark.slow
def test_dlpack_hand_over_matches_a_numpy_copy(env):
    import jax
    import jax.numpy as jnp

    acts = actions(7, env.act_dim, seed=1)
    env.reset(3)
    via_dlpack = [
        torch.cat([x.reshape(-1).float() for x in (o, r, te, tr, i["final_obs"])]).clone()
        for o, r, te, tr, i in map(env.step, acts)
    ]
    env.reset(3)
    state = env._state
    for a, got in zip(acts, via_dlpack):
        state, packed = env._step_fn(state, jax.device_put(a.numpy(), env._jax_device))
        o, r, te, tr, info = unpack_step(torch.from_numpy(np.array(packed)), env.num_envs, env.obs_dim)  # host copy
        want = torch.cat([x.reshape(-1).float() for x in (o, r, te, tr, info["final_obs"])])
        assert torch.equal(got, want)
    env._state = state
    # step_into: the same outputs written into one flat tensor, as the trainer's rollout takes them
    env.reset(3)
    out = torch.full((env_out_size(env.num_envs, env.obs_dim),), float("nan"))
    for a, got in zip(acts, via_dlpack):
        env.step_into(a, out)
        o, final, r, te, tr, _, _ = env_out_views(out, env.num_envs, env.obs_dim)
        assert torch.equal(got, torch.cat([o.reshape(-1), r, te, tr, final.reshape(-1)]))
    # zero-copy: the torch tensor reads the JAX buffer itself
    x = jnp.arange(12, dtype=jnp.float32, device=env._jax_device)  # the environment's device (the CPU here)
    t = env.to_torch(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer() and torch.equal(t, torch.arange(12.0))
    src = torch.linspace(0, 1, 8)
    assert np.array_equal(np.asarray(env.to_jax(src)), src.numpy())


@pytest.mark.slow
def test_same_shape_shares_compiled_step_but_not_state(env):
    from fpo_utils.playground_env import PlaygroundVecEnv

    other = PlaygroundVecEnv("CartpoleSwingup", 4, seed=0, device=torch.device("cpu"), episode_length=EPISODE)
    assert other._step_fn is env._step_fn and other.compile_s < env.compile_s
    other.reset(8)
    env.reset(8)
    env.step(torch.ones(4, 1))  # moves env only
    o_other = other.step(torch.zeros(4, 1))[0].clone()
    env.reset(8)
    assert torch.equal(o_other, env.step(torch.zeros(4, 1))[0])


@pytest.fixture(scope="module")
def warp_env():
    pytest.importorskip("warp", reason=NO_WARP)
    if not warp_runs_on_cpu():
        pytest.skip(NO_WARP_CPU)
    from fpo_utils.playground_env import PlaygroundVecEnv

    e = PlaygroundVecEnv(
        "CartpoleSwingup", 4, seed=0, device=torch.device("cpu"), episode_length=EPISODE, physics="warp"
    )
    yield e
    e.close()


@pytest.mark.slow
def test_physics_keys_the_compiled_functions(env, warp_env):
    assert (env.physics, warp_env.physics) == ("jax", "warp")
    assert env._key[:4] == warp_env._key[:4] and env._step_fn is not warp_env._step_fn
    assert warp_env.obs_dim == env.obs_dim and warp_env.act_dim == env.act_dim


@pytest.mark.slow
def test_warp_state_round_trips_and_other_physics_is_refused(env, warp_env):
    """A checkpoint's simulator state under MuJoCo Warp: saved mid-episode and loaded back, the environments
    continue exactly; an MJX state is refused by Warp environments (and the other way round) in one line."""
    acts = actions(2 * EPISODE, warp_env.act_dim, seed=4)
    warp_env.reset(5)
    for a in acts[:3]:
        warp_env.step(a)
    saved = warp_env.state_dict()
    assert saved["physics"] == "warp"
    first = [torch.cat([x.reshape(-1).float() for x in warp_env.step(a)[:4]]).clone() for a in acts[3:]]
    warp_env.reset(6)  # elsewhere
    warp_env.load_state_dict(saved)
    again = [torch.cat([x.reshape(-1).float() for x in warp_env.step(a)[:4]]) for a in acts[3:]]
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    env.reset(5)
    for src, dst in ((env, warp_env), (warp_env, env)):
        with pytest.raises(RunError) as err:
            dst.load_state_dict(src.state_dict())
        assert "does not fit" in str(err.value) and "MuJoCo Warp" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for torch and JAX")
def test_a_cuda_graph_captures_right_after_a_state_is_loaded():
    """4,096 environments on the GPU: ``load_state_dict`` and ``reset`` return once JAX's copies are done, and a
    CUDA graph captured at once is not invalidated by JAX's threads (resuming a G1 run once failed here with
    cudaErrorStreamCaptureInvalidated)."""
    from fpo_utils.playground_env import PlaygroundVecEnv

    e = PlaygroundVecEnv("CartpoleSwingup", 4096, seed=0, device=torch.device("cuda"), episode_length=1000)
    saved, x = e.state_dict(), torch.zeros(4096, device="cuda")
    for load in (lambda: e.load_state_dict(saved), lambda: e.reset(1)) * 3:
        load()
        assert all(a.is_ready() for a in e._state)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.add_(1)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 6.0))
    e.close()


def physics_gap(task: str, steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest |MJX - MuJoCo Warp| over 4 environments at each step of one fixed action sequence, for the
    observations and the rewards ([steps + 1] and [steps])."""
    from fpo_utils.playground_env import PlaygroundVecEnv

    runs = []
    for physics in ("jax", "warp"):
        e = PlaygroundVecEnv(task, 4, seed=0, device=torch.device("cpu"), episode_length=1000, physics=physics)
        obs, rew = [e.reset(seed).clone()], []
        for a in actions(steps, e.act_dim, seed=seed):
            o, r, *_ = e.step(a)
            obs.append(o.clone())
            rew.append(r.clone())
        runs.append((torch.stack(obs), torch.stack(rew)))
        e.close()
    (o1, r1), (o2, r2) = runs
    return (o1 - o2).abs().amax((1, 2)), (r1 - r2).abs().amax(1)


@pytest.mark.slow
@needs_warp_cpu
def test_both_physics_give_the_same_cartpole():
    """CartpoleSwingup under MJX and under MuJoCo Warp, 4 environments, 200 random actions (the pole swings
    through several turns): the same Newton solver with the same settings, in float32 on two code paths,
    so the states agree to float32 rounding that grows slowly (measured: largest observation gap 2.4e-7 at
    the first step, 1.6e-6 at step 200, over values up to 2.8); 1e-4 bounds it with sixty times room."""
    obs_gap, rew_gap = physics_gap("CartpoleSwingup", 200)
    assert float(obs_gap.max()) < 1e-4 and float(rew_gap.max()) < 1e-4, (obs_gap.max(), rew_gap.max())


@pytest.mark.slow
@needs_warp_cpu
def test_both_physics_give_the_same_walker_until_contacts_diverge():
    """WalkerRun (feet on the floor: contacts, 2 solver iterations) under both physics, 4 environments, 10 random
    actions. The two contact pipelines differ in float32 rounding and contact order, and a walker amplifies any
    difference once its feet hit the ground: measured from two initial states, the largest observation gap is
    2e-5 at step 1 and 1.7e-4 / 1.6e-3 at step 10 (over values up to 31), then 1.4 at step 20 and ~10 by step
    50, where single episodes part ways (300-step returns within 2.2%). So the comparison holds for the first 10
    steps, at 1e-2: six times the larger measured gap, a hundredth of the gap once episodes part."""
    obs_gap, rew_gap = physics_gap("WalkerRun", 10)
    assert float(obs_gap.max()) < 1e-2 and float(rew_gap.max()) < 1e-3, (obs_gap, rew_gap)


@needs_warp
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for torch and JAX")
def test_both_physics_give_cheetah_the_same_mean_reward_on_the_gpu():
    """CheetahRun on the GPU at the fpo preset's 2,048 environments, 300 steps of uniform random actions: the
    mean reward under MuJoCo Warp equals MJX's within 10%. Measured on an H200: Playground's own step 0.00327
    (Warp) and 0.00328 (MJX); this backend's Warp step 0.00325 in graph mode ``WARP_STAGED`` and 0.00000 (every
    step) in MJX's mode for GPUs, ``WARP``. Single states part from the reset on (CheetahRun settles for 200
    physics steps there; largest observation gap 0.17 at the reset, 4.5 by step 10), so only the mean is
    compared."""
    from fpo_utils.playground_env import PlaygroundVecEnv

    n, dev, means = 2048, torch.device("cuda"), []
    for physics in ("jax", "warp"):
        e = PlaygroundVecEnv("CheetahRun", n, seed=0, device=dev, episode_length=1000, physics=physics)
        e.reset(0)
        g = torch.Generator(device=dev).manual_seed(0)
        total = torch.zeros((), device=dev, dtype=torch.float64)
        for _ in range(300):
            total += e.step(torch.rand(n, e.act_dim, device=dev, generator=g) * 2 - 1)[1].double().mean()
        means.append(float(total) / 300)
        e.close()
    mjx, warp = means
    assert mjx > 1e-3 and abs(warp - mjx) < 0.1 * mjx, means


# A tiny CPU run: 4 CartpoleSwingup environments, 20-step episodes, 16 steps an update.
TINY_PLAYGROUND = dict(
    backend="playground", env_id="CartpoleSwingup", num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2,
    num_draws=4, flow_steps=4, actor_hidden=16, critic_hidden=16, eval_every=2, eval_episodes=4, episode_length=20,
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["fpo", "fpopp"])
def test_end_to_end_robot_fpo_on_playground(tmp_path, objective):
    """robot_fpo.py on the playground backend, tiny: 4 environments, 20-step episodes, 2 updates."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    flags = [x for k, v in TINY_PLAYGROUND.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    cmd = [sys.executable, os.path.join(ROOT, "robot_fpo.py"), *flags, "--objective", objective]
    cmd += ["--alpha-eps", "0.5", "--alpha", "0.5", "--runs-dir", str(tmp_path), "--run-name", "pg"]
    cmd += ["--no-cuda", "--torch-threads", "1", "--total-timesteps", "128"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "pg"
    args = json.loads((run / "args.json").read_text())
    assert (args["backend"], args["env_id"], args["episode_length"]) == ("playground", "CartpoleSwingup", 20)
    assert args["physics"] == "jax"  # auto, resolved: CartpoleSwingup has no contacts
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 128 and summary["updates_done"] == 2
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2]
    assert all(0.0 <= r["eval_return"] <= 20.0 for r in rows if "eval_return" in r)  # reward in [0, 1], 20 steps
    # 4 environments x 16 steps, 20-step episodes: each environment ends one in update 2 (its steps 17-32)
    assert rows[1]["episodes"] == 0 and rows[2]["episodes"] == 4 and rows[2]["episodic_length"] == 20.0
    assert all(math.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean"))


def playground_args(tmp_path, **kw):
    """robot_fpo.Args for a tiny CPU run: 4 CartpoleSwingup environments, 20-step episodes, 16 steps an update."""
    from dataclasses import replace

    import robot_fpo as R

    where = dict(cuda=False, runs_dir=str(tmp_path), run_name="run")
    return replace(R.Args(), **{**TINY_PLAYGROUND, **where, **kw})


@pytest.mark.slow
def test_episodes_run_on_across_checkpoints_unless_restarted(tmp_path):
    """20-step episodes, 16-step updates, a checkpoint every update: every environment ends its first episode
    in update 2 (its second in update 3) when episodes run on, none ever does when each update restarts them."""
    import robot_fpo as R

    R.main(playground_args(tmp_path, num_updates=3, checkpoint_every=1))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["episodes"] for r in rows[1:]] == [0, 4, 4]  # episodes end at steps 20 and 40
    R.main(playground_args(tmp_path, num_updates=3, checkpoint_every=1, restart_every=1, run_name="restarted"))
    rows = read_jsonl(tmp_path / "restarted" / "metrics.jsonl")
    assert [r["episodes"] for r in rows[1:]] == [0, 0, 0]


@pytest.mark.slow
def test_resume_continues_the_environments_exactly(tmp_path):
    """Kill after update 3 (the checkpoint of update 2 kept), resume: the rows equal an uninterrupted run's,
    episodes running on through the resume (the checkpoint holds the simulator state and the observation)."""
    import shutil
    from dataclasses import replace

    from test_robot_fpo import strip_time  # drops the timing columns

    import robot_fpo as R

    R.main(playground_args(tmp_path / "a", num_updates=4))
    ref = strip_time(read_jsonl(tmp_path / "a/run/metrics.jsonl"))
    part = playground_args(tmp_path / "b", num_updates=2)
    R.main(part)
    ckpt = tmp_path / "b" / "run" / "checkpoints" / "last.pt"
    assert torch.load(ckpt, weights_only=False)["envs"]["sim"]["task"] == "CartpoleSwingup"
    shutil.copy(ckpt, tmp_path / "saved.pt")
    R.main(replace(part, num_updates=3, resume=True))
    shutil.copy(tmp_path / "saved.pt", ckpt)
    R.main(replace(part, num_updates=4, resume=True))
    got = strip_time(read_jsonl(tmp_path / "b/run/metrics.jsonl"))
    assert got == ref and [r["episodes"] for r in got[1:]] == [0, 4, 4, 4]


@pytest.fixture
def float32_matmul():
    """Full float32 matrix products on CUDA during the test, the setting restored afterwards (by hand: pytest's
    monkeypatch cannot undo a setattr on this torch attribute)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize(
    "objective,device,physics",
    [
        ("fpo", "cpu", "jax"),
        ("fpopp", "cpu", "jax"),
        pytest.param("fpo", "cpu", "warp", marks=needs_warp_cpu),
        ("fpo", "cuda", "jax"),
        pytest.param("fpo", "cuda", "warp", marks=needs_warp),
    ],
)
@pytest.mark.slow
def test_scanned_rollout_matches_the_per_step_rollout(objective, device, physics, float32_matmul):
    """--scan-rollout: the rollout as one JAX scan (a JAX copy of the sampler) gives the per-step path's batch:
    observations, actions, rewards, episode ends and sums, old losses and advantages, over two rollouts with
    episodes ending inside them and the observation statistics moving between them, on MJX and MuJoCo Warp."""
    from dataclasses import replace

    import jax

    if device == "cuda" and not (torch.cuda.is_available() and jax.default_backend() == "gpu"):
        pytest.skip(
            "needs a CUDA GPU for torch and JAX (the GPU path: DLPack hand-over, Triton sampler on the per-step side)"
        )
    sys.path.insert(0, ROOT)
    import robot_fpo as R
    import robot_fpo_fast as F

    args = replace(
        F.Args(),
        backend="playground",
        env_id="CartpoleSwingup",
        objective=objective,
        num_envs=4,
        num_steps=12,
        num_minibatches=2,
        num_draws=4,
        flow_steps=4,
        actor_hidden=16,
        critic_hidden=16,
        episode_length=5,
        cuda=device == "cuda",
        obs_stats="update",
        norm_reward=False,
        reward_scale=10.0,
        action_bound=1.5,
        seed=2,
        fused=device == "cuda",
        physics=physics,
    )
    runs = []
    for scan in (False, True):
        a = replace(args, scan_rollout=scan)
        torch.manual_seed(0)
        with jax.default_matmul_precision("highest"):  # float32 products on both sides (no TF32 on a GPU)
            state = F.build_state(a, torch.device(device))
        assert (state.scan is not None) == scan
        R.reset_envs(state, a.seed)
        torch.manual_seed(1)
        runs.append([])
        for _ in range(2):
            with jax.default_matmul_precision("highest"):
                batch = F.collect_rollout(state, a)
            runs[-1].append(
                {
                    **{k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()},
                    "std": state.obs_rms.var.sqrt().float(),
                }
            )  # the statistics the batch is normalised with
        state.envs.close()
    for per_step, scanned in zip(*runs):
        assert per_step["episodes"] == scanned["episodes"] > 0
        for key in ("episodic_return", "episodic_length", "action_abs_max"):
            assert scanned[key] == pytest.approx(per_step[key], rel=1e-5)
        torch.testing.assert_close(scanned["x"], per_step["x"], rtol=1e-5, atol=1e-6)
        # observations in their own units: the scan normalises in float32, the per-step path in float64, and a
        # near-constant coordinate (std ~3e-5 here) turns float32 rounding into 1e-3 of a normalised unit
        torch.testing.assert_close(
            scanned["obs"] * scanned["std"], per_step["obs"] * per_step["std"], rtol=1e-5, atol=1e-6
        )
        for key in ("l_old", "adv", "returns"):
            torch.testing.assert_close(scanned[key], per_step[key], rtol=1e-3, atol=1e-4)
    # statistics that move inside a rollout keep the per-step path
    state = F.build_state(replace(args, scan_rollout=True, obs_stats="step"), torch.device(device))
    assert state.scan is None
    state.envs.close()


# ---------------------------------------------------------------- Legged robots: locomotion tasks, dict observations
GO1 = "Go1JoystickFlatTerrain"
GO1_EPISODE = 5  # every Go1 environment below has this episode length, so all share one compiled step


@pytest.fixture(scope="module")
def go1():
    """4 Go1 environments on MJX (auto's choice for locomotion tasks), their Menagerie from envpool's assets."""
    from fpo_utils.playground_env import PlaygroundVecEnv, menagerie_for

    try:
        menagerie_for(GO1)
    except RunError as err:
        pytest.skip(str(err))
    e = PlaygroundVecEnv(GO1, 4, seed=0, device=torch.device("cpu"), episode_length=GO1_EPISODE, physics="auto")
    yield e
    e.close()


@pytest.mark.slow
def test_go1_observation_is_routed_state_then_privileged_state(go1):
    """The flat observation is ``state`` (48, the actor's) then ``privileged_state`` (123, the critic's): checked
    at the reset against Playground's own task reset with the same keys, and after steps against the
    observation dict inside the simulator state the step returns."""
    import jax

    from fpo_utils.playground_env import load_task

    route = go1.route
    assert (go1.physics, go1.obs_dim, go1.act_dim) == ("jax", 171, 12)
    assert (route.actor, route.critic) == (("state",), ("privileged_state",))
    assert (route.obs_actor, route.obs_critic) == (slice(0, 48), slice(48, 171))
    obs = go1.reset(3).clone()
    # the keys BraxAutoResetWrapper.reset hands the task: the last axis of each environment's split key
    keys = jax.vmap(jax.random.split)(go1._keys(3))[..., 1]
    want = jax.jit(jax.vmap(load_task(GO1, "jax").reset))(keys).obs
    # the same reset compiled into two XLA programs: equal up to float32 rounding
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(obs[:, route.obs_actor], torch.tensor(np.asarray(want["state"])), **close)
    torch.testing.assert_close(obs[:, route.obs_critic], torch.tensor(np.asarray(want["privileged_state"])), **close)
    for k, a in enumerate(actions(GO1_EPISODE + 1, go1.act_dim, seed=5)):
        o, r, term, trunc, info = go1.step(a)
        assert o.shape == info["final_obs"].shape == (4, 171) and r.shape == term.shape == trunc.shape == (4,)
        assert torch.isfinite(o).all() and torch.isfinite(r).all() and torch.isfinite(info["final_obs"]).all()
        cut = k + 1 == GO1_EPISODE
        assert trunc.all() if cut else not trunc.any(), k
        if cut:  # each episode restarts from its first state; the observation that ended it is kept
            assert torch.equal(o, obs) and not torch.equal(info["final_obs"], obs)
        inner = go1._unpack_state(go1._state).obs  # the state the next step starts from
        assert torch.equal(o[:, :48], torch.tensor(np.asarray(inner["state"])))
        assert torch.equal(o[:, 48:], torch.tensor(np.asarray(inner["privileged_state"])))


@pytest.mark.slow
def test_full_reset_redraws_the_command_and_keeps_the_ended_episodes_bookkeeping(go1):
    """An episode cut at the limit: with ``env_reset="first"`` (the ``go1`` fixture) the next one starts from the
    cached first state with the same command; with ``"full"`` from the task's reset, with a new command. Both
    report the ended episode's truncation, length, return and final observation."""
    from fpo_utils import legged
    from fpo_utils.playground_env import PlaygroundVecEnv

    full = PlaygroundVecEnv(GO1, 4, seed=0, device=torch.device("cpu"), episode_length=GO1_EPISODE, env_reset="full")
    seen = {}
    for name, e in (("first", go1), ("full", full)):
        obs = e.reset(3).clone()
        total, before = torch.zeros(4), legged.command_velocity(e, obs)[0]
        for k, a in enumerate(actions(GO1_EPISODE, e.act_dim, seed=5)):
            o, r, term, trunc, info = e.step(a)
            total += r
            last = info["final_obs"].clone()
        assert trunc.all() and not term.any(), name
        torch.testing.assert_close(info["episode_length"], torch.full((4,), float(GO1_EPISODE)))
        torch.testing.assert_close(info["episode_return"], total, rtol=1e-5, atol=1e-5)
        assert not torch.equal(last, o)  # the observation that ended the episode, not the next one's first
        seen[name] = (before, legged.command_velocity(e, o)[0], obs, o.clone())
    assert torch.equal(seen["full"][2], seen["first"][2])  # one seed, the same first states in both modes
    before, after, start, restart = seen["first"]
    assert torch.equal(after, before) and torch.equal(restart, start)  # the first state again, command and all
    before, after, start, restart = seen["full"]
    assert not torch.isclose(after, before).all(dim=1).any()  # every environment's command is drawn anew
    with pytest.raises(RunError, match="env_reset 'full'.*'first'"):
        go1.load_state_dict(full.state_dict())  # the two keep different simulator states
    full.close()


def test_full_reset_is_refused_off_playground():
    from fpo_utils.envs import make_envs

    with pytest.raises(RunError, match="env_reset 'full' needs the playground backend"):
        make_envs("InvertedPendulum-v5", 2, 0, "gymnasium", env_reset="full")


@pytest.mark.slow
def test_reward_scales_reach_the_playground_reward_and_leave_the_default_task_as_it_was(go1):
    """--reward-scales on Go1: every term weighted 0 but action_rate, weighted 1, leaves the reward
    clip(0.02 s x sum_j (a_j - last a_j)^2, 0, 1e4) (Playground's go1/joystick.py), a closed form of the actions:
    0.5 on 12 joints from the reset's zeros, then -0.5, then -0.5 again. The default task keeps its own weight."""
    from fpo_utils import playground_env
    from fpo_utils.envs import make_envs, reward_terms

    terms = reward_terms(GO1, "playground")
    assert {"action_rate", "torques", "energy", "tracking_lin_vel"} <= set(terms) and len(terms) == 16
    only = tuple(f"{t}={1 if t == 'action_rate' else 0}" for t in terms)
    e = make_envs(GO1, 4, 0, "playground", episode_length=GO1_EPISODE, physics="auto", reward_scales=only)
    assert e._key != go1._key  # its own compiled step
    e.reset(3)
    for a, want in ((0.5, 0.02 * 12 * 0.25), (-0.5, 0.02 * 12 * 1.0), (-0.5, 0.0)):
        r = e.step(torch.full((4, 12), a))[1]
        torch.testing.assert_close(r, torch.full((4,), want), rtol=0, atol=1e-6)
    e.close()
    assert playground_env._mjx_task(GO1)._config.reward_config.scales.action_rate == -0.01
    with pytest.raises(RunError, match="no term 'action'; its terms: action_rate, ang_vel_xy, "):
        make_envs(GO1, 4, 0, "playground", reward_scales=("action=1",))
    with pytest.raises(RunError, match="CartpoleSwingup has no reward terms"):
        make_envs("CartpoleSwingup", 4, 0, "playground", reward_scales=("action_rate=1",))


def go1_args(tmp_path, presets=None, **kw):
    """The fpopp-locomotion preset (of ``presets``, default robot_fpo's) on 4 Go1 environments, tiny: 8 steps an
    update, small networks."""
    from dataclasses import replace

    import robot_fpo as R

    tiny = dict(
        backend="playground", env_id=GO1, num_envs=4, num_steps=8, num_minibatches=2, update_epochs=2, num_draws=4,
        flow_steps=4, actor_hidden=16, critic_hidden=16, eval_every=2, eval_episodes=4, episode_length=GO1_EPISODE,
        num_updates=2, cuda=False, runs_dir=str(tmp_path), run_name="go1",
    )  # fmt: skip
    return replace((presets or R.PRESETS)["fpopp-locomotion"], **{**tiny, **kw})


@pytest.mark.slow
def test_go1_fpopp_locomotion_end_to_end(tmp_path, go1):
    """robot_fpo.main with the fpopp-locomotion preset on Go1: args.json records the routed keys, the actor reads
    ``state`` and the critic ``privileged_state``, and every update's losses are finite."""
    import robot_fpo as R

    R.main(go1_args(tmp_path))
    run = tmp_path / "go1"
    saved = json.loads((run / "args.json").read_text())
    assert (saved["backend"], saved["env_id"], saved["physics"]) == ("playground", GO1, "jax")
    assert (saved["obs_actor"], saved["obs_critic"]) == ("state", "privileged_state")
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2] and rows[-1]["global_step"] == 64
    assert all(math.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean", "grad_norm"))
    assert all(math.isfinite(r["eval_return"]) for r in (rows[0], rows[-1]))
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["actor"]["net.0.weight"].shape[1] == 48 + 12 + 8  # state, the noisy action, the time embedding
    assert ckpt["critic"]["net.0.weight"].shape[1] == 123  # privileged_state
    assert ckpt["envs"]["sim"]["task"] == GO1


@pytest.mark.slow
def test_go1_runs_with_full_resets_and_a_resume_may_not_switch_them_under_a_saved_state(tmp_path, go1):
    """--env-reset full end to end on Go1 (episodes of 5 steps, so every update restarts them): finite losses, the
    setting in args.json and in the checkpoint's environment state; a resume that switches back to first-state
    restarts is refused in one line while the checkpoint holds that state, and runs once it does not (the
    environments restart, as after benchmarks/portable_checkpoints.py)."""
    from dataclasses import replace

    import robot_fpo as R

    args = go1_args(tmp_path, env_reset="full")
    R.main(args)
    run = tmp_path / "go1"
    assert json.loads((run / "args.json").read_text())["env_reset"] == "full"
    rows = read_jsonl(run / "metrics.jsonl")
    assert all(math.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean", "grad_norm"))
    assert rows[-1]["episodes"] > 0  # 16 steps of episodes of 5: some ended inside the last rollout
    last = run / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["envs"]["sim"]["env_reset"] == "full"
    back = replace(args, env_reset="first", resume=True, num_updates=3)
    with pytest.raises(RunError, match="env_reset 'full'.*'first'"):
        R.main(back)
    torch.save({**ckpt, "envs": None}, last)
    R.main(back)
    assert [r["update"] for r in read_jsonl(run / "metrics.jsonl")][-1] == 3


@pytest.mark.slow
def test_go1_scanned_rollout_matches_the_per_step_rollout(tmp_path, go1):
    """--scan-rollout on Go1 (FPO++ with --obs-stats update, which the scan needs): the JAX sampler reads the
    actor's columns and gives the per-step path's rollout."""
    from dataclasses import replace

    import jax

    import robot_fpo as R
    import robot_fpo_fast as F

    args = go1_args(tmp_path, presets=F.PRESETS, obs_stats="update", seed=2)
    runs = []
    for scan in (False, True):
        a = replace(args, scan_rollout=scan)
        torch.manual_seed(0)
        with jax.default_matmul_precision("highest"):
            state = F.build_state(a, torch.device("cpu"))
            assert (state.scan is not None) == scan
            R.reset_envs(state, a.seed)
            torch.manual_seed(1)
            runs.append({k: v.clone() if torch.is_tensor(v) else v for k, v in F.collect_rollout(state, a).items()})
        state.envs.close()
    per_step, scanned = runs
    assert per_step["episodes"] == scanned["episodes"] == 4  # each environment's 5-step episode ends once
    assert scanned["episodic_return"] == pytest.approx(per_step["episodic_return"], rel=1e-5, abs=1e-6)
    torch.testing.assert_close(scanned["x"], per_step["x"], rtol=1e-5, atol=1e-5)
    for key in ("l_old", "adv", "returns"):
        torch.testing.assert_close(scanned[key], per_step[key], rtol=1e-3, atol=1e-4)


def test_missing_menagerie_is_one_line_and_never_cloned(monkeypatch, tmp_path):
    """A locomotion task whose robot folder is absent: one line naming the task, the folder and the package to
    install, raised before Playground is asked to build it (so it never tries to git-clone Menagerie)."""
    from mujoco_playground._src import mjx_env

    from fpo_utils import playground_env
    from fpo_utils.envs import make_envs

    def no_clone(*args, **kwargs):
        raise AssertionError("Playground tried to clone Menagerie")

    monkeypatch.setattr(mjx_env, "_clone_with_progress", no_clone)
    monkeypatch.setattr(playground_env, "menagerie_roots", lambda: {playground_env.LARGE: tmp_path})
    playground_env.observation_space.cache_clear()  # shapes read with the real assets must not hide the error,
    playground_env._mjx_task.cache_clear()  # nor a task built with them
    missing = (
        (GO1, f"({tmp_path / 'unitree_go1'})", playground_env.LARGE),  # the wheel's folder lacks the robot
        ("G1JoystickFlatTerrain", f"({playground_env.HUMANOID} is not installed)", playground_env.HUMANOID),
    )
    try:
        for task, where, package in missing:
            with pytest.raises(RunError) as err:
                make_envs(task, 4, 0, "playground")
            msg = str(err.value)
            assert task in msg and where in msg and f"pip install {package}" in msg and "\n" not in msg, msg
            assert err.value.code == EXIT_BAD_INPUT
    finally:
        playground_env.observation_space.cache_clear()
        playground_env._mjx_task.cache_clear()


@pytest.mark.slow
def test_render_strip_of_a_trained_run_replays_its_evaluation(tmp_path, monkeypatch, capsys):
    """benchmarks/render_legged.py on a tiny CartpoleSwingup run: the recorded episode is robot_fpo.py's own
    evaluation (the same return), and the strip holds the chosen frames side by side. MuJoCo's renderer needs a GL
    context this machine may lack, so a stand-in draws each frame from the state it is given."""
    import mujoco

    import robot_fpo as R

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from dataclasses import replace

    import render_legged

    args = replace(R.Args(), **TINY_PLAYGROUND, runs_dir=str(tmp_path), run_name="run", num_updates=2, cuda=False)
    summary = R.main(args)
    drawn = []

    class Renderer:  # a frame whose pixels encode the cart position it was given
        def __init__(self, model, height, width):
            self.shape = (height, width, 3)

        def update_scene(self, data, camera=None):
            drawn.append(float(data.qpos[0]))

        def render(self):
            return np.full(self.shape, len(drawn), dtype=np.uint8)

        def close(self):
            pass

    monkeypatch.setattr(mujoco, "Renderer", Renderer)
    out = tmp_path / "strip.png"
    argv = ["render_legged.py", str(tmp_path / "run"), "--out", str(out), "--frames", "3", "--every", "4"]
    monkeypatch.setattr(sys, "argv", [*argv, "--size", "16"])
    render_legged.main()
    from PIL import Image

    img = np.asarray(Image.open(out))
    assert img.shape == (16, 48, 3) and [int(img[0, 16 * k, 0]) for k in range(3)] == [1, 2, 3]
    assert len(set(drawn)) == 3  # three different states: steps 4, 8 and 12 of the episode
    state, run_args = render_legged.load_run(tmp_path / "run", torch.device("cpu"))
    assert state.update == summary["updates_done"] == 2
    envs = render_legged.Recording(render_legged.book.task_envs(run_args, 1, run_args.eval_seed, state.device))
    got = R.evaluate(state, envs, run_args, "random" if run_args.objective == "fpo" else "zero")
    assert len(envs.states) == TINY_PLAYGROUND["episode_length"]
    assert envs.states[3]["qpos"][0] == pytest.approx(drawn[0])  # the recorded episode is the rendered one
    assert math.isfinite(float(got))
    # --episodes eval_episodes: the printed mean return is the run's own logged evaluation of its last update
    monkeypatch.setattr(sys, "argv", [*argv, "--size", "16", "--episodes", str(TINY_PLAYGROUND["eval_episodes"])])
    render_legged.main()
    printed = float(capsys.readouterr().out.strip().splitlines()[-1].split(":")[0])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["eval_return"] for r in rows if "eval_return" in r and r["update"] == 2]
    assert logged and printed == pytest.approx(logged[0], rel=1e-4)  # printed with 6 digits


def test_render_recording_keeps_only_the_first_episode_of_environment_0():
    """render_legged.Recording draws environment 0's first episode: once it ends (here at step 3, while environment
    1 runs on) no later state, which would be a fresh episode's, joins the strip."""
    from types import SimpleNamespace

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import render_legged

    class Envs:  # two environments; environment 0 terminates at step 3, environment 1 is truncated at step 6
        def __init__(self):
            self.t, self._state = 0, None

        def _unpack_state(self, _):
            data = {k: np.full((2, 1), float(self.t)) for k in render_legged.STATE_KEYS}
            return SimpleNamespace(data=SimpleNamespace(**data))

        def step(self, actions):
            self.t += 1
            term, trunc = torch.tensor([self.t == 3, False]), torch.tensor([False, self.t == 6])
            return None, torch.zeros(2), term, trunc, {}

    rec = render_legged.Recording(Envs())
    for _ in range(6):
        rec.step(None)
    assert [float(s["qpos"][0]) for s in rec.states] == [1.0, 2.0, 3.0]
