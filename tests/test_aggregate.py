"""A sweep's answer (racsim/report/aggregate.py, racsim/report/gather.py): the gathered rows averaged
over seeds against a hand loop, the plot per swept knob and its series, and a tiny sweep end to end."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import racsim
from racsim.report import aggregate as A
from racsim.sweep.gather import gather_and_write
from racsim.report.paper import paper_report

# t(0.975, df) for df = 1..5, from a printed table: the interval is a t interval, not a normal one
T975 = dict(enumerate([12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228], start=1))
CORRECTORS = ["naive", "rac", "wait_for_slow"]


def synthetic(seed: int) -> tuple:
    """A gathered table: jobs over tau_age x batch_size x seed (1 to 5 seeds a cell), each a grid
    over mdp_seed and mode (one cell of one seed and one mdp_seed), K constant; metrics random, some NaN."""
    rng = np.random.default_rng(seed)
    rows = []
    job = 0
    for tau in (20.0, 1000.0):
        for batch in (2, 8):
            lone = (tau, batch) == (20.0, 8)  # one seed, one grid cell: no interval
            for s in range(1 if lone else int(rng.integers(1, 6))):
                for mdp in (1,) if lone else (1, 2):
                    for mode in ("pipeline", "static"):
                        for name in CORRECTORS:
                            rows.append({"job_dir": str(job), "corrector.tau_age": tau, "pipeline.batch_size": batch,
                                         "override:seed": s, "learner.mdp_seed": mdp, "cell": mdp, "scenario": "x",
                                         "study": "", "mode": mode, "corrector": name, "K": 2, "seed": s,
                                         "bias_exact": rng.lognormal() if rng.random() > 0.1 else math.nan,
                                         "wallclock_s": rng.uniform(50, 60), "reduction_exact": rng.uniform(1, 3)})
                job += 1
    axes = ["corrector.tau_age", "pipeline.batch_size", "override:seed", "learner.mdp_seed"]
    return pd.DataFrame(rows), axes


def hand(df: pd.DataFrame, keys: list, metric: str, low: float = -math.inf) -> dict:
    """{cell and corrector: (n, mean, lo, hi)} by a plain loop over the rows, lo at least ``low``."""
    groups: dict = {}
    for _, r in df.iterrows():
        groups.setdefault(tuple(r[k] for k in keys), []).append(r[metric])
    out = {}
    for key, values in groups.items():
        x = [v for v in values if not math.isnan(v)]
        n = len(x)
        mean = sum(x) / n if n else math.nan
        if n < 2:
            out[key] = (len(values), mean, math.nan, math.nan)
            continue
        sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
        half = T975[n - 1] * sd / math.sqrt(n)
        out[key] = (len(values), mean, max(mean - half, low), mean + half)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_aggregate_is_the_hand_loop(seed):
    df, axes = synthetic(seed)
    agg = A.aggregate(df, axes)
    keys = ["corrector.tau_age", "pipeline.batch_size", "mode", "corrector"]  # seeds out, K constant: no key
    assert list(agg.columns[:5]) == keys[:3] + ["corrector", "n"]
    for metric in ("bias_exact", "wallclock_s", "reduction_exact"):
        want = hand(df, keys, metric, low=0.0)  # a bias, a duration, a ratio: never below 0
        assert len(agg) == len(want)
        for _, r in agg.iterrows():
            n, mean, lo, hi = want[tuple(r[k] for k in keys)]
            assert r["n"] == n
            got = (r[metric], r[metric] - r[f"{metric}_lo"], r[f"{metric}_hi"] - r[metric])  # mean, the half widths
            for g, e, rel in zip(got, (mean, mean - lo, hi - mean), (1e-12, 1e-3, 1e-3)):
                assert (math.isnan(g) and math.isnan(e)) or g == pytest.approx(e, rel=rel), (metric, r)
    assert (agg.n == 1).any() and (agg.n >= 2).any()


def test_seed_axes_and_cells():
    assert all(map(A.is_seed, ["seed", "override:seed", "learner.mdp_seed", "mdp_seed"]))
    assert not any(map(A.is_seed, ["corrector.tau_age", "seeds", "override:corrector"]))
    df = pd.DataFrame({"a": [1, 1, 2], "b": [5, 5, 5], "seed": [0, 1, 0], "K": [2, 2, 2], "mode": ["p", "s", "p"]})
    assert A.cell_keys(df, ["a", "b", "seed"]) == ["a", "mode"]  # b never varies, K neither; seed is averaged
    assert A.fixed(df, ["a", "b", "seed"]) == {"b": 5}
    agg = pd.DataFrame({"x": [1.0, 2.0], "flag": [True, False], "group": ["u", "v"], "K": [2, 3],
                        "corrector": ["rac", "rac"], "n": [1, 1]})
    assert A.knobs(agg) == ["x"]  # not a bool, a text, a descriptor, nor anything after corrector


def test_text_shows_intervals_only_where_there_are_some():
    agg = pd.DataFrame({"corrector.tau_age": [20.0, 1000.0], "corrector": ["rac", "rac"], "n": [3, 1],
                        "bias_exact": [0.5, 0.25], "bias_exact_lo": [0.25, math.nan], "bias_exact_hi": [0.75, math.nan]})
    lines = A.format_aggregate(agg).splitlines()
    assert lines[0].split() == ["tau_age", "corrector", "n", "bias", "(exact)"]
    assert lines[1].split()[-3:] == ["0.5", "[0.25,", "0.75]"] and lines[2].split()[-1] == "0.25"


@pytest.mark.long
def test_one_plot_per_swept_numeric_knob_with_its_series(tmp_path):
    df, axes = synthetic(0)
    agg = A.aggregate(df, axes)
    assert A.knobs(agg) == ["corrector.tau_age", "pipeline.batch_size"]
    written = A.write_knob_plots(agg, tmp_path)
    assert [p.name for p in written] == ["sweep_corrector.tau_age.png", "sweep_pipeline.batch_size.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    fig = A.knob_figure(agg, "corrector.tau_age")
    # one row of panels per metric, one panel per (batch_size, mode), one series per corrector in its own colour
    combos = [(b, mode) for b in (2, 8) for mode in ("pipeline", "static")]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 * len(combos)
    colours = {}
    for ax, (metric, (b, mode)) in zip(panels, [(m, c) for m in ("bias_exact", "wallclock_s") for c in combos]):
        assert ax.get_title() == f"batch_size={b}, mode={mode}"
        labels = ax.get_legend_handles_labels()[1]
        assert sorted(labels) == sorted(CORRECTORS) and len(ax.containers) == len(CORRECTORS)
        for container, name in zip(ax.containers, labels):
            rows = agg[(agg.corrector == name) & (agg["pipeline.batch_size"] == b) & (agg["mode"] == mode)]
            rows = rows.sort_values("corrector.tau_age")
            x, y = container.lines[0].get_data()
            assert list(x) == list(rows["corrector.tau_age"])
            np.testing.assert_array_equal(np.asarray(y, dtype=float), rows[metric].to_numpy(dtype=float))
            colours.setdefault(name, set()).add(container.lines[0].get_color())
    assert all(len(c) == 1 for c in colours.values())  # a corrector has one colour in every panel
    assert len({next(iter(c)) for c in colours.values()}) == len(CORRECTORS)  # and no two share one
    assert panels[0].get_xscale() == "log" and panels[-1].get_ylabel().startswith("clock s")
    A._plt().close(fig)


def test_no_paper_section_without_a_paper_study():
    df, _ = synthetic(1)
    assert paper_report(df, ".") == ""


def test_a_grid_job_through_racsim_run(tmp_path):
    """A multi-cell job (a study grid over seed and tau_age) written by racsim.run: gathered, its rows
    keep the grid's columns, and the seed axis of the grid is averaged."""
    grid = "study.grid={seed:[0,1,2],corrector.tau_age:[20,1000]}"
    t = racsim.run(overrides=["learner.trials=8", "learner.bootstrap=0", "learner.train.enabled=false",
                              "pipeline.steps=8", "output.plots=false", grid], out=tmp_path / "job")
    g = gather_and_write(tmp_path / "job", out=tmp_path / "report")
    assert {"seed", "corrector.tau_age"} <= set(g.table.columns) and len(g.table) == len(t.results)
    assert list(g.aggregate.columns[:3]) == ["corrector.tau_age", "corrector", "n"] and (g.aggregate.n == 3).all()
    rac = t.results[(t.results.corrector == "rac") & (t.results["corrector.tau_age"] == 20)]
    row = g.aggregate[(g.aggregate.corrector == "rac") & (g.aggregate["corrector.tau_age"] == 20)].iloc[0]
    assert row.bias_exact == pytest.approx(rac.bias_exact.mean(), rel=1e-12)
    assert [p.name for p in g.written if p.suffix == ".png"] == ["sweep_corrector.tau_age.png"]


