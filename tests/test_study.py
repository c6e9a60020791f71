"""The study grid: expansion, shortcuts, and results that do not depend on how it is run."""

import numpy as np
import pytest

from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.errors import ConfigError
from racsim.pipeline.kernels import distribution_kernel
from racsim.analyses.dispatch import run


def cfg(*overrides, grid=None):
    c = compose_config("~scenario", *overrides)  # conf/'s defaults, no scenario
    if grid is not None:  # keys with commas are not expressible in Hydra's override grammar
        c.study.grid = grid
    return scenario(c)  # the config boundary: what the racsim command computes from


GRID = ["pipeline.delay_steps=[2,3]", "pipeline.batch_size=1", "pipeline.steps=10", "learner.trials=30",
        "learner.bootstrap=20", "corrector.names=[naive,rac,sync_oracle]", "learner.train.enabled=false"]


def test_cells_are_the_cartesian_product_with_tuples():
    cells = expand(cfg(*GRID, grid={"learner.mdp_seed": [0, 1, 2],
                                    "corrector.tau_age,corrector.alpha": [[5, 1.0], [50, 0.5]]}))
    assert len(cells) == 6
    seen = {(v["learner.mdp_seed"], v["corrector.tau_age"], v["corrector.alpha"]) for v, _ in cells}
    assert seen == {(s, t, a) for s in (0, 1, 2) for t, a in ((5, 1.0), (50, 0.5))}
    for values, c in cells:
        assert c.learner.mdp_seed == values["learner.mdp_seed"] and c.corrector.alpha == values["corrector.alpha"]
        assert list(c.pipeline.channels) == ["ch1", "ch2"] and c.pipeline.channels["ch2"].kernel == [0, 0, 0, 1.0]


@pytest.mark.parametrize("grid, key", [
    ({"learner.nope": [1, 2]}, "study.grid.learner.nope"),
    ({"learner.mdp_seed": []}, "study.grid.learner.mdp_seed"),
    ({"learner.mdp_seed,seed": [[1]]}, "study.grid.learner.mdp_seed,seed"),
    ({"pipeline.delay_distribution": [{"kind": "lognormal", "mean": 5, "bogus": 1}]},
     "study.grid.pipeline.delay_distribution"),
])
def test_bad_grid_names_the_key(grid, key):
    with pytest.raises(ConfigError) as ex:
        expand(cfg(*GRID, grid=grid))
    assert ex.value.key == key


def test_fast_mode_keeps_two_seeds_and_few_trials():
    cells = expand(cfg(*GRID, "learner.trials=1000", "study.fast=true", "+study.grid={learner.mdp_seed:[0,1,2,3],seed:[5,6,7]}"))
    assert len(cells) == 4 and all(c.learner.trials == 100 for _, c in cells)


def test_distribution_kernel_is_the_rounded_law():
    from racsim.config.schema import LatencyConf

    k = np.array(distribution_kernel(LatencyConf(kind="gaussian", mean=20.0, std=6.0, discrete=True, low=1.0, high=200.0), "x"))
    assert abs(k.sum() - 1) < 1e-9 and k[0] == 0.0
    assert abs((np.arange(len(k)) * k).sum() - 20.0) < 0.01
    rng = np.random.default_rng(0)
    draws = np.clip(np.rint(rng.normal(20, 6, 200_000)), 1, 200)
    emp = np.bincount(draws.astype(int), minlength=len(k))[: len(k)] / len(draws)
    assert np.abs(emp - k).max() < 0.003


@pytest.mark.long
def test_results_do_not_depend_on_workers_or_grouping():
    grid = "+study.grid={learner.mdp_seed:[0,1],corrector.tau_age:[5,1000]}"
    serial = run(cfg(*GRID, grid, "study.workers=1")).results
    parallel = run(cfg(*GRID, grid, "study.workers=2")).results
    assert serial.equals(parallel)
    # a cell run alone equals the same cell inside the grid (its group shares trajectories, not results)
    alone = run(cfg(*GRID, "learner.mdp_seed=1", "corrector.tau_age=5")).results
    inside = serial[(serial["learner.mdp_seed"] == 1) & (serial["corrector.tau_age"] == 5)]
    assert np.allclose(alone.bias_exact.to_numpy(), inside.bias_exact.to_numpy(), rtol=1e-12)
