"""Measured per-layer operator times: a file of them (the Vidur format, racsim/data/kernels/README.md), the
tables racsim ships, which one serves a model on a GPU, and one layer's seconds at any tokens per pass.

A file holds, per (num_tokens, num_tensor_parallel_workers), the median milliseconds of each operator of
ONE transformer layer outside attention (``time_stats.OP.median``; other columns are ignored) and of the
embedding lookup (``emb``, once per model), with the layer's shape. One layer's seconds are the sum of its
operators (those a file lacks, such as phi-2's second norm, are not run by that model); rows measured twice
count by their median. Per tp, a layer's seconds against the tokens of a pass (:class:`Row`) are made
monotone (a pass never takes less than a smaller one: the running maximum over tokens, as the profiled
service model does), linear between measured token counts, the first count's below it and proportional
past the last (the time per token of the longest measured pass); a tp between two measured ones is
interpolated linearly in log2(tp) between them.

Which table serves a model on a GPU (:func:`kernel_source`), in this order:

* ``measured``: a table of that GPU with the model's layer shape (d_model, heads, KV heads, d_ff; the one
  of the same vocabulary first);
* ``mapped``: the layer shape measured on another GPU of the same chip (:data:`SAME_CHIP`: an H200 is an
  H100's compute with faster memory), times the efficiency curve's ratio of the two GPUs
  (racsim.pipeline.efficiency), token by token;
* ``extrapolated``: the table of that GPU (or its chip's) nearest the model's size among those that
  measured its tp, times the curve's ratio of the two shapes; with no such table, the curve itself at the
  GPU's peak and bandwidth.

A user's own file in the same format (``rm.profile``) must hold the model's shape and is used as given.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.errors import ConfigError
from racsim.pipeline.efficiency import Curve, Layer, layer_params, layer_seconds, shipped_curve

OPERATORS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
EMBEDDING = "emb"
TOKENS, TP = "num_tokens", "num_tensor_parallel_workers"
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")  # integers; use_gated_mlp true or false
VOCAB = "vocab_size"  # optional: which of two tables of one shape matches a model's embedding
GATED = "use_gated_mlp"
# GPUs racsim has no table of that are another's chip: their tables serve them, scaled by the curve.
SAME_CHIP = {"H200": "H100"}
# The tokens per pass at which the curve is tabulated (1 to 64 each, then 16 points an octave to 2^20).
CURVE_TOKENS = np.unique(np.concatenate([np.arange(1.0, 65.0), np.round(2.0 ** np.arange(6.0, 20.0 + 1e-9, 1 / 16))]))


def median(op: str) -> str:
    return f"time_stats.{op}.median"


def monotone(x: np.ndarray) -> np.ndarray:
    """The running maximum: a pass never takes less time than a smaller one."""
    return np.maximum.accumulate(x)


@dataclass(frozen=True)
class Row:
    """One layer's and the embedding's seconds at one tp against the tokens of a pass (both monotone)."""

    tokens: np.ndarray
    layer: np.ndarray
    emb: np.ndarray

    def at(self, tokens) -> Tuple[np.ndarray, np.ndarray]:
        """(layer, embedding) seconds of passes of ``tokens`` tokens (an array): linear between the
        measured counts, the first one's below them, proportional past the last."""
        n = np.asarray(tokens, dtype=np.float64)
        top = self.tokens[-1]
        return tuple(np.where(n <= top, np.interp(n, self.tokens, v), v[-1] * (n / top))
                     for v in (self.layer, self.emb))

    def scaled(self, factor: np.ndarray) -> "Row":
        """The row with both columns times ``factor`` (one per token count), kept monotone."""
        return Row(self.tokens, monotone(self.layer * factor), monotone(self.emb * factor))


