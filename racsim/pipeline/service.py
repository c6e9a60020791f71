"""Service models of a reward model on GPUs: how long does one batch take?

A gpu_rm channel (racsim/pipeline/) scores batches of sequences on replicas
of ``tp`` GPUs; this module turns a batch -- its number of sequences, the sum
and the sum of squares of their token lengths, the longest length -- into
seconds. A pass's tokens are ``count * max_len`` with ``padded`` batches (every
sequence counts as long as the batch's longest, sum seq^2 = count * max_len^2,
as with a right-padded Hugging Face batch), else their sum (packed/varlen
attention). Three models:

* :class:`Roofline` (prefill-only scoring, no KV cache kept)::

      FLOPs   = 2 * N_ne * tokens + 2 * layers * d_model * sum_i seq_i^2
      compute = FLOPs / (tp * peak * MFU(tokens, tp))
      memory  = non-embedding weight bytes / (tp * HBM bandwidth)   (weights read once per batch)
      seconds = max(compute, memory) + overhead_s

  with N_ne the non-embedding parameters (the embedding is a lookup). MFU is
  ``rm.mfu`` where set (flat in the batch), else the efficiency curve fitted to
  measured kernels (racsim.pipeline.efficiency: a layer's MFU on passes of that
  many tokens at that tp on that GPU, times ``rm.mfu_scale``, at most 1).
  Tensor parallelism divides both terms by ``tp`` and adds no communication
  cost (optimistic for tp > 1 over PCIe).

  One decode step of ``b`` running sequences (a rollout engine, racsim/generation/) puts one
  token of each through the model, attending over ``context`` tokens of KV cache in all::

      FLOPs   = 2 * N_ne * b + 4 * layers * d_model * context      (QK^T and AV per cached token)
      compute = FLOPs / (tp * peak * MFU(b, tp))
      memory  = (non-embedding weight bytes + 2 * layers * kv_dim * bytes * context) / (tp * HBM bandwidth)
      seconds = max(compute, memory) + overhead_s

  with kv_dim = n_kv_heads * d_model / n_heads (keys and values read once each).

* :class:`Kernels`: measured per-layer operator times (racsim.pipeline.layer_times: the tables racsim
  ships for the models and GPUs they cover, mapped or extrapolated for the others, or the user's own
  ``rm.profile`` in the same format)::

      prefill = layers * layer(tokens) + emb(tokens) + 2 * layers * d_model * sum_i seq_i^2 / (tp * peak * attn_mfu)
      decode  = layers * layer(b) + emb(b) + 2 * layers * kv_dim * bytes * context / (tp * HBM bandwidth)
      seconds = (1 + kernel_overhead) * (prefill or decode) + overhead_s

  ``kernel_overhead`` is what a real engine adds to its kernels' sum (launch gaps, host-side
  scheduling), a share; tp adds no communication cost here either.

* :class:`Profiled`: a table of measured (batch size, sequence length) ->
  seconds, the CSV that ``racsim-profile`` writes (racsim/profile.py),
  interpolated bilinearly after a monotone envelope (a batch never takes less
  time than a smaller one; measurement noise can say otherwise).

Catalogs (conf/rm/gpu/*.yaml and conf/rm/model/*.yaml, their one source, loaded
from the racsim.conf package): GPUs with dense bf16 peak (no sparsity), HBM
bandwidth, memory and a price per GPU-hour, an assumption to edit; RM sizes as
transformer shapes of well-known models (the parameter counts follow from the
shape, biases left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np

from racsim.errors import ConfigError
from racsim.pipeline.efficiency import layer_params, shipped_curve
from racsim.pipeline.layer_times import curve_row, kernel_source, model_layer, profile_source


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of a decoder-only reward model (GQA attention, SwiGLU MLP,
    RMSNorm, no biases, a d_model x 1 score head, no LM head)."""

    non_embedding: int
    embedding: int

    @property
    def total(self) -> int:
        return self.non_embedding + self.embedding


