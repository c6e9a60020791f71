"""Every plot a run writes can be read (issue 43, point 5), checked from matplotlib's layout, no browser:
each legend lies inside the figure, off every axes' data area and every title and axis label
(racsim.report.plots.legend_problems, itself checked on a legend put over the data); the capacity
curve draws the dropped share the table prints, a delay axis that starts at 0, coinciding series once
(named together), and its recommendation as a legend entry, not a label on another line."""

from __future__ import annotations

import contextlib
import io
import sys

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from racsim.report.plots import _plt, alike, legend_outside, legend_problems

matplotlib.use("Agg")

SMALL = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=30", "pipeline.warmup_steps=5",
         "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false",
         "capacity.sensitivity.enabled=false"]
RUNS = {
    "default": ["learner.trials=8", "pipeline.steps=20", "learner.bootstrap=20"],
    # the curve as the search reads it (the deciding replications, three times its time, draw nothing more)
    "capacity": ["scenario=capacity/judge_rm_faults", *SMALL, "capacity.counts=[4,8]", "capacity.decide_steps=0"],
    "lm": ["learner=lm", "learner.lm.policy=bandit", "learner.lm.seeds=3", "pipeline.steps=8", "learner.lm.decide=[]"],
    "lags": ["scenario=two_lags", "learner.trials=4", "learner.bootstrap=20", "learner.horizon=5", "pipeline.steps=10", "pipeline.warmup_steps=4",
             "learner.train.lanes=2",
             "study.grid={pipeline.delay_distribution.mean: [1.0, 4.0], pipeline.generation.lag.mean: [0.0, 3.0]}"],
}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """``drawn(run)``: the figures that run saved, by file name, each with its legend problems (read as it
    was saved), and its folder under "_dir"; each run made once, by the first test that asks for it."""
    made: dict = {}

    def get(run: str) -> dict:
        if run not in made:
            made[run] = _drawn(run, tmp_path_factory.mktemp(run))
        return made[run]

    return get


