"""A small causal transformer (transformers, torch) as the GRPO policy of racsim/learner/grpo.py.

The model is built in code from a GPT-2 or Llama config with random weights
(no download), or loaded from a local checkpoint (``learner.lm.checkpoint``,
offline). Responses use the first ``vocab`` token ids. Sampling draws each
token by inverse CDF from the model's float64 softmax with a NumPy generator,
so a fixed seed gives the same responses on any device that gives the same
logits; log-probabilities are teacher-forced, summed over the response's
tokens (the sequence-level log pi(y | x) of the ratio pi_now / pi_behaviour).

:class:`BatchedTransformerPolicy` holds S such models (S seeds) stacked
(``torch.func.stack_module_state``) and runs them as one: every forward pass is the
model's own under ``torch.func.vmap`` of ``functional_call`` over the seed axis (the
KV cache too), one backward pass and one optimizer step serve every seed.

This is the only racsim module that imports torch and transformers at its
top; racsim.analyses.lm_study imports it when ``learner.kind=lm`` runs, so
``import racsim`` and the command line never load them.

torch's CPU kernels are pinned to their AVX2 forms before torch loads (:data:`CPU_KERNELS`),
as tests/golden.py pins NumPy's: ATen's vectorised loops and MKL's and oneDNN's code paths
otherwise follow the CPU (AVX-512 where it has it), round some last bits differently, and a
token sampled near a boundary of its CDF then flips; the LM verdict moved from +0.753 to
+0.803 between CPUs (issue 49). With the pin it is the same on any x86-64 CPU with AVX2.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable, Optional, Sequence

# Set before torch is imported, which reads them (a variable already set, by a user or a caller, is left
# as it is). NumPy's SIMD loops do not move the LM run (measured: its figures are the same with them pinned).
CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
for _name, _value in CPU_KERNELS.items():
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402 (after the pin above)
import torch  # noqa: E402
from torch.func import functional_call, stack_module_state, vmap  # noqa: E402
from transformers import (AutoModelForCausalLM, DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM)

from racsim.errors import ConfigError
from racsim.learner.rollouts import _inverse_cdf, _search_table


def pick_device(name: str) -> torch.device:
    """``auto``: the CUDA device when one is present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("learner.lm.device", name, "auto or cpu: no CUDA device is present")
    return torch.device(name)


