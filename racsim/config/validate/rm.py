"""An RM server (:class:`~racsim.config.schema.RMConf`: its :class:`RMModelConf` and
:class:`GpuConf`, the pool, the service model and the batcher): a gpu_rm channel's ``rm``
and ``pipeline.fast_rm``. Whether the model fits the GPU's memory is checked where the
server is built (racsim.pipeline.service.build_service)."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import BATCH_ORDERS, BATCH_POLICIES, SERVICE_MODELS
from racsim.config.validate.common import (finite, fraction, int_at_least, need, need_file, need_one_of, nonneg,
                                          positive)
from racsim.config.validate.latency import validate_latency


def validate_rm(rm: Any, key: str) -> None:
    """Range checks of an RM server, block by block."""
    m, g = rm.model, rm.gpu
    _model(m, f"{key}.model")
    _gpu(g, f"{key}.gpu")
    _pool(rm, key)
    _service(rm, key)
    _batcher(rm, key)
    validate_latency(rm.prompt_tokens, f"{key}.prompt_tokens")
    validate_latency(rm.response_tokens, f"{key}.response_tokens")


def _model(m: Any, key: str) -> None:
    for f in ("layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "vocab"):
        int_at_least(f"{key}.{f}", getattr(m, f), 1)
    need(m.d_model % m.n_heads == 0, f"{key}.n_heads", m.n_heads, f"a divisor of d_model ({m.d_model})")
    need(m.n_heads % m.n_kv_heads == 0, f"{key}.n_kv_heads", m.n_kv_heads, f"a divisor of n_heads ({m.n_heads})")
    positive(f"{key}.bytes_per_param", m.bytes_per_param)


def _gpu(g: Any, key: str) -> None:
    for f in ("peak_tflops", "mem_bw_tbs", "memory_gb"):
        positive(f"{key}.{f}", getattr(g, f))
    nonneg(f"{key}.price_per_hour", g.price_per_hour)


def _pool(rm: Any, key: str) -> None:
    """gpus / tp replicas, tp splitting the model's heads."""
    int_at_least(f"{key}.gpus", rm.gpus, 1)
    int_at_least(f"{key}.tp", rm.tp, 1)
    need(rm.model.n_heads % rm.tp == 0, f"{key}.tp", rm.tp, f"a divisor of model.n_heads ({rm.model.n_heads})")
    need(rm.gpus % rm.tp == 0, f"{key}.gpus", rm.gpus, f"a multiple of tp ({rm.tp}): the pool is gpus / tp replicas")


def _service(rm: Any, key: str) -> None:
    """How a batch's seconds are told: a roofline (mfu or the efficiency curve, overhead, memory use), a
    measured profile, or measured kernels (attention's MFU, their overhead; a profile of the user's own)."""
    need_one_of(f"{key}.service", rm.service, SERVICE_MODELS)
    need(rm.mfu is None or (finite(rm.mfu) and 0 < rm.mfu <= 1), f"{key}.mfu", rm.mfu,
         "null (the efficiency curve fitted to measured kernels) or a number in (0, 1]")
    positive(f"{key}.mfu_scale", rm.mfu_scale)
    fraction(f"{key}.attn_mfu", rm.attn_mfu)
    nonneg(f"{key}.kernel_overhead", rm.kernel_overhead)
    nonneg(f"{key}.overhead_s", rm.overhead_s)
    fraction(f"{key}.mem_util", rm.mem_util)
    if rm.service == "profiled":
        need_file(f"{key}.profile", rm.profile, "the path of a CSV written by racsim-profile")
    if rm.service == "kernels" and rm.profile is not None:
        need_file(f"{key}.profile", rm.profile, "null (the tables racsim ships) or the path of a CSV of per-layer "
                  "operator times (docs/kernels.md)")


def _batcher(rm: Any, key: str) -> None:
    int_at_least(f"{key}.max_batch", rm.max_batch, 1)
    int_at_least(f"{key}.token_budget", rm.token_budget, 1)
    nonneg(f"{key}.max_wait_s", rm.max_wait_s)
    need_one_of(f"{key}.order", rm.order, BATCH_ORDERS)
    int_at_least(f"{key}.sequences_per_sample", rm.sequences_per_sample, 1)
    need_one_of(f"{key}.batching", rm.batching, BATCH_POLICIES)
    need(isinstance(rm.chunked_prefill, bool), f"{key}.chunked_prefill", rm.chunked_prefill, "true or false")
    need(not rm.chunked_prefill or rm.batching == "continuous", f"{key}.chunked_prefill", rm.chunked_prefill,
         "false unless batching is continuous (static batches are not split)")
