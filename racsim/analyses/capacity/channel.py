"""The channel a capacity search sizes: which one, the config key of its count, its unit, servers
and price, and the spec at one count."""

from __future__ import annotations

from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at


def channel_of(cfg: RacsimConf) -> str:
    """The channel to size: ``capacity.channel``, or the only sizable one."""
    if cfg.capacity.channel is not None:
        return str(cfg.capacity.channel)
    chans = cfg.pipeline.channels
    return next(n for n, ch in chans.items() if ch.kind == "gpu_rm" or ch.workers is not None)


def is_gpu(cfg: RacsimConf, name: str) -> bool:
    """Is channel ``name`` a gpu_rm pool (sized in GPUs; else a queue sized in workers)?"""
    return cfg.pipeline.channels[name].kind == "gpu_rm"


def unit_name(cfg: RacsimConf, name: str) -> str:
    """What a count of channel ``name`` counts: "GPUs" or "workers"."""
    return "GPUs" if is_gpu(cfg, name) else "workers"


def count_key(cfg: RacsimConf, name: str) -> str:
    """The config key of channel ``name``'s count: its GPUs (``rm.gpus``) or its ``workers``."""
    return f"pipeline.channels.{name}.rm.gpus" if is_gpu(cfg, name) else f"pipeline.channels.{name}.workers"


def unit_price(cfg: RacsimConf, name: str) -> float:
    """USD per unit-hour: the GPU's price, or ``capacity.price_per_unit_hour`` (0 when unset)."""
    if is_gpu(cfg, name):
        return float(cfg.pipeline.channels[name].rm.gpu.price_per_hour)
    p = cfg.capacity.price_per_unit_hour
    return 0.0 if p is None else float(p)


def with_count(cfg: RacsimConf, key: str, n: int) -> RacsimConf:
    """A new spec: ``key`` (:func:`count_key`) set to ``n``, capacity planning off (one ordinary run)."""
    return replace_at(replace_at(cfg, "capacity.enabled", False), key, int(n))


def units_per_server(cfg: RacsimConf, name: str) -> int:
    """GPUs per replica (tp) of a gpu_rm channel, 1 worker per server of a queue channel."""
    return int(cfg.pipeline.channels[name].rm.tp) if is_gpu(cfg, name) else 1


def fixed_pool(cfg: RacsimConf, name: str) -> RacsimConf:
    """A new spec: ``name``'s autoscale rule removed (a fixed pool of its count)."""
    return replace_at(cfg, f"pipeline.channels.{name}.autoscale", None)
