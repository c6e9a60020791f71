"""Service models (racsim/pipeline/service.py), the RM/GPU catalogs and configuration,
and the uniform latency kind the capacity scenarios use."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import MISSING, OmegaConf

from racsim.config.defaults import catalog, default_config
from racsim.config.schema import (
    ChannelConf,
    GpuConf,
    LatencyConf,
    RacsimConf,
    RMConf,
    RMModelConf,
    register_configs,
)
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.latency import build_latency
from racsim.pipeline.service import (
    Profiled,
    Roofline,
    build_service,
    model_size,
)

GPU_CATALOG, RM_CATALOG = catalog("gpu"), catalog("model")  # conf/rm/*/*.yaml

CONF = Path(__file__).resolve().parents[1] / "conf"


# ----------------------------------------------------------------------------
# Roofline: a hand-worked case.


def test_roofline_hand_worked_8b_on_h100():
    """8B RM (Llama-3.1-8B shape), one sequence of 450 tokens, H100, MFU 0.4.

    Non-embedding parameters, by hand: per layer q and o 4096 x 4096 each, k and v
    4096 x 1024 each (8 KV heads of 128), the SwiGLU MLP 3 x 4096 x 14336, two
    norms of 4096; 32 layers, plus the final norm and the 4096 x 1 score head.
    """
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert per_layer == 218_112_000
    n_ne = 32 * per_layer + 4096 + 4096
    assert n_ne == 6_979_592_192
    flops = 2 * n_ne * 450 + 2 * 32 * 4096 * 450**2  # 6.2816e12 (weights) + 5.31e10 (attention)
    assert flops == 6_334_717_132_800
    compute = flops / (989.5e12 * 0.4)  # H100 dense BF16 peak x MFU
    assert compute == pytest.approx(0.016005, rel=1e-4)  # 16.0 ms
    floor = n_ne * 2 / 3.35e12  # bf16 weights read once, 3.35 TB/s
    assert floor == pytest.approx(0.0041669, rel=1e-4)  # 4.2 ms: compute-bound
    rm = RMConf(model=RMModelConf(**RM_CATALOG["8B"]), gpu=GpuConf(**GPU_CATALOG["H100"]), mfu=0.4, overhead_s=0.0)
    model = Roofline(rm)
    assert model_size(rm.model).non_embedding == n_ne
    got = float(model.seconds(1, 450.0, 450.0**2, 450.0))
    assert got == pytest.approx(compute, rel=1e-12)
    rm.overhead_s = 0.01
    assert float(Roofline(rm).seconds(1, 450.0, 450.0**2, 450.0)) == pytest.approx(compute + 0.01, rel=1e-12)


def test_roofline_padding_tp_and_memory_floor():
    """A flat MFU (rm.mfu set, as before the efficiency curve): padding, tp and the weights' floor."""
    rm = RMConf(model=RMModelConf(**RM_CATALOG["8B"]), gpu=GpuConf(**GPU_CATALOG["H100"]), mfu=0.4, overhead_s=0.0)
    packed = Roofline(RMConf(**{**rm.__dict__, "padded": False}))
    padded = Roofline(rm)
    # padded: two sequences of 100 and 400 tokens cost as two of 400
    assert float(padded.seconds(2, 500.0, 100.0**2 + 400.0**2, 400.0)) == pytest.approx(
        float(packed.seconds(2, 800.0, 2 * 400.0**2, 400.0)), rel=1e-12)
    assert float(packed.seconds(2, 500.0, 170000.0, 400.0)) < float(padded.seconds(2, 500.0, 170000.0, 400.0))
    # tensor parallelism divides compute and the floor
    tp2 = Roofline(RMConf(**{**rm.__dict__, "tp": 2}))
    x = (8, 8 * 450.0, 8 * 450.0**2, 450.0)
    assert float(tp2.seconds(*x)) == pytest.approx(float(padded.seconds(*x)) / 2, rel=1e-12)
    # one token of a 70B model on B200s x 8: the weights' read time, not the FLOPs
    big = RMConf(model=RMModelConf(**RM_CATALOG["70B"]), gpu=GpuConf(**GPU_CATALOG["B200"]), gpus=8, tp=8, mfu=0.4,
                 overhead_s=0.0)
    m = Roofline(big)
    floor = model_size(big.model).non_embedding * 2 / (8 * 8e12)
    assert float(m.seconds(1, 1.0, 1.0, 1.0)) == pytest.approx(floor, rel=1e-12)


