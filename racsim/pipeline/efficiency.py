"""The efficiency curve: one transformer layer's seconds on a GPU from the tokens a pass puts through
it and the tensor parallelism, fitted to measured per-layer operator times (racsim/data/kernels/).

A pass of ``n`` tokens through one layer whose matmuls (q, k, v, o and the MLP) hold ``P`` parameters
of ``b`` bytes, split over ``tp`` GPUs of peak ``F`` FLOP/s and HBM bandwidth ``W`` B/s::

    weights = P * b / (tp * W * eta)            the layer's weights read at a share eta of the bandwidth
    compute = 2 * P * n / (tp * F * e_max)      its matmuls at a share e_max of the peak
    seconds = tau + (weights^g + compute^g)^(1/g) + kappa * n * d_model / W

``tau`` is the kernel-launch latency a layer pays whatever its size (tp does not divide it); the middle
term is a smoothed roofline (g -> infinity: the larger of the two; g = 1: their sum); the last is the
elementwise operators (norms, residual add) that every GPU of a tp group runs on the whole activations,
``kappa`` bytes per token and model dimension. The layer's efficiency (its MFU) is its matmul FLOPs
over peak x seconds::

    e(n, tp) = 2 * P * n / (tp * F * seconds)

rising from a few thousandths at one token (the weight read binds) to near ``e_max`` on long passes,
and falling with tp where ``tau`` and the replicated term weigh more. The GPU enters through ``F`` and
``W`` alone, so the curve carries to GPUs nobody measured, an extrapolation racsim names as one. The
five parameters are fitted (:func:`fit`: least squares on the log of the seconds) to every measured
file at once; racsim ships the fit (``curve.json`` beside the tables, :func:`shipped_curve`), made by
``python -m racsim.tools.kernels derive`` and checked against a refit by the tests.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from importlib.resources import files

import numpy as np
import pandas as pd

# The tokens per pass the fit reads: powers of 2 and 3 x powers of 2 up to 4096 (the measured grid
# is every 8 tokens, so a grid even in log tokens keeps the many long passes from outweighing the few
# short ones that decode steps and small batches make).
FIT_TOKENS = tuple(sorted({2 ** k for k in range(13)} | {3 * 2 ** k for k in range(11)}))
# Significant digits of the shipped parameters (a refit on another CPU agrees to these).
DIGITS = 4


@dataclass(frozen=True)
class Curve:
    """The fitted parameters (module docstring): ``tau_s`` seconds, ``eta`` and ``e_max`` shares,
    ``sharpness`` g, ``kappa`` bytes per token and model dimension."""

    tau_s: float
    eta: float
    e_max: float
    sharpness: float
    kappa: float


@dataclass(frozen=True)
class Layer:
    """What the curve needs of a layer: its matmul parameters, model dimension, bytes per parameter."""

    params: float
    d_model: float
    bytes: float = 2.0


def layer_params(d_model: int, d_ff: int, n_heads: int, n_kv_heads: int, gated: bool = True) -> int:
    """Matmul parameters of one decoder layer: q and o (d x d each), k and v (d x kv_dim each,
    kv_dim = n_kv_heads x d / n_heads), the MLP (gate, up, down: 3 d x d_ff; 2 without a gate)."""
    kv = n_kv_heads * (d_model // n_heads)
    return 2 * d_model * d_model + 2 * d_model * kv + (3 if gated else 2) * d_model * d_ff


def layer_seconds(c: Curve, layer: Layer, tp: float, tokens, peak: float, bandwidth: float) -> np.ndarray:
    """Seconds of one layer for passes of ``tokens`` tokens (an array) on tp GPUs of ``peak`` FLOP/s
    and ``bandwidth`` B/s each (module docstring)."""
    n = np.asarray(tokens, dtype=np.float64)
    weights = layer.params * layer.bytes / (tp * bandwidth * c.eta)
    compute = 2.0 * layer.params * n / (tp * peak * c.e_max)
    g = c.sharpness
    return c.tau_s + (weights ** g + compute ** g) ** (1.0 / g) + c.kappa * n * layer.d_model / bandwidth


def efficiency(c: Curve, layer: Layer, tp: float, tokens, peak: float, bandwidth: float) -> np.ndarray:
    """The layer's MFU on passes of ``tokens`` tokens: its matmul FLOPs over tp x peak x its seconds."""
    n = np.asarray(tokens, dtype=np.float64)
    return 2.0 * layer.params * n / (tp * peak * layer_seconds(c, layer, tp, n, peak, bandwidth))


def predicted(c: Curve, rows: pd.DataFrame) -> np.ndarray:
    """The curve's seconds for measured rows (columns params, d_model, bytes, tp, tokens, peak, bandwidth)."""
    p, d, b = (rows[k].to_numpy(np.float64) for k in ("params", "d_model", "bytes"))
    return layer_seconds(c, Layer(p, d, b), rows["tp"].to_numpy(np.float64), rows["tokens"].to_numpy(np.float64),
                         rows["peak"].to_numpy(np.float64), rows["bandwidth"].to_numpy(np.float64))


def fit_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a fit reads: those at :data:`FIT_TOKENS` tokens."""
    return rows[rows["tokens"].isin(FIT_TOKENS)]


def fit(rows: pd.DataFrame) -> Curve:
    """Least squares on log(curve / measured) over ``rows`` (columns of :func:`predicted` and ``seconds``,
    one layer's measured seconds) at :data:`FIT_TOKENS`, from a fixed start inside fixed bounds; the
    parameters rounded to :data:`DIGITS` significant digits."""
    from scipy.optimize import least_squares

    r = fit_rows(rows)
    measured = r["seconds"].to_numpy(np.float64)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predicted(Curve(x[0] * 1e-6, *x[1:]), r) / measured)

    start = [50.0, 0.7, 0.7, 2.0, 10.0]  # tau in microseconds, so that the parameters share a scale
    low, high = [0.0, 0.05, 0.05, 0.5, 0.0], [1000.0, 1.5, 1.0, 50.0, 1000.0]
    x = least_squares(residuals, start, bounds=(low, high)).x
    x[0] *= 1e-6
    return Curve(*(float(f"{v:.{DIGITS}g}") for v in x))


def curve_text(c: Curve) -> str:
    """The parameters as curve.json holds them."""
    return json.dumps(asdict(c), indent=1) + "\n"


@functools.lru_cache(maxsize=1)
def shipped_curve() -> Curve:
    """The curve racsim ships (racsim/data/kernels/curve.json)."""
    return Curve(**json.loads(files("racsim.data").joinpath("kernels").joinpath("curve.json").read_text()))
