"""racsim's sweeper and launcher (racsim/sweeper.py, hydra_plugins/racsim_sweeper), in process:
a job's config composed from a cached base equals Hydra's own composition of it
(load_sweep_config), key for key, for plain values, config groups, lists and
interpolations (and so are the plain dataclasses ``cell_object`` builds of
it); check_cells finds exactly the cells whose job would stop on its
config (the oracle: compose each with Hydra, then check it as the job does);
Hydra discovers the plugins; the batches keep the job numbers."""

from __future__ import annotations

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import RunMode
from omegaconf import OmegaConf

from racsim.analyses.grid import expand
from racsim.config.schema import register_configs
from racsim.config.spec import scenario
from racsim.sweep.callback import register_resolvers
from racsim.sweep import sweeper as S

SMALL = ["learner.trials=20", "learner.bootstrap=20", "learner.train.enabled=false", "pipeline.steps=8"]


@pytest.fixture(scope="module")
def loader():
    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


def sweep(loader, args):
    """(master config, cells, swept keys) of ``racsim -m ARGS``, as the sweeper sees them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    master = loader.load_configuration("config", list(args), RunMode.MULTIRUN)
    parsed = OverridesParser.create().parse_overrides(list(args))
    return master, BasicSweeper.split_arguments(parsed, None)[0], S.swept_keys(parsed)


@pytest.mark.parametrize("args", [
    [*SMALL, "seed=0,3", "corrector.tau_age=20,inf"],  # plain leaves: the fast path
    ["scenario=default,paper/tv_bound", "seed=1,2"],  # a config group swept: one base per scenario
    [*SMALL, "corrector.names=[naive],[rac,naive]", "corrector.alpha=0.5,1"],  # a list value: its own base
    [*SMALL, "learner.mdp_seed=${seed}", "seed=4,5"],  # an interpolation reads a swept key
    ["+study.grid.seed=[1,2]", "learner.trials=3,4"],  # an added key
])
@pytest.mark.long
def test_composed_from_a_base_equals_hydras_composition(loader, args):
    master, cells, swept = sweep(loader, args)
    composer = S.Composer(loader, master)
    for cell in cells:
        fast = composer.compose(cell, swept)
        slow = loader.load_sweep_config(master, list(cell))
        assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(slow), cell
        fast_task, slow_task = S.task_config(fast), S.task_config(slow)
        assert OmegaConf.to_yaml(fast_task, resolve=True) == OmegaConf.to_yaml(slow_task, resolve=True)
        assert OmegaConf.get_type(fast_task.corrector) is OmegaConf.get_type(slow_task.corrector)
        # the task config the racsim launcher hands the job, from the base's own task config
        task = composer.task(cell, swept)
        assert OmegaConf.to_yaml(task) == OmegaConf.to_yaml(slow_task), cell
        assert OmegaConf.is_struct(task) == OmegaConf.is_struct(slow_task)
        # the plain dataclasses the racsim launcher computes a batch from (no composition per job)
        assert composer.cell_object(cell, swept) == OmegaConf.to_object(slow_task), cell
    if args[-1] == "corrector.tau_age=20,inf":  # 4 cells, one Hydra composition
        assert len(composer._bases) == 1
    if args[0].startswith("scenario="):
        assert len(composer._bases) >= 2


def oracle(loader, master, cells):
    """The slow, obvious way: compose each cell with Hydra, then check it as its job does."""
    bad = []
    for i, cell in enumerate(cells):
        try:
            task = S.task_config(loader.load_sweep_config(master, list(cell)))
            expand(scenario(task))  # the config boundary (the schema check, the dataclasses), then the cells
        except Exception:
            bad.append(i)
    return bad


@pytest.mark.parametrize("args", [
    # a bad value alone (seed=-1), a cross-field rule (warmup_steps >= steps), a wrong type (abc)
    [*SMALL, "seed=-1,2", "pipeline.warmup_steps=0,8", "corrector.alpha=abc,1"],
    [*SMALL, "scenario=default,nope", "corrector.alpha=nan,1"],  # a config group that does not exist, a NaN
    [*SMALL, "+learner.nope=1,2"],  # a key the schema lacks
    # a swept integer beyond int64 (a leaf check of the set value), with a rule on another swept key
    [*SMALL, "seed=2,9223372036854775808", "learner.mdp_seed=-1,3"],
    # a base whose own leaf fails (checked cell by cell in full), a swept value on it
    [*SMALL, "learner.theta_seed=9223372036854775808", "corrector.alpha=0.5,1"],
])
@pytest.mark.long
def test_check_cells_finds_exactly_the_cells_whose_job_would_stop(loader, args):
    master, cells, swept = sweep(loader, args) if "scenario=default,nope" not in args else (None, None, None)
    if master is None:  # Hydra refuses an unknown group at the sweep's own composition: compose without it
        master, _, _ = sweep(loader, [a for a in args if not a.startswith("scenario")])
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(args)
        cells, swept = BasicSweeper.split_arguments(parsed, None)[0], S.swept_keys(parsed)
    found = S.check_cells(S.Composer(loader, master), cells, swept)
    assert [i for i, _ in found] == oracle(loader, master, cells)
    assert found, "the grid has bad cells"
    for i, why in found:  # one line naming the key
        assert "\n" not in why
        bad_keys = {"seed": "seed=-1", "pipeline.warmup_steps": "warmup_steps=8", "corrector.alpha": "alpha=",
                    "scenario": "scenario=nope", "learner.nope": "nope=", "seed =": "seed=922337",
                    "learner.mdp_seed": "mdp_seed=-1", "learner.theta_seed": "theta_seed=922337"}
        assert any(key in why and hint in " ".join(cells[i]) for key, hint in bad_keys.items()), (cells[i], why)
    if "seed=-1,2" in args:
        assert dict(found)[1].startswith("seed = -1: an integer >= 0")
    labels = [S.cell_label(c, swept) for c in cells]
    line = S.bad_cells_message(labels, found, shown=2)
    assert "\n" not in line and line.startswith(f"sweep: {len(found)} of {len(cells)} cells are invalid")
    assert f"job {found[0][0]} ({labels[found[0][0]]})" in line
    if len(found) > 2:
        assert line.endswith(f"and {len(found) - 2} more")


LAT = "pipeline.channels.judge.latency"


@pytest.mark.long
@pytest.mark.parametrize("swept", ["path", "kind"])
def test_check_cells_finds_a_missing_data_file_before_the_first_job(loader, tmp_path, swept):
    """A data file that some cells read and that is not there: refused by the cell check (the
    oracle agrees), whether the path is swept or a swept kind makes a cell read it."""
    good, gone = tmp_path / "good.csv", tmp_path / "gone.csv"
    good.write_text("x\n1\n2\n")
    vary = [f"{LAT}.path={good},{gone}"] if swept == "path" else [f"{LAT}.path={gone}",
                                                                  f"{LAT}.kind=lognormal,empirical"]
    args = [*SMALL, f"{LAT}.column=x", *vary, "seed=0,1", *([f"{LAT}.kind=empirical"] * (swept == "path"))]
    master, cells, keys = sweep(loader, args)
    found = S.check_cells(S.Composer(loader, master), cells, keys)
    assert [i for i, _ in found] == oracle(loader, master, cells) == [i for i, c in enumerate(cells)
                                                                         if f"{LAT}.kind=empirical" in c
                                                                         and f"{LAT}.path={gone}" in c]
    assert len(found) == 2
    for _, why in found:
        assert why.startswith(f"{LAT}.path = {str(gone)!r}: the path of a CSV file with the latency samples: "
                              f"there is no such file"), why


def test_hydra_discovers_the_plugins():
    assert "RacsimSweeper" in [c.__name__ for c in Plugins.instance().discover(Sweeper)]
    assert "RacsimLauncher" in [c.__name__ for c in Plugins.instance().discover(Launcher)]


@pytest.mark.parametrize("seed", range(20))
def test_chunks_keep_job_numbers(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(0, 40)
    cells = [[f"seed={i}"] for i in range(n)]
    todo = sorted(rng.sample(range(n), rng.randint(0, n)))
    size = rng.randint(1, 7)
    expected = []  # the obvious loop: a new chunk at a gap in the numbers or when the chunk is full
    for i in todo:
        if expected and i == expected[-1][-1] + 1 and len(expected[-1]) < size:
            expected[-1].append(i)
        else:
            expected.append([i])
    assert list(S.chunks(todo, cells, size)) == [(c[0], [cells[i] for i in c]) for c in expected]