def test_catalogs_are_the_yaml_files():
    """GPU_CATALOG and RM_CATALOG are conf/rm/gpu/*.yaml and conf/rm/model/*.yaml (their one
    source), keyed by each file's name; every entry sets every field of its dataclass,
    which has no default of its own (no second, competing catalog entry)."""
    for group, cat, conf in (("gpu", GPU_CATALOG, GpuConf), ("model", RM_CATALOG, RMModelConf)):
        files = sorted((CONF / "rm" / group).glob("*.yaml"))
        assert len(files) == len(cat) >= 4, group
        for f in files:
            spec = OmegaConf.to_container(OmegaConf.load(f))
            assert cat[spec["name"]] == spec, f
            # the option name on the command line is the name, spelled as a file name
            assert f.stem == (spec["name"] if group == "gpu" else spec["name"].lower().replace(".", "_")), f
        fields = [f.name for f in dataclasses.fields(conf)]
        assert all(list(spec) == fields for spec in cat.values()), group
        assert all(getattr(conf(), f) == MISSING for f in fields), f"{conf.__name__} has a default beside conf/rm/{group}/"
    assert set(GPU_CATALOG) == {"A100", "H100", "H200", "L40S", "B200"} and set(RM_CATALOG) == {"1.5B", "7B", "8B", "70B"}
    sizes = {n: model_size(RMModelConf(**s)).total / 1e9 for n, s in RM_CATALOG.items()}
    assert sizes["1.5B"] == pytest.approx(1.54, abs=0.05) and sizes["7B"] == pytest.approx(6.6, abs=0.1)
    assert sizes["8B"] == pytest.approx(7.5, abs=0.05) and sizes["70B"] == pytest.approx(69.5, abs=0.5)


# ----------------------------------------------------------------------------
# Configuration.


def rm_conf(**rm) -> RMConf:
    """An RM server: the 8B model on an H100 (from the catalogs) unless given."""
    return RMConf(**{"model": RMModelConf(**RM_CATALOG["8B"]), "gpu": GpuConf(**GPU_CATALOG["H100"]), **rm})


def gpu_cfg(**rm) -> RacsimConf:
    cfg = default_config("~scenario")  # conf/'s defaults, no slow channel
    cfg.pipeline.channels["judge"] = ChannelConf(kind="gpu_rm", rm=rm_conf(**rm))
    return cfg


def error(cfg) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    return info.value


def built(cfg):
    """Validate, then build the judge's service model (where the memory check lives)."""
    validate(cfg)
    return build_service(cfg.pipeline.channels["judge"].rm, "pipeline.channels.judge.rm")


def fit_error(cfg) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        built(cfg)
    return info.value


def test_model_that_does_not_fit_is_a_config_error():
    ex = fit_error(gpu_cfg(model=RMModelConf(**RM_CATALOG["70B"])))
    assert ex.key == "pipeline.channels.judge.rm.tp"
    assert "does not fit" in ex.allowed and "tp >= 4" in ex.allowed, ex
    built(gpu_cfg(model=RMModelConf(**RM_CATALOG["70B"]), gpus=4, tp=4))
    built(gpu_cfg(model=RMModelConf(**RM_CATALOG["70B"]), gpu=GpuConf(**GPU_CATALOG["B200"])))
    ex = fit_error(gpu_cfg(model=RMModelConf(**RM_CATALOG["8B"]), gpu=GpuConf(**GPU_CATALOG["L40S"]), token_budget=10**6))
    assert ex.key == "pipeline.channels.judge.rm.tp" and "token_budget" in ex.allowed


