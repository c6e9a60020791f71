"""learner=lm: S seeds of the transformer policy trained as one batch
(racsim.learner.lm.BatchedTransformerPolicy, racsim.learner.grpo.train_lanes) against the
same seeds trained one at a time (TransformerPolicy, train_lane).

Tolerance. The batched model computes attention as matmul and softmax (vmap has no rule for
the CPU's fused attention that TransformerPolicy's model uses), GPT-2's gelu_new as torch's
fused tanh GELU (the same formula), and LayerNorm's parameter gradients under vmap sum in
another order, so floats differ in their last bits. Exact: the sampled tokens at every step
(hence the true and proxy curves), the late rows' delays, c0. Within rtol 1e-5 (atol 1e-6):
the log-probability ratios, delivered/owed, and after SGD the final float32 parameters and
the final policies' log-probabilities. The gradient records (dot products of float32
gradients; late_dot a difference of two): within 1e-4 of their scale (the larger of
|late_dot| and |res_dot|) after SGD.

Adam divides each gradient element by its own running scale, so an element whose gradient
is near rounding level amplifies those last bits: GPT-2's key bias has an exact gradient of
0 (softmax ignores a score added to a whole row), so Adam moves it by rounding noise alone,
up to lr per step either way, in both runs. After Adam: the parameters other than the key
bias within atol 1e-4 (lr 0.05, 5 steps; the key bias does not change the policy), the
final policies' log-probabilities within rtol 1e-4, the gradient records within 2e-3 of
their scale.

A token flips only if a uniform falls within ~1e-7 of a CDF boundary: not on these seeds
(the exact comparison of the curves would show it)."""

import numpy as np
import pytest

from helpers import Lazy

torch = Lazy("torch")  # imported by the first test that runs, not at collection
LM = Lazy("racsim.learner.lm")

from racsim.learner.correctors import CorrectorParams  # noqa: E402
from racsim.learner.grpo import make_task, train_lane, train_lanes  # noqa: E402
from racsim.pipeline.schedule import DROPPED, INJECTED  # noqa: E402

from test_lm import tiny_conf  # noqa: E402

V, L, LP = 4, 2, 2
N, P, K, G = 5, 2, 2, 4
SHARES = [0.3, 0.7]
RTOL, ATOL = 1e-5, 1e-6


def lane_schedule(seed: int, name: str):
    """Random delays 0..2 and drops: late rows in varying numbers per step and lane."""
    rng = np.random.default_rng(100 + seed)
    st = np.where(rng.random((N, P, K)) < 0.25, DROPPED, INJECTED).astype(np.int8)
    d = np.where(st == INJECTED, rng.integers(0, 3, (N, P, K)), -1)
    land = np.where(st == INJECTED, np.arange(N)[:, None, None] + d, -1)
    if name == "naive":
        land = np.full_like(land, -1)
    return d, st, land


def params_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_both(S, name, optimizer, kl, backbone="gpt2", checkpoints=(1, 3)):
    task = make_task(3, LP, L, V, -0.5, seed=11)
    conf = tiny_conf(optimizer=optimizer, lr=0.05, backbone=backbone)
    prm = CorrectorParams(tau_age=3.0, rho_bar=1.2)
    scheds = [lane_schedule(s, name) for s in range(S)]
    batch = LM.BatchedTransformerPolicy(task.prompts, V, L, conf, [7 + s for s in range(S)], reference=kl > 0)
    got = train_lanes(batch, task, *zip(*scheds), name, prm, SHARES, G, kl,
                      [np.random.default_rng(s) for s in range(S)], [np.random.default_rng(50 + s) for s in range(S)],
                      checkpoints, 2)
    singles, want = [], []
    for s in range(S):
        pol = LM.TransformerPolicy(task.prompts, V, L, conf, 7 + s, reference=kl > 0)
        want.append(train_lane(pol, task, *scheds[s], name, prm, SHARES, G, kl, np.random.default_rng(s),
                               np.random.default_rng(50 + s), checkpoints, 2))
        singles.append(pol)
    return batch, got, singles, want


