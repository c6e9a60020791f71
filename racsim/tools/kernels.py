"""``python -m racsim.tools.kernels``: the measured kernel tables racsim ships, the efficiency curve fitted
to them, which table serves each catalog model on each catalog GPU, and decode throughput.

    python -m racsim.tools.kernels derive SRC   # SRC/<gpu>/<model>.csv -> racsim/data/kernels/ and curve.json
    python -m racsim.tools.kernels fit          # the curve: parameters, residuals, leave-one-out errors
    python -m racsim.tools.kernels catalog      # each catalog model on each GPU: measured, mapped, extrapolated
    python -m racsim.tools.kernels decode       # decode tokens/s per GPU against concurrency (and decode.png)
    python -m racsim.tools.kernels answers --jobs 2   # every shipped GPU capacity scenario under each service model

``derive`` reads files in the Vidur format (racsim/data/kernels/README.md), keeps each operator's median,
merges rows measured twice by their median (5 significant digits), writes one file per model and GPU with
the attribution line, the GPUs' peak and bandwidth (gpus.csv, from the catalog), and the curve fitted to
the tables written (racsim.pipeline.efficiency.fit).
"""

from __future__ import annotations

import argparse
import math
import sys
from importlib.resources import files
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from racsim.analyses.capacity import run_capacity
from racsim.config.defaults import catalog, compose_config
from racsim.config.schema import GpuConf, RMConf, RMModelConf, RacsimConf
from racsim.config.spec import replace_at, scenario
from racsim.errors import ConfigError, Parser, interruptible, say
from racsim.io import spawn_pool, write_text
from racsim.progress import Progress
from racsim.pipeline import layer_times
from racsim.pipeline.efficiency import FIT_TOKENS, Layer, curve_text, efficiency, fit, predicted, shipped_curve
from racsim.pipeline.layer_times import EMBEDDING, OPERATORS, SHAPE, TOKENS, TP, VOCAB, GATED, median
from racsim.pipeline.service import Kernels, model_size

HERE = Path(__file__).resolve().parents[1] / "data" / "kernels"
ATTRIBUTION = ("# Derived from the Vidur simulator's profiling data (microsoft/vidur, MIT License, Copyright (c) "
               "Microsoft Corporation): see README.md and LICENSE beside this file")
CHECK_TOKENS = (256, 1024, 4096)  # the leave-one-out errors' tokens per pass
CONCURRENCY = (1, 8, 32, 64, 128, 256)  # decode: running sequences per GPU
CONTEXT = 1024  # decode: KV-cache tokens of each running sequence
MEM_UTIL = 0.9  # the share of a GPU's memory weights and KV cache may take (rm.mem_util's default)


def significant(x: pd.Series, digits: int = 5) -> pd.Series:
    """Each number to ``digits`` significant digits (as the shared files are)."""
    return x.map(lambda v: float(f"{v:.{digits}g}"))


def derive_file(src: Path) -> str:
    """One derived table's text: the operators' medians, rows measured twice merged by their median."""
    df = pd.read_csv(src)
    ops = [median(op) for op in (EMBEDDING, *OPERATORS) if median(op) in df.columns]
    shape = [*SHAPE, VOCAB, GATED]
    out = df.groupby([TP, TOKENS], sort=True).agg({**{c: "median" for c in ops}, **{c: "first" for c in shape}})
    out = out.reset_index()
    for c in ops:
        out[c] = significant(out[c])
    return ATTRIBUTION + "\n" + out[[*ops, *shape, TOKENS, TP]].to_csv(index=False, lineterminator="\n")