@pytest.mark.parametrize("change,key,allowed", [
    (dict(kind="warp"), "pipeline.channels.judge.kind", "queue, gpu_rm"),
    (dict(rm=None), "pipeline.channels.judge.rm", "when kind is gpu_rm"),
    (dict(workers=4), "pipeline.channels.judge.workers", "rm.gpus"),
    (dict(kernel=[0.5]), "pipeline.channels.judge.kernel", "null for a gpu_rm"),
    (dict(rm_gpus=3, rm_tp=2), "pipeline.channels.judge.rm.gpus", "multiple of tp"),
    (dict(rm_tp=3), "pipeline.channels.judge.rm.tp", "divisor of model.n_heads"),
    (dict(rm_order="lifo"), "pipeline.channels.judge.rm.order", "fifo, shortest"),
    (dict(rm_service="guess"), "pipeline.channels.judge.rm.service", "roofline, profiled, kernels"),
    (dict(rm_service="profiled"), "pipeline.channels.judge.rm.profile", "racsim-profile"),
    (dict(rm_service="kernels", rm_profile="no/such.csv"), "pipeline.channels.judge.rm.profile", "per-layer operator"),
    (dict(rm_mfu=1.5), "pipeline.channels.judge.rm.mfu", "(0, 1]"),
    (dict(rm_mfu=0.0), "pipeline.channels.judge.rm.mfu", "null (the efficiency curve"),
    (dict(rm_mfu_scale=0.0), "pipeline.channels.judge.rm.mfu_scale", "positive"),
    (dict(rm_mfu_scale=float("inf")), "pipeline.channels.judge.rm.mfu_scale", "positive"),
    (dict(rm_attn_mfu=1.2), "pipeline.channels.judge.rm.attn_mfu", "(0, 1]"),
    (dict(rm_kernel_overhead=-0.1), "pipeline.channels.judge.rm.kernel_overhead", ">= 0"),
    (dict(rm_max_batch=0), "pipeline.channels.judge.rm.max_batch", ">= 1"),
    (dict(rm_max_wait_s=-1.0), "pipeline.channels.judge.rm.max_wait_s", ">= 0"),
    (dict(rm_sequences_per_sample=0), "pipeline.channels.judge.rm.sequences_per_sample", ">= 1"),
])
def test_gpu_rm_config_errors_name_the_key(change, key, allowed):
    cfg = gpu_cfg()
    ch = cfg.pipeline.channels["judge"]
    for k, v in change.items():
        if k.startswith("rm_"):
            setattr(ch.rm, k[3:], v)
        else:
            setattr(ch, k, v)
    ex = error(cfg)
    assert ex.key == key and allowed in ex.allowed, ex


def test_queue_channel_with_an_rm_block_is_an_error():
    cfg = default_config("~scenario")
    cfg.pipeline.channels["judge"] = ChannelConf(rm=rm_conf())
    assert error(cfg).key == "pipeline.channels.judge.rm"


@pytest.fixture(scope="module")
def hydra_ctx():
    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        yield


def test_an_rm_without_gpu_or_model_says_which_catalog_to_pick(hydra_ctx):
    """RMConf's model and gpu have no default beside the catalogs: a fast scorer given only
    its model is an error that names the gpu key and a working override."""
    cfg = compose("config", overrides=["+rm/model@pipeline.fast_rm.model=8b"])
    ex = error(cfg)
    assert ex.key == "pipeline.fast_rm.gpu" and "+rm/gpu@pipeline.fast_rm.gpu=" in ex.allowed, ex
    hint = ex.allowed.split("e.g. ", 1)[1]
    cfg = compose("config", overrides=["+rm/model@pipeline.fast_rm.model=8b", hint])
    validate(cfg)
    assert OmegaConf.to_container(cfg.pipeline.fast_rm.gpu) == GPU_CATALOG["H100"]
    ex = error(compose("config", overrides=["+rm/gpu@pipeline.fast_rm.gpu=A100"]))
    assert ex.key == "pipeline.fast_rm.model" and "+rm/model@pipeline.fast_rm.model=8b" in ex.allowed, ex


@pytest.mark.parametrize("gpu", sorted(GPU_CATALOG))
def test_every_gpu_option_composes(hydra_ctx, gpu):
    cfg = compose("config", overrides=["+channel@pipeline.channels.rm=judge_gpu_rm",
                                       f"rm/gpu@pipeline.channels.rm.rm.gpu={gpu}"])
    assert OmegaConf.to_container(cfg.pipeline.channels.rm.rm.gpu) == GPU_CATALOG[gpu]
    validate(cfg)
    validate(OmegaConf.to_object(cfg))


@pytest.mark.parametrize("model,tp", [("1_5b", 1), ("7b", 1), ("8b", 1), ("70b", 4)])
def test_every_rm_model_option_composes(hydra_ctx, model, tp):
    over = ["+channel@pipeline.channels.rm=judge_gpu_rm", f"rm/model@pipeline.channels.rm.rm.model={model}",
            f"pipeline.channels.rm.rm.tp={tp}", f"pipeline.channels.rm.rm.gpus={tp}"]
    cfg = compose("config", overrides=over)
    validate(cfg)
    build_service(cfg.pipeline.channels.rm.rm, "pipeline.channels.rm.rm")
    if tp > 1:  # without tensor parallelism the 70B RM does not fit an H100
        cfg = compose("config", overrides=over[:2])
        validate(cfg)
        with pytest.raises(ConfigError):
            build_service(cfg.pipeline.channels.rm.rm, "pipeline.channels.rm.rm")


# ----------------------------------------------------------------------------
# The profiled model.


def write_table(path, batches, seqs, f, extra_header=""):
    lines = ["# racsim-profile: test table", "# device: test", extra_header, "batch_size,seq_len,seconds"]
    lines += [f"{b},{s},{f(b, s)!r}" for b in batches for s in seqs]
    path.write_text("\n".join(x for x in lines if x) + "\n")


