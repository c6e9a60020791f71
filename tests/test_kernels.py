"""Service times from measured kernels (issue 48): the kernel service model against hand sums of a
shipped file's rows (read here with the csv module), monotone in tokens for every catalog model and
GPU, the catalog's mapping, a user's own profile and its malformed forms, the efficiency curve (its
closed form, a fit that recovers known parameters, the shipped fit against a refit, leave-one-out
errors) and the roofline's use of it."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dataclasses import replace

from helpers import assert_same_schedule
from racsim.config.defaults import catalog
from racsim.config.schema import GpuConf, RMConf, RMModelConf
from racsim.errors import ConfigError
from racsim.pipeline import layer_times
from racsim.pipeline.efficiency import (FIT_TOKENS, Curve, Layer, curve_text, efficiency, fit, layer_params,
                                        layer_seconds, predicted, shipped_curve)
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.service import Kernels, Roofline, build_service, model_size
from racsim.pipeline.simpy_engine import run_simpy

MODELS, GPUS = catalog("model"), catalog("gpu")
DATA = Path(layer_times.__file__).resolve().parents[1] / "data" / "kernels"
OPS = layer_times.OPERATORS


def rm(model="8B", gpu="H100", **kw) -> RMConf:
    tp = kw.pop("tp", 1)
    return RMConf(**{"model": RMModelConf(**MODELS[model]), "gpu": GpuConf(**GPUS[gpu]), "gpus": tp, "tp": tp,
                     "overhead_s": 0.0, **kw})


def hand_rows(path: Path, tp: int):
    """{tokens: (layer ms, emb ms)} of a file at ``tp``, by a loop: each row's operator medians summed
    (the embedding apart), a pair measured twice by its median, then each the largest of its own and
    every smaller pass's."""
    seen = {}
    with open(path) as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    for r in csv.DictReader(lines):
        if int(r["num_tensor_parallel_workers"]) != tp:
            continue
        layer = sum(float(r[f"time_stats.{op}.median"]) for op in OPS if f"time_stats.{op}.median" in r)
        seen.setdefault(int(r["num_tokens"]), []).append((layer, float(r.get("time_stats.emb.median") or 0.0)))
    out, top_l, top_e = {}, 0.0, 0.0
    for n in sorted(seen):
        pairs = seen[n]
        layer = float(np.median([p[0] for p in pairs]))
        emb = float(np.median([p[1] for p in pairs]))
        top_l, top_e = max(top_l, layer), max(top_e, emb)
        out[n] = (top_l, top_e)
    return out


CELLS = [("8B", "A100", "a100/Meta-Llama-3-8B.csv", 1, 256), ("8B", "A100", "a100/Meta-Llama-3-8B.csv", 4, 3072),
         ("7B", "H100", "h100/Llama-2-7b-hf.csv", 1, 64), ("7B", "H100", "h100/Llama-2-7b-hf.csv", 2, 1024),
         ("7B", "A100", "a100/Llama-2-7b-hf.csv", 8, 4096), ("70B", "A100", "a100/Meta-Llama-3-70B.csv", 4, 512)]


