"""The learner (:class:`~racsim.config.schema.LearnerConf`): the tabular MDP and its training
lanes (:class:`TrainConf`), the seeds, how the channels' rewards are made, and the language
model's GRPO (:class:`LMConf`). racsim.config.validate.top interleaves these groups with the
study's, in the order the first error of a config has always been named."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from racsim.config.names import missing_extra
from racsim.config.schema import (CORRECTORS, LEARNERS, LM_BACKBONES, LM_POLICIES, OPTIMIZERS, REWARD_SPLITS,
                                  ROLLOUT_CORRECTORS, TOPOLOGIES)
from racsim.config.validate.common import INT64, MAX_GAIN, finite, int_at_least, need, need_one_of, nonneg, positive
from racsim.errors import ConfigError

BASE = "rac"  # the corrector of every pair (racsim.analyses.lm_study.BASE)


def validate_tabular(lr: Any) -> None:
    """The learner's kind, the tabular MDP, its trials and its training lanes."""
    need_one_of("learner.kind", lr.kind, LEARNERS)
    int_at_least("learner.n_states", lr.n_states, 1)
    int_at_least("learner.n_actions", lr.n_actions, 2)
    need(finite(lr.gamma) and 0 <= lr.gamma < 1, "learner.gamma", lr.gamma, "a number in [0, 1)")
    int_at_least("learner.horizon", lr.horizon, 1)
    nonneg("learner.theta_scale", lr.theta_scale, MAX_GAIN, "the policy's logits' scale: past it they overflow")
    need(finite(lr.slow_bump) and abs(lr.slow_bump) <= MAX_GAIN, "learner.slow_bump", lr.slow_bump,
         f"a number in [-{MAX_GAIN:g}, {MAX_GAIN:g}] (a reward: past it its squares overflow)")
    nonneg("learner.fast_noise_std", lr.fast_noise_std, MAX_GAIN, "a reward noise's std: past it its squares overflow")
    int_at_least("learner.trials", lr.trials, 2)
    int_at_least("learner.bootstrap", lr.bootstrap, 0)
    int_at_least("learner.train.lanes", lr.train.lanes, 1)
    need(finite(lr.train.lr) and 0 < lr.train.lr <= MAX_GAIN, "learner.train.lr", lr.train.lr,
         f"a positive number <= {MAX_GAIN:g} (a step size: past it theta overflows)")


def validate_seeds(seed: Any, lr: Any) -> None:
    """The run's ``seed`` and the learner's own: each an integer >= 0."""
    int_at_least("seed", seed, 0)
    int_at_least("learner.mdp_seed", lr.mdp_seed, 0)
    int_at_least("learner.theta_seed", lr.theta_seed, 0)


def validate_channel_rewards(lr: Any) -> None:
    """How the slow channels' rewards relate: their topology, noise and split."""
    need_one_of("learner.topology", lr.topology, TOPOLOGIES)
    nonneg("learner.channel_noise_std", lr.channel_noise_std, MAX_GAIN,
           "a reward noise's std: past it its squares overflow")
    need_one_of("learner.reward_split", lr.reward_split, REWARD_SPLITS)


def validate_lm(lm: Any) -> None:
    """``learner.lm``: GRPO's sizes, the task, the model and the optimizer (checked whatever
    ``learner.kind`` is, so that a bad value is refused, not carried unused)."""
    key = "learner.lm"
    need_one_of(f"{key}.policy", lm.policy, LM_POLICIES)
    int_at_least(f"{key}.seeds", lm.seeds, 2)
    int_at_least(f"{key}.group_size", lm.group_size, 2)
    for name, low in (("n_prompts", 1), ("prompt_len", 1), ("response_len", 1), ("vocab", 2), ("layers", 1),
                      ("d_model", 1), ("heads", 1), ("n_responses", 0), ("checkpoints", 0), ("sync_batch", 1),
                      ("task_seed", 0), ("init_seed", 0)):
        int_at_least(f"{key}.{name}", getattr(lm, name), low)
    need(finite(lm.proxy_correlation) and -1 <= lm.proxy_correlation <= 1, f"{key}.proxy_correlation",
         lm.proxy_correlation, "a correlation in [-1, 1]")
    need_one_of(f"{key}.backbone", lm.backbone, LM_BACKBONES)
    need(lm.d_model % lm.heads == 0, f"{key}.heads", lm.heads, f"a divisor of learner.lm.d_model={lm.d_model}")
    need_one_of(f"{key}.optimizer", lm.optimizer, OPTIMIZERS)
    need(finite(lm.lr) and 0 < lm.lr <= MAX_GAIN, f"{key}.lr", lm.lr,
         f"a positive number <= {MAX_GAIN:g} (a step size: past it the weights overflow)")
    nonneg(f"{key}.kl_coef", lm.kl_coef)
    dev = str(lm.device)
    need(dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()), f"{key}.device",
         lm.device, "auto (CUDA when present), cpu, cuda or cuda:N")
    if lm.threads is not None:
        int_at_least(f"{key}.threads", lm.threads, 1)
    _seed_count(lm, key)
    if lm.policy == "bandit":
        _bandit_space(lm, key)


