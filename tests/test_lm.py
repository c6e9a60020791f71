"""learner=lm: GRPO with late slow rewards on a tiny transformers policy and its NumPy stand-in.

Oracles: a hand-written GRPO loop (token by token log-probs, explicit group loops,
SGD by hand), a synchronous GRPO loop, the bandit's closed-form expected update,
and Theorem 2.1's slack at a fixed policy."""

import copy
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import Lazy
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = Lazy("torch")  # imported by the first test that runs, not at collection
LM = Lazy("racsim.learner.lm")

from racsim.config.schema import CORRECTORS
from racsim.analyses.lm_study import checkpoint_steps, value_at_clock  # noqa: E402
from racsim.config.defaults import default_config  # noqa: E402
from racsim.config.validate import validate  # noqa: E402
from racsim.errors import ConfigError  # noqa: E402
from racsim.learner.bandit import BanditPolicy, expected_grpo_gradient, log_softmax  # noqa: E402
from racsim.learner.correctors import CorrectorParams  # noqa: E402
from racsim.learner.grpo import group_relative, make_task, missing_fraction, task_rewards, train_lane  # noqa: E402
from racsim.pipeline.schedule import DROPPED, INJECTED  # noqa: E402

V, L, LP = 4, 2, 2  # vocab, response and prompt length: 16 responses per prompt


def tiny_conf(**kw):
    base = dict(device="cpu", checkpoint=None, backbone="gpt2", layers=1, d_model=16, heads=2, optimizer="sgd",
                lr=0.5, threads=1)
    base.update(kw)
    return SimpleNamespace(**base)


def tiny_task(rho=-0.5, n_prompts=3):
    return make_task(n_prompts, LP, L, V, rho, seed=11)


def policy(task, seed=0, reference=False, **kw):
    return LM.TransformerPolicy(task.prompts, V, L, tiny_conf(**kw), seed, reference=reference)


def schedule(N, P, K, delay, status=None):
    d = np.broadcast_to(np.asarray(delay), (N, P, K)).astype(np.int64).copy()
    st = np.full((N, P, K), INJECTED) if status is None else status
    land = np.where(st == INJECTED, np.arange(N)[:, None, None] + d, -1)
    return np.where(st == INJECTED, d, -1), st, land


def sync_land(N, P, K):
    return np.broadcast_to(np.arange(N)[:, None, None], (N, P, K)).copy()


def params_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---- hand-written oracles ------------------------------------------------------------------

def loop_logp(model, prompt, response):
    """log pi(y | x), one forward pass per token on the growing prefix."""
    total = 0.0
    seq = list(prompt)
    for tok in response:
        logits = model(input_ids=torch.tensor([seq])).logits[0, -1, :V]
        total = total + torch.log_softmax(logits, -1)[int(tok)]
        seq.append(int(tok))
    return total


