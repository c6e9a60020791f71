"""Accepted runs put no NumPy or matplotlib RuntimeWarning on stderr (issue 27): a capacity run whose
targets are far out (1e308: the plot's target lines once stretched its axes until matplotlib overflowed),
a default run and an LM run, in-process with every RuntimeWarning turned into an error, plots on."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import racsim
from racsim.report.plots import _plt, target_line

SMALL_CAPACITY = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=30", "pipeline.warmup_steps=5",
                  "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false",
                  "capacity.counts=[1,5,8]"]
RUNS = {
    "capacity, targets far out": ("capacity/judge_rm_faults", [*SMALL_CAPACITY, "capacity.max_bias=1e308",
                                                               "capacity.max_bias_vs_naive=1e308",
                                                               "capacity.max_step_s=1e308"]),
    "capacity, targets near 0": ("capacity/judge_rm_h100", [*SMALL_CAPACITY, "capacity.max_bias=1e-300",
                                                          "capacity.max_step_s=1e-300", "capacity.max_dropped=0"]),
    "default": (None, ["learner.trials=8", "pipeline.steps=20"]),
    "lm": (None, ["learner=lm", "learner.lm.policy=bandit", "learner.lm.seeds=2", "pipeline.steps=8", "learner.lm.decide=[]"]),
}


@pytest.mark.long  # a run of each kind, 2-4 CPU s each
@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_accepted_run_raises_no_runtime_warning(tmp_path, name):
    scenario, overrides = RUNS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        t = racsim.run(scenario, [*overrides, "output.plots=true"], out=tmp_path / "run")
    assert any(f.suffix == ".png" for f in map(__import__("pathlib").Path, t.files))


def test_a_target_line_is_drawn_near_the_data_and_only_named_far_from_it():
    plt = _plt()
    fig, ax = plt.subplots()
    data = np.array([0.5, 2.0, np.nan])
    cases = [(3.0, False, True), (20.0, False, True), (20.01, False, False), (1e308, False, False),
             (np.inf, False, False), (np.nan, False, False), (0.0, True, False), (-1.0, True, False),
             (0.0, False, True), (1e-3, True, True)]
    for y, log, drawn in cases:
        before = len(ax.lines)
        target_line(ax, y, data, log=log, color="red", label=f"t{y}")
        line = ax.lines[before]
        assert len(ax.lines) == before + 1
        assert (len(line.get_xdata()) > 0) == drawn, (y, log)
        assert line.get_label() == f"t{y}" + ("" if drawn else " (off the plot)")
    target_line(ax, 5.0, [np.nan], label="none")  # no data: drawn where it is
    assert ax.lines[-1].get_label() == "none"
    plt.close(fig)