@dataclass(frozen=True)
class Table:
    """A file of per-layer operator times: its path, the layer's shape (:data:`SHAPE`, ``gated``,
    ``vocab`` or None), and per measured tp the (tokens, layer seconds, embedding seconds) rows,
    tokens ascending, each column monotone (:func:`monotone`), and the layer seconds as measured."""

    path: str
    shape: Dict[str, Any]
    rows: Dict[int, Row]
    measured: Dict[int, np.ndarray]

    @property
    def tps(self) -> List[int]:
        return sorted(self.rows)

    @property
    def layer(self) -> Layer:
        s = self.shape
        return Layer(float(layer_params(s["n_embd"], s["n_expanded_embd"], s["n_head"], s["n_kv_head"], s["gated"])),
                     float(s["n_embd"]))

    def row(self, tp: int) -> Optional[Row]:
        """The row at ``tp``: measured, or linear in log2(tp) between the two measured tps around it
        (on both's token counts); None outside the measured tps."""
        if tp in self.rows:
            return self.rows[tp]
        below, above = [t for t in self.tps if t < tp], [t for t in self.tps if t > tp]
        if not below or not above:
            return None
        lo, hi = self.rows[below[-1]], self.rows[above[0]]
        w = math.log2(tp / below[-1]) / math.log2(above[0] / below[-1])
        grid = np.union1d(lo.tokens, hi.tokens)
        (l0, e0), (l1, e1) = lo.at(grid), hi.at(grid)
        return Row(grid, (1.0 - w) * l0 + w * l1, (1.0 - w) * e0 + w * e1)


def read_table(path: str, key: str) -> Table:
    """A file of per-layer operator times (module docstring); a malformed one is a ConfigError naming
    ``key`` and what the file must hold."""
    try:
        df = pd.read_csv(path, comment="#")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(key, path, f"a readable CSV of per-layer operator times in the Vidur format "
                                     f"({type(e).__name__}: {e})") from e
    need = [TOKENS, TP, *SHAPE, GATED]
    lacks = [c for c in need if c not in df.columns]
    ops = [op for op in (EMBEDDING, *OPERATORS) if median(op) in df.columns]
    if lacks or not any(op in ops for op in OPERATORS):
        what = ", ".join(lacks) if lacks else "every time_stats.OP.median column"
        raise ConfigError(key, path, f"a CSV of per-layer operator times with columns {', '.join(need)} and "
                                     f"time_stats.OP.median (milliseconds) for OP in {', '.join(OPERATORS)} (and "
                                     f"{EMBEDDING}); it lacks {what}")
    if len(df) == 0:
        raise ConfigError(key, path, "a CSV with at least one measured row")
    keys = df[[TOKENS, TP, *SHAPE]].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    if not (np.all(np.isfinite(keys)) and np.all(keys >= 1) and np.all(keys == np.round(keys))):
        raise ConfigError(key, path, f"integers >= 1 in every row's {', '.join([TOKENS, TP, *SHAPE])}")
    times = df[[median(op) for op in ops]].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    if not (np.all(np.isfinite(times)) and np.all(times >= 0)):
        raise ConfigError(key, path, "a number of milliseconds >= 0 in every row's time_stats.OP.median")
    gated = df[GATED].astype(str).str.strip().str.lower()
    if not gated.isin(["true", "false"]).all():
        raise ConfigError(key, path, f"true or false in every row's {GATED}")
    shape_rows = np.column_stack([keys[:, 2:], gated.to_numpy() == "true"])
    if len(np.unique(shape_rows, axis=0)) != 1:
        raise ConfigError(key, path, f"one layer shape in every row ({', '.join(SHAPE)}, {GATED})")
    shape = {c: int(keys[0, 2 + i]) for i, c in enumerate(SHAPE)}
    shape["gated"] = bool(gated.iloc[0] == "true")
    shape["vocab"] = int(df[VOCAB].iloc[0]) if VOCAB in df.columns else None
    frame = pd.DataFrame(times * 1e-3, columns=ops)
    frame["layer"] = frame[[op for op in ops if op != EMBEDDING]].sum(axis=1)
    frame["emb"] = frame[EMBEDDING] if EMBEDDING in ops else 0.0
    frame[TOKENS], frame[TP] = keys[:, 0], keys[:, 1].astype(int)
    merged = frame.groupby([TP, TOKENS], sort=True)[["layer", "emb"]].median()
    rows, measured = {}, {}
    for tp, part in merged.groupby(level=0):
        tokens = part.index.get_level_values(1).to_numpy(np.float64)
        measured[int(tp)] = part["layer"].to_numpy(np.float64)
        rows[int(tp)] = Row(tokens, monotone(measured[int(tp)]), monotone(part["emb"].to_numpy(np.float64)))
    return Table(str(path), shape, rows, measured)