def loop_advantages(r, G):
    out = []
    for g in range(len(r) // G):
        grp = [float(x) for x in r[g * G:(g + 1) * G]]
        m = sum(grp) / G
        out += [x - m for x in grp]
    return out


def test_grpo_update_matches_a_hand_written_loop():
    """Two steps of RAC with every slow result one step late (K = 1): step 0 is GRPO on
    the proxy; step 1 adds exp(-1/tau) * min(rho_bar, pi_now/pi_behaviour) * X for the
    earlier groups, X the group-relative residual. The loop recomputes every log-prob
    token by token and takes the SGD steps by hand."""
    task, P, G, lr = tiny_task(), 2, 4, 0.5
    prm = CorrectorParams(tau_age=3.0, rho_bar=1.2)
    pol = policy(task, lr=lr)
    model = copy.deepcopy(pol.model)
    sampler = copy.deepcopy(pol)
    delay, status, land = schedule(2, P, 1, 1)
    train_lane(pol, task, delay, status, land, "rac", prm, [1.0], G, 0.0, np.random.default_rng(5))

    rng = np.random.default_rng(5)
    beh = []
    hist = []
    for t in range(2):
        pidx = np.repeat(rng.integers(0, task.n_prompts, P), G)
        sampler.model.load_state_dict(model.state_dict())
        resp = sampler.sample(pidx, rng)
        r_fast, r_true = task_rewards(task, pidx, resp)
        adv = loop_advantages(r_fast, G)
        resid = loop_advantages(r_true - r_fast, G)
        logps = [loop_logp(model, task.prompts[x], y) for x, y in zip(pidx, resp)]
        loss = -sum(a * lp for a, lp in zip(adv, logps))
        if t == 1:
            for (opid, oresp, ores, olp) in hist:
                for x, y, X, lb in zip(opid, oresp, ores, olp):
                    lp = loop_logp(model, task.prompts[x], y)
                    ratio = float(np.exp(float(lp.detach()) - lb))
                    c = prm.alpha * np.exp(-1 / prm.tau_age) * min(prm.rho_bar, ratio)
                    loss = loss - c * X * lp
        loss = loss / (P * G)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        beh = [float(lp.detach()) for lp in logps]
        hist = [(pidx, resp, resid, beh)]
    assert torch.allclose(params_of(pol.model), params_of(model), rtol=1e-4, atol=1e-6)
    assert not torch.allclose(params_of(pol.model), params_of(sampler.model), atol=1e-4)  # it moved


def synchronous_grpo(pol, task, N, P, G, rng):
    """Plain synchronous GRPO on the true reward: the sync oracle's definition."""
    true = []
    for _ in range(N):
        pidx = np.repeat(rng.integers(0, task.n_prompts, P), G)
        resp = pol.sample(pidx, rng)
        _, r_true = task_rewards(task, pidx, resp)
        true.append(r_true.mean())
        adv = np.asarray(r_true, dtype=np.float64).reshape(-1, G)
        adv = (adv - adv.mean(axis=1, keepdims=True)).ravel()
        pol.update(pidx, resp, lambda lp, a=adv: a, float(P * G))
    return np.array(true)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_oracle_and_wait_for_slow_equal_synchronous_grpo_bit_for_bit(optimizer):
    task, N, P, K, G = tiny_task(), 4, 2, 2, 4
    rng = np.random.default_rng(0)
    ref = policy(task, optimizer=optimizer, lr=0.05)
    true = synchronous_grpo(ref, task, N, P, G, np.random.default_rng(3))
    # the sync oracle ignores the asynchronous schedule (random delays, some drops)
    status = np.where(rng.random((N, P, K)) < 0.3, DROPPED, INJECTED).astype(np.int8)
    delay, status, _ = schedule(N, P, K, rng.integers(0, 3, (N, P, K)), status)
    a = policy(task, optimizer=optimizer, lr=0.05)
    cv = train_lane(a, task, delay, status, sync_land(N, P, K), "sync_oracle", CorrectorParams(), [0.3, 0.7], G,
                    0.0, np.random.default_rng(3))
    # wait-for-slow on a blocking schedule where everything lands in its own step
    b = policy(task, optimizer=optimizer, lr=0.05)
    d0, s0, l0 = schedule(N, P, K, 0)
    cw = train_lane(b, task, d0, s0, l0, "wait_for_slow", CorrectorParams(), [0.3, 0.7], G, 0.0,
                    np.random.default_rng(3))
    assert torch.equal(params_of(a.model), params_of(ref.model))
    assert torch.equal(params_of(b.model), params_of(ref.model))
    assert np.array_equal(cv.true[:N], true) and np.array_equal(cw.true[:N], true)
    # ... and naive does not
    c = policy(task, optimizer=optimizer, lr=0.05)
    train_lane(c, task, delay, status, np.full_like(delay, -1), "naive", CorrectorParams(), [0.3, 0.7], G, 0.0,
               np.random.default_rng(3))
    assert not torch.equal(params_of(c.model), params_of(ref.model))


def test_ratios_are_one_at_zero_delay():
    task, N, P, K, G = tiny_task(), 3, 2, 1, 4
    # every result at Delta = 0: RAC's weight is alpha * w_age(0) * min(rho_bar, 1) = 1, the sync oracle
    rac, sync = policy(task), policy(task)
    d0, s0, l0 = schedule(N, P, K, 0)
    c1 = train_lane(rac, task, d0, s0, l0, "rac", CorrectorParams(), [1.0], G, 0.0, np.random.default_rng(1))
    train_lane(sync, task, d0, s0, sync_land(N, P, K), "sync_oracle", CorrectorParams(), [1.0], G, 0.0,
               np.random.default_rng(1))
    assert torch.equal(params_of(rac.model), params_of(sync.model)) and c1.ratio.size == 0
    # a frozen policy (lr 0) has ratio 1 at any delay; a learning one does not
    d1, s1, l1 = schedule(N, P, K, 1)
    frozen = train_lane(policy(task, lr=0.0), task, d1, s1, l1, "rac", CorrectorParams(), [1.0], G, 0.0,
                        np.random.default_rng(1))
    moving = train_lane(policy(task, lr=2.0), task, d1, s1, l1, "rac", CorrectorParams(), [1.0], G, 0.0,
                        np.random.default_rng(1))
    assert frozen.ratio.size == (N - 1) * P * G and np.all(frozen.ratio_delay == 1)
    assert np.allclose(frozen.ratio, 1.0, rtol=0, atol=1e-5)
    assert np.max(np.abs(moving.ratio - 1.0)) > 1e-3


def test_same_seed_same_bits_on_cpu():
    task = tiny_task()
    d, s, land = schedule(3, 2, 1, 1)
    runs = [train_lane(policy(task, optimizer="adam", lr=0.05, reference=True), task, d, s, land, "rac", CorrectorParams(), [1.0], 4,
                       0.1, np.random.default_rng(2)) for _ in range(2)]
    assert np.array_equal(runs[0].true, runs[1].true) and np.array_equal(runs[0].ratio, runs[1].ratio)


# ---- the NumPy stand-in ------------------------------------------------------------------

def enumerate_responses():
    codes = np.arange(V**L)
    return (codes[:, None] // V ** np.arange(L - 1, -1, -1)) % V


def test_stand_in_expected_update_agrees_with_the_transformer_at_a_fixed_policy():
    """The bandit's closed-form expected GRPO update, with its logits set to the transformer's
    log-probs over the enumerated response set and mapped through d log pi / d theta, equals
    the Monte-Carlo mean of the transformer learner's own update gradients."""
    task, G = tiny_task(n_prompts=2), 4
    lm = policy(task, d_model=8, heads=2)
    Y = enumerate_responses()
    R = len(Y)
    xs = np.repeat(np.arange(task.n_prompts), R)
    ys = np.tile(Y, (task.n_prompts, 1))
    phi = lm.logprob(xs, ys).reshape(task.n_prompts, R)
    assert np.allclose(np.exp(phi).sum(axis=1), 1.0, atol=1e-5)  # the response set is all of pi's support
    bandit = BanditPolicy(task, 0, "sgd", 1.0, seed=0)
    bandit.phi[:] = phi
    r_fast, r_true = task_rewards(task, xs, ys)
    exact = {}
    for key, r in (("true", r_true), ("fast", r_fast)):
        g_phi = expected_grpo_gradient(phi, r.reshape(task.n_prompts, R), G)
        exact[key] = lm.gradient(xs, ys, g_phi.ravel(), 1.0)  # J^T g_phi
    # the bandit's own expected update agrees with its sampled updates too
    rng = np.random.default_rng(0)
    chunks, P = 24, 96
    mc, mc_b = [], []
    for _ in range(chunks):
        pidx = np.repeat(rng.integers(0, task.n_prompts, P), G)
        resp = lm.sample(pidx, rng)
        _, rt = task_rewards(task, pidx, resp)
        mc.append(lm.gradient(pidx, resp, group_relative(rt, G), float(P * G)))
        resp_b = bandit.sample(pidx, rng)
        _, rb = task_rewards(task, pidx, resp_b)
        mc_b.append(bandit.gradient(pidx, resp_b, group_relative(rb, G), float(P * G)))
    mc = np.array(mc)
    mean, se = mc.mean(axis=0), mc.std(axis=0, ddof=1) / np.sqrt(chunks)
    noise = np.sqrt((se**2).sum())
    assert np.linalg.norm(mean - exact["true"]) < 2.0 * noise
    assert np.linalg.norm(mean - exact["fast"]) > 4.0 * noise  # the test can tell two targets apart
    mb = np.array(mc_b)
    g_b = expected_grpo_gradient(phi, r_true.reshape(task.n_prompts, R), G).ravel()
    assert np.linalg.norm(mb.mean(axis=0) - g_b) < 2.0 * np.sqrt((mb.var(axis=0, ddof=1) / chunks).sum())


def test_bandit_gradient_against_a_loop():
    task = tiny_task()
    b = BanditPolicy(task, 5, "sgd", 1.0, seed=3)
    b.phi[:] = np.random.default_rng(1).standard_normal(b.phi.shape)
    rng = np.random.default_rng(2)
    pidx = rng.integers(0, task.n_prompts, 7)
    resp = b.sample(pidx, rng)
    coef = rng.standard_normal(7)
    want = np.zeros_like(b.phi)
    for x, y, c in zip(pidx, resp, coef):
        j = [i for i in range(b.responses.shape[1]) if np.array_equal(b.responses[x, i], y)][0]
        pi = np.exp(b.phi[x] - b.phi[x].max())
        pi /= pi.sum()
        for a in range(len(pi)):
            want[x, a] += c * ((a == j) - pi[a]) / 2.5
    assert np.allclose(b.gradient(pidx, resp, coef, 2.5).reshape(b.phi.shape), want)
    assert np.allclose(b.logprob(pidx, resp), log_softmax(b.phi)[pidx, b.index(pidx, resp)])
    outside = np.setdiff1d(np.arange(V**L), b.codes[pidx[0]])[0]  # a sequence not in prompt pidx[0]'s set
    with pytest.raises(ValueError, match="outside"):
        b.index(pidx[:1], enumerate_responses()[outside][None])


@pytest.mark.parametrize("name,delay,want", [("naive", 1, 1.0), ("sync_oracle", 1, 0.0), ("rac", 0, 0.0),
                                             ("retrace_a", 1, 0.5), ("retrace_a", 2, 0.75)])
def test_missing_fraction_is_the_slack_at_a_fixed_policy(name, delay, want):
    """At a frozen policy (ratio 1) the measured missing fraction of the slow residual's
    gradient is Theorem 2.1's slack: 1 - gamma**Delta for Retrace-A."""
    task, N, P, G = make_task(6, 2, 3, 4, -0.5, seed=2), 30, 4, 8
    delay_, status, land = schedule(N, P, 1, delay)
    if name == "naive":
        land = np.full_like(land, -1)
    elif name == "sync_oracle":
        land = sync_land(N, P, 1)
    got = []
    for s in range(3):
        b = BanditPolicy(task, 0, "sgd", 0.0, seed=0)
        b.phi[:] = np.random.default_rng(9).standard_normal(b.phi.shape)
        cv = train_lane(b, task, delay_, status, land, name, CorrectorParams(), [1.0], G, 0.0,
                        np.random.default_rng(s), np.random.default_rng(50 + s), checkpoints=range(5, N), sync_batch=16)
        got.append(missing_fraction(*(np.array([g[k] for g in cv.gradients]) for k in ("c0", "late_dot", "res_dot"))))
    assert abs(np.mean(got) - want) < (1e-12 if name in ("naive", "sync_oracle", "rac") else 0.08)


# ---- study, config and layout ------------------------------------------------------------

def test_checkpoints_and_clock_helpers():
    assert checkpoint_steps(50, 4) == [10, 20, 30, 40] and checkpoint_steps(3, 8) == [0, 1, 2]
    clock = np.array([[0.0, 1, 2, 3, 4], [10.0, 12, 14, 16, 18]])
    vals = np.array([[0.0, 1, 2, 3, 4], [5.0, 6, 7, 8, 9]])
    # lane 0 completes 2 steps by 2.5 s (entries 1, 2), lane 1 one step (entries 0, 1)
    assert np.allclose(value_at_clock(clock, vals, 2.5, 2), [1.5, 5.5])


@pytest.mark.parametrize("override,key", [
    ("learner.lm.heads=3", "learner.lm.heads"),
    ("learner.lm.policy=rnn", "learner.lm.policy"),
    ("learner.lm.proxy_correlation=1.5", "learner.lm.proxy_correlation"),
    ("learner.lm.group_size=1", "learner.lm.group_size"),
    ("learner.lm.device=tpu", "learner.lm.device"),
    ("learner.lm.optimizer=lbfgs", "learner.lm.optimizer"),
])
@pytest.mark.parametrize("learner", ["lm", "tabular"])
def test_bad_lm_values_name_the_key(override, key, learner):
    """Refused whatever learner.kind is: a tabular run never carries a bad lm value unused."""
    with pytest.raises(ConfigError) as ex:
        validate(default_config(f"learner={learner}", override))
    assert ex.value.key == key


@pytest.mark.long
def test_learner_lm_runs_end_to_end(tmp_path):
    from racsim.report.writers import write_outputs
    from racsim.analyses.dispatch import run

    cfg = default_config("learner=lm", "pipeline.steps=4", "learner.lm.seeds=2", "learner.lm.checkpoints=1",
                         "learner.lm.decide=[]", "learner.lm.d_model=16", "learner.lm.layers=1", "learner.lm.vocab=6",
                         "learner.lm.response_len=3", "learner.lm.group_size=4")
    res = run(cfg)
    r = res.results
    assert list(r.corrector)[0] == "naive" and len(r) == len(CORRECTORS)
    assert (r.grad_missing[r.corrector == "naive"] == 1).all() and (r.grad_missing[r.corrector == "sync_oracle"] == 0).all()
    sync, wait = (r[r.corrector == n].iloc[0] for n in ("sync_oracle", "wait_for_slow"))
    assert wait.wallclock_ratio > 1 and sync.wallclock_ratio == 1
    files = {p.name for p in write_outputs(tmp_path, res, "x: 1\n", plots=True)}
    assert {"lm_training.png", "lm_gradients.png", "lm_curves.parquet", "summary.md"} <= files
    assert "true @ naive clock" in (tmp_path / "summary.md").read_text()


def test_cli_and_run_do_not_import_torch():
    code = "import sys, racsim, racsim.app.cli, racsim.analyses.dispatch; print('torch' in sys.modules or 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("backbone", ["gpt2", "llama"])
def test_local_checkpoint_loads_the_same_model(tmp_path, backbone):
    task = tiny_task()
    a = policy(task, backbone=backbone)
    a.model.save_pretrained(tmp_path)
    b = policy(task, seed=99, checkpoint=str(tmp_path))
    rng = np.random.default_rng(0)
    pidx = rng.integers(0, task.n_prompts, 6)
    resp = a.sample(pidx, np.random.default_rng(1))
    assert np.array_equal(b.sample(pidx, np.random.default_rng(1)), resp)
    assert np.allclose(a.logprob(pidx, resp), b.logprob(pidx, resp), atol=1e-6)
    with pytest.raises(ConfigError) as ex:
        policy(task, checkpoint=str(tmp_path / "absent"))
    assert ex.value.key == "learner.lm.checkpoint"



@settings(max_examples=40, deadline=None, derandomize=True)
@example(value="lean")  # allowed for output.job_files (refused as learner.lm.lr's type)
@example(value=0.5)  # allowed for learner.lm.lr ("0.5" for output.job_files: refused)
@given(value=st.one_of(st.text(min_size=1, max_size=12), st.integers(-10**20, 10**20), st.floats(allow_nan=True)))
@pytest.mark.long
def test_generated_values_for_job_files_and_lm_lr_on_a_tabular_run(value):
    """Generated values for output.job_files and learner.lm.lr (a tabular run): validated when
    allowed, else a ConfigError naming the key, never another exception."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    from racsim.config.defaults import compose_config
    from racsim.config.schema import JOB_FILES

    def positive(v) -> bool:  # a step size: past 1e6 the weights overflow, refused up front
        return isinstance(v, float) and np.isfinite(v) and 0 < v <= 1e6

    for key, allowed in (("output.job_files", lambda v: v in JOB_FILES), ("learner.lm.lr", positive)):
        cfg = compose_config()
        try:
            OmegaConf.update(cfg, key, value)
        except ValidationError:  # a type the typed schema refuses before racsim's validation
            continue
        v = OmegaConf.select(cfg, key)  # as the schema converted it
        if allowed(v):
            validate(cfg)
        else:
            with pytest.raises(ConfigError) as ex:
                validate(cfg)
            assert ex.value.key == key
