"""What a run was given, for summary.md and the run's own lines: each slow channel's delay
law (kind, mean, source), what racsim changed in a user's data (an empirical law rescaled
or clipped) and the command line's overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from racsim.config.schema import PHASES, RacsimConf, phase_conf
from racsim.io import fmt
from racsim.pipeline.latency import build_latency
from racsim.pipeline.service import build_service


@dataclass(frozen=True)
class Law:
    """One slow channel's delay law as the run used it."""

    channel: str
    law: str  # the distribution as sampled (racsim.pipeline.latency.Latency.describe)
    mean_s: Optional[float]  # its exact mean; None where no law gives the delay (a gpu_rm channel, a kernel)
    source: str  # the data file and column, or the preset, the scenario and the command line's keys


def _given(overrides: Sequence[str], key: str) -> List[str]:
    """The overrides that set ``key`` or a key under it (``latency@KEY=...`` too)."""
    def target(o: str) -> str:
        k = o.split("=", 1)[0].lstrip("+~")
        return k.split("@", 1)[1] if "@" in k else k

    return [o for o in overrides if target(o) == key or target(o).startswith(key + ".")]


def channel_laws(cfg: RacsimConf, choices: Mapping[str, Any], overrides: Sequence[str]) -> List[Law]:
    """Every slow channel's :class:`Law`; ``choices``: Hydra's config group choices
    (``hydra.runtime.choices``), ``overrides``: the command line's."""
    laws = []
    scenario = choices.get("scenario") or cfg.name
    for name, ch in cfg.pipeline.channels.items():
        key = f"pipeline.channels.{name}"
        if ch.kind == "gpu_rm":
            law, mean = (f"gpu_rm: {ch.rm.model.name} on {ch.rm.gpus} x {ch.rm.gpu.name}, batched; "
                         f"{build_service(ch.rm, f'{key}.rm').describe()}"), None
        elif ch.kernel is not None:
            law, mean = f"delay kernel over {len(ch.kernel)} steps (given as {key}.kernel)", None
        else:
            lat = build_latency(ch.latency, f"{key}.latency")
            law, mean = lat.describe(), lat.mean()
        if ch.kind != "gpu_rm" and ch.kernel is None and ch.latency.kind == "empirical":
            source = f"file {ch.latency.path}, column {ch.latency.column}"
        else:
            preset = choices.get(f"channel@{key}")
            source = f"preset channel/{preset}" if preset else f"scenario {scenario}"
            if choices.get(f"latency@{key}.latency"):
                source += f", law latency/{choices[f'latency@{key}.latency']}"
        here = _given(overrides, key)
        laws.append(Law(name, law, mean, source + (f"; command line: {' '.join(here)}" if here else "")))
    return laws


def data_changes(cfg: RacsimConf) -> List[str]:
    """What racsim did to a user's data, one line each: every empirical law of the pipeline
    (its phases and channels) rescaled to a mean or clipped to [low, high], and a GPU pool's measured
    profile (racsim-profile's, or per-layer kernel times) made monotone."""
    p = cfg.pipeline
    blocks: List[Tuple[str, Any]] = [(f"pipeline.{ph}", phase_conf(p, ph)) for ph in PHASES]
    blocks += [(f"pipeline.channels.{n}.latency", ch.latency) for n, ch in p.channels.items()
               if ch.kind != "gpu_rm" and ch.kernel is None]
    profiles = [(f"pipeline.channels.{n}.rm", ch.rm) for n, ch in p.channels.items()
                if ch.kind == "gpu_rm" and ch.rm.service in ("profiled", "kernels") and ch.rm.profile is not None]
    return ([f"{key}: the data of {conf.path}:{conf.column}: {change}"
             for key, conf in blocks if conf.kind == "empirical"
             for change in build_latency(conf, key).changes]
            + [f"{key}.profile: {rm.profile}: {change}" for key, rm in profiles
               for change in build_service(rm, key).changes])


def summary_lines(laws: Sequence[Law], changes: Sequence[str], overrides: Sequence[str]) -> List[str]:
    """summary.md's "Inputs" section."""
    lines = ["## Inputs", ""]
    if laws:
        lines += ["Delay law of each slow channel (`mean`: the exact mean of the law as sampled, seconds):", "",
                  "| channel | law | mean (s) | source |", "|---|---|---|---|"]
        lines += [f"| {w.channel} | {w.law} | {fmt(w.mean_s)} | {w.source} |" for w in laws] + [""]
    if changes:
        lines += ["racsim changed the data it was given:", ""] + [f"- {c}" for c in changes] + [""]
    lines += [f"Command line: `racsim {' '.join(overrides)}`" if overrides
              else "Command line: no overrides (the scenario as written).", ""]
    return lines