def _seed_count(lm: Any, key: str) -> None:
    """The seeds a comparison runs: ``seeds`` first, then the seed rule's stages up to ``max_seeds``
    while a pair of ``decide`` is open, within ``budget_s``."""
    need(isinstance(lm.decide, Sequence) and not isinstance(lm.decide, str)
         and all(isinstance(n, str) for n in lm.decide), f"{key}.decide", lm.decide,
         "a list of correctors (rac against each is what the seed rule decides; [] for a fixed seed count)")
    for n in lm.decide:
        reward, plus, rollout = n.partition("+")
        need(reward in CORRECTORS and (not plus or rollout in ROLLOUT_CORRECTORS and rollout != "none"),
             f"{key}.decide", n, "each one of " + ", ".join(c for c in CORRECTORS if c != BASE) + ", alone or with +"
             + ", +".join(r for r in ROLLOUT_CORRECTORS if r != "none") + " (a row of corrector.rollout)")
    need(BASE not in lm.decide, f"{key}.decide", list(lm.decide),
         f"correctors other than {BASE} (each pair is {BASE} minus the corrector named)")
    need(len(set(lm.decide)) == len(lm.decide), f"{key}.decide", list(lm.decide), "each corrector at most once")
    int_at_least(f"{key}.max_seeds", lm.max_seeds, lm.seeds if lm.decide else 2)
    positive(f"{key}.bound", lm.bound)
    if lm.budget_s is not None:
        positive(f"{key}.budget_s", lm.budget_s)


def validate_lm_pairs(lr: Any, names: Any, rollout: Any) -> None:
    """An LM run's seed rule decides rac against rows that run: rac and each of ``learner.lm.decide``
    among ``corrector.names``, a row's rollout-axis corrector (``naive+tis``) among ``corrector.rollout``."""
    if lr.kind != "lm" or not lr.lm.decide:
        return
    rewards = [n.partition("+")[0] for n in [BASE, *lr.lm.decide]]
    absent = list(dict.fromkeys(n for n in rewards if n not in names))
    need(not absent, "learner.lm.decide", list(lr.lm.decide),
         f"correctors that run, and {BASE} with them: {', '.join(absent)} not in corrector.names="
         f"[{','.join(names)}] (learner.lm.decide=[] for a fixed seed count of learner.lm.seeds)")
    off = [n for n in lr.lm.decide if (n.partition("+")[2] or "none") not in rollout]
    need(not off, "learner.lm.decide", list(lr.lm.decide),
         f"rows that run: {', '.join(off)} not among corrector.names x corrector.rollout=[{','.join(rollout)}]")


def _bandit_space(lm: Any, key: str) -> None:
    """The bandit stand-in numbers its vocab**response_len responses in int64, and samples n_responses of them."""
    longest = next(n for n in range(64) if lm.vocab ** (n + 1) >= INT64)
    need(lm.response_len <= longest, f"{key}.response_len", lm.response_len,
         f"at most {longest} with the bandit policy and vocab={lm.vocab} (its vocab**response_len responses "
         f"are numbered in int64)")
    space = lm.vocab ** lm.response_len
    need(lm.n_responses <= space and (lm.n_responses > 0 or space <= 1_000_000), f"{key}.n_responses",
         lm.n_responses, f"at most vocab**response_len={space} (0: all of them, when that is <= 1e6)")


def validate_lm_packages(lr: Any) -> None:
    """An LM learner with the transformers policy: torch and transformers installed, or the
    extra to install named."""
    if lr.kind == "lm" and lr.lm.policy == "transformer":
        absent = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if absent:
            raise ConfigError("learner.lm.policy", lr.lm.policy,
                              f"needs {' and '.join(absent)}, not installed: {missing_extra(absent[0])} "
                              f"(or learner.lm.policy=bandit for the NumPy stand-in)")