@pytest.mark.parametrize("model,gpu,path,tp,n", CELLS)
def test_kernel_model_is_a_hand_sum_of_the_files_rows(model, gpu, path, tp, n):
    """Prefill of one sequence of n tokens: layers x the row's operators + the embedding + attention's FLOPs
    at attn_mfu; a decode step of n sequences: the same operators + the KV cache over the bandwidth; each
    times 1 + kernel_overhead, plus overhead_s."""
    m, g = MODELS[model], GPUS[gpu]
    layer_ms, emb_ms = hand_rows(DATA / path, tp)[n]
    conf = rm(model, gpu, tp=tp, service="kernels", kernel_overhead=0.1, overhead_s=0.01, attn_mfu=0.5)
    k = build_service(conf)
    assert k.source.kind == "measured"
    attn = 2 * m["layers"] * m["d_model"] * n * n / (tp * g["peak_tflops"] * 1e12 * 0.5)
    want = 1.1 * (m["layers"] * layer_ms * 1e-3 + emb_ms * 1e-3 + attn) + 0.01
    assert float(k.seconds(1, n, n * n, n)) == pytest.approx(want, rel=1e-12)
    kv_bytes = 2 * m["layers"] * m["n_kv_heads"] * (m["d_model"] // m["n_heads"]) * 2.0  # keys and values, a token
    kv = kv_bytes * (n * 700) / (tp * g["mem_bw_tbs"] * 1e12)
    want = 1.1 * (m["layers"] * layer_ms * 1e-3 + emb_ms * 1e-3 + kv) + 0.01
    assert float(k.decode_seconds(n, n * 700)) == pytest.approx(want, rel=1e-12)


def test_between_and_past_the_measured_tokens():
    """Linear between two measured counts; past the last, its time per token; below the first, the first's."""
    rows = hand_rows(DATA / "h100/Llama-2-7b-hf.csv", 1)
    k = build_service(rm("7B", "H100", service="kernels"))
    layer = lambda n: float(k.kernels(n))  # noqa: E731
    (l0, e0), (l1, e1) = rows[256], rows[264]
    between = 32 * (l0 + 3 / 8 * (l1 - l0)) * 1e-3 + (e0 + 3 / 8 * (e1 - e0)) * 1e-3
    assert layer(259) == pytest.approx(between, rel=1e-12)
    top = rows[4096]
    assert layer(10_000) == pytest.approx((32 * top[0] + top[1]) * 1e-3 * 10_000 / 4096, rel=1e-12)
    assert layer(0.5) == layer(1)
    packed = build_service(rm("7B", "H100", service="kernels", padded=False))
    # padded: every sequence as long as the longest (tokens and squares); packed: as they are
    as_long = float(packed.seconds(3, 1200, 3 * 400 ** 2, 400))
    assert float(k.seconds(3, 900, 3 * 400 ** 2, 400)) == pytest.approx(as_long)
    assert float(packed.seconds(3, 900, 270_000, 400)) < float(k.seconds(3, 900, 270_000, 400))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_monotone_in_tokens_for_every_catalog_model_and_gpu(model, gpu):
    """Prefill and decode seconds never fall as tokens (or running sequences, or cached tokens) grow,
    under the kernel model and the curve's roofline, at every tp a model's heads allow up to 8."""
    rng = np.random.default_rng(len(model) * 31 + len(gpu))
    n = np.sort(np.concatenate([rng.integers(1, 40_000, 300), [1, 2, 8, 4095, 4096, 4097, 32768, 32769]])).astype(float)
    for tp in (t for t in (1, 2, 3, 4, 8) if MODELS[model]["n_heads"] % t == 0):
        for service in ("kernels", "roofline"):
            conf = rm(model, gpu, tp=tp, service=service)
            s = Kernels(conf) if service == "kernels" else Roofline(conf)
            for t in (s.seconds(np.ones_like(n), n, n * n, n), s.decode_seconds(n, 500 * n), s.decode_seconds(64, n)):
                assert np.all(np.diff(t) >= 0), (model, gpu, tp, service)


KIND = {("7B", "A100"): "measured", ("8B", "A100"): "measured", ("70B", "A100"): "measured",
        ("7B", "H100"): "measured", ("7B", "H200"): "mapped"}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_catalog_mapping(model, gpu):
    """Measured where a table of that GPU has the model's layer shape; mapped where its chip's has (the
    H200's, the H100's); extrapolated otherwise (by the nearest table of that chip, else the curve), and
    each row is its source's times the curve's ratio, by hand."""
    tp = 4 if model == "70B" else 1
    src = layer_times.kernel_source(RMModelConf(**MODELS[model]), GpuConf(**GPUS[gpu]), tp)
    assert src.kind == KIND.get((model, gpu), "extrapolated"), src.how
    c, m, g = shipped_curve(), RMModelConf(**MODELS[model]), GPUS[gpu]
    mine = layer_times.model_layer(m)
    peak, bw = g["peak_tflops"] * 1e12, g["mem_bw_tbs"] * 1e12
    if gpu in ("B200", "L40S"):  # no table of that chip: the curve itself
        assert "efficiency curve" in src.how
        n = np.array([1.0, 64.0, 4096.0])
        np.testing.assert_allclose(src.row.at(n)[0], layer_seconds(c, mine, tp, n, peak, bw), rtol=1e-12)
        return
    chip = "H100" if gpu == "H200" else gpu
    assert src.table.startswith(chip.lower() + "/") and src.table in src.how
    table = layer_times.read_table(str(DATA / f"{src.table}.csv"), "x")
    hand = hand_rows(DATA / f"{src.table}.csv", tp)
    other = {"A100": (312e12, 2.039e12), "H100": (989.5e12, 3.35e12)}[chip]
    def scaled(m):
        ratio = layer_seconds(c, mine, tp, m, peak, bw) / layer_seconds(c, table.layer, tp, m, *other)
        return hand[m][0] * 1e-3 * (1.0 if src.kind == "measured" else float(ratio))

    for n in (1, 64, 256, 4096):  # the largest of the scaled times of this pass and every smaller one
        assert float(src.row.at(n)[0]) == pytest.approx(max(scaled(m) for m in hand if m <= n), rel=1e-12)
    if model == "8B" and gpu == "H100":
        assert src.table == "h100/Llama-2-7b-hf"  # the 7B's table, nearest in size of the H100's that measured tp 1


def test_shipped_gpus_are_the_catalogs():
    for name, (peak, bw) in layer_times.shipped_gpus().items():
        assert (peak, bw) == (GPUS[name]["peak_tflops"] * 1e12, GPUS[name]["mem_bw_tbs"] * 1e12)


def test_the_attribution_ships_with_the_tables():
    text = (DATA / "README.md").read_text() + (DATA / "LICENSE").read_text()
    assert "microsoft/vidur" in text and "MIT License" in text and "Copyright (c) Microsoft Corporation" in text
    for f in sorted(DATA.glob("*/*.csv")):
        assert f.read_text().startswith("# Derived from the Vidur simulator's profiling data"), f


# ----------------------------------------------------------------------------
# A user's own profile.

HEADER = ("time_stats.emb.median,time_stats.attn_pre_proj.median,time_stats.mlp_up_proj.median,n_head,n_kv_head,"
          "n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,num_tensor_parallel_workers")
SHAPE_8B = "32,8,4096,14336,128256,True"


def profile(tmp_path, rows, header=HEADER):
    p = tmp_path / "mine.csv"
    p.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return str(p)


def test_a_users_profile_is_read_interpolated_in_tp_and_made_monotone(tmp_path):
    path = profile(tmp_path, [f"0.01,0.1,0.3,{SHAPE_8B},1,1", f"0.02,0.5,1.5,{SHAPE_8B},100,1",
                              f"0.02,0.4,1.4,{SHAPE_8B},200,1",  # faster than 100: raised to it
                              f"0.01,0.05,0.1,{SHAPE_8B},1,4", f"0.01,0.2,0.5,{SHAPE_8B},100,4",
                              f"0.01,0.3,0.7,{SHAPE_8B},200,4"])
    k = Kernels(rm(service="kernels", profile=path, tp=1))
    assert k.source.kind == "measured" and path in k.source.how
    assert float(k.kernels(200)) == pytest.approx(32 * 2.0e-3 + 0.02e-3, rel=1e-12)
    assert k.changes and "1 of 6" in k.changes[0] and "by 11%" in k.changes[0]  # 1.8 ms raised to 2.0
    two = Kernels(rm(service="kernels", profile=path, tp=2, gpus=2))
    # tp 2: halfway in log2 between tp 1 and tp 4
    assert float(two.kernels(100)) == pytest.approx(32 * 0.5 * (2.0e-3 + 0.7e-3) + 0.5 * (0.02e-3 + 0.01e-3), rel=1e-12)
    with pytest.raises(ConfigError) as info:
        Kernels(rm(service="kernels", profile=path, tp=8, gpus=8), "pipeline.channels.judge.rm")
    assert info.value.key == "pipeline.channels.judge.rm.tp" and "1, 4" in info.value.allowed


BAD = {
    "lacks a column": (HEADER.replace(",num_tensor_parallel_workers", ""), [f"0.01,0.1,0.3,{SHAPE_8B},1"]),
    "no operator": ("time_stats.emb.median," + HEADER.split(",", 3)[3], [f"0.01,{SHAPE_8B},1,1"]),
    "empty": (HEADER, []),
    "a word": (HEADER, [f"0.01,fast,0.3,{SHAPE_8B},1,1"]),
    "negative": (HEADER, [f"0.01,-0.1,0.3,{SHAPE_8B},1,1"]),
    "fractional tokens": (HEADER, [f"0.01,0.1,0.3,{SHAPE_8B},1.5,1"]),
    "zero tp": (HEADER, [f"0.01,0.1,0.3,{SHAPE_8B},1,0"]),
    "gated": (HEADER, [f"0.01,0.1,0.3,{SHAPE_8B.replace('True', 'maybe')},1,1"]),
    "two shapes": (HEADER, [f"0.01,0.1,0.3,{SHAPE_8B},1,1", f"0.01,0.1,0.3,{SHAPE_8B.replace('4096', '2048')},2,1"]),
    "another model": (HEADER, [f"0.01,0.1,0.3,{SHAPE_8B.replace('14336', '11008')},1,1"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_profile_is_one_clear_line(tmp_path, case):
    header, rows = BAD[case]
    path = profile(tmp_path, rows, header)
    with pytest.raises(ConfigError) as info:
        Kernels(rm(service="kernels", profile=path), "pipeline.channels.judge.rm")
    assert info.value.key == "pipeline.channels.judge.rm.profile" and info.value.value == path
    assert "\n" not in str(info.value)


def test_an_unreadable_profile(tmp_path):
    p = tmp_path / "bin.csv"
    p.write_bytes(b"\xff\xfe\x00garbage\x00")
    with pytest.raises(ConfigError) as info:
        Kernels(rm(service="kernels", profile=str(p)), "k")
    assert info.value.key == "k.profile"


# ----------------------------------------------------------------------------
# The efficiency curve.


def test_the_curve_by_hand():
    """tau + the g-norm of the weights' read and the matmuls + the replicated elementwise bytes."""
    c = Curve(tau_s=30e-6, eta=0.8, e_max=0.7, sharpness=2.0, kappa=40.0)
    lay = Layer(params=2e8, d_model=4096, bytes=2.0)
    weights = 2e8 * 2 / (2 * 2e12 * 0.8)
    compute = 2 * 2e8 * 512 / (2 * 300e12 * 0.7)
    want = 30e-6 + math.sqrt(weights ** 2 + compute ** 2) + 40 * 512 * 4096 / 2e12
    assert float(layer_seconds(c, lay, 2, 512, 300e12, 2e12)) == pytest.approx(want, rel=1e-12)
    assert float(efficiency(c, lay, 2, 512, 300e12, 2e12)) == pytest.approx(2 * 2e8 * 512 / (2 * 300e12 * want))
    assert layer_params(4096, 14336, 32, 8) == 2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert layer_params(2560, 10240, 32, 32, gated=False) == 4 * 2560 ** 2 + 2 * 2560 * 10240
    ms = model_size(RMModelConf(**MODELS["8B"]))
    assert ms.non_embedding == 32 * (layer_params(4096, 14336, 32, 8) + 2 * 4096) + 2 * 4096


@pytest.mark.parametrize("seed", range(3))
def test_a_fit_recovers_the_parameters_that_made_its_data(seed):
    rng = np.random.default_rng(seed)
    truth = Curve(tau_s=float(rng.uniform(10e-6, 80e-6)), eta=float(rng.uniform(0.5, 0.95)),
                  e_max=float(rng.uniform(0.4, 0.9)), sharpness=float(rng.uniform(1.2, 4.0)),
                  kappa=float(rng.uniform(5.0, 80.0)))
    rows = []
    for params, d in ((2e8, 4096), (8.6e8, 8192), (7.9e7, 2560)):
        for (peak, bw) in ((312e12, 2.039e12), (989.5e12, 3.35e12)):
            for tp in (1, 2, 4, 8):
                rows.append(pd.DataFrame({"params": params, "d_model": d, "bytes": 2.0, "tp": tp,
                                          "tokens": np.array(FIT_TOKENS, float), "peak": peak, "bandwidth": bw}))
    df = pd.concat(rows, ignore_index=True)
    df["seconds"] = predicted(truth, df)
    got = fit(df)
    for f in ("tau_s", "eta", "e_max", "sharpness", "kappa"):
        assert getattr(got, f) == pytest.approx(getattr(truth, f), rel=2e-3), f


def test_the_shipped_curve_is_a_fit_of_the_shipped_tables():
    refit = fit(layer_times.measured_rows())
    shipped = shipped_curve()
    for f in ("tau_s", "eta", "e_max", "sharpness", "kappa"):
        assert getattr(refit, f) == pytest.approx(getattr(shipped, f), rel=2e-3), f
    assert json.loads(curve_text(shipped)) == json.loads((DATA / "curve.json").read_text())


def loo_errors(file: str) -> pd.Series:
    rows = layer_times.measured_rows()
    c = fit(rows[rows.file != file])
    mine = rows[(rows.file == file) & rows.tokens.isin([256, 1024, 4096])]
    at = pd.MultiIndex.from_frame(mine[["tp", "tokens"]])
    return pd.Series(predicted(c, mine) / mine.seconds.to_numpy() - 1.0, index=at)


@pytest.mark.parametrize("file", ["h100/Llama-2-7b-hf", "a100/Meta-Llama-3-8B"])
def test_leave_one_out_errors_of_the_judges_neighbours(file):
    """The curve fitted without a file predicts its layer seconds at 256, 1024 and 4096 tokens within
    20% at every tp (docs/kernels.md lists every file's)."""
    err = loo_errors(file)
    assert len(err) == 12 and err.abs().max() < 0.2, err


@pytest.mark.long  # eight fits: 3 CPU s
def test_leave_one_out_errors_of_every_file():
    """Within 25% for every file (phi-2 on the H100 at 1024 tokens is the worst, its measured pass an outlier
    of its own neighbours)."""
    for file in layer_times.measured_rows().file.unique():
        assert loo_errors(file).abs().max() < 0.25, file


def test_the_roofline_on_the_curve():
    """rm.mfu null: the compute term at the curve's MFU of the pass (times rm.mfu_scale, at most 1); its
    tabulated curve agrees with the closed form at the table's points and within 0.1% between them."""
    c, m, g = shipped_curve(), MODELS["8B"], GPUS["H100"]
    lay = layer_times.model_layer(RMModelConf(**m))
    base = Roofline(rm(mfu=None, overhead_s=0.01))
    size = model_size(RMModelConf(**m)).non_embedding
    for n in (64.0, 450.0, 4096.0, 14_400.0, 100_000.0):
        e = float(efficiency(c, lay, 1, n, 989.5e12, 3.35e12))
        flops = 2 * size * n + 2 * 32 * 4096 * n * n
        want = max(flops / (989.5e12 * e), size * 2 / 3.35e12) + 0.01
        assert float(base.seconds(1, n, n * n, n)) == pytest.approx(want, rel=1e-3), n
        assert float(base.efficiency(n)) == pytest.approx(e, rel=1e-3)
        dec = (2 * size * n + 4 * 32 * 4096 * 1000 * n) / (989.5e12 * e)
        mem = (size * 2 + 2 * 32 * 1024 * 2 * 1000 * n) / 3.35e12
        assert float(base.decode_seconds(n, 1000 * n)) == pytest.approx(max(dec, mem) + 0.01, rel=1e-3)
    flat = Roofline(rm(mfu=0.4, overhead_s=0.01))  # a set MFU: flat in the pass, as before the curve
    for b, ctx in ((1, 500.0), (64, 64_000.0), (512, 2e6)):
        dec = (2 * size * b + 4 * 32 * 4096 * ctx) / (989.5e12 * 0.4)
        mem = (size * 2 + 2 * 32 * 1024 * 2 * ctx) / 3.35e12
        assert float(flat.decode_seconds(b, ctx)) == pytest.approx(max(dec, mem) + 0.01, rel=1e-12)
    grid = layer_times.CURVE_TOKENS[::37]
    np.testing.assert_allclose(base.efficiency(grid), efficiency(c, lay, 1, grid, 989.5e12, 3.35e12), rtol=1e-12)
    faster = Roofline(rm(mfu=None, mfu_scale=1.2))
    assert float(faster.efficiency(4096)) == pytest.approx(1.2 * float(base.efficiency(4096)), rel=1e-12)
    assert float(Roofline(rm(mfu=None, mfu_scale=100.0)).efficiency(4096)) == 1.0
    assert "efficiency curve" in base.describe() and "MFU 0.4" in Roofline(rm(mfu=0.4)).describe()


def test_the_issues_gap_between_the_flat_roofline_and_measured_kernels():
    """Issue 48's reading of the H100 7B file: the 0.4 roofline is too fast for short passes and too slow
    for long ones; the curve and the kernels agree with each other within 10% from 64 tokens on."""
    flat = Roofline(rm("7B", "H100", mfu=0.4))
    curve = Roofline(rm("7B", "H100"))
    kern = Kernels(rm("7B", "H100", service="kernels"))

    def batch(model, n):  # n tokens a pass in sequences of at most 256
        seq = min(n, 256)
        return float(model.seconds(n // seq, n, n // seq * seq * seq, seq))

    ratio = {n: batch(kern, n) / batch(flat, n) for n in (64, 256, 1024, 4096)}
    assert ratio[64] > 1.3 and 0.8 < ratio[256] < 1.2 and ratio[1024] < 0.75 and ratio[4096] < 0.75, ratio
    for n in (64, 256, 1024, 4096, 14_336):
        assert batch(curve, n) == pytest.approx(batch(kern, n), rel=0.1), n


@pytest.mark.parametrize("seed", range(4))
def test_the_engines_agree_under_the_kernel_model(seed):
    """tests/test_gpu_rm.py's random pipelines with every GPU pool an A100 under measured kernels (slowed
    20-fold by kernel_overhead so that queues form): the lanes engine, its per-lane loop and SimPy give the
    same schedule to the last bit."""
    from test_gpu_rm import random_pcfg

    pcfg = random_pcfg(seed)
    for ch in [c for c in pcfg.channels.values() if c.kind == "gpu_rm"]:
        ch.rm = replace(ch.rm, gpu=GpuConf(**GPUS["A100"]), service="kernels", kernel_overhead=20.0)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    queued = False
    for blocking, timeout in ((False, None), (True, 0.6)):
        sim = run_simpy(draws, blocking, timeout)
        assert_same_schedule(run_lanes(draws, blocking, timeout), sim, f"lanes, seed {seed}")
        assert_same_schedule(run_lanes(draws, blocking, timeout, gpu_loop=True), sim, f"loop, seed {seed}")
        queued |= bool((sim.service_start > sim.submit_time).any())
    assert queued


def test_deriving_a_table_keeps_the_medians_and_merges_repeated_rows(tmp_path):
    """racsim.tools.kernels: of a file in the shared format, each operator's median (std dropped), a (tokens, tp)
    measured twice as the median of the two to 5 significant digits, the attribution line first; read back, the
    layer's time is the sum of the operators."""
    from racsim.tools.kernels import ATTRIBUTION, derive_file

    head = ("time_stats.emb.median,time_stats.emb.std,time_stats.attn_pre_proj.median,time_stats.attn_pre_proj.std,"
            "time_stats.add.median,time_stats.add.std,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,"
            "num_tokens,num_tensor_parallel_workers")
    shape = "32,8,4096,14336,128256,True"
    src = tmp_path / "m.csv"
    rows = [f"0.1,0.01,0.5,0.02,0.03,0.001,{shape},8,1", f"0.2,0.01,0.7,0.02,0.05,0.001,{shape},8,1",
            f"0.1,0.01,0.3,0.02,0.02,0.001,{shape},1,1"]
    src.write_text("\n".join([head, *rows]) + "\n")
    text = derive_file(src)
    lines = text.splitlines()
    assert lines[0] == ATTRIBUTION and "std" not in lines[1]
    assert lines[2:] == [f"0.1,0.3,0.02,{shape},1,1", f"0.15,0.6,0.04,{shape},8,1"]
    out = tmp_path / "d.csv"
    out.write_text(text)
    t = layer_times.read_table(str(out), "x")
    np.testing.assert_allclose(t.rows[1].layer, [0.32e-3, 0.64e-3], rtol=1e-12)
    np.testing.assert_allclose(t.rows[1].emb, [0.1e-3, 0.15e-3], rtol=1e-12)


def test_the_rollout_engines_decode_and_prefill_on_the_kernels():
    """pipeline.generation.engines.service=kernels: a decode step of b sequences over X cached tokens is b tokens
    through every layer and the embedding of the table serving the policy, plus the KV cache's bytes over the HBM
    bandwidth, plus overhead_s; a prefill pass adds attention at the engines' mfu; both Python floats, and the
    lane's two engines make the same schedules on them."""
    from racsim.config.defaults import compose_config
    from racsim.config.spec import scenario
    from racsim.generation.draws import engine_model, kv_bytes_per_token
    from racsim.generation.schedule import async_schedules
    from racsim.seeds import rng_for

    tiny = ["pipeline.steps=4", "pipeline.batch_size=16", "pipeline.generation.engines.gpus=2",
            "pipeline.generation.engines.concurrency=8", "pipeline.generation.engines.response_tokens.mean=128",
            "pipeline.generation.engines.max_response_tokens=512", "pipeline.generation.engines.service=kernels"]
    cfg = scenario(compose_config("scenario=async/areal", *tiny))
    e = cfg.pipeline.generation.engines
    model = engine_model(e)
    assert isinstance(model, Kernels) and model.scale == 1.0 and model.attn_mfu == e.mfu
    m, g = e.model, e.gpu
    row = layer_times.kernel_source(m, g, e.tp).row
    bw, peak = e.tp * g.mem_bw_tbs * 1e12, e.tp * g.peak_tflops * 1e12
    for b, X in ((1, 300.0), (7, 5000.0), (128, 2.5e5)):
        layer, emb = (float(v) for v in row.at(b))
        step = model.decode_step(b, X)
        assert type(step) is float
        assert step == pytest.approx(m.layers * layer + emb + X * kv_bytes_per_token(m) / bw + e.overhead_s, rel=1e-12)
    prompts = [100, 37, 400]
    n = sum(prompts)
    layer, emb = (float(v) for v in row.at(n))
    attn = 2.0 * m.layers * m.d_model * sum(p * p for p in prompts) / (peak * e.mfu)
    pass_s = model.seconds(3, float(n), float(sum(p * p for p in prompts)), 400.0)
    assert type(pass_s) is float and pass_s == pytest.approx(m.layers * layer + emb + attn + e.overhead_s, rel=1e-12)
    one = async_schedules(cfg.pipeline, 2, rng_for(1, "pipeline"), blocking=False, engine="lanes")
    two = async_schedules(cfg.pipeline, 2, rng_for(1, "pipeline"), blocking=False, engine="simpy")
    for key in one:
        assert_same_schedule(one[key], two[key], key)


def services_table() -> dict:
    """docs/capacity.md's generated capacity.services block: (scenario, service) -> GPUs."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "capacity.md").read_text()
    block = text[text.index("<!-- generated:capacity.services -->"):]
    block = block[:block.index("<!-- /generated -->")]
    rows = re.findall(r"^\s*(judge_\w+)\s+(.+?)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+$", block, re.M)
    return {(scen, service): int(n) for scen, service, n in rows}


def test_the_capacity_pages_reading_of_the_services_table():
    """What docs/capacity.md says of its services table, read off the table: the curve and the kernels agree
    where the load decides; 10% adds one GPU to the judge, the bursty judge and the autoscaled pool and none to
    the preempted pool; 30% adds one more to the bursty judge and the preempted pool, none to the other two;
    no overhead brings back the flat 0.4's answer there."""
    t = services_table()
    load_decides = ("judge_rm_h100", "judge_rm_autoscale", "judge_rm_bursts", "judge_rm_preempt")
    assert {s for s, _ in t} == set(load_decides) | {"judge_rm_faults"}
    for s in load_decides:
        kernels, plus10, plus30 = (t[(s, f"kernels{x}")] for x in ("", " + 10%", " + 30%"))
        assert t[(s, "roofline, efficiency curve")] == kernels, s
        assert plus10 - kernels == (0 if s == "judge_rm_preempt" else 1), s
        assert plus30 - plus10 == (1 if s in ("judge_rm_bursts", "judge_rm_preempt") else 0), s
        assert plus30 < t[(s, "roofline, MFU 0.4")], s


def test_the_capacity_pages_reading_of_the_faults_rows():
    """What docs/capacity.md says of judge_rm_faults' rows (its candidate decided first), read off the table."""
    t = services_table()
    f = {s: n for (scen, s), n in t.items() if scen == "judge_rm_faults"}
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "capacity.md").read_text().split())
    assert f["roofline, efficiency curve"] == f["kernels"] and f["kernels + 10%"] == f["kernels + 30%"]
    said = (f"its rows read as the judge's do ({f['kernels']} GPUs under the curve and the kernels, "
            f"{f['kernels + 10%']} with 10% or 30% overhead)")
    assert said in text
    assert (f"now follows it as the judge does: {f['kernels']} with the kernels, {f['kernels + 10%']} with 10% and "
            f"with 30%.") in text