def assert_same_lane(a, b, optimizer):
    assert np.array_equal(a.true, b.true) and np.array_equal(a.fast, b.fast)  # the same tokens at every step
    assert np.array_equal(a.ratio_delay, b.ratio_delay) and a.ratio.shape == b.ratio.shape
    # the ratios come from log-probabilities: after Adam's steps their rounding is amplified as in
    # assert_same_policy (an AVX-512 core measured 2.4e-5 relative on one of 24 ratios)
    close = RTOL if optimizer == "sgd" else 1e-4
    np.testing.assert_allclose(a.ratio, b.ratio, rtol=close, atol=ATOL)
    np.testing.assert_allclose(a.delivered, b.delivered, rtol=close, atol=ATOL)
    np.testing.assert_allclose(a.owed, b.owed, rtol=close, atol=ATOL)
    assert [g["step"] for g in a.gradients] == [g["step"] for g in b.gradients]
    rtol = 1e-4 if optimizer == "sgd" else 2e-3  # after Adam's steps: the parameters' last bits amplified
    for ga, gb in zip(a.gradients, b.gradients):
        assert ga["c0"] == gb["c0"]
        scale = max(abs(gb["late_dot"]), abs(gb["res_dot"]))
        for k in ("late_dot", "res_dot"):
            assert abs(ga[k] - gb[k]) <= rtol * scale, (k, ga[k], gb[k])
        assert np.isnan(ga["cosine"]) == np.isnan(gb["cosine"])
        if not np.isnan(gb["cosine"]):
            assert abs(ga["cosine"] - gb["cosine"]) <= rtol


def key_bias_mask(model) -> "torch.Tensor":
    """True on the flat parameters that are a GPT-2 key bias (c_attn.bias's middle third)."""
    parts = []
    for name, p in model.named_parameters():
        m = torch.zeros(p.numel(), dtype=torch.bool)
        if name.endswith("attn.c_attn.bias"):
            d = p.numel() // 3
            m[d:2 * d] = True
        parts.append(m)
    return torch.cat(parts)


def assert_same_parameters(after, model, optimizer):
    want = params_of(model)
    if optimizer == "sgd":
        assert torch.allclose(after, want, rtol=RTOL, atol=ATOL)
        return
    keep = ~key_bias_mask(model)
    assert torch.allclose(after[keep], want[keep], rtol=0, atol=1e-4)
    assert torch.all((after[~keep] - want[~keep]).abs() <= 0.05 * N)  # lr per step at most, either way