def derive(src: Path) -> List[Path]:
    """Write the derived tables of every SRC/<gpu>/<model>.csv, gpus.csv and curve.json (fitted to the tables
    written) into racsim/data/kernels/."""
    out = HERE
    gpus = catalog("gpu")
    written, used = [], []
    for f in sorted(src.glob("*/*.csv")):
        name = next((g for g in gpus if g.lower() == f.parent.name.lower()), None)
        if name is None:
            raise ConfigError("SRC", str(f), f"a folder named after a catalog GPU ({', '.join(gpus)})")
        used += [name] if name not in used else []
        dst = out / name.lower() / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        write_text(dst, derive_file(f))
        written.append(dst)
    rows = pd.DataFrame([{"name": g, "peak_tflops": gpus[g]["peak_tflops"], "mem_bw_tbs": gpus[g]["mem_bw_tbs"]}
                         for g in used])
    write_text(out / "gpus.csv", rows.to_csv(index=False, lineterminator="\n"))
    for cached in (layer_times.shipped, layer_times.shipped_gpus, shipped_curve):
        cached.cache_clear()
    write_text(out / "curve.json", curve_text(fit(layer_times.measured_rows())))
    return written + [out / "gpus.csv", out / "curve.json"]


def pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def fit_report() -> str:
    """The curve: its form and parameters, its residuals by file, the measured and fitted efficiency of
    one layer, and each file's leave-one-out errors."""
    rows = layer_times.measured_rows()
    c = shipped_curve()
    used = rows[rows.tokens.isin(FIT_TOKENS)]
    res = np.log(predicted(c, used) / used.seconds.to_numpy())
    lines = [f"racsim: efficiency curve fitted to {rows.file.nunique()} files ({len(used)} rows at 1 to 4096 tokens a "
             "pass, powers of 2 and 3 x powers of 2, every tp)",
             "  seconds of one layer = tau + (weights^g + compute^g)^(1/g) + kappa * tokens * d_model / bandwidth",
             "  weights = params * bytes / (tp * bandwidth * eta), compute = 2 * params * tokens / (tp * peak * e_max)",
             f"  tau {c.tau_s * 1e6:.4g} us, eta {c.eta:.4g}, e_max {c.e_max:.4g}, g {c.sharpness:.4g}, kappa "
             f"{c.kappa:.4g} B per token and d_model; residuals (log) rms {np.sqrt(np.mean(res ** 2)):.3f}", ""]
    bins = [0, 8, 64, 512, 4096]
    r = used.assign(res=np.exp(res) - 1.0, band=pd.cut(used.tokens, bins, labels=["1-8", "16-64", "96-512",
                                                                                    "768-4096"]))
    table = r.pivot_table(index="file", columns="band", values="res", aggfunc="mean", observed=True)
    lines += ["Mean residual (curve / measured - 1) by file and tokens a pass, every tp:",
              table.map(pct).to_string(), ""]
    lines += ["Efficiency (MFU) of one layer, tp 1, measured / curve:"]
    eff = []
    for f in sorted(rows.file.unique()):
        one = rows[(rows.file == f) & (rows.tp == 1)].set_index("tokens")
        cells = {}
        for n in (64, 256, 1024, 4096):
            p = one.loc[n]
            meas = 2 * p.params * n / (p.peak * p.seconds)
            curve = float(efficiency(c, Layer(p.params, p.d_model), 1, n, p.peak, p.bandwidth))
            cells[f"{n} tokens"] = f"{meas:.2f} / {curve:.2f}"
        eff.append({"file": f, **cells})
    lines += [pd.DataFrame(eff).set_index("file").to_string(), ""]
    lines += ["Leave-one-out: the curve fitted to the other files predicts this one's layer seconds (error, tp 1; "
              "the worst over tp 2-8):"]
    loo = []
    for f in sorted(rows.file.unique()):
        c1 = fit(rows[rows.file != f])
        mine = rows[(rows.file == f) & rows.tokens.isin(CHECK_TOKENS)]
        err = pd.Series(predicted(c1, mine) / mine.seconds.to_numpy() - 1.0, index=mine.index)
        cells = {f"{n}": pct(err[(mine.tp == 1) & (mine.tokens == n)].iloc[0]) for n in CHECK_TOKENS}
        more = err[mine.tp > 1]
        worst = more.iloc[np.argmax(np.abs(more.to_numpy()))] if len(more) else None
        loo.append({"file": f, **cells, "worst tp > 1": "-" if worst is None else pct(worst)})
    lines.append(pd.DataFrame(loo).set_index("file").to_string())
    return "\n".join(lines + [""] + checks_report())