def build_model(conf: Any, vocab: int, max_len: int, seed: int) -> torch.nn.Module:
    """The policy's model: ``conf.checkpoint`` (a local path), or a ``conf.backbone``
    (gpt2 or llama) with ``conf.layers`` layers of width ``conf.d_model``, ``conf.heads``
    heads, no dropout, weights from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    if conf.checkpoint:
        try:
            model = AutoModelForCausalLM.from_pretrained(conf.checkpoint, local_files_only=True)
        except (OSError, ValueError) as ex:
            raise ConfigError("learner.lm.checkpoint", conf.checkpoint,
                              f"a local causal-LM checkpoint folder ({str(ex).splitlines()[0]})") from None
        if model.config.vocab_size < vocab:
            raise ConfigError("learner.lm.vocab", vocab, f"at most the checkpoint's {model.config.vocab_size} tokens")
        return model
    if conf.backbone == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=conf.d_model, n_layer=conf.layers,
                         n_head=conf.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=None, eos_token_id=None)
        return GPT2LMHeadModel(cfg)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=conf.d_model, intermediate_size=2 * conf.d_model,
                      num_hidden_layers=conf.layers, num_attention_heads=conf.heads,
                      num_key_value_heads=conf.heads, max_position_embeddings=max_len,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg)


def response_logprob(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: int, vocab: int) -> torch.Tensor:
    """Teacher-forced log pi(y | x) = sum_t log softmax(logits_{t-1})[y_t] over the response tokens
    (``tokens[..., prompt_len:]``), the logits restricted to the first ``vocab`` ids; any leading axes
    (rows, or seeds x rows); float32."""
    lp = torch.log_softmax(logits[..., prompt_len - 1 : -1, :vocab].float(), dim=-1)
    return lp.gather(-1, tokens[..., prompt_len:, None]).squeeze(-1).sum(dim=-1)


class _Scores:
    """log pi(y | x) and log pi_ref(y | x) of rows as float64 arrays, for both policies: their
    ``_logp(weights, prompt_idx, responses)`` on the trained ``weights``, a :meth:`snapshot` of them
    or the frozen ``ref``."""

    @torch.no_grad()
    def logprob_at(self, weights: Any, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        """log pi(y | x) under ``weights`` (a snapshot; None: the current ones)."""
        return self._logp(self.weights if weights is None else weights, prompt_idx, responses).double().cpu().numpy()

    def logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        return self.logprob_at(None, prompt_idx, responses)

    @torch.no_grad()
    def ref_logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        if self.ref is None:
            raise ValueError("no reference model: build the policy with reference=True for a KL term")
        return self._logp(self.ref, prompt_idx, responses).double().cpu().numpy()


class TransformerPolicy(_Scores):
    """pi(y | x) of a causal LM over the task's prompts (tokens (n_prompts, prompt_len)),
    responses of ``response_len`` tokens among the first ``vocab`` ids; ``optimizer``
    (sgd or adam) with learning rate ``lr``; a frozen copy as the KL reference when
    ``reference``."""

    def __init__(self, prompts: np.ndarray, vocab: int, response_len: int, conf: Any, seed: int,
                 reference: bool = False):
        if conf.threads:  # one thread by default: the same bits on any machine, and no oversubscription
            torch.set_num_threads(conf.threads)
        self.device = pick_device(conf.device)
        self.prompts = np.asarray(prompts, dtype=np.int64)
        self.vocab, self.response_len = vocab, response_len
        self.model = build_model(conf, vocab, self.prompts.shape[1] + response_len, seed).to(self.device).eval()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n_params = sum(p.numel() for p in self.params)
        opt = torch.optim.Adam if conf.optimizer == "adam" else torch.optim.SGD
        self.opt = opt(self.params, lr=conf.lr)
        self.ref = copy.deepcopy(self.model).requires_grad_(False) if reference else None
        self.weights = self.model

    def _tokens(self, prompt_idx: np.ndarray, responses: np.ndarray) -> torch.Tensor:
        x = np.concatenate([self.prompts[np.asarray(prompt_idx)], np.asarray(responses, dtype=np.int64)], axis=1)
        return torch.as_tensor(x, device=self.device)

    def _logp(self, model: torch.nn.Module, prompt_idx: np.ndarray, responses: np.ndarray) -> torch.Tensor:
        """Teacher-forced sum over the response of log pi(y_t | x, y_<t), (n,) float32."""
        x = self._tokens(prompt_idx, responses)
        return response_logprob(model(input_ids=x).logits, x, self.prompts.shape[1], self.vocab)

    def uniforms(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The uniforms :meth:`sample_at` takes for n rows, (n, response_len): token j's of every row, then
        token j + 1's, drawn with ``rng`` alone."""
        return rng.random((self.response_len, n)).T

    def snapshot(self) -> torch.nn.Module:
        """A frozen copy of the current model (a policy version that stale generation samples and scores with)."""
        return copy.deepcopy(self.model).requires_grad_(False)

    @torch.no_grad()
    def sample_at(self, model: Optional[torch.nn.Module], prompt_idx: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Responses (n, L), token j of row i by inverse CDF of u[i, j] (:meth:`uniforms`) under ``model``
        (a :meth:`snapshot`; None: the current one)."""
        model = self.model if model is None else model
        n = len(prompt_idx)
        out = np.empty((n, self.response_len), dtype=np.int64)
        step = model(input_ids=self._tokens(prompt_idx, np.zeros((n, 0), dtype=np.int64)), use_cache=True)
        rows = np.arange(n)
        for j in range(self.response_len):
            p = torch.softmax(step.logits[:, -1, : self.vocab].double(), dim=-1).cpu().numpy()
            out[:, j] = _inverse_cdf(_search_table(p), rows, u[:, j])
            if j + 1 < self.response_len:
                tok = torch.as_tensor(out[:, j : j + 1], device=self.device)
                step = model(input_ids=tok, past_key_values=step.past_key_values, use_cache=True)
        return out

    def sample(self, prompt_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.sample_at(None, prompt_idx, self.uniforms(rng, len(prompt_idx)))

    def _backward(self, logp: torch.Tensor, coef: np.ndarray, norm: float) -> None:
        c = torch.as_tensor(coef, dtype=logp.dtype, device=self.device)
        self.opt.zero_grad(set_to_none=False)
        (-(c * logp).sum() / norm).backward()

    def _flat_grad(self) -> np.ndarray:
        """The gradient of the objective (ascent direction), flat, float64."""
        return -torch.cat([p.grad.reshape(-1) for p in self.params]).double().cpu().numpy()

    def update(self, prompt_idx: np.ndarray, responses: np.ndarray, coefficients: Callable[[np.ndarray], np.ndarray],
               norm: float, want_grad: bool = False):
        logp = self._logp(self.model, prompt_idx, responses)
        lp = logp.detach().double().cpu().numpy()
        self._backward(logp, coefficients(lp), norm)
        grad: Optional[np.ndarray] = self._flat_grad() if want_grad else None
        self.opt.step()
        return lp, grad

    def gradient(self, prompt_idx: np.ndarray, responses: np.ndarray, coef: np.ndarray, norm: float) -> np.ndarray:
        self._backward(self._logp(self.model, prompt_idx, responses), coef, norm)
        g = self._flat_grad()
        self.opt.zero_grad(set_to_none=False)
        return g


LANE_BUCKETS = 4  # a batched update's forward passes: lanes grouped by their rows' count (padding skipped)
BUCKET_LANES = 16  # ... of at least this many lanes each


class _GeluTanh(torch.nn.Module):
    """GPT-2's gelu_new, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as torch's one fused
    kernel (``approximate="tanh"``: the same formula) instead of seven elementwise passes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def fuse_gelu(model: torch.nn.Module) -> None:
    """GPT-2's MLP activations (gelu_new, written as Python arithmetic) replaced by :class:`_GeluTanh`."""
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if type(child).__name__ == "NewGELUActivation":
                setattr(mod, child_name, _GeluTanh())


class BatchedTransformerPolicy(_Scores):
    """S :class:`TransformerPolicy` runs at once: seed s's model is
    ``build_model(conf, vocab, max_len, seeds[s])``, its parameters slice s of stacked
    leaf tensors (S, ...), and one optimizer (``conf.optimizer``: Adam and SGD act
    elementwise, so one over the stacked leaves steps each seed as its own would).
    Every forward pass is the model's own, vmapped over the seed axis (``functional_call``
    of one template module), the KV cache of sampling included; one backward pass gives
    every seed's gradient (a seed's loss reaches only its own slice).

    The methods take and return arrays with a leading seed axis: prompt indices (S, n),
    responses (S, n, L), log-probabilities (S, n), flat gradients (S, n_params); sampling
    draws seed s's tokens with ``rngs[s]`` by inverse CDF from its float64 softmax, as
    :meth:`TransformerPolicy.sample` does. Rows whose coefficient is 0 (padding: lanes
    with fewer rows than the batch's widest) contribute exactly 0 to the gradient."""

    def __init__(self, prompts: np.ndarray, vocab: int, response_len: int, conf: Any, seeds: Sequence[int],
                 reference: bool = False):
        if conf.threads:
            torch.set_num_threads(conf.threads)
        self.device = pick_device(conf.device)
        self.prompts = np.asarray(prompts, dtype=np.int64)
        self.vocab, self.response_len = vocab, response_len
        self.n_lanes = len(seeds)
        max_len = self.prompts.shape[1] + response_len
        models = [build_model(conf, vocab, max_len, int(s)).to(self.device).eval() for s in seeds]
        self.model = models[0]  # the template: functional_call swaps in each seed's slice of the stacked tensors
        # attention as matmul and softmax, which vmap batches: torch has no vmap rule for the CPU's fused
        # (flash) attention, and its per-seed fallback costs O(S^2) in the backward pass
        self.model.set_attn_implementation("eager")
        fuse_gelu(self.model)
        params, self.buffers = stack_module_state(models)  # leaves (S, ...) that require grad
        self.params = params
        self.leaves = list(params.values())
        self.n_params = sum(p[0].numel() for p in self.leaves)
        opt = torch.optim.Adam if conf.optimizer == "adam" else torch.optim.SGD
        self.opt = opt(self.leaves, lr=conf.lr)
        self.ref = {k: v.detach().clone() for k, v in params.items()} if reference else None
        self.weights = params
        model = self.model

        def logits(p, b, x):
            return functional_call(model, (p, b), (), {"input_ids": x, "use_cache": False}).logits

        def first(p, b, x):
            out = functional_call(model, (p, b), (), {"input_ids": x, "use_cache": True})
            return out.logits[:, -1], tuple((k, v) for k, v, *_ in out.past_key_values)

        def step(p, b, tok, kv):
            out = functional_call(model, (p, b), (), {"input_ids": tok, "past_key_values": DynamicCache(kv),
                                                      "use_cache": True})
            return out.logits[:, -1], tuple((k, v) for k, v, *_ in out.past_key_values)

        self._logits = vmap(logits, randomness="error")
        self._first = vmap(first, randomness="error")
        self._step = vmap(step, randomness="error")

    def _tokens(self, prompt_idx: np.ndarray, responses: np.ndarray) -> torch.Tensor:
        x = np.concatenate([self.prompts[np.asarray(prompt_idx)], np.asarray(responses, dtype=np.int64)], axis=2)
        return torch.as_tensor(x, device=self.device)

    def _logp(self, params: dict, prompt_idx: np.ndarray, responses: np.ndarray) -> torch.Tensor:
        """Teacher-forced sum over the response of log pi(y_t | x, y_<t), (S, n) float32."""
        x = self._tokens(prompt_idx, responses)
        return response_logprob(self._logits(params, self.buffers, x), x, self.prompts.shape[1], self.vocab)

    def uniforms(self, rngs: Sequence[np.random.Generator], n: int) -> np.ndarray:
        """The uniforms :meth:`sample_at` takes for n rows of each seed, (S, n, response_len): seed s's drawn
        with ``rngs[s]`` alone, as :meth:`TransformerPolicy.uniforms` draws them."""
        return np.stack([rng.random((self.response_len, n)).T for rng in rngs])

    def snapshot(self) -> dict:
        """A copy of every seed's current parameters (stacked: a policy version that stale generation samples
        and scores with)."""
        return {k: v.detach().clone() for k, v in self.params.items()}

    @torch.no_grad()
    def sample_at(self, params: Optional[dict], prompt_idx: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Responses (S, n, L), token j of seed s's row i by inverse CDF of u[s, i, j] (:meth:`uniforms`) under
        ``params`` (a :meth:`snapshot`; None: the current ones)."""
        params = self.params if params is None else params
        S, n = np.shape(prompt_idx)
        out = np.empty((S, n, self.response_len), dtype=np.int64)
        logits, kv = self._first(params, self.buffers, self._tokens(prompt_idx, np.zeros((S, n, 0), np.int64)))
        rows = np.arange(S * n)
        for j in range(self.response_len):  # every seed's rows at once (row by row: seed s's as alone)
            p = torch.softmax(logits[:, :, : self.vocab].double(), dim=-1).cpu().numpy().reshape(S * n, -1)
            out[:, :, j] = _inverse_cdf(_search_table(p), rows, u[:, :, j].reshape(S * n)).reshape(S, n)
            if j + 1 < self.response_len:
                tok = torch.as_tensor(out[:, :, j : j + 1], device=self.device)
                logits, kv = self._step(params, self.buffers, tok, kv)
        return out

    def sample(self, prompt_idx: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return self.sample_at(None, prompt_idx, self.uniforms(rngs, np.shape(prompt_idx)[1]))

    def _backward(self, logp: torch.Tensor, coef: np.ndarray, norm: float) -> None:
        c = torch.as_tensor(np.asarray(coef), dtype=logp.dtype, device=self.device)
        self.opt.zero_grad(set_to_none=False)
        # seed s's loss is -(c_s * logp_s).sum() / norm, as TransformerPolicy's; d(sum_s loss_s)/d loss_s = 1
        (-(c * logp).sum(dim=1) / norm).sum().backward()

    def _flat_grad(self) -> np.ndarray:
        return -torch.cat([p.grad.reshape(self.n_lanes, -1) for p in self.leaves], dim=1).double().cpu().numpy()

    def _logp_widths(self, prompt_idx: np.ndarray, responses: np.ndarray, widths: Sequence[int]) -> torch.Tensor:
        """:meth:`_logp` where lane s's rows past ``widths[s]`` are padding: the lanes sorted by
        width in up to LANE_BUCKETS groups of at least BUCKET_LANES, each group's forward pass
        on its own widest rows (its seeds' parameters gathered, so the one backward pass
        reaches the stacked leaves); 0 on the rows skipped."""
        S, m = np.shape(prompt_idx)
        k = max(1, min(LANE_BUCKETS, S // BUCKET_LANES))
        widths = np.asarray(widths)
        if k == 1 or widths.min() == m:
            return self._logp(self.params, prompt_idx, responses)
        order = np.argsort(widths, kind="stable")
        parts = []
        for idx in np.array_split(order, k):
            w = int(widths[idx].max())
            it = torch.as_tensor(idx, device=self.device)
            params = {name: v.index_select(0, it) for name, v in self.params.items()}
            buffers = self.buffers
            x = self._tokens(prompt_idx[idx, :w], responses[idx, :w])
            logits = self._logits(params, {name: b.index_select(0, it) for name, b in buffers.items()}, x)
            lp = response_logprob(logits, x, self.prompts.shape[1], self.vocab)
            parts.append(torch.nn.functional.pad(lp, (0, m - w)))
        inverse = torch.as_tensor(np.argsort(order), device=self.device)
        return torch.cat(parts).index_select(0, inverse)

    def update(self, prompt_idx: np.ndarray, responses: np.ndarray, coefficients: Callable[[np.ndarray], np.ndarray],
               norm: float, want_grad: bool = False, widths: Optional[Sequence[int]] = None):
        """One step for every lane; ``widths``: lane s's rows past widths[s] are padding
        (coefficient 0, log-probability returned as 0), skipped where lanes group by width."""
        if widths is None:
            logp = self._logp(self.params, prompt_idx, responses)
        else:
            logp = self._logp_widths(np.asarray(prompt_idx), np.asarray(responses), widths)
        lp = logp.detach().double().cpu().numpy()
        self._backward(logp, coefficients(lp), norm)
        grad: Optional[np.ndarray] = self._flat_grad() if want_grad else None
        self.opt.step()
        return lp, grad

    def gradient(self, prompt_idx: np.ndarray, responses: np.ndarray, coef: np.ndarray, norm: float) -> np.ndarray:
        self._backward(self._logp(self.params, prompt_idx, responses), coef, norm)
        g = self._flat_grad()
        self.opt.zero_grad(set_to_none=False)
        return g

    def lane_parameters(self, s: int) -> torch.Tensor:
        """Seed s's parameters, flat, in ``model.parameters()`` order (tied ones once)."""
        return torch.cat([p[s].detach().reshape(-1) for p in self.leaves])