def assert_same_policy(batch, s, single, optimizer):
    """The two final policies give every (prompt, response) pair the same log-probability
    (rtol 1e-5; 1e-4 after Adam's steps, which amplify rounding as above)."""
    xs = np.repeat(np.arange(batch.prompts.shape[0]), V**L)
    ys = np.tile((np.arange(V**L)[:, None] // V ** np.arange(L - 1, -1, -1)) % V, (batch.prompts.shape[0], 1))
    S = batch.n_lanes
    lp = batch.logprob(np.broadcast_to(xs, (S,) + xs.shape), np.broadcast_to(ys, (S,) + ys.shape))
    np.testing.assert_allclose(lp[s], single.logprob(xs, ys), rtol=RTOL if optimizer == "sgd" else 1e-4, atol=ATOL)


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("name", ["naive", "rac", "wait_for_slow"])
@pytest.mark.parametrize("optimizer,kl", [("adam", 0.0), ("sgd", 0.1), ("adam", 0.1)])
def test_batched_seeds_equal_one_seed_at_a_time(S, name, optimizer, kl):
    batch, got, singles, want = run_both(S, name, optimizer, kl)
    assert len(got) == S and batch.n_params == singles[0].n_params
    widths = set()
    for s in range(S):
        assert_same_lane(got[s], want[s], optimizer)
        after = batch.lane_parameters(s)
        assert_same_parameters(after, singles[s].model, optimizer)
        assert_same_policy(batch, s, singles[s], optimizer)
        assert not torch.allclose(after, params_of(LM.TransformerPolicy(  # it trained
            batch.prompts, V, L, tiny_conf(), 7 + s).model), atol=1e-4)
        widths.add(got[s].ratio.size)
    if S == 3 and name != "naive":
        assert len(widths) > 1  # the lanes' late rows differed: the batch was padded


def test_llama_batch_equals_one_seed_at_a_time():
    batch, got, singles, want = run_both(2, "rac", "adam", 0.1, backbone="llama", checkpoints=(2,))
    for s in range(2):
        assert_same_lane(got[s], want[s], "adam")
        assert_same_parameters(batch.lane_parameters(s), singles[s].model, "adam")
        assert_same_policy(batch, s, singles[s], "adam")


def test_initial_weights_sampling_and_logprobs_are_each_seeds_own():
    task = make_task(3, LP, L, V, -0.5, seed=11)
    conf = tiny_conf()
    seeds = [3, 4, 9]
    batch = LM.BatchedTransformerPolicy(task.prompts, V, L, conf, seeds)
    singles = [LM.TransformerPolicy(task.prompts, V, L, conf, s) for s in seeds]
    for s, pol in enumerate(singles):
        assert torch.equal(batch.lane_parameters(s), params_of(pol.model))  # build_model(seed) exactly
    pidx = np.random.default_rng(0).integers(0, task.n_prompts, (3, 40))
    resp = batch.sample(pidx, [np.random.default_rng(s) for s in range(3)])
    for s, pol in enumerate(singles):
        assert np.array_equal(resp[s], pol.sample(pidx[s], np.random.default_rng(s)))
    lp = batch.logprob(pidx, resp)
    for s, pol in enumerate(singles):
        np.testing.assert_allclose(lp[s], pol.logprob(pidx[s], resp[s]), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_padding_rows_change_nothing(optimizer):
    """Rows of coefficient 0 appended to one lane: that lane's gradient and step (Adam's
    moments included) are those without them, and rows of coefficient 0 alone give a
    gradient of exactly 0."""
    task = make_task(3, LP, L, V, -0.5, seed=11)
    conf = tiny_conf(optimizer=optimizer, lr=0.05)
    rng = np.random.default_rng(1)
    x = rng.integers(0, task.n_prompts, (2, 8))
    y = rng.integers(0, V, (2, 8, L))
    coef = rng.standard_normal((2, 8))
    pad_x = np.concatenate([x, np.zeros((2, 5), np.int64)], axis=1)
    pad_y = np.concatenate([y, rng.integers(0, V, (2, 5, L))], axis=1)
    pad_c = np.concatenate([coef, np.zeros((2, 5))], axis=1)
    a = LM.BatchedTransformerPolicy(task.prompts, V, L, conf, [0, 1])
    b = LM.BatchedTransformerPolicy(task.prompts, V, L, conf, [0, 1])
    assert np.array_equal(a.gradient(pad_x[:, 8:], pad_y[:, 8:], pad_c[:, 8:], 8.0), np.zeros((2, a.n_params)))
    np.testing.assert_allclose(a.gradient(pad_x, pad_y, pad_c, 8.0), b.gradient(x, y, coef, 8.0),
                               rtol=1e-6, atol=1e-9)
    for _ in range(3):  # a few steps: Adam's moments see the same gradients
        a.update(pad_x, pad_y, lambda lp: pad_c, 8.0)
        b.update(x, y, lambda lp: coef, 8.0)
    for s in range(2):
        assert torch.allclose(a.lane_parameters(s), b.lane_parameters(s), rtol=1e-6, atol=1e-8)
    if optimizer == "adam":
        for p, q in zip(a.leaves, b.leaves):
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.allclose(a.opt.state[p][key], b.opt.state[q][key], rtol=1e-5, atol=1e-12)


def test_study_trains_each_correctors_seeds_as_one_batch_with_each_seeds_own_run():
    """run_cell (the batch) against train_lane seed by seed on the same schedules, seeds and
    streams: the same reward curves, the rest within rounding."""
    from racsim.analyses.bias_study import corrector_params
    from racsim.analyses.lm_study import checkpoint_steps, run_cell
    from racsim.config.defaults import default_config
    from racsim.config.validate import validate
    from racsim.learner.bias import schedule_for
    from racsim.learner.grpo import lane_slices
    from racsim.seeds import seed_sequence

    cfg = default_config("learner=lm", "pipeline.steps=4", "learner.lm.seeds=3", "learner.lm.checkpoints=1",
                         "learner.lm.decide=[]", "learner.lm.d_model=16", "learner.lm.layers=1", "learner.lm.vocab=6",
                         "learner.lm.response_len=3", "learner.lm.group_size=4", "learner.lm.device=cpu",
                         "learner.lm.kl_coef=0.1", "corrector.names=[naive,rac,wait_for_slow]")
    validate(cfg)
    out = run_cell(cfg)
    lm, p = cfg.learner.lm, cfg.pipeline
    task = make_task(lm.n_prompts, lm.prompt_len, lm.response_len, lm.vocab, lm.proxy_correlation, lm.task_seed)
    shares = np.array([float(ch.share) for ch in p.channels.values()])
    stream = seed_sequence(cfg.seed, "lm").spawn(3)
    grad_stream = seed_sequence(cfg.seed, "lm_gradient").spawn(3)
    for name in ("naive", "rac", "wait_for_slow"):
        for lane, (d, s, land) in enumerate(lane_slices(schedule_for(name, out["schedules"]), name)):
            pol = LM.TransformerPolicy(task.prompts, lm.vocab, lm.response_len, lm, lm.init_seed + lane, reference=True)
            want = train_lane(pol, task, d, s, land, name, corrector_params(cfg), shares, lm.group_size, lm.kl_coef,
                              np.random.default_rng(stream[lane]), np.random.default_rng(grad_stream[lane]),
                              checkpoint_steps(p.steps, lm.checkpoints), lm.sync_batch)
            assert_same_lane(out["curves"][name][lane], want, lm.optimizer)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_one_optimizer_over_stacked_leaves_steps_each_seed_as_its_own(optimizer):
    """Adam and SGD act elementwise: given the same gradients, the batch's one optimizer over
    the stacked (S, ...) leaves moves seed s's slice exactly as seed s's own optimizer."""
    task = make_task(3, LP, L, V, -0.5, seed=11)
    conf = tiny_conf(optimizer=optimizer, lr=0.05)
    batch = LM.BatchedTransformerPolicy(task.prompts, V, L, conf, [0, 1])
    singles = [LM.TransformerPolicy(task.prompts, V, L, conf, s) for s in (0, 1)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for leaf, *ps in zip(batch.leaves, *(pol.params for pol in singles)):
            g = torch.randn(leaf.shape, generator=gen) * 10.0 ** torch.randint(-9, 1, leaf.shape, generator=gen)
            leaf.grad = g.clone()
            for s, p in enumerate(ps):
                p.grad = g[s].clone()
        batch.opt.step()
        for pol in singles:
            pol.opt.step()
    for s, pol in enumerate(singles):
        assert torch.equal(batch.lane_parameters(s), params_of(pol.model))


@pytest.mark.parametrize("optimizer,kl", [("adam", 0.1), ("sgd", 0.0)])
def test_lanes_grouped_by_width_equal_one_seed_at_a_time(monkeypatch, optimizer, kl):
    """The update's forward passes on groups of lanes of similar row counts (each padded to
    its own widest; here one lane a group) give each seed its run alone too."""
    import racsim.learner.lm as lm_mod

    monkeypatch.setattr(lm_mod, "BUCKET_LANES", 1)
    batch, got, singles, want = run_both(3, "rac", optimizer, kl)
    assert len({c.ratio.size for c in got}) > 1  # widths differed
    for s in range(3):
        assert_same_lane(got[s], want[s], optimizer)
        assert_same_parameters(batch.lane_parameters(s), singles[s].model, optimizer)
        assert_same_policy(batch, s, singles[s], optimizer)
