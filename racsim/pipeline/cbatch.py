"""Continuous batching for gpu_rm pools (``rm.batching: continuous``), beside static batches.

Static batching (``rm.batching: static``, the default, racsim/pipeline/batcher.py)
forms a batch and holds it until it is full or its oldest request has waited
``max_wait_s``, padded or packed, as a Hugging Face pipeline or a Triton
dynamic batcher does. Continuous batching is iteration-level scheduling, as
vLLM and SGLang (and TGI's router) schedule prefill-only pooling models such as
reward models: whenever a replica is free, one iteration takes the waiting
requests in ``order`` up to ``token_budget`` packed tokens and ``max_batch``
sequences at once, without waiting to fill (``max_wait_s`` and ``padded`` do
not apply: varlen attention packs the tokens). A request longer than the
budget runs alone, in one iteration.

With ``rm.chunked_prefill`` (vLLM's chunked prefill, SGLang's
``chunked_prefill_size``), the request that does not fit the budget left in an
iteration is split: its first ``budget left`` tokens are scored in this
iteration, and its rest opens the next iteration on the same replica (chunk
by chunk, if still over the budget). A request is done when its last chunk
is; its first dispatch is its first chunk's. An iteration's seconds come from
the channel's service model on its chunks (racsim/pipeline/service.py), a chunk
of ``l`` tokens after ``c`` tokens of its request already scored counting

    tokens  = l
    squares = (c + l)^2 - c^2 = l * (l + 2 c)

so the attention term (``2 layers d_model squares``) of a chunk counts its
context, the tokens already processed plus the chunk, and a request's chunks
add up to its unchunked cost L^2.

Without chunking, continuous batching of prefill-only requests is the static
rule with ``max_wait_s = 0`` on packed batches (a replica that falls free takes
what waits, and only then), so :func:`serving_spec` hands that spec to the
static machinery, vectorised FIFO path included; with chunking,
:class:`_Chunked` is the dispatch rule both event-loop engines call.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from racsim.pipeline.batcher import GpuSpec, _Batch, _Waiting, gpu_spec


def serving_spec(rm: Any, key: str) -> GpuSpec:
    """The :class:`GpuSpec` of an RM config: :func:`gpu_spec`, turned continuous
    (packed, no waiting to fill, ``chunked`` as ``rm.chunked_prefill``) when
    ``rm.batching`` is continuous."""
    spec = gpu_spec(rm, key)
    if getattr(rm, "batching", "static") != "continuous":
        return spec
    model = copy.copy(spec.model)
    model.padded = False  # continuous batches pack their tokens
    return GpuSpec(**{**spec.__dict__, "max_wait": 0.0, "padded": False, "model": model,
                      "chunked": bool(rm.chunked_prefill)})


def chunk_squares(length: float, context: float) -> float:
    """The attention term of a chunk of ``length`` tokens after ``context`` tokens of
    its request: (context + length)^2 - context^2 (module docstring)."""
    return length * (length + 2.0 * context)


def waiting(spec: GpuSpec, tokens: List[float], group: int) -> _Waiting:
    """The waiting list and dispatch rule a server of ``spec`` uses."""
    return _Chunked(spec, tokens, group) if spec.chunked else _Waiting(spec, tokens, group)


class _Chunked(_Waiting):
    """Continuous batching with chunked prefill (module docstring): the waiting
    requests, in ``order``, and per replica the request whose rest it scores next."""

    def __init__(self, spec: GpuSpec, tokens: List[float], group: int):
        super().__init__(spec, tokens, group)
        self.carry: Dict[int, Tuple[int, float]] = {}  # replica -> (request, tokens already scored)

    def __len__(self) -> int:
        return len(self.keys) + len(self.carry)

    def deadline(self, arrival: Sequence[float]) -> float:
        """Never: an iteration does not wait to fill."""
        return math.inf

    def dispatch(self, idle: Sequence[int], tau: float, arrival: Sequence[float]) -> List[_Batch]:
        """At instant ``tau``, each replica of ``idle`` (ascending) with work runs one
        iteration: its carried request's rest first, then waiting requests in order
        while sequences and budget are left, the one that does not fit split."""
        out: List[_Batch] = []
        s = self.spec
        for r in idle:
            if not self.keys and r not in self.carry:
                continue
            ids: List[int] = []
            new: List[int] = []
            last: List[int] = []
            room, ts, sq, mx = s.budget, 0.0, 0.0, 0.0
            head = self.carry.pop(r, None)  # (request, tokens already scored)
            while room > 0 and len(ids) < s.max_batch and (head is not None or self.keys):
                if head is None:
                    key = self.keys[0]
                    head = (key if self.fifo else key[1], 0.0)
                    self.remove([head[0]])
                    new.append(head[0])
                (j, done), head = head, None
                size = min(self.tok[j] - done, room)
                ids.append(j)
                ts, sq, mx, room = ts + size, sq + chunk_squares(size, done), max(mx, size), room - size
                if done + size < self.tok[j]:
                    self.carry[r] = (j, done + size)
                    break
                last.append(j)
            seconds = float(s.model.seconds(np.float64(len(ids)), ts, sq, mx))
            out.append(_Batch(r, ids, seconds, ts, min(ids) // self.G, new, last))
        return out