@pytest.mark.long
def test_a_tiny_sweep_prints_its_answer(tmp_path):
    cmd = [sys.executable, "-m", "racsim", "-m", "seed=0,1", "corrector.tau_age=20,1000", "learner.trials=8",
           "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=8", "output.progress=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout[proc.stdout.index("one row per cell and"):].splitlines()  # its line may wrap (120 columns)
    head = next(k for k, ln in enumerate(lines) if ln.split()[:1] == ["tau_age"])
    # the table's rows: up to the note on the columns left out, or the warning naming cells not healthy
    rows = list(itertools.takewhile(lambda ln: not ln.startswith(("(", "warning:", "racsim:")), lines[head + 1:]))
    assert lines[head].split()[:3] == ["tau_age", "corrector", "n"] and len(rows) == 2 * 8  # 2 cells x 8 correctors
    sweep = next((tmp_path / "outputs" / "default").glob("multirun_*"))
    flat = pd.read_parquet(sweep / "results.parquet")
    agg = pd.read_parquet(sweep / "aggregate.parquet")
    assert "job" not in flat and len(flat) == 4 * 8 and (agg.n == 2).all() and len(agg) == 2 * 8
    pd.testing.assert_frame_equal(agg, A.aggregate(flat, ["override:seed", "corrector.tau_age"]))
    report = (sweep / "report.md").read_text()
    assert "## Results per cell" in report and "averaged over `seed`" in report and "t interval" in report
    assert "racsim beside the paper" not in report and "![sweep_corrector.tau_age.png]" in report
    assert (sweep / "sweep_corrector.tau_age.png").read_bytes()[:4] == b"\x89PNG"
    again = subprocess.run([sys.executable, "-c", "from racsim.sweep.gather import main; main()", str(sweep),
                            "--out", str(tmp_path / "again")], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "aggregate.parquet").read_bytes() == (sweep / "aggregate.parquet").read_bytes()
    assert "one row per cell and corrector" in again.stdout


def _fewest_by_hand(curve, corrector):
    """The fewest count at and above which every evaluated count meets the targets (a plain loop)."""
    sub = curve[curve.corrector == corrector].sort_values("count")
    best = None
    for count, ok in zip(sub["count"], sub["feasible"]):
        if not ok:
            best = None
        elif best is None:
            best = count
    return best


@pytest.mark.parametrize("seed", range(8))
def test_a_capacity_job_gathers_as_its_answer_per_corrector(seed):
    from racsim.sweep.gather import capacity_rows

    rng = np.random.default_rng(seed)
    counts = sorted(rng.choice(np.arange(1, 40), size=int(rng.integers(1, 7)), replace=False))
    names = ["naive", "rac", "sync_oracle"]
    curve = pd.DataFrame([{"channel": "judge", "count": int(n), "corrector": c, "feasible": bool(rng.random() < 0.6),
                           "load": 5.0 / n, "bias_exact": rng.random(), "step_s": rng.random() * 10,
                           "dropped_frac": rng.random() / 10} for n in counts for c in names])
    rows = capacity_rows(curve).set_index("corrector")
    assert list(rows.index) == ["naive", "rac"]  # the synchronous oracle is a reference, not a pipeline
    for c in ("naive", "rac"):
        n = _fewest_by_hand(curve, c)
        r = rows.loc[c]
        assert r["counts_tried"] == len(counts) and r["channel"] == "judge"
        if n is None:
            assert math.isnan(r["recommended"]) and math.isnan(r["recommended_load"])
        else:
            at = curve[(curve.corrector == c) & (curve["count"] == n)].iloc[0]
            assert r["recommended"] == n and r["recommended_load"] == at["load"] and r["recommended_bias"] == at["bias_exact"]
            assert r["recommended_step_s"] == at["step_s"] and r["recommended_dropped"] == at["dropped_frac"]


@pytest.mark.long  # a capacity sweep: 4 CPU s
def test_capacity_jobs_are_gathered_and_reported(tmp_path):
    """Two capacity runs (two seeds) under one folder: racsim-report reads them, one row per job and
    corrector, and the answer over seeds is the fewest count with its load."""
    small = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=30", "pipeline.warmup_steps=5",
             "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false", "output.plots=false",
             "capacity.counts=[4,5,6]", "corrector.names=[naive,rac]"]
    plans = {s: racsim.run("capacity/judge_rm_h100", [*small, f"seed={s}"], out=tmp_path / "plans" / f"s{s}")
             for s in (0, 1)}
    g = gather_and_write(tmp_path / "plans", out=tmp_path / "report", plots=False)
    assert len(g.table) == 4 and set(g.table["job_dir"]) == {"s0", "s1"}
    rac = g.table[g.table.corrector == "rac"].set_index("job_dir")
    assert all(t.recommended is not None for t in plans.values())  # 30 steps: long enough to show a steady state
    for s, t in plans.items():
        assert rac.loc[f"s{s}", "recommended"] == t.recommended
    agg = g.aggregate[g.aggregate.corrector == "rac"].iloc[0]
    assert agg["n"] == 2 and agg["recommended"] == np.mean([t.recommended for t in plans.values()])
    assert "fewest count" in (tmp_path / "report" / "report.md").read_text()


def test_the_same_run_twice_is_one_sample_not_two():
    """Two folders of one config at one seed (racsim-report over outputs/) give the same rows: n = 1.
    Another seed, or rows that differ (a config changed between the runs), count apart."""
    row = {"job_dir": "a", "corrector": "rac", "seed": 0, "bias_exact": 0.5, "wallclock_s": 10.0}
    same = pd.DataFrame([row, {**row, "job_dir": "b"}])
    assert A.aggregate(same, [])["n"].tolist() == [1]
    assert A.aggregate(pd.DataFrame([row, {**row, "job_dir": "b", "seed": 1}]), [])["n"].tolist() == [2]
    assert A.aggregate(pd.DataFrame([row, {**row, "job_dir": "b", "bias_exact": 0.4}]), [])["n"].tolist() == [2]
    swept = pd.DataFrame([{**row, "learner.mdp_seed": s} for s in (0, 1, 2)])  # one results seed, three mdp seeds
    assert A.aggregate(swept, ["learner.mdp_seed"])["n"].tolist() == [3]
