"""racsim-report over any mix of folders (issue 49, point 1): run folders, sweep jobs over swept knobs,
study grids, capacity plans and LM runs, side by side under one folder, some degenerate (every value
NaN, zero, negative or infinite, a single point, a knob only some jobs set, incomplete and damaged
folders): generated at random, each kind of folder as racsim writes it (results.parquet, channels.parquet,
capacity.parquet, done.json), and gathered by the command itself: it writes its tables, plots and
report.md and ends with its answer, never a traceback. The plots choose their scales from the values they
draw (racsim.report.plots.scale_from_data): log only where every value drawn is positive."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from racsim.report.plots import NO_DATA, _plt, log_fits, scale_from_data
from racsim.sweep.gather import main as report_main
from racsim.sweep.markers import write_marker

CORRECTORS = ["naive", "wait_for_slow", "rac", "sync_oracle"]
METRICS = ["bias_exact", "reduction_exact", "wallclock_ratio", "wallclock_s", "slack_eta", "J_at_naive_clock",
           "step_s", "delay_past_warmup"]
KINDS = ("normal", "nan", "zero", "negative", "inf", "mixed")


def values(rng, kind: str, n: int) -> np.ndarray:
    """``n`` values of a figure: ``normal`` positive ones spanning decades, or a degenerate column."""
    x = rng.lognormal(-3, 2, n)
    if kind == "nan":
        return np.full(n, np.nan)
    if kind == "zero":
        return np.zeros(n)
    if kind == "negative":
        return -x
    if kind == "inf":
        return np.where(rng.random(n) < 0.5, np.inf, x)
    if kind == "mixed":
        return rng.choice([np.nan, 0.0, -1.0, np.inf, 1.0, 1e-9, 1e9], n)
    return x


def write_job(folder, tables: dict, overrides: list, cell: dict) -> None:
    """A complete job as racsim leaves it: its tables, then done.json listing them."""
    folder.mkdir(parents=True)
    written = []
    for name, table in tables.items():
        table.to_parquet(folder / name, index=False)
        written.append(folder / name)
    write_marker(folder, written, overrides=overrides, cell=cell, job=None, runtime_s=1.0)


def run_tables(rng, seed: int, kinds: dict, cells=None) -> dict:
    """A bias run's results.parquet and channels.parquet (a grid job's when ``cells``: one block per cell)."""
    blocks, chans = [], []
    for c in cells or [None]:
        n = len(CORRECTORS)
        r = pd.DataFrame({"scenario": "default", "study": "", "mode": "pipeline", "corrector": CORRECTORS, "K": 2,
                          "steps": 20, "warmup_steps": 5, "trials": 8, "seed": seed})
        for m in METRICS:
            r[m] = values(rng, kinds.get(m, "normal"), n)
        r["stationary"] = bool(rng.random() < 0.7)
        ch = pd.DataFrame({"channel": ["verifier", "judge"], "emitted": [100, 100],
                           "dropped": rng.integers(0, 60, 2), "stationary": [True, bool(r["stationary"].iloc[0])],
                           "steady_note": ["", "trend in the batch means"],
                           "offered_load": rng.choice([np.nan, 0.5, 0.99, 1.0, 2.5], 2)})
        if c is not None:
            r.insert(0, "cell", c)
            r.insert(1, "corrector.tau_age", float(10 * (c + 1)))
            ch.insert(0, "cell", c)
        blocks.append(r)
        chans.append(ch)
    return {"results.parquet": pd.concat(blocks, ignore_index=True),
            "channels.parquet": pd.concat(chans, ignore_index=True)}


def capacity_table(rng) -> pd.DataFrame:
    counts = sorted(rng.choice(np.arange(1, 17), size=int(rng.integers(1, 5)), replace=False))
    rows = [{"channel": "judge", "count": int(n), "corrector": c, "feasible": bool(rng.random() < 0.6),
             "stationary": bool(rng.random() < 0.8), "load": 4.0 / n, "bias_exact": float(values(rng, "mixed", 1)[0]),
             "step_s": rng.random() * 10, "dropped_frac": rng.random() / 10}
            for n in counts for c in ("naive", "rac", "sync_oracle")]
    return pd.DataFrame(rows)


def lm_table(rng, seed: int) -> pd.DataFrame:
    return pd.DataFrame({"scenario": "default", "study": "", "mode": "pipeline", "policy": "bandit",
                         "corrector": ["naive", "rac"], "K": 2, "seed": seed, "seeds": 3,
                         "true_final": values(rng, "mixed", 2), "true_at_naive_clock": values(rng, "normal", 2),
                         "wallclock_ratio": [1.0, 1.0], "wallclock_s": values(rng, "normal", 2)})


def make_mix(root, seed: int) -> int:
    """Every kind of folder under ``root``, degenerate columns drawn at random; the complete jobs made."""
    rng = np.random.default_rng(seed)
    jobs = 0
    for i in range(3):  # plain runs, no overrides
        write_job(root / "default" / f"run{i}", run_tables(rng, i, {m: rng.choice(KINDS) for m in METRICS}), [], {})
        jobs += 1
    knob = rng.choice(["workers", "one value", "everything nan"])
    for j, (w, s) in enumerate((w, s) for w in (4, 16, 64) for s in (0, 1)):  # a sweep over a knob and seeds
        if knob == "one value":
            w = 4
        kinds = {"bias_exact": "nan"} if knob == "everything nan" else {"bias_exact": rng.choice(KINDS)}
        over = [f"pipeline.channels.judge.workers={w}", f"seed={s}"]
        write_job(root / "default" / "multirun_x" / str(j), run_tables(rng, s, kinds), over,
                  {"pipeline.channels.judge.workers": w, "seed": s})
        jobs += 1
    write_job(root / "default" / "grid", run_tables(rng, 0, {}, cells=[0, 1, 2]), [], {})  # a study grid
    single = root / "lonely" / "0"  # a sweep of one job, one cell, one seed
    write_job(single, run_tables(rng, 0, {m: "mixed" for m in METRICS}), ["corrector.tau_age=5"],
              {"corrector.tau_age": 5})
    for s in (0, 1):  # capacity plans
        write_job(root / "capacity" / f"s{s}", {"capacity.parquet": capacity_table(rng)}, [f"seed={s}"], {"seed": s})
    write_job(root / "lm" / "run", {"results.parquet": lm_table(rng, 0)}, [], {})
    jobs += 5
    (root / "default" / "multirun_x" / "99" / ".hydra").mkdir(parents=True)  # a job that never finished
    damaged = root / "default" / "damaged"  # a job whose results changed after its marker
    write_job(damaged, run_tables(rng, 0, {}), [], {})
    (damaged / "results.parquet").write_bytes(b"PAR1 half a file")
    return jobs


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.long) for s in range(1, 12))])
def test_racsim_report_over_a_generated_mix_of_folders(tmp_path, capsys, seed):
    jobs = make_mix(tmp_path / "outputs", seed)
    report_main([str(tmp_path / "outputs")])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert f"racsim-report: {jobs} job(s)" in out
    top = tmp_path / "outputs"
    for name in ("results.parquet", "results.csv", "aggregate.parquet", "aggregate.csv", "report.md"):
        assert (top / name).is_file(), name
    for png in top.glob("*.png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    agg = pd.read_parquet(top / "aggregate.parquet")
    assert {"stationary", "offered_load", "dropped_share", "warnings"} <= set(agg.columns)
    report = (top / "report.md").read_text()
    assert "1 incomplete job folder(s) left out" not in report  # the damaged one and the unfinished one: two
    assert "2 incomplete job folder(s) left out" in report and "`health` says" in report
    assert all(len(ln) <= 120 for ln in out.splitlines())


def test_a_log_axis_only_where_every_value_drawn_is_positive():
    cases = [([1.0, 10.0, 100.0], True), ([0.0, 1.0], False), ([-1.0, 5.0], False), ([np.nan, np.inf], False),
             ([], False), ([3.0], True), ([np.nan, 2.0, np.inf], True), (["text", 2.0], True)]
    plt = _plt()
    fig, axes = plt.subplots(1, len(cases))
    for ax, (drawn, log) in zip(axes, cases):
        assert log_fits(drawn) == log, drawn
        ax.plot(pd.to_numeric(pd.Series(drawn, dtype=object), errors="coerce"), "o")
        assert scale_from_data(ax, "y", drawn) == log and ax.get_yscale() == ("log" if log else "linear")
        noted = [t for t in ax.texts if t.get_gid() == NO_DATA]
        assert len(noted) == (not any(isinstance(v, float) and math.isfinite(v) for v in drawn)), drawn
    fig.canvas.draw()  # matplotlib draws them all: no "Data cannot be log-scaled"
    plt.close(fig)
    assert not log_fits([1.0, 10.0], spread=20) and log_fits([1.0, 20.0], spread=20)