# (from, to): a table carried to another shape or GPU by the curve's ratio, where both are measured
TRANSFERS = (("a100/Llama-2-7b-hf", "a100/Meta-Llama-3-8B"),
             ("a100/CodeLlama-34b-Instruct-hf", "a100/Meta-Llama-3-70B"),
             ("a100/Llama-2-7b-hf", "a100/Meta-Llama-3-70B"), ("h100/phi-2", "h100/Llama-2-7b-hf"),
             ("a100/Llama-2-7b-hf", "h100/Llama-2-7b-hf"), ("a100/Llama-2-70b-hf", "a100/Meta-Llama-3-70B"))


def errors_row(predict, target: layer_times.Table, tokens: Sequence[int]) -> dict:
    """A row of errors (predicted / measured - 1) at ``tokens``, tp 1 apart from the worst over the other tps;
    ``predict(tp)``: the predicted Row at tp (None: no prediction there)."""
    cells, worst, more = {}, 0.0, False
    for tp in target.tps:
        row, measured = predict(tp), dict(zip(target.rows[tp].tokens, target.measured[tp]))
        if row is None:  # the source did not measure this tp
            continue
        more = more or tp > 1
        for n in tokens:
            e = float(row.at(n)[0]) / measured[n] - 1.0
            if tp == 1:
                cells[f"{n}"] = pct(e)
            elif abs(e) > abs(worst):
                worst = e
    return {**cells, "worst tp > 1": pct(worst) if more else "-"}


def checks_report() -> List[str]:
    """How far the kernel model's own steps stray, where the files can tell: the monotone envelope, the
    proportional extension past the last measured pass, and tables carried to another shape or GPU."""
    tables = {f"{g.lower()}/{stem}": t for g, ts in layer_times.shipped().items() for stem, t in ts}
    gpus, c = layer_times.shipped_gpus(), shipped_curve()
    lines = ["The monotone envelope (running maximum over tokens, per tp): layer times it raised, by how much on "
             "average where it did, and the most:"]
    lines += [f"  {name}: {n} of {cells}, {pct(mean)} on average, at most {pct(most)}" for name, (n, cells, mean, most)
              in ((name, layer_times.raised(t)) for name, t in tables.items())]
    lines += ["", "Past the last measured pass, its time per token (the files measured to 32768 tokens, cut at 4096; "
                  "error at tp 1, the worst over tp 2-8):"]
    far = [(name, t) for name, t in tables.items() if t.rows[1].tokens[-1] > 4096]

    def cut(t, tp):
        r = t.rows[tp]
        keep = r.tokens <= 4096
        return layer_times.Row(r.tokens[keep], r.layer[keep], r.emb[keep])

    rows = [{"file": name, **errors_row(lambda tp, t=t: cut(t, tp), t, (8192, 16384, 32768))} for name, t in far]
    lines += [pd.DataFrame(rows).set_index("file").to_string(), ""]
    lines += ["A table carried to another shape or GPU by the curve's ratio, against that one measured (error at tp 1, "
              "the worst over tp 2-8; the last pair: one layer measured twice, as a model of the other):"]
    rows = []
    for src, dst in TRANSFERS:
        a, b = tables[src], tables[dst]
        on, measured_on = gpus[dst.split("/")[0].upper()], gpus[src.split("/")[0].upper()]
        same = layer_times.same_layer(a.shape, b.shape) and on == measured_on
        predict = (lambda tp, a=a: a.row(tp)) if same else (
            lambda tp, a=a, b=b, on=on, mo=measured_on: layer_times.transferred(a, tp, mo, b.layer, on, c))
        rows.append({"from -> to": f"{src} -> {dst}", **errors_row(predict, b, CHECK_TOKENS)})
    lines.append(pd.DataFrame(rows).set_index("from -> to").to_string())
    return lines