def raised(table: Table) -> Tuple[int, int, float, float]:
    """What the running maximum did to a table's layer times: how many it raised, of how many, by how
    much on average where it did and the most, each as a share of the measured time."""
    up = np.concatenate([table.rows[tp].layer / np.maximum(table.measured[tp], 1e-300) for tp in table.tps]) - 1.0
    n = int(np.sum(up > 0))
    return n, len(up), float(up[up > 0].mean()) if n else 0.0, float(up.max())


def raised_note(table: Table) -> Tuple[str, ...]:
    """What the running maximum did to a user's file: one line, or nothing when it raised no time."""
    n, cells, _, most = raised(table)
    if n == 0:
        return ()
    return (f"not monotone: {n} of {cells} layer times were below a smaller pass's, raised to it (the most by "
            f"{most:.0%}); racsim uses that monotone envelope",)


def model_shape(m: Any) -> Dict[str, Any]:
    """An RMModelConf's layer shape in a table's terms (catalog models have a gated MLP)."""
    return {"n_head": int(m.n_heads), "n_kv_head": int(m.n_kv_heads), "n_embd": int(m.d_model),
            "n_expanded_embd": int(m.d_ff), "gated": True, "vocab": int(m.vocab)}


def model_layer(m: Any) -> Layer:
    s = model_shape(m)
    return Layer(float(layer_params(s["n_embd"], s["n_expanded_embd"], s["n_head"], s["n_kv_head"])),
                 float(s["n_embd"]), float(m.bytes_per_param))


def same_layer(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in (*SHAPE, "gated"))


def kernels_folder():
    return files("racsim.data").joinpath("kernels")


@functools.lru_cache(maxsize=1)
def shipped() -> Dict[str, List[Tuple[str, Table]]]:
    """The tables racsim ships, by GPU name: [(model file's stem, table)], in file-name order."""
    gpus = shipped_gpus()
    out: Dict[str, List[Tuple[str, Table]]] = {}
    for gpu in gpus:
        folder = kernels_folder().joinpath(gpu.lower())
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".csv"))
        out[gpu] = [(n[:-4], read_table(str(folder.joinpath(n)), "rm.profile")) for n in names]
    return out


@functools.lru_cache(maxsize=1)
def shipped_gpus() -> Dict[str, Tuple[float, float]]:
    """The GPUs the shipped tables were measured on: name -> (peak FLOP/s, bandwidth B/s) (gpus.csv)."""
    df = pd.read_csv(str(kernels_folder().joinpath("gpus.csv")))
    return {str(r.name): (float(r.peak_tflops) * 1e12, float(r.mem_bw_tbs) * 1e12) for r in df.itertuples()}


@dataclass(frozen=True)
class Source:
    """Where a model's layer times on a GPU come from: ``kind`` (measured, mapped, extrapolated), in
    words (``how``), the row at its tp, and the shipped table it rests on (``gpu/model``; None: the curve
    alone, or a user's file)."""

    kind: str
    how: str
    row: Row
    table: Optional[str] = None


def curve_row(curve: Curve, layer: Layer, tp: int, peak: float, bandwidth: float) -> Row:
    """The curve's seconds of one layer at :data:`CURVE_TOKENS` (no embedding term)."""
    seconds = layer_seconds(curve, layer, tp, CURVE_TOKENS, peak, bandwidth)
    return Row(CURVE_TOKENS, seconds, np.zeros(len(CURVE_TOKENS)))


def nearest(tables: List[Tuple[str, Table]], shape: Dict[str, Any], layer: Layer) -> Tuple[str, Table]:
    """The table of the same layer shape (the same vocabulary first), else the one nearest in size."""
    return min(tables, key=lambda t: (not same_layer(t[1].shape, shape), t[1].shape["vocab"] != shape["vocab"],
                                      abs(math.log(t[1].layer.params / layer.params))))