def _drawn(run: str, tmp) -> dict:
    out = {"_dir": tmp / "run"}
    real = Figure.savefig

    def save(fig, fname, *args, **kw):
        name = getattr(fname, "name", str(fname)).split("/")[-1].lstrip(".")  # the atomic writer's temporary
        out[name[: name.index(".png") + 4]] = (legend_problems(fig), fig)
        return real(fig, fname, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", save)
        mp.chdir(tmp)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = _run(mp, [*RUNS[run], f"hydra.run.dir={tmp / 'run'}"])
    assert code in (0, None), (run, code)
    return out


def _run(mp, argv):
    from racsim.app import cli

    mp.setattr(sys, "argv", ["racsim", *argv])
    try:
        cli.main()
    except SystemExit as ex:
        return ex.code
    return 0


# each run takes a few seconds: in the long stage, with the capacity curve's own test (and the lag grid's)
@pytest.mark.long
@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_legend_is_inside_the_figure_and_off_the_data_and_text(drawn, run):
    figs = {k: v for k, v in drawn(run).items() if k != "_dir"}
    assert figs, f"{run}: no plot written"
    assert {name: problems for name, (problems, _) in figs.items() if problems} == {}


def test_the_check_finds_a_legend_over_the_data_or_the_title():
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(np.arange(10), np.arange(10), label="a series with a long name that covers the data")
    ax.set_title("a title")
    ax.legend(loc="center")
    assert any("over the data" in p for p in legend_problems(fig))
    ax.get_legend().remove()
    fig.legend(loc="upper center")
    assert any("over the text 'a title'" in p for p in legend_problems(fig))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    ax.plot(np.arange(10), label="x")
    ax.twinx().plot(np.arange(10)[::-1], label="y, on the twin")
    ax.set_title("a title")
    legend_outside(ax)
    assert legend_problems(fig) == [] and len(ax.get_legend().get_texts()) == 2  # the twin's series named too
    plt.close(fig)


@pytest.mark.long
def test_the_capacity_curve_draws_what_the_table_says(drawn):
    _, fig = drawn("capacity")["capacity.png"]
    curve = pd.read_csv(drawn("capacity")["_dir"] / "capacity.csv")
    rac = curve[curve.corrector == "rac"].sort_values("count")
    delay = fig.axes[0]
    assert delay.get_ylim()[0] == 0
    twin = next(a for a in fig.axes if a is not delay and a.get_position().bounds == delay.get_position().bounds)
    (dropped,) = [ln for ln in twin.get_lines() if ln.get_label().startswith("dropped")]
    np.testing.assert_allclose(dropped.get_ydata(), 100 * rac.dropped_frac.to_numpy())
    labels = [t.get_text() for a in fig.axes if a.get_legend() for t in a.get_legend().get_texts()]
    assert any(t.startswith("recommended: ") for t in labels) or curve.feasible.sum() == 0
    assert not [t for a in fig.axes for t in a.texts if "recommended" in t.get_text()]  # no label on a line
    steps = [t for t in labels if t.startswith("s/step ")]
    assert len(steps) == len(alike(curve, "step_s")) < curve.corrector.nunique()  # coinciding series once


def test_alike_groups_equal_series_in_order():
    c = pd.DataFrame({"corrector": ["a", "a", "b", "b", "c", "c", "d", "d"], "count": [1, 2] * 4,
                      "y": [1.0, np.nan, 1.0, np.nan, 2.0, 3.0, 1.0, 2.0]})
    assert [names for names, _ in alike(c, "y")] == [["a", "b"], ["c"], ["d"]]


def test_a_sweeps_knob_plot_keeps_its_legend_off_the_panels_and_title():
    from test_aggregate import synthetic

    from racsim.report import aggregate as A

    agg = A.aggregate(*synthetic(0))
    one = agg[(agg["pipeline.batch_size"] == 2) & (agg["mode"] == "pipeline")].drop(columns=["pipeline.batch_size",
                                                                                            "mode"])
    for table in (agg, one):  # many panels, and one (the sweep of docs/sweeps.md: its legend once hid two lines)
        fig = A.knob_figure(table, "corrector.tau_age")
        assert legend_problems(fig) == [] and len(fig.legends) == 1


def test_the_gantt_legend_names_every_colour_drawn(drawn):
    """Issue 49: the legend named the optimizer's phases only while the channels' bars took the same colours."""
    from matplotlib.colors import to_hex

    _, fig = drawn("default")["gantt.png"]
    ax = fig.axes[0]
    bars = {to_hex(c) for coll in ax.collections for c in coll.get_facecolors()}
    named = {to_hex(h.get_facecolor()) for h in ax.get_legend().legend_handles}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert bars == named, (bars - named, named - bars)
    assert "generate" in labels and "channel: rollout of step 0" in labels


def test_markers_at_one_clock_are_told_apart(drawn):
    """Issue 49: five markers overlapped at x = 1 on pareto.png. Correctors at one point are one marker named
    together; at one clock, the markers spread sideways in the order of their reduction (dodged), each within
    a few percent of its clock."""
    from racsim.report.plots import DODGE, dodged

    rng = np.random.default_rng(4)
    for _ in range(100):
        n = int(rng.integers(1, 9))
        x = rng.choice([1.0, 1.0, 1.0, 2.5, 5.6], n)
        y = rng.lognormal(0, 2, n)
        got = dodged(x, y)
        for v in np.unique(x):
            at = np.flatnonzero(x == v)
            order = at[np.argsort(y[at], kind="stable")]
            assert np.all(np.diff(got[order]) > 0) or len(at) == 1  # left to right by reduction, none alike
            assert np.all(np.abs(np.log(got[at] / v)) <= DODGE * (len(at) - 1) / 2 + 1e-12)
    _, fig = drawn("default")["pareto.png"]
    ax = fig.axes[0]
    xy = [(float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in ax.get_lines() if len(ln.get_xdata()) == 1
          and ln.get_marker() not in (None, "None", "", "_")]
    assert len(xy) == len(set(xy)) and len({x for x, _ in xy}) == len(xy), xy
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    results = pd.read_csv(drawn("default")["_dir"] / "results.csv")
    assert sum(len(t.split(" (")[0].split(", ")) for t in labels) == len(results)  # every corrector named once


def test_the_capacity_plot_shades_every_count_that_misses_and_its_slack_axis_starts_at_0():
    """Issue 49: a count failing two targets was not shaded; the slack axis spanned 0.0016-0.0024."""
    from racsim.analyses.capacity import CapacityResult
    from racsim.report.plots import capacity_curve, shaded

    rng = np.random.default_rng(9)
    missed = {5: "max_dropped, max_sojourn_p95_s", 7: "max_dropped"}  # 5 misses two targets, 7 one
    rows = []
    for n in range(1, 11):
        load = 4.0 / n
        fails = "load" if load >= 0.95 else missed.get(n, "")
        status = f"overloaded: load {load:.3g} >= capacity.max_load 0.95" if load >= 0.95 else "ok"
        for c in ("naive", "rac"):
            rows.append({"count": n, "corrector": c, "load": load, "status": status, "fails": fails,
                         "feasible": not fails, "delay_p50_steps": 1.0, "delay_p95_steps": 2.0,
                         "dropped_frac": 0.01, "bias_exact": 1e-3 if c == "rac" else 0.04, "step_s": 8.0,
                         "eta": 0.0016 + 0.0008 * rng.random(), "utilisation": min(load, 1.0),
                         "cost_per_hour": 2.5 * n})
    curve = pd.DataFrame(rows)
    base = curve[curve.corrector == "rac"]
    want = [(r.count, "red" if r.status != "ok" else "orange") for r in base.itertuples()
            if r.status != "ok" or r.fails]
    assert shaded(base) == want and any(", " in f for f in base.fails)  # two targets missed: shaded too
    res = CapacityResult(curve, "judge", "GPUs", "k", None, pd.DataFrame(), {"corrector": "rac"})
    plt = _plt()
    figs = []
    real = plt.close
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("racsim.report.plots._save", lambda fig, path: figs.append(fig))
        mp.setattr(plt, "close", lambda fig: None)
        capacity_curve(res, None)
    fig = figs[0]
    slack = next(a for a in fig.axes if a.get_ylabel().startswith("slack eta"))
    assert slack.get_ylim()[0] == 0 and slack.get_ylim()[1] >= 0.01
    spans = sorted({(round(p.get_x() + p.get_width() / 2, 6), p.get_facecolor()[:3]) for a in fig.axes[:1]
                    for p in a.patches})
    from matplotlib.colors import to_rgb
    assert [(n, to_rgb(c)) for n, c in want] == [(int(x), rgb) for x, rgb in spans]
    real(fig)