def smallest_tp(m: dict, g: dict) -> Optional[int]:
    """The fewest GPUs of ``g`` (1, 2, 4, 8, dividing the heads) whose memory holds ``m``'s weights in at
    most half of its ``MEM_UTIL`` share (the rest for the KV cache, as a serving engine leaves it);
    None when 8 do not."""
    weights = model_size(RMModelConf(**m)).total * m["bytes_per_param"]
    room = g["memory_gb"] * 1e9 * MEM_UTIL / 2
    return next((t for t in (1, 2, 4, 8) if m["n_heads"] % t == 0 and weights / t <= room), None)


def by_size(models: dict) -> list:
    """The catalog's models, smallest first."""
    return sorted(models.items(), key=lambda kv: model_size(RMModelConf(**kv[1])).total)


def service(m: dict, g: dict, tp: int) -> Kernels:
    """The kernel model of ``m`` on ``g`` at ``tp``, nothing added (overhead_s 0)."""
    return Kernels(RMConf(model=RMModelConf(**m), gpu=GpuConf(**g), gpus=tp, tp=tp, service="kernels",
                          overhead_s=0.0))


def catalog_report() -> str:
    """Each catalog model on each catalog GPU at the fewest GPUs that hold it: where its layer times come
    from, and one layer's MFU at 64, 256 and 4096 tokens a pass under the kernel model and the curve."""
    gpus, c = catalog("gpu"), shipped_curve()
    rows = []
    for mn, m in by_size(catalog("model")):
        for gn, g in gpus.items():
            tp = smallest_tp(m, g)
            if tp is None:
                continue
            k = service(m, g, tp)
            layer = layer_times.model_layer(RMModelConf(**m))
            peak, bw = g["peak_tflops"] * 1e12, g["mem_bw_tbs"] * 1e12
            cells = {}
            for n in (64, 256, 4096):
                kern = 2 * layer.params * n / (tp * peak * float(k.source.row.at(n)[0]))
                cells[f"MFU {n}"] = f"{kern:.2f} / {float(efficiency(c, layer, tp, n, peak, bw)):.2f}"
            rows.append({"model": mn, "GPU": gn, "tp": tp, "layer times": k.source.kind, **cells,
                         "from": k.source.how})
    t = pd.DataFrame(rows)
    head = ("racsim: per-layer times of each catalog model on each catalog GPU (tp: the fewest that hold its "
            "weights in half their memory); MFU of one layer, kernel model / efficiency curve")
    return head + "\n" + t.drop(columns="from").to_string(index=False) + "\n\n" + "\n".join(
        f"{r.model} on {r.GPU}: {r._4}: {r._8}" for r in t.itertuples())


