"""What asynchronous generation draws and builds before a lane runs: the rollout engines' service model (and
whether the policy fits their GPUs), each lane's prompt and response lengths and gate-all service times
(their own random streams, drawn a block of groups at a time as the lane asks for more), and the trainer's
seconds per step.

The streams: one seed per run, drawn last from the pipeline's stream and only in async mode (a sync run
draws what it always drew); from it, per lane, one stream for the lengths and one per gate-all channel for
its service times and one for its routing. Group j's lengths are the same whatever the gate, the channels or
the number of groups a lane needs (blocks of :data:`BLOCK` groups, in order).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

import numpy as np

from racsim.errors import ConfigError
from racsim.pipeline.latency import build_latency
from racsim.pipeline.service import Roofline, model_size

BLOCK = 256  # groups drawn at a time
KEY = "pipeline.generation"


def kv_bytes_per_token(m: Any) -> float:
    """Bytes of KV cache one token holds: keys and values of every layer (GQA: n_kv_heads heads)."""
    return 2.0 * int(m.layers) * int(m.n_kv_heads) * (int(m.d_model) // int(m.n_heads)) * float(m.bytes_per_param)


def check_engine_memory(e: Any, key: str = f"{KEY}.engines") -> None:
    """A ConfigError naming ``key.concurrency`` (or ``key.tp`` when not even one sequence fits) when one
    replica's share of the policy's weights and of the KV cache of ``concurrency`` sequences of the longest
    length (max_prompt_tokens + max_response_tokens) exceeds ``memory_gb * mem_util`` per GPU."""
    m, g = e.model, e.gpu
    weights = model_size(m).total * float(m.bytes_per_param)
    longest = int(e.max_prompt_tokens) + int(e.max_response_tokens)
    per_seq = kv_bytes_per_token(m) * longest
    usable = float(g.memory_gb) * 1e9 * float(e.mem_util) * int(e.tp)  # the replica's tp GPUs
    if weights + e.concurrency * per_seq <= usable:
        return
    fits = int((usable - weights) // per_seq) if usable > weights else 0
    what = (f"the {m.name} policy on {g.name} x tp={e.tp}: weights {weights / 1e9:.1f} GB + KV cache "
            f"{e.concurrency * per_seq / 1e9:.1f} GB for {e.concurrency} sequences of {longest} tokens, "
            f"over {usable / 1e9:.1f} GB (memory_gb {g.memory_gb:g} x mem_util {e.mem_util:g} x tp)")
    if fits >= 1:
        raise ConfigError(f"{key}.concurrency", e.concurrency,
                          f"at most {fits}: {what}; or raise tp, shorten max_response_tokens, or a larger GPU")
    raise ConfigError(f"{key}.tp", e.tp, f"a larger tp (or GPU): not one sequence fits; {what}")


def engine_model(e: Any, key: str = f"{KEY}.engines") -> Roofline:
    """The engines' service model, once the policy is known to fit: a roofline of one replica (tp GPUs),
    decode steps by :meth:`~racsim.pipeline.service.Roofline.decode_seconds`, prefill passes packed."""
    check_engine_memory(e, key)
    return Roofline(SimpleNamespace(model=e.model, gpu=e.gpu, tp=e.tp, mfu=e.mfu, overhead_s=e.overhead_s,
                                    padded=False))


def training_seconds(params: float, tokens: np.ndarray, gpus: int, peak_tflops: float, mfu: float) -> np.ndarray:
    """Seconds of one update on the trainer's roofline: 6 x params x tokens FLOPs (forward and backward,
    the usual 6ND) over ``gpus`` x peak x MFU."""
    return 6.0 * params * tokens / (gpus * peak_tflops * 1e12 * mfu)


def step_tokens(prompt: np.ndarray, response: np.ndarray, groups: int, steps: int) -> np.ndarray:
    """(steps,) tokens of the t-th ``groups`` groups drawn (prompt and responses of each sample): the batch
    step t's update is timed on (those it trains on are mostly these; docs/generation.md)."""
    per_group = prompt[:groups * steps] * response.shape[1] + response[:groups * steps].sum(axis=1)
    return per_group.reshape(steps, groups).sum(axis=1).astype(np.float64)


def lengths(law: Any, cap: int, rng: np.random.Generator, size, key: str) -> np.ndarray:
    """Token lengths drawn from ``law``: rounded, at least 1 and at most ``cap`` (int64)."""
    x = build_latency(law, key).sample(rng, size)
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


class LaneDraws:
    """One lane's drawn inputs, :data:`BLOCK` groups at a time: prompt (n,) and response (n, S) lengths,
    and per gate-all channel its service seconds (n S,) by submission order and its routing (n, S)."""

    def __init__(self, gen: Any, channels: List[Tuple[str, Any]], seed: int, lane: int):
        self.gen, self.channels = gen, channels
        self.S = int(gen.group_size)
        self.rng = np.random.default_rng([seed, lane, 0])
        self.chan_rng = [(np.random.default_rng([seed, lane, 1 + 2 * k]), np.random.default_rng([seed, lane, 2 + 2 * k]))
                         for k in range(len(channels))]
        self.prompt = np.empty(0, dtype=np.int64)
        self.response = np.empty((0, self.S), dtype=np.int64)
        self.service: List[np.ndarray] = [np.empty(0) for _ in channels]
        self.routed: List[Optional[np.ndarray]] = [None if ch.route_prob >= 1 else np.empty((0, self.S), dtype=bool)
                                                   for _, ch in channels]

    def grow(self, n: int) -> None:
        """Draw blocks until at least ``n`` groups are drawn."""
        e = self.gen.engines
        while self.prompt.shape[0] < n:
            p = lengths(e.prompt_tokens, e.max_prompt_tokens, self.rng, (BLOCK,), f"{KEY}.engines.prompt_tokens")
            r = lengths(e.response_tokens, e.max_response_tokens, self.rng, (BLOCK, self.S),
                        f"{KEY}.engines.response_tokens")
            self.prompt, self.response = np.concatenate([self.prompt, p]), np.concatenate([self.response, r])
            for k, (name, ch) in enumerate(self.channels):
                srv, route = self.chan_rng[k]
                law = build_latency(ch.latency, f"pipeline.channels.{name}.latency")
                self.service[k] = np.concatenate([self.service[k], law.sample(srv, (BLOCK * self.S,))])
                if self.routed[k] is not None:
                    self.routed[k] = np.concatenate([self.routed[k], route.random((BLOCK, self.S)) < ch.route_prob])

    def channel_inputs(self) -> tuple:
        """LaneInputs.channels: (workers, service, routed) per channel."""
        return tuple((ch.workers, self.service[k], self.routed[k]) for k, (_, ch) in enumerate(self.channels))


def first_groups(steps: int, groups: int, engines: int, concurrency: int, group_size: int,
                 capacity: Optional[int] = None) -> int:
    """Groups to draw for a lane's first try (a lane that asks for more runs again with twice as many): the
    trained ones, a step's more, a full queue, and four times the groups the engines hold at once (a group
    stays in flight until its longest response ends, while its finished ones free their slots), in whole
    blocks."""
    need = (steps + 1) * groups + (capacity or 0) + 4 * math.ceil(engines * concurrency / group_size)
    return BLOCK * math.ceil(need / BLOCK)