def kernel_source(m: Any, g: Any, tp: int, curve: Optional[Curve] = None) -> Source:
    """Which shipped table serves model ``m`` (an RMModelConf) on GPU ``g`` (a GpuConf) at ``tp``, and its
    row (module docstring)."""
    curve = curve or shipped_curve()
    shape, layer = model_shape(m), model_layer(m)
    peak, bw = float(g.peak_tflops) * 1e12, float(g.mem_bw_tbs) * 1e12
    chip = g.name if g.name in shipped() else SAME_CHIP.get(g.name)
    able = [(stem, t) for stem, t in shipped().get(chip, []) if t.row(tp) is not None]
    if not able:
        why = f"no measured table for the {g.name}" + ("" if chip is None else f" at tp {tp}")
        return Source("extrapolated", f"the efficiency curve at the {g.name}'s peak and bandwidth ({why})",
                      curve_row(curve, layer, tp, peak, bw))
    stem, table = nearest(able, shape, layer)
    name = f"{chip.lower()}/{stem}"
    if same_layer(table.shape, shape) and chip == g.name:
        return Source("measured", f"{name}", table.row(tp), name)
    row = transferred(table, tp, shipped_gpus()[chip], layer, (peak, bw), curve)
    if same_layer(table.shape, shape):
        return Source("mapped", f"{name} (the same chip), times the efficiency curve's {g.name} / {chip} ratio",
                      row, name)
    on = "" if chip == g.name else f" on the {chip} (the same chip as the {g.name})"
    return Source("extrapolated", f"{name}{on}, times the efficiency curve's ratio of the {m.name} to that shape"
                  + ("" if chip == g.name else f" and of the {g.name} to the {chip}"), row, name)


def transferred(table: Table, tp: int, measured_on: Tuple[float, float], layer: Layer, on: Tuple[float, float],
                curve: Curve) -> Optional[Row]:
    """``table``'s row at ``tp`` (measured on a GPU of (peak, bandwidth) ``measured_on``) carried to
    ``layer`` on a GPU of ``on``: times the curve's ratio of the two at each measured token count, kept
    monotone; None where the table has no row at ``tp``."""
    row = table.row(tp)
    return None if row is None else row.scaled(layer_seconds(curve, layer, tp, row.tokens, *on)
                      / layer_seconds(curve, table.layer, tp, row.tokens, *measured_on))


def measured_rows() -> pd.DataFrame:
    """Every shipped table's layer times as measured, one row per (file, tp, tokens), with what the
    efficiency curve reads of its layer and GPU (racsim.pipeline.efficiency.predicted)."""
    parts = []
    for gpu, tables in shipped().items():
        peak, bw = shipped_gpus()[gpu]
        for stem, t in tables:
            for tp in t.tps:
                n = len(t.rows[tp].tokens)
                parts.append(pd.DataFrame({"file": f"{gpu.lower()}/{stem}", "gpu": gpu, "params": t.layer.params,
                                           "d_model": t.layer.d_model, "bytes": t.layer.bytes, "tp": np.full(n, tp),
                                           "tokens": t.rows[tp].tokens, "seconds": t.measured[tp], "peak": peak,
                                           "bandwidth": bw}))
    return pd.concat(parts, ignore_index=True)


def profile_source(path: str, m: Any, tp: int, key: str) -> Tuple[Source, Tuple[str, ...]]:
    """A user's own file (``key``: its config key) for model ``m`` at ``tp``, and what racsim did to it."""
    table = read_table(path, key)
    shape = model_shape(m)
    if not same_layer(table.shape, shape):
        has = ", ".join(f"{k} {table.shape[k]}" for k in SHAPE) + f", {GATED} {table.shape['gated']}"
        want = ", ".join(f"{k} {shape[k]}" for k in SHAPE) + f", {GATED} True"
        raise ConfigError(key, path, f"a profile of the model's layer shape ({want}); it has {has}")
    row = table.row(tp)
    if row is None:
        tps = ", ".join(map(str, table.tps))
        raise ConfigError(key.rsplit(".", 1)[0] + ".tp", tp, f"a tp the profile {path} measured ({tps}) or one "
                                                             "between two of them")
    return Source("measured", f"your profile {path}", row), raised_note(table)
