"""Own data used as given (issue 20, point 4): an empirical latency law chosen on the command
line uses the data as measured unless the command line sets a mean; a rescale or clip of a
user's data is printed in one line and recorded in summary.md, which names every channel's
law, mean and source and the run's overrides."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from helpers import messages

from racsim.config.defaults import compose_config, empirical_blocks
from racsim.config.schema import LatencyConf
from racsim.pipeline.latency import build_latency
from test_cli import SMALL, racsim

JUDGE = "pipeline.channels.judge.latency"
TINY = ["learner.trials=8", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=6",
        "output.plots=false", "output.progress=false"]


def _csv(tmp_path, values, name="delays.csv"):
    path = tmp_path / name
    pd.DataFrame({"seconds": values}).to_csv(path, index=False)
    return path


def empirical(path, *extra):
    return [f"{JUDGE}.kind=empirical", f"{JUDGE}.path={path}", f"{JUDGE}.column=seconds", *extra]


def test_choosing_empirical_drops_the_presets_mean_unless_the_command_line_sets_one():
    assert compose_config().pipeline.channels.judge.latency.mean == 20.0  # the judge preset's, for its pareto
    for choose in ([f"{JUDGE}.kind=empirical"], [f"latency@{JUDGE}=empirical"]):
        rest = [f"{JUDGE}.path=x.csv", f"{JUDGE}.column=s"]
        assert compose_config(*choose, *rest).pipeline.channels.judge.latency.mean is None
        assert compose_config(*choose, *rest, f"{JUDGE}.mean=7").pipeline.channels.judge.latency.mean == 7.0
        assert compose_config(f"{JUDGE}.mean=7", *choose, *rest).pipeline.channels.judge.latency.mean == 7.0
    # another channel's law and the mean of a law that is not empirical stay as they were
    cfg = compose_config(f"{JUDGE}.kind=empirical", f"{JUDGE}.path=x.csv", f"{JUDGE}.column=s")
    assert cfg.pipeline.channels.verifier.latency.mean == compose_config().pipeline.channels.verifier.latency.mean
    assert compose_config(f"{JUDGE}.kind=lognormal").pipeline.channels.judge.latency.mean == 20.0


def test_empirical_blocks_on_random_command_lines():
    rng = random.Random(5)
    blocks = ["pipeline.channels.judge.latency", "pipeline.channels.verifier.latency", "pipeline.generate"]
    seen = {"dropped": 0, "kept": 0}
    for _ in range(300):
        overrides, want = [], []
        for b in rng.sample(blocks, rng.randint(0, 3)):
            form = rng.choice(["kind", "group", "other kind", "mean only"])
            mean = rng.random() < 0.4 and form != "mean only"
            if form == "kind":
                overrides.append(f"{b}.kind=empirical")
            elif form == "group":
                overrides.append(f"latency@{b}=empirical")
            elif form == "other kind":
                overrides.append(f"{b}.kind={rng.choice(['pareto', 'lognormal'])}")
            if mean or form == "mean only":
                overrides.append(f"{b}.mean={rng.choice([1, 2.5])}")
            if form in ("kind", "group") and not mean:
                want.append(b)
        rng.shuffle(overrides)
        got = empirical_blocks(overrides + ["seed=1"])
        assert sorted(got) == sorted(want), overrides
        seen["dropped" if want else "kept"] += 1
    assert min(seen.values()) > 30, seen


@pytest.mark.parametrize("seed", range(40))
def test_an_empirical_law_names_each_change_to_the_data(tmp_path, seed):
    rng = np.random.default_rng(seed)
    v = np.round(rng.lognormal(2.0, 0.7, int(rng.integers(5, 300))), 3)
    path = _csv(tmp_path, v)
    mean = None if rng.random() < 0.5 else float(rng.choice([5.0, 20.0]))
    low = None if rng.random() < 0.5 else float(rng.uniform(0, 5))
    high = None if rng.random() < 0.5 else float(rng.uniform(10, 40))
    discrete = bool(rng.random() < 0.3)
    lat = build_latency(LatencyConf(kind="empirical", path=str(path), column="seconds", mean=mean, low=low,
                                    high=high, discrete=discrete), "k")
    x = v * (mean / v.mean()) if mean is not None else v  # the oracle: rescale, round, clip
    x = np.rint(x) if discrete else x
    lo, hi = (low or 0.0), (np.inf if high is None else high)
    outside = int(np.sum((x < lo) | (x > hi)))
    assert np.allclose(np.sort(lat.values), np.sort(np.clip(x, lo, hi)))
    assert len(lat.changes) == (mean is not None) + (outside > 0)
    if mean is not None:
        assert lat.changes[0].startswith(f"rescaled x{mean / v.mean():.4g}") and "k.mean=null" in lat.changes[0]
    if outside:
        assert lat.changes[-1].startswith(f"{outside} of {v.size} values clipped to")
    if mean is None and not outside:
        assert lat.mean() == pytest.approx(np.rint(v).mean() if discrete else v.mean())


def _inputs(summary: str) -> dict:
    rows = [ln for ln in summary.split("## Inputs")[1].splitlines() if ln.startswith("| ") and "---" not in ln]
    return {r.split(" | ")[0].strip("| "): r.split(" | ")[1:] for r in rows[1:]}


@pytest.mark.long
def test_own_delays_run_as_measured_and_summary_says_so(tmp_path):
    v = np.random.default_rng(1).lognormal(2.5, 0.6, 500)
    path = _csv(tmp_path, v)
    args = [*TINY, *empirical(path)]
    p = racsim(tmp_path, *args, "hydra.run.dir=plain")
    assert p.returncode == 0, p.stderr
    assert "racsim: note:" not in p.stdout  # nothing changed in the data
    summary = (tmp_path / "plain" / "summary.md").read_text()
    laws = _inputs(summary)
    assert set(laws) == {"verifier", "judge"}
    law, mean, source = laws["judge"]
    assert law.startswith(f"empirical({path}:seconds, n=500)") and float(mean) == pytest.approx(v.mean(), rel=1e-3)
    assert source.startswith(f"file {path}, column seconds; command line: {JUDGE}.kind=empirical")
    assert laws["verifier"][2].strip(" |") == "preset channel/code_verifier, law latency/lognormal"
    assert f"Command line: `racsim {' '.join(args)}`" in summary and "racsim changed" not in summary
    assert json.loads((tmp_path / "plain" / "done.json").read_text())

    # a mean and a bound set here: rescaled and clipped, in one line each and in summary.md
    p = racsim(tmp_path, *args, f"{JUDGE}.mean=20", f"{JUDGE}.high=30", "hydra.run.dir=scaled")
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in messages(p.stdout) if ln.startswith("racsim: note:")]  # a long path wraps
    scaled = v * 20 / v.mean()
    assert len(notes) == 2 and f"rescaled x{20 / v.mean():.4g}, from its mean {v.mean():.4g} s" in notes[0]
    assert f"{int(np.sum(scaled > 30))} of 500 values clipped to [0, 30] s" in notes[1]
    summary = (tmp_path / "scaled" / "summary.md").read_text()
    assert all(n.removeprefix("racsim: note: ") in summary for n in notes)
    assert float(_inputs(summary)["judge"][1]) == pytest.approx(np.clip(scaled, 0, 30).mean(), rel=1e-3)


@pytest.mark.long
def test_a_sweep_over_own_delays_uses_them_as_measured_in_every_job(tmp_path):
    """The sweeper computes a batch of jobs ahead (racsim.analyses.dispatch.run_many): a job whose command
    line drops a mean is left to its task, so the sweep gives what single runs give."""
    path = _csv(tmp_path, np.random.default_rng(2).lognormal(2.5, 0.6, 200))
    args = [*SMALL, "learner.train.enabled=false", "output.plots=false", "output.progress=false", *empirical(path)]
    p = racsim(tmp_path, "-m", *args, "seed=0,1", "hydra.sweep.dir=sweep")
    assert p.returncode == 0, p.stderr
    one = racsim(tmp_path, *args, "seed=1", "hydra.run.dir=single")
    assert one.returncode == 0, one.stderr
    job = pd.read_parquet(tmp_path / "sweep" / "1" / "results.parquet")
    single = pd.read_parquet(tmp_path / "single" / "results.parquet")
    pd.testing.assert_frame_equal(job[single.columns], single)
    scaled = racsim(tmp_path, *args, "seed=1", f"{JUDGE}.mean=20", "hydra.run.dir=scaled")  # the preset's mean
    assert scaled.returncode == 0, scaled.stderr
    assert not pd.read_parquet(tmp_path / "scaled" / "results.parquet")["bias_exact"].equals(single["bias_exact"])