def test_profiled_interpolates_bilinearly(tmp_path):
    f = lambda b, s: 0.01 + 1e-5 * b * s + 1e-3 * b  # noqa: E731  (bilinear: exact in between)
    p = tmp_path / "t.csv"
    write_table(p, [1, 2, 4, 8], [64, 128, 256], f)
    m = Profiled(str(p))
    assert m.header["device"] == "test"
    for b in (1, 2, 3, 5.5, 8):
        for s in (64, 100, 200, 256):
            assert float(m.at(b, s)) == pytest.approx(f(b, s), rel=1e-12)
    # past the table: proportional to the largest batch / length; below: clamped
    assert float(m.at(16, 256)) == pytest.approx(2 * f(8, 256), rel=1e-12)
    assert float(m.at(8, 512)) == pytest.approx(2 * f(8, 256), rel=1e-12)
    assert float(m.at(1, 10)) == pytest.approx(f(1, 64), rel=1e-12)
    # as a service model: padded batches use (count, longest); packed ones the mean length
    assert float(m.seconds(4, 300.0, 0.0, 128.0)) == pytest.approx(f(4, 128), rel=1e-12)
    packed = Profiled(str(p), padded=False)
    assert float(packed.seconds(4, 400.0, 0.0, 256.0)) == pytest.approx(f(4, 100), rel=1e-12)


def test_profiled_takes_a_monotone_envelope(tmp_path):
    table = {(1, 10): 1.0, (1, 20): 0.9, (2, 10): 0.8, (2, 20): 2.0}
    p = tmp_path / "t.csv"
    write_table(p, [1, 2], [10, 20], lambda b, s: table[(b, s)])
    m = Profiled(str(p))
    assert m.table.tolist() == [[1.0, 1.0], [1.0, 2.0]]
    assert np.all(np.diff(m.table, axis=0) >= 0) and np.all(np.diff(m.table, axis=1) >= 0)


def test_profiled_errors(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("batch,seconds\n1,0.1\n")
    with pytest.raises(ConfigError, match="columns batch_size, seq_len, seconds"):
        Profiled(str(p))
    write_table(p, [1, 2], [10], lambda b, s: 0.1)
    p.write_text(p.read_text() + "2,20,0.3\n")
    with pytest.raises(ConfigError, match="full grid"):
        Profiled(str(p))
    with pytest.raises(ConfigError) as info:
        build_service(rm_conf(service="profiled", profile=str(tmp_path / "missing.csv")), "x.rm")
    assert info.value.key == "x.rm.profile"


# ----------------------------------------------------------------------------
# Uniform latencies (the code verifier's U[1, 40] s).


def test_uniform_latency():
    lat = build_latency(LatencyConf(kind="uniform", mean=None, low=1.0, high=40.0))
    x = lat.sample(np.random.default_rng(0), 400_000)
    assert x.min() >= 1.0 and x.max() <= 40.0
    assert lat.mean() == pytest.approx(20.5, rel=1e-12)
    assert x.mean() == pytest.approx(20.5, abs=5 * 39 / np.sqrt(12 * 400_000))
    assert np.allclose(lat.cdf([0.0, 1.0, 20.5, 40.0, 50.0]), [0, 0, 0.5, 1, 1])
    assert np.allclose(lat.quantile([0.0, 0.25, 1.0]), [1.0, 10.75, 40.0])
    hist = np.histogram(x, bins=13, range=(1, 40))[0] / x.size
    assert np.allclose(hist, 1 / 13, atol=0.003)
    # matched to the mean: U[low, 2 mean - low]
    assert build_latency(LatencyConf(kind="uniform", mean=10.0)).quantile(1.0) == 20.0
    assert build_latency(LatencyConf(kind="uniform", mean=10.0, low=4.0)).quantile(0.0) == 4.0
    d = build_latency(LatencyConf(kind="uniform", mean=None, low=1.0, high=40.0, discrete=True))
    assert d.mean() == pytest.approx(20.5, rel=1e-9)


@pytest.mark.parametrize("conf,key,allowed", [
    (dict(mean=None), "lat.high", "uniform needs mean"),
    (dict(mean=5.0, low=1.0, high=40.0), "lat.mean", "midpoint 20.5"),
    (dict(mean=2.0, low=3.0), "lat.mean", ">= low"),
    (dict(mean=None, low=5.0, high=2.0), "lat.high", "> low"),
])
def test_uniform_latency_errors(conf, key, allowed):
    with pytest.raises(ConfigError) as info:
        build_latency(LatencyConf(kind="uniform", **conf), "lat")
    assert info.value.key == key and allowed in info.value.allowed, info.value
