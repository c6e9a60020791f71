"""The transformer policy's NumPy stand-in: a contextual bandit with a softmax
policy over a fixed response set per prompt, for sweeps of many cells.

It has the interface of racsim.learner.grpo.Policy, so the same GRPO loop,
correctors and arrival schedules drive it. Prompt x's response set is
``n_responses`` distinct token sequences of the task (every one of the
V**L sequences when ``n_responses`` is 0), drawn once; the policy is
pi(y | x) = softmax(phi[x])_y with logits phi of shape (n_prompts, R).
The gradient of ``sum_i coef_i log pi(y_i | x_i)`` with respect to phi[x] is
``sum_{i : x_i = x} coef_i (e_{y_i} - pi(. | x))``.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from racsim.learner.grpo import RewardTask
from racsim.learner.rollouts import _inverse_cdf, _search_table


def log_softmax(phi: np.ndarray) -> np.ndarray:
    z = phi - phi.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def adam_step(x: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float,
              b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
    """Adam (Kingma and Ba, Algorithm 1) ascending ``g``: updates x, m, v in place; t counts from 1."""
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    x += lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)


def expected_grpo_gradient(phi: np.ndarray, reward: np.ndarray, group: int) -> np.ndarray:
    """Expected GRPO gradient with respect to the logits, prompts uniform:
    E[(1/PG) sum_i (r_i - mean_group r) grad log pi(y_i | x_i)]
    = (1 - 1/G) / n_prompts * pi(y|x) (r(x, y) - E_pi[r | x]) per (x, y)
    (the cross terms E[r_j grad log pi(y_i)] vanish for j != i). ``reward`` is (n_prompts, R)."""
    pi = np.exp(log_softmax(phi))
    centred = reward - (pi * reward).sum(axis=-1, keepdims=True)
    return (1.0 - 1.0 / group) / phi.shape[0] * pi * centred


class BanditPolicy:
    """Softmax over each prompt's response set; ``optimizer`` sgd or adam, learning rate ``lr``."""

    def __init__(self, task: RewardTask, n_responses: int, optimizer: str, lr: float, seed: int):
        V, L = task.vocab, task.response_len
        rng = np.random.default_rng(seed)
        total = V**L
        if n_responses == 0:
            codes = np.broadcast_to(np.arange(total), (task.n_prompts, total))
        else:
            codes = np.stack([np.sort(rng.choice(total, n_responses, replace=False)) for _ in range(task.n_prompts)])
        self.codes = np.ascontiguousarray(codes, dtype=np.int64)
        self.base = V ** np.arange(L - 1, -1, -1, dtype=np.int64)
        self.responses = (self.codes[..., None] // self.base) % V  # (n_prompts, R, L)
        self.phi = np.zeros(self.codes.shape)
        self.phi0 = self.phi.copy()
        self.optimizer, self.lr = optimizer, lr
        self.m, self.v, self.t = np.zeros_like(self.phi), np.zeros_like(self.phi), 0
        self.n_params = int(self.phi.size)

    def index(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        """Position of each response in its prompt's (sorted) response set."""
        code = np.asarray(responses, dtype=np.int64) @ self.base
        rows = self.codes[np.asarray(prompt_idx)]
        j = np.minimum((rows < code[:, None]).sum(axis=1), rows.shape[1] - 1)
        if not np.all(rows[np.arange(len(code)), j] == code):
            raise ValueError("a response outside its prompt's response set")
        return j

    def uniforms(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The uniforms :meth:`sample_at` takes for n rows: one each, (n, 1), drawn with ``rng`` alone."""
        return rng.random((n, 1))

    def snapshot(self) -> np.ndarray:
        """A copy of the current logits (a policy version that stale generation samples and scores with)."""
        return self.phi.copy()

    def sample_at(self, weights: Optional[np.ndarray], prompt_idx: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Responses (n, L) by inverse CDF of u (:meth:`uniforms`) under the logits ``weights`` (a
        :meth:`snapshot`; None: the current ones)."""
        pi = np.exp(log_softmax((self.phi if weights is None else weights)[prompt_idx]))
        j = _inverse_cdf(_search_table(pi), np.arange(len(prompt_idx)), u[:, 0])
        return self.responses[prompt_idx, j]

    def sample(self, prompt_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.sample_at(None, prompt_idx, self.uniforms(rng, len(prompt_idx)))

    def _logp(self, phi: np.ndarray, prompt_idx, responses) -> np.ndarray:
        return log_softmax(phi[prompt_idx])[np.arange(len(prompt_idx)), self.index(prompt_idx, responses)]

    def logprob_at(self, weights: Optional[np.ndarray], prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        """log pi(y | x) under the logits ``weights`` (a :meth:`snapshot`; None: the current ones)."""
        return self._logp(self.phi if weights is None else weights, prompt_idx, responses)

    def logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        return self._logp(self.phi, prompt_idx, responses)

    def ref_logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        return self._logp(self.phi0, prompt_idx, responses)

    def _grad(self, prompt_idx, responses, coef, norm) -> np.ndarray:
        x = np.asarray(prompt_idx)
        g = np.zeros_like(self.phi)
        np.add.at(g, (x, self.index(x, responses)), coef)
        np.add.at(g, x, -coef[:, None] * np.exp(log_softmax(self.phi[x])))
        return g / norm

    def update(self, prompt_idx: np.ndarray, responses: np.ndarray, coefficients: Callable[[np.ndarray], np.ndarray],
               norm: float, want_grad: bool = False):
        lp = self.logprob(prompt_idx, responses)
        g = self._grad(prompt_idx, responses, coefficients(lp), norm)
        if self.optimizer == "adam":
            self.t += 1
            adam_step(self.phi, g, self.m, self.v, self.t, self.lr)
        else:
            self.phi += self.lr * g
        out: Optional[np.ndarray] = g.ravel().copy() if want_grad else None
        return lp, out

    def gradient(self, prompt_idx: np.ndarray, responses: np.ndarray, coef: np.ndarray, norm: float) -> np.ndarray:
        return self._grad(prompt_idx, responses, coef, norm).ravel()