def decode_table() -> pd.DataFrame:
    """Decode tokens per second per GPU at each concurrency per GPU (:data:`CONCURRENCY` sequences of
    :data:`CONTEXT` cached tokens each), per catalog model and GPU at the fewest GPUs that hold it; NaN
    where the KV cache does not fit."""
    rows = []
    for mn, m in by_size(catalog("model")):
        for gn, g in catalog("gpu").items():
            tp = smallest_tp(m, g)
            if tp is None:
                continue
            k = service(m, g, tp)
            weights = model_size(RMModelConf(**m)).total * m["bytes_per_param"]
            kv = 2 * m["layers"] * m["n_kv_heads"] * (m["d_model"] // m["n_heads"]) * m["bytes_per_param"]
            row = {"model": mn, "GPU": gn, "tp": tp, "layer times": k.source.kind}
            for c in CONCURRENCY:
                b = c * tp
                fits = weights + kv * b * CONTEXT <= tp * g["memory_gb"] * 1e9 * MEM_UTIL
                step = float(k.decode_seconds(b, b * CONTEXT))
                row[str(c)] = b / step / tp if fits else math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def decode_report(out: Optional[Path]) -> str:
    t = decode_table()
    shown = t.copy()
    for c in map(str, CONCURRENCY):
        shown[c] = [("-" if math.isnan(v) else f"{v:,.0f}") for v in t[c]]
    lines = [f"racsim: decode tokens/s per GPU (kernel model, no overhead) against running sequences per GPU, each "
             f"with {CONTEXT} tokens of KV cache ('-': the cache does not fit {MEM_UTIL:g} of the memory)",
             shown.to_string(index=False)]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        decode_plot(t, out / "decode.png")
        lines.append(f"racsim: results in {out}")
    return "\n".join(lines)


def decode_plot(t: pd.DataFrame, path: Path) -> None:
    """Tokens per second per GPU against concurrency per GPU: one panel per model, one line per GPU
    (dashed where the layer times are extrapolated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(t.model))
    cols = 2
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(9, 3.4 * rows), squeeze=False)
    x = np.array(CONCURRENCY, dtype=float)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, mn in zip(axes.flat, models):
        for r in t[t.model == mn].itertuples():
            y = np.array([getattr(r, f"_{i + 5}") for i in range(len(CONCURRENCY))], dtype=float)
            ax.plot(x, y, marker="o", ls="-" if r._4 in ("measured", "mapped") else "--",
                    label=f"{r.GPU} (tp {r.tp}, {r._4})")
        ax.set(xscale="log", yscale="log", title=f"{mn} RM", xlabel="running sequences per GPU",
               ylabel="decode tokens/s per GPU")
        ax.legend(fontsize=6)
    fig.suptitle(f"Decode throughput from measured kernels ({CONTEXT} cached tokens a sequence)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# The service models each shipped GPU capacity scenario is answered under: a name, and the sized channel's
# rm keys that make it (the efficiency curve, racsim's default, named: a scenario may pin a flat MFU).
SERVICES = (("roofline, MFU 0.4", {"mfu": 0.4}), ("roofline, efficiency curve", {"mfu": "null"}),
            ("kernels", {"service": "kernels"}), ("kernels + 10%", {"service": "kernels", "kernel_overhead": 0.1}),
            ("kernels + 30%", {"service": "kernels", "kernel_overhead": 0.3}))
QUIET = ("capacity.sensitivity.enabled=false", "capacity.benchmark=false")


def shipped_capacity() -> List[str]:
    """The shipped capacity scenarios (scenarios/capacity/*.yaml), by name."""
    folder = files("racsim.scenarios.scenario").joinpath("capacity")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def one_answer(cfg: RacsimConf, name: str, service: str) -> dict:
    """A capacity run's answer: the recommended count, its offered load and costs (for capacity.corrector)."""
    res = run_capacity(cfg)
    row = {"scenario": name, "service": service, "GPUs": res.recommended}
    if res.recommended is not None:
        at = (res.curve["count"] == res.recommended) & (res.curve.corrector == res.targets["corrector"])
        r = res.curve[at].iloc[0]
        row.update({"load": r.load, "$/h": r.cost_per_hour, "$/1000 steps": r.cost_per_1000_steps})
    return row


def answers(overrides: Sequence[str], jobs: int = 1,
            progress: Optional[Progress] = None) -> Tuple[pd.DataFrame, List[str]]:
    """Every shipped capacity scenario whose sized channel is a GPU pool, answered under each of
    :data:`SERVICES` (``overrides`` after the scenario's, the sensitivity table and the speed figure
    off): a row per scenario and service; and the scenarios left out (not a GPU pool)."""
    plans, skipped = [], []
    for name in shipped_capacity():
        base = scenario(compose_config(f"scenario=capacity/{name}", *QUIET, *overrides))
        ch = base.capacity.channel
        if base.pipeline.channels[ch].kind != "gpu_rm":
            skipped.append(name)
            continue
        for service, keys in SERVICES:
            extra = [f"pipeline.channels.{ch}.rm.{k}={v}" for k, v in keys.items()]
            plans.append((scenario(compose_config(f"scenario=capacity/{name}", *QUIET, *overrides, *extra)), name,
                          service))
    progress = progress or Progress.off()
    progress.start("answers", len(plans), "run")
    rows = []
    if jobs > 1:
        with spawn_pool(min(jobs, len(plans))) as pool:
            for row in pool.map(one_answer, *zip(*((replace_workers(c), n, s) for c, n, s in plans))):
                rows.append(row)
                progress.advance(1, f"{row['scenario']}, {row['service']}: {gpus_text(row['GPUs'])}")
    else:
        for plan in plans:
            rows.append(one_answer(*plan))
            progress.advance(1, f"{plan[1]}, {plan[2]}: {gpus_text(rows[-1]['GPUs'])}")
    return pd.DataFrame(rows), skipped


def gpus_text(n: Optional[int]) -> str:
    return "no count meets the targets" if n is None else f"{n} GPUs"


def replace_workers(cfg: RacsimConf) -> RacsimConf:
    """A run in a pool of runs: its counts one at a time (the runs fill the cores)."""
    return replace_at(cfg, "capacity.workers", 1)


def answers_report(table: pd.DataFrame, skipped: List[str]) -> str:
    shown = table.copy()
    shown["GPUs"] = [("none" if pd.isna(v) else f"{int(v)}") for v in table["GPUs"]]
    for c, f in (("load", "{:.3f}"), ("$/h", "{:.2f}"), ("$/1000 steps", "{:.2f}")):
        shown[c] = [("-" if pd.isna(v) else f.format(v)) for v in table.get(c, [np.nan] * len(table))]
    head = ("racsim: each shipped capacity scenario whose sized channel is a GPU pool, under each service model "
            "(capacity.corrector's answer: GPUs, offered load, cost); not a GPU pool: " + ", ".join(skipped))
    return head + "\n" + shown.to_string(index=False)


@interruptible("python -m racsim.tools.kernels")
def main(argv: Sequence[str] | None = None) -> None:
    ap = Parser(prog="python -m racsim.tools.kernels", description=__doc__.splitlines()[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("derive", help="derive the shipped tables and the curve from files in the Vidur format")
    d.add_argument("src", type=Path, help="a folder of <gpu>/<model>.csv")
    sub.add_parser("fit", help="the curve's parameters, residuals and leave-one-out errors")
    sub.add_parser("catalog", help="where each catalog model's layer times on each GPU come from")
    dc = sub.add_parser("decode", help="decode tokens/s per GPU against concurrency")
    dc.add_argument("--out", type=Path, default=None, help="a folder for decode.png (default: no plot)")
    an = sub.add_parser("answers", help="every shipped GPU capacity scenario under each service model")
    an.add_argument("--jobs", type=int, default=1, help="runs side by side in that many processes (default 1)")
    an.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="overrides for every run, as racsim takes them")
    args = ap.parse_args(argv)
    try:
        if args.what == "derive":
            for p in derive(args.src):
                say(f"racsim.tools.kernels: wrote {p}")
        elif args.what == "fit":
            say(fit_report())
        elif args.what == "catalog":
            say(catalog_report())
        elif args.what == "decode":
            say(decode_report(args.out))
        else:
            with Progress("answers", mode="lines", quiet_s=0) as progress:
                table, skipped = answers(args.overrides, max(1, args.jobs), progress)
                progress.finish()
            say(answers_report(table, skipped))
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        say(f"python -m racsim.tools.kernels: error: {e}", sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
