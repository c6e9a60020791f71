"""A run's pipeline timeline: Chrome/Perfetto trace JSON and a PNG Gantt chart.

One trial (lane) of an arrival schedule becomes a trace that chrome://tracing
or https://ui.perfetto.dev opens: the optimizer's steps and phases (generate,
fast scoring, submit, the wait of a blocking corrector, update) on one track;
per slow channel, each GPU replica's batches on its own track (gpu_rm), and
every result's queue wait and service as async spans (queue channels: service
per sample, since workers are interchangeable). Times are microseconds of
simulated wall-clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import numpy as np

from racsim.io import write_text
from racsim.pipeline.schedule import ArrivalSchedule
from racsim.report.plots import _plt, _save, legend_outside

PHASE_NAMES = ("generate", "fast_score", "submit", "update")


def _us(x: float) -> float:
    return round(float(x) * 1e6, 3)


def trace_events(sched: ArrivalSchedule, lane: int = 0) -> List[dict]:
    """Trace Event Format events (complete 'X', async 'b'/'e', metadata 'M') for one lane."""
    ev: List[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "optimizer"}},
                      {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "steps"}}]
    S = sched.step_start[lane]
    steps = sched.n_steps
    phase = sched.phase[:, lane] if sched.phase is not None else None
    for t in range(steps):
        ev.append({"ph": "X", "pid": 1, "tid": 1, "name": f"step {t}", "cat": "step", "ts": _us(S[t]),
                   "dur": _us(S[t + 1] - S[t])})
        if phase is None:
            continue
        t0 = S[t]
        for k, nm in enumerate(PHASE_NAMES[:3]):
            ev.append({"ph": "X", "pid": 1, "tid": 1, "name": nm, "cat": "phase", "ts": _us(t0),
                       "dur": _us(phase[k, t])})
            t0 = t0 + phase[k, t]
        upd_start = S[t + 1] - phase[3, t]
        if sched.blocking and upd_start > t0:
            ev.append({"ph": "X", "pid": 1, "tid": 1, "name": "wait for slow", "cat": "phase", "ts": _us(t0),
                       "dur": _us(upd_start - t0)})
        ev.append({"ph": "X", "pid": 1, "tid": 1, "name": "update", "cat": "phase", "ts": _us(upd_start),
                   "dur": _us(phase[3, t])})
    uid = 0
    for k, name in enumerate(sched.channel_names):
        pid = 2 + k
        ev.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"channel {name}"}})
        gpu = (sched.gpu_batches or {}).get(name)
        if gpu is not None:
            for r in range(int(gpu["replicas"])):
                ev.append({"ph": "M", "pid": pid, "tid": 10 + r, "name": "thread_name", "args": {"name": f"GPU replica {r}"}})
            sel = gpu["lane"] == lane
            for r, a, b, n, tok, t in zip(gpu["replica"][sel], gpu["start"][sel], gpu["end"][sel], gpu["size"][sel],
                                          gpu["tokens"][sel], gpu["step"][sel]):
                of = f"step {int(t)}" if t >= 0 else "other tenants"  # step -1: background requests only
                ev.append({"ph": "X", "pid": pid, "tid": 10 + int(r), "name": f"batch x{int(n)} ({of})",
                           "cat": "batch", "ts": _us(a), "dur": _us(b - a),
                           "args": {"sequences": int(n), "tokens": float(tok), "step": int(t)}})
        if sched.submit_time is None:
            continue
        sub, beg, end = (x[lane, ..., k] for x in (sched.submit_time, sched.service_start, sched.completion))
        for t, b in np.ndindex(sub.shape):
            label = f"{name} t{t} s{b}"
            if beg[t, b] > sub[t, b]:
                uid += 1
                ev += [{"ph": "b", "pid": pid, "tid": 1, "cat": "queue wait", "name": label, "id": uid,
                        "ts": _us(sub[t, b])},
                       {"ph": "e", "pid": pid, "tid": 1, "cat": "queue wait", "name": label, "id": uid,
                        "ts": _us(beg[t, b])}]
            if gpu is None and np.isfinite(end[t, b]):
                uid += 1
                ev += [{"ph": "b", "pid": pid, "tid": 2, "cat": "service", "name": label, "id": uid,
                        "ts": _us(beg[t, b])},
                       {"ph": "e", "pid": pid, "tid": 2, "cat": "service", "name": label, "id": uid,
                        "ts": _us(end[t, b])}]
    return ev


def write_trace(path: Path, sched: ArrivalSchedule, lane: int = 0) -> None:
    doc = {"traceEvents": trace_events(sched, lane), "displayTimeUnit": "ms",
           "otherData": {"racsim": "pipeline timeline", "lane": lane, "blocking": sched.blocking}}
    write_text(path, json.dumps(doc, separators=(",", ":")))


# The optimizer's phases in deep colours; a channel's bars in pale ones, one per rollout step (mod their count),
# so that no bar reads as a phase; grey for another tenant's batch.
PHASE_COLORS = {"generate": "#4C72B0", "fast_score": "#DD8452", "submit": "#937860", "update": "#55A868",
                "wait for slow": "#C44E52"}
STEP_COLORS = ("#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec")  # Pastel1
OTHERS = "0.75"


def step_color(t: int) -> str:
    """The colour of a channel's bar serving rollout step ``t`` (:data:`STEP_COLORS`; another tenant's: grey)."""
    return STEP_COLORS[t % len(STEP_COLORS)] if t >= 0 else OTHERS


def gantt(sched: ArrivalSchedule, path: Path, lane: int = 0, steps: int = 3, max_rows: int = 12) -> bool:
    """The first ``steps`` optimizer steps of one lane as a Gantt chart (PNG); its legend names every
    colour drawn: the optimizer's phases, the rollout step a channel's bar serves, other tenants' batches."""
    plt = _plt()
    S = sched.step_start[lane]
    t_end = float(S[min(steps, sched.n_steps)])
    rows, labels = [], []
    colors = PHASE_COLORS
    opt = []
    for ev in trace_events(sched, lane):
        if ev.get("pid") == 1 and ev.get("cat") == "phase" and ev["ts"] / 1e6 < t_end:
            opt.append((ev["ts"] / 1e6, ev["dur"] / 1e6, colors.get(ev["name"], "grey")))
    rows.append(opt)
    labels.append("optimizer")
    for k, name in enumerate(sched.channel_names):
        gpu = (sched.gpu_batches or {}).get(name)
        if gpu is not None:
            sel = (gpu["lane"] == lane) & (gpu["start"] < t_end)
            for r in range(min(int(gpu["replicas"]), max_rows)):
                m = sel & (gpu["replica"] == r)
                rows.append([(a, b - a, step_color(int(t))) for a, b, t in zip(gpu["start"][m], gpu["end"][m],
                                                                              gpu["step"][m])])
                labels.append(f"{name}: GPU {r}")
        elif sched.submit_time is not None:  # services packed onto tracks (workers are interchangeable)
            beg, end = sched.service_start[lane, ..., k], sched.completion[lane, ..., k]
            tracks: List[list] = []
            ends: List[float] = []
            for i in np.argsort(beg, axis=None, kind="stable"):
                t, b = np.unravel_index(i, beg.shape)
                if beg[t, b] >= t_end:
                    continue
                bar = (beg[t, b], min(end[t, b], 2 * t_end) - beg[t, b], step_color(int(t)))
                free = next((j for j, e in enumerate(ends) if e <= beg[t, b]), None)
                if free is None:
                    tracks.append([])
                    ends.append(0.0)
                    free = len(ends) - 1
                tracks[free].append(bar)
                ends[free] = end[t, b]
            for j, bars in enumerate(tracks[:max_rows]):
                rows.append(bars)
                labels.append(f"{name}: in service {j}")
    fig, ax = plt.subplots(figsize=(12.5, 0.45 * len(rows) + 1.6), layout="constrained")
    for i, bars in enumerate(rows):
        y = len(rows) - 1 - i
        for x, w, c in bars:
            ax.broken_barh([(x, max(w, 0.0))], (y - 0.4, 0.8), facecolors=c, edgecolors="black", linewidth=0.3)
    for t in range(min(steps, sched.n_steps) + 1):
        ax.axvline(S[t], color="black", lw=0.6, ls=":")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels[::-1], fontsize=8)
    ax.set_xlim(0, t_end * 1.02)
    ax.set_xlabel("simulated wall-clock (s); dotted: step starts")
    from matplotlib.patches import Patch

    drawn = {b[2] for bars in rows[1:] for b in bars}
    handles = [Patch(color=c, label=n) for n, c in colors.items() if any(b[2] == c for b in opt)]
    handles += [Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=f"channel: rollout of step {t}")
                for t, c in enumerate(STEP_COLORS) if c in drawn]
    if OTHERS in drawn:
        handles.append(Patch(facecolor=OTHERS, edgecolor="black", linewidth=0.3, label="channel: other tenants' batch"))
    if handles:
        legend_outside(ax, fontsize=7, handles=handles)
    ax.set_title(f"Pipeline timeline, lane {lane}, first {min(steps, sched.n_steps)} steps "
                 f"({'blocking' if sched.blocking else 'asynchronous'}); channel bars coloured by rollout step")
    _save(fig, path)
    plt.close(fig)
    return True


def write_timeline(out_dir: Path, sched: ArrivalSchedule, png: bool = True) -> list:
    """trace.json (and gantt.png) for lane 0; returns the paths written."""
    out = [out_dir / "trace.json"]
    write_trace(out[0], sched)
    if png and gantt(sched, out_dir / "gantt.png"):
        out.append(out_dir / "gantt.png")
    return out