def model_size(m: Any) -> ModelSize:
    """Parameters of an :class:`~racsim.config.schema.RMModelConf`."""
    d = int(m.d_model)
    per_layer = layer_params(d, int(m.d_ff), int(m.n_heads), int(m.n_kv_heads)) + 2 * d  # the matmuls; 2 norms
    return ModelSize(non_embedding=int(m.layers) * per_layer + 2 * d, embedding=int(m.vocab) * d)  # + final norm, head


def pass_tokens(padded: bool, count, tok_sum, sq_sum, max_len) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, sum of squared lengths) a batch puts through the model: every sequence as long as the
    longest when ``padded``, else as long as it is."""
    if not scalars(count, tok_sum, sq_sum, max_len):
        count, tok_sum, sq_sum, max_len = (np.asarray(x, dtype=np.float64)
                                           for x in (count, tok_sum, sq_sum, max_len))
    if padded:
        return count * max_len, count * (max_len * max_len)
    return tok_sum, sq_sum


def kv_seconds_per_token(rm: Any) -> float:
    """Seconds to read one cached token's keys and values of every layer on a replica."""
    m = rm.model
    kv_dim = int(m.n_kv_heads) * (int(m.d_model) // int(m.n_heads))
    return 2.0 * float(m.layers) * kv_dim * float(m.bytes_per_param) / (float(rm.tp) * float(rm.gpu.mem_bw_tbs) * 1e12)


def activation_bytes(m: Any, tokens: float) -> float:
    """Peak activations of one prefill forward pass over ``tokens`` tokens (no KV
    cache kept, attention by a fused kernel): the MLP's gate, up and product
    (3 d_ff) and a few d_model-wide buffers (4 d_model) per token, layer by layer."""
    return float(tokens) * (3 * int(m.d_ff) + 4 * int(m.d_model)) * float(m.bytes_per_param)


def check_memory(rm: Any, key: str) -> None:
    """A ConfigError naming ``key.tp`` when one replica's share of the weights and of
    the largest batch's activations does not fit ``memory_gb * mem_util`` per GPU."""
    m, g = rm.model, rm.gpu
    weights = model_size(m).total * float(m.bytes_per_param)
    act = activation_bytes(m, rm.token_budget)
    usable = float(g.memory_gb) * 1e9 * float(rm.mem_util)
    need = (weights + act) / rm.tp
    if need <= usable:
        return
    heads = int(m.n_heads)
    tp_min = next((t for t in range(1, heads + 1) if heads % t == 0 and (weights + act) / t <= usable), None)
    if tp_min is None:
        tp_min = f"{heads} (still too little)"
    raise ConfigError(
        f"{key}.tp", rm.tp,
        f"the {m.name} model does not fit: {need / 1e9:.1f} GB per GPU at tp={rm.tp} (weights "
        f"{weights / 1e9:.1f} GB + activations {act / 1e9:.1f} GB for a {rm.token_budget}-token batch, / tp) "
        f"but a {g.name} has {usable / 1e9:.1f} GB (memory_gb {g.memory_gb:g} x mem_util {rm.mem_util:g}); "
        f"use tp >= {tp_min}, a smaller token_budget, or a larger GPU")


def scalars(*xs) -> bool:
    """Whether every argument is a Python int or float: one batch or decode step, computed in Python floats
    (the rollout engines' event loop, one call per event), the same IEEE operations as NumPy's elementwise."""
    for x in xs:
        if type(x) is not float and type(x) is not int:
            return False
    return True


def larger(a, b):
    """The elementwise maximum of arrays (np.maximum), or of two Python floats (max): the same value."""
    return max(a, b) if type(a) is float and type(b) is float else np.maximum(a, b)


class ServiceModel:
    """Seconds for batches, elementwise over arrays of batch statistics."""

    padded: bool = True
    changes: Tuple[str, ...] = ()  # what racsim did to a user's data (a profile: its monotone envelope)

    def seconds(self, count, tok_sum, sq_sum, max_len) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def decode_seconds(self, running, context) -> np.ndarray:  # pragma: no cover - interface
        """Seconds of one decode step of ``running`` sequences whose KV caches hold ``context``
        tokens in all (elementwise over arrays)."""
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class Roofline(ServiceModel):
    """See the module docstring. All arithmetic is +, *, / and max (the efficiency curve is
    tabulated once and read by linear interpolation), so the two pipeline engines get
    bit-identical seconds for the same batch."""

    def __init__(self, rm: Any):
        m, g = rm.model, rm.gpu
        size = model_size(m)
        self.name, self.gpu_name, self.tp = str(m.name), str(g.name), int(rm.tp)
        self.params = float(size.non_embedding)
        self.attn = 2.0 * float(m.layers) * float(m.d_model)
        self.peak = float(rm.tp) * float(g.peak_tflops) * 1e12
        bandwidth = float(rm.tp) * float(g.mem_bw_tbs) * 1e12
        self.floor = size.non_embedding * float(m.bytes_per_param) / bandwidth
        self.kv_per_token = kv_seconds_per_token(rm)  # s per cached token
        self.decode_attn = 4.0 * float(m.layers) * float(m.d_model)  # FLOPs per cached token a step
        self.overhead = float(rm.overhead_s)
        self.mfu = None if rm.mfu is None else float(rm.mfu)
        self.flops_per_s = None if self.mfu is None else self.peak * self.mfu
        self.scale = float(rm.mfu_scale)
        self.padded = bool(rm.padded)
        if self.mfu is None:  # the layer's seconds on the curve, and its FLOPs per token per GPU
            layer = model_layer(m)
            self.curve = curve_row(shipped_curve(), layer, self.tp, float(g.peak_tflops) * 1e12,
                                   float(g.mem_bw_tbs) * 1e12)
            self.layer_flops = 2.0 * layer.params / self.tp

    def efficiency(self, tokens) -> np.ndarray:
        """The MFU of a pass of ``tokens`` tokens: ``rm.mfu``, or the curve's times ``rm.mfu_scale`` (at most 1); a
        pass of no tokens (an empty batch a vectorised step computes) at one token's, so that its compute is 0 s."""
        n = np.asarray(tokens, dtype=np.float64)
        if self.mfu is not None:
            return np.full(n.shape, self.mfu)
        n = np.maximum(n, 1.0)
        seconds = self.curve.at(n)[0]
        mfu = np.minimum(1.0, self.scale * (self.layer_flops * n / (self.peak / self.tp * seconds)))
        return float(mfu) if scalars(tokens) else mfu

    def rate(self, tokens):
        """FLOPs per second of a replica on passes of ``tokens`` tokens: ``tp * peak * MFU``."""
        return self.flops_per_s if self.mfu is not None else self.peak * self.efficiency(tokens)

    def seconds(self, count, tok_sum, sq_sum, max_len) -> np.ndarray:
        tokens, squares = pass_tokens(self.padded, count, tok_sum, sq_sum, max_len)
        compute = (2.0 * self.params * tokens + self.attn * squares) / self.rate(tokens)
        return larger(compute, self.floor) + self.overhead

    def decode_seconds(self, running, context) -> np.ndarray:
        if scalars(running, context):
            return self.decode_step(running, context)
        return self.decode_step(np.asarray(running, dtype=np.float64), np.asarray(context, dtype=np.float64),
                                np.maximum)

    def decode_step(self, running, context, top=max):
        """:meth:`decode_seconds` without its check: of Python numbers (``top`` max), or of arrays with
        ``top`` np.maximum. The rollout engines' event loop calls it once per event."""
        compute = (2.0 * self.params * running + self.decode_attn * context) / self.rate(running)
        return top(compute, self.floor + self.kv_per_token * context) + self.overhead

    def describe(self) -> str:
        if self.mfu is not None:
            mfu = f"MFU {self.mfu:g}"
        else:
            at = self.efficiency(np.array([256.0, 4096.0]))
            mfu = (f"MFU from the efficiency curve ({at[0]:.2f} at 256 tokens a pass, {at[1]:.2f} at 4096"
                   + (f", x {self.scale:g}" if self.scale != 1.0 else "") + ")")
        return (f"roofline: {self.name} RM on {self.gpu_name} x tp={self.tp}, {mfu}, "
                f"{'padded' if self.padded else 'packed'} batches, overhead {self.overhead:g} s")


class Kernels(ServiceModel):
    """Measured per-layer operator times (see the module docstring): ``source`` says which table
    (racsim.pipeline.layer_times.Source: measured, mapped or extrapolated, and how). Interpolation
    is linear and the rest +, *, /, so the two pipeline engines get bit-identical seconds."""

    def __init__(self, rm: Any, key: str = "rm"):
        m, g = rm.model, rm.gpu
        self.name, self.gpu_name, self.tp = str(m.name), str(g.name), int(rm.tp)
        if rm.profile is not None:
            self.source, self.changes = profile_source(rm.profile, m, self.tp, f"{key}.profile")
        else:
            self.source = kernel_source(m, g, self.tp)
        self.layers = float(m.layers)
        self.attn = 2.0 * float(m.layers) * float(m.d_model)
        self.attn_rate = float(rm.tp) * float(g.peak_tflops) * 1e12 * float(rm.attn_mfu)
        self.kv_per_token = kv_seconds_per_token(rm)
        self.scale = 1.0 + float(rm.kernel_overhead)
        self.overhead = float(rm.overhead_s)
        self.attn_mfu = float(rm.attn_mfu)
        self.padded = bool(rm.padded)

    def kernels(self, tokens) -> np.ndarray:
        """Seconds of the operators outside attention for passes of ``tokens`` tokens: every layer's and
        the embedding's."""
        layer, emb = self.source.row.at(tokens)
        return self.layers * layer + emb

    def seconds(self, count, tok_sum, sq_sum, max_len) -> np.ndarray:
        tokens, squares = pass_tokens(self.padded, count, tok_sum, sq_sum, max_len)
        out = self.scale * (self.kernels(tokens) + self.attn * squares / self.attn_rate) + self.overhead
        return float(out) if scalars(count, tok_sum, sq_sum, max_len) else out

    def decode_seconds(self, running, context) -> np.ndarray:
        context = np.asarray(context, dtype=np.float64)
        return self.scale * (self.kernels(running) + self.kv_per_token * context) + self.overhead

    def decode_step(self, running: int, context: float) -> float:
        """:meth:`decode_seconds` of Python numbers, a float: the rollout engines' event loop calls it once
        per event."""
        return float(self.decode_seconds(running, context))

    def describe(self) -> str:
        more = f" + {self.scale - 1.0:.0%}" if self.scale != 1.0 else ""
        return (f"kernels: {self.name} RM on {self.gpu_name} x tp={self.tp}, per-layer times {self.source.kind}: "
                f"{self.source.how}; attention at MFU {self.attn_mfu:g}, "
                f"{'padded' if self.padded else 'packed'} batches, overhead {self.overhead:g} s{more}")


class Profiled(ServiceModel):
    """Bilinear interpolation of a racsim-profile table (monotone envelope).

    Inside the grid: bilinear in (batch size, sequence length). Past the largest
    batch size or length: proportional to it (time per token of the largest
    measured batch). Below the smallest: the smallest's time (overhead-bound).
    """

    def __init__(self, path: str, padded: bool = True, key: str = "rm.profile"):
        self.path, self.padded = str(path), bool(padded)
        self.header, table = read_profile(path, key)
        self.b = np.array(sorted(table.batch_size.unique()), dtype=np.float64)
        self.s = np.array(sorted(table.seq_len.unique()), dtype=np.float64)
        grid = table.pivot_table(index="batch_size", columns="seq_len", values="seconds", aggfunc="first")
        grid = grid.reindex(index=self.b.astype(int), columns=self.s.astype(int))
        if grid.isna().to_numpy().any():
            raise ConfigError(key, path, "a full grid: every (batch_size, seq_len) pair measured once")
        self.measured = grid.to_numpy(dtype=np.float64)
        if not (np.all(np.isfinite(self.measured)) and np.all(self.measured > 0)):
            raise ConfigError(key, path, "positive, finite seconds in every row")
        self.table = np.maximum.accumulate(np.maximum.accumulate(self.measured, axis=0), axis=1)
        self.changes = envelope_change(self.measured, self.table, self.b, self.s)

    @staticmethod
    def _axis(grid: np.ndarray, x: np.ndarray):
        """Cell index, weight in the cell, and the proportional scale past the end."""
        xc = np.clip(x, grid[0], grid[-1])
        i = np.clip(np.searchsorted(grid, xc, side="right") - 1, 0, max(len(grid) - 2, 0))
        if len(grid) == 1:
            return i, np.zeros_like(xc), np.maximum(x / grid[0], 1.0)
        w = (xc - grid[i]) / (grid[i + 1] - grid[i])
        return i, w, np.maximum(x / grid[-1], 1.0)

    def at(self, batch, seq) -> np.ndarray:
        """Seconds for a batch of ``batch`` sequences of ``seq`` tokens."""
        b = np.asarray(batch, dtype=np.float64)
        s = np.asarray(seq, dtype=np.float64)
        i, wi, si = self._axis(self.b, b)
        j, wj, sj = self._axis(self.s, s)
        t = self.table
        i1, j1 = np.minimum(i + 1, len(self.b) - 1), np.minimum(j + 1, len(self.s) - 1)
        top = t[i, j] * (1.0 - wj) + t[i, j1] * wj
        bot = t[i1, j] * (1.0 - wj) + t[i1, j1] * wj
        return (top * (1.0 - wi) + bot * wi) * si * sj

    def seconds(self, count, tok_sum, sq_sum, max_len) -> np.ndarray:
        count = np.asarray(count, dtype=np.float64)
        seq = np.asarray(max_len, dtype=np.float64) if self.padded else np.asarray(tok_sum, dtype=np.float64) / count
        return self.at(count, seq)

    def describe(self) -> str:
        dev = self.header.get("device", "?")
        model = self.header.get("model", "?")
        return f"profiled: {self.path} ({model} on {dev})"


def envelope_change(measured: np.ndarray, table: np.ndarray, b: np.ndarray, s: np.ndarray) -> Tuple[str, ...]:
    """What the monotone envelope did to a measured profile (a batch never faster than a smaller one):
    one line naming how many cells it raised and the largest rise, or nothing when it raised none."""
    raised = table > measured
    if not raised.any():
        return ()
    rise = table / measured - 1.0
    i, j = np.unravel_index(np.argmax(rise), rise.shape)
    return (f"not monotone: {int(raised.sum())} of {raised.size} cells were faster than a smaller batch or length, "
            f"raised to its time (the most, batch {int(b[i])} x seq {int(s[j])}, by {rise[i, j]:.0%}); racsim "
            f"uses that monotone envelope",)


def read_profile(path: str, key: str = "rm.profile"):
    """(header dict, DataFrame) of a racsim-profile CSV: '# key: value' lines, then
    columns batch_size, seq_len, seconds (and more)."""
    import pandas as pd

    header: Dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.startswith("#"):
                    break
                k, _, v = line[1:].partition(":")
                if v:
                    header[k.strip()] = v.strip()
        table = pd.read_csv(path, comment="#")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(key, path, f"a readable CSV written by racsim-profile ({type(e).__name__}: {e})") from e
    need = {"batch_size", "seq_len", "seconds"}
    if not need <= set(table.columns):
        raise ConfigError(key, path, "a CSV with columns batch_size, seq_len, seconds (it has: "
                          + ", ".join(map(str, table.columns)) + ")")
    if len(table) == 0:
        raise ConfigError(key, path, "a CSV with at least one measured row")
    sizes = table[["batch_size", "seq_len"]].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    if not (np.all(np.isfinite(sizes)) and np.all(sizes >= 1) and np.all(sizes == np.round(sizes))):
        raise ConfigError(key, path, "integers >= 1 in every row's batch_size and seq_len")
    if not np.all(np.isfinite(pd.to_numeric(table["seconds"], errors="coerce").to_numpy(dtype=np.float64))):
        raise ConfigError(key, path, "a number of seconds in every row")
    return header, table.astype({"batch_size": np.int64, "seq_len": np.int64, "seconds": np.float64})


def build_service(rm: Any, key: str = "rm") -> ServiceModel:
    """The service model an RM config asks for, once the model is known to fit the GPUs."""
    check_memory(rm, key)
    if rm.service == "roofline":
        return Roofline(rm)
    if rm.service == "profiled":
        return Profiled(rm.profile, rm.padded, f"{key}.profile")
    if rm.service == "kernels":
        return Kernels(rm, key)
    raise ConfigError(f"{key}.service", rm.service, "one of roofline, profiled, kernels")
