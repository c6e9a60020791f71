"""Budgets checked before anything is asked for (issue 21, points 1 and 5): memory, and failures.

racsim.config.validate.run_estimate counts every array whose size a config key sets; the
tests hold its sum to the peak that tracemalloc measures (NumPy reports its buffers to it)
within a factor of FACTOR on small runs where each key's arrays dominate, check that the
estimate refuses each of the issue's cases in one line naming the key, that the limit the
process really has (RLIMIT_AS, a cgroup, MemAvailable) is read, and that a MemoryError
that still escapes ends in one line, exit 2, with no run folder left.
"""

import os
import resource
import subprocess
import sys
import tracemalloc

import pytest

from helpers import messages
from racsim.config import validate as V
from racsim.config.validate import limits as L  # the budgets' own module: process_memory and its readers
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.errors import ConfigError
from racsim.analyses.dispatch import run

FACTOR = 2.0  # the estimate is within [peak / FACTOR, peak * FACTOR]
SMALL = ["learner.trials=20", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=10"]
J = "pipeline.channels.judge"
GPU_JUDGE = f"channel@{J}=judge_gpu_rm"

# each case: overrides on SMALL, and the key its largest arrays are charged to
MEASURED = {
    "trials": (["learner.trials=3000"], "learner.trials"),
    "n_states": (["learner.n_states=300"], "learner.n_states"),
    "n_actions": (["learner.n_actions=600"], "learner.n_actions"),
    "bootstrap": (["learner.bootstrap=100000"], "learner.bootstrap"),
    "workers": ([f"{J}.workers=400000"], f"{J}.workers"),
    "gpus": ([GPU_JUDGE, f"{J}.rm.gpus=200000"], f"{J}.rm.gpus"),
    "lanes": (["learner.train.enabled=true", "learner.train.lanes=400", "pipeline.steps=4",
               "corrector.names=[naive,rac]"], "learner.train.lanes"),
    "probe": (["study.kind=probe", "study.probe.n=20000"], "study.probe.n"),
}


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(MEASURED))
def test_the_estimate_is_within_a_factor_of_the_measured_peak(case):
    overrides, knob = MEASURED[case]
    cfg = scenario(compose_config(*SMALL, *overrides))
    est = V.run_estimate(cfg)
    assert V.biggest_knob(est) == knob
    assert est["terms"][knob] > 0.5 * (est["memory"] - V.BASELINE_BYTES)  # the case measures this key's arrays
    tracemalloc.start()
    try:
        run(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / FACTOR <= est["memory"] <= peak * FACTOR, (case, est["memory"] / 1e6, peak / 1e6)


# the issue's cases (a 4 GB address-space cap gave a NumPy traceback for each), and the key named
ISSUE_CASES = [
    ([f"{J}.workers=1000000000"], f"{J}.workers"),
    (["learner.n_states=100000"], "learner.n_states"),
    (["learner.bootstrap=1000000000"], "learner.bootstrap"),
    ([GPU_JUDGE, f"{J}.rm.gpus=1000000000"], f"{J}.rm.gpus"),
    (["learner.n_states=1000000", "learner.n_actions=1000"], "learner.n_states"),
    (["learner.n_actions=100000000"], "learner.n_actions"),
    (["learner.train.lanes=1000000000"], "learner.train.lanes"),
    (["scenario=paper/advantage_probe", "study.probe.n=1000000000"], "study.probe.n"),
    ([GPU_JUDGE, f"{J}.rm.sequences_per_sample=1000000"], f"{J}.rm.sequences_per_sample"),
]


@pytest.mark.parametrize("overrides,knob", ISSUE_CASES)
def test_the_issue_cases_are_refused_naming_the_key(overrides, knob):
    with pytest.raises(ConfigError) as ex:
        V.check_limits(compose_config(*overrides, "limits.memory_gb=4"))
    assert ex.value.key == knob and "limits.memory_gb is 4" in str(ex.value) and "\n" not in str(ex.value)


def test_a_grid_counts_its_largest_value():
    small = V.run_estimate(compose_config(f"{J}.workers=1000"))
    big = V.run_estimate(compose_config(f"{J}.workers=1000", f"+study.grid={{{J}.workers:[10,100000]}}"))
    assert big["terms"][f"{J}.workers"] == pytest.approx(100 * small["terms"][f"{J}.workers"])


def test_the_process_limit_is_read_and_enforced(monkeypatch):
    soft = 3 * 2**30
    monkeypatch.setattr(L.resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    have, what = V.process_memory()
    assert "RLIMIT_AS" in what or have < soft  # another limit may be tighter still
    assert have <= soft
    with pytest.raises(ConfigError) as ex:  # 6 GB of workers: within limits.memory_gb, not within the cap
        V.check_limits(compose_config(f"{J}.workers=500000", "limits.memory_gb=1000"))
    assert ex.value.key == f"{J}.workers" and "can have about" in str(ex.value)


@pytest.mark.parametrize("v2", [True, False])
def test_a_cgroup_limit_is_read(tmp_path, monkeypatch, v2):
    """A cgroup's limit less its use, v2 (memory.max) or v1 (memory.limit_in_bytes); 'max' is no limit."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n" if v2 else "4:memory:/job\n3:cpu:/job\n")
    d = tmp_path / "fs" / ("job" if v2 else "memory/job")
    d.mkdir(parents=True)
    limit, use = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    (d / limit).write_text("3000000000\n")
    (d / use).write_text("1000000000\n")
    assert L._cgroup_headroom(str(proc), str(tmp_path / "fs")) == 2e9
    (d / limit).write_text("max\n" if v2 else f"{2**63 - 4096}\n")
    assert L._cgroup_headroom(str(proc), str(tmp_path / "fs")) is None


def test_a_memory_error_that_escapes_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from racsim.app import cli

    def oom(cfg, progress=None):
        raise MemoryError("Unable to allocate 149. GiB")

    monkeypatch.setattr("racsim.analyses.dispatch.run", oom)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.setattr(sys, "argv", ["racsim", *SMALL, f"{J}.workers=100000", "output.progress=false"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    lines = messages(capsys.readouterr().err)
    assert ex.value.code == 2 and len(lines) == 1, lines
    assert f"{J}.workers = 100000" in lines[0] and "ran out of memory" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.long  # 3 CPU s
def test_under_a_4_gb_cap_the_command_refuses_in_one_line(tmp_path):
    """The real limit, in a subprocess: 6 GB of workers fit limits.memory_gb=1000 but not RLIMIT_AS."""
    cap = 4 * 2**30

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    p = subprocess.run([sys.executable, "-m", "racsim", f"{J}.workers=500000", "limits.memory_gb=1000",
                        "output.progress=false"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, preexec_fn=limit)
    lines = messages(p.stderr)
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert f"{J}.workers = 500000" in lines[0] and "can have about" in lines[0]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- failures: their events counted, their hangs refused

FAULTY = [*SMALL, f"{J}.workers=4", f"{J}.latency.mean=2.0", f"{J}.faults.mtbf_s=5", f"{J}.faults.mttr_s=2"]


def test_the_fault_events_estimate_is_within_a_factor_of_the_outages_generated():
    """The outages the engines actually generate (every lane's and worker's timeline once the run
    is simulated) against :func:`fault_events`' count."""
    from racsim.analyses.grid import expand
    from racsim.pipeline.draws import draw
    from racsim.pipeline.engines import simulate
    from racsim.seeds import rng_for

    cfg = expand(scenario(compose_config(*FAULTY)))[0][1]
    est = V.fault_events(cfg, V.run_sizes(cfg))[f"{J}.faults.mtbf_s"]
    d = draw(cfg.pipeline, cfg.learner.trials, rng_for(cfg.seed, "pipeline"))
    simulate(cfg.pipeline, cfg.learner.trials, None, draws=d)
    made = sum(u.size for u in d.faults["judge"].up)
    assert made / 4 <= est <= made * 4, (est, made)


def test_fault_events_grow_with_lanes_servers_and_retries():
    base = V.fault_events(compose_config(*FAULTY), V.run_sizes(compose_config(*FAULTY)))[f"{J}.faults.mtbf_s"]

    def events(*more):
        cfg = compose_config(*FAULTY, *more)
        return V.fault_events(cfg, V.run_sizes(cfg))[f"{J}.faults.mtbf_s"]

    assert events("learner.trials=40") == pytest.approx(2 * base)
    assert events(f"{J}.workers=8") > base and events(f"{J}.faults.on_failure=lose") < base
    assert events(f"{J}.faults.max_retries=100000", f"{J}.faults.mtbf_s=0.5") > 20 * base  # ~50 retries a request


@pytest.mark.parametrize("overrides,key,word", [
    ([f"{J}.faults.mtbf_s=1e-320"], f"{J}.faults.mtbf_s", "[1e-06, 1e+12]"),
    ([f"{J}.faults.mttr_s=1e308"], f"{J}.faults.mttr_s", "[1e-06, 1e+12]"),
    ([f"{J}.faults.mtbf_s=0.001", f"{J}.faults.mttr_s=1e9", f"{J}.faults.max_retries=1000000"], f"{J}.faults.mtbf_s",
     "larger"),
    ([f"{J}.faults.mtbf_s=0.01", f"{J}.faults.mttr_s=1e4", f"{J}.faults.max_retries=1000000", "limits.memory_gb=inf"],
     f"{J}.faults.mtbf_s", "limits.hours"),
])
def test_the_fault_hangs_are_refused_up_front(overrides, key, word, monkeypatch):
    """Issue 21's hangs (past 120 s in faults.cover under workers._grow): refused in one line."""
    from racsim.analyses.grid import expand

    monkeypatch.setattr(L, "process_memory", lambda: (float("inf"), ""))
    with pytest.raises(ConfigError) as ex:
        expand(scenario(compose_config("scenario=capacity/judge_rm_faults", *overrides)))
    assert ex.value.key == key and word in str(ex.value), str(ex.value)


def test_the_fault_scenario_still_fits():
    V.check_limits(compose_config("scenario=capacity/judge_rm_faults"))


# ---------------------------------------------------------------- values the arithmetic cannot carry (point 4)

LAT = f"{J}.latency"
PHASE_ZERO = [f"pipeline.{ph}.{k}" for ph in ("generate", "fast_score", "submit", "update")
              for k in ("kind=deterministic", "mean=0")]


@pytest.mark.parametrize("overrides,key", [
    ([f"{LAT}.mean=1e308"], f"{LAT}.mean"),
    ([f"{LAT}.kind=pareto", f"{LAT}.alpha=1e308"], f"{LAT}.alpha"),
    ([f"{LAT}.kind=gaussian", f"{LAT}.std=1e308"], f"{LAT}.std"),
    ([f"{LAT}.kind=lognormal", f"{LAT}.sigma=1e308"], f"{LAT}.sigma"),
    (["learner.train.lr=1e308"], "learner.train.lr"),
    ([f"{J}.route_prob=1e-320"], f"{J}.route_prob"),
    ([f"{J}.workers=4", f"{J}.faults.mtbf_s=100", f"{J}.faults.mttr_s=1e308"], f"{J}.faults.mttr_s"),
    (PHASE_ZERO, "pipeline.update.mean"),
])
def test_the_issue_extremes_are_refused_naming_the_key(overrides, key):
    from racsim.analyses.grid import expand

    with pytest.raises(ConfigError) as ex:
        expand(scenario(compose_config(*overrides)))
    assert ex.value.key == key


@pytest.mark.parametrize("values,key", [("1e308\n1e308\n", f"{LAT}.column"), ("1e-320\n1e-320\n", f"{LAT}.mean")])
def test_an_empirical_column_it_cannot_carry_is_refused(tmp_path, values, key):
    from racsim.analyses.grid import expand
    from racsim.pipeline.latency import build_latency

    csv = tmp_path / "lat.csv"
    csv.write_text("x\n" + values)
    cfg = expand(scenario(compose_config(f"{LAT}.kind=empirical", f"{LAT}.path={csv}", f"{LAT}.column=x",
                                         f"{LAT}.mean=20")))
    with pytest.raises(ConfigError) as ex:
        build_latency(cfg[0][1].pipeline.channels["judge"].latency, LAT)
    assert ex.value.key == key


def test_the_predicted_kernel_carries_a_zero_step_and_an_unbounded_latency():
    """Where validation cannot see a mean (an empirical phase of zeros, say), the predicted kernel
    is unknown (NaN), not a ZeroDivisionError; a quantile past float range is capped, not an OverflowError."""
    import numpy as np

    from racsim.analyses.grid import expand
    from racsim.pipeline.kernels import MAX_KERNEL_STEPS, predicted_kernel

    from racsim.pipeline import kernels

    cfg = expand(scenario(compose_config()))[0][1]
    for ch in cfg.pipeline.channels.values():
        ch.max_delay = None
    build = kernels.build_latency

    def unbounded(conf, key):  # a latency whose top quantile is past float range
        lat = build(conf, key)
        lat.quantile = lambda q: np.inf
        return lat

    kernels.build_latency = unbounded
    try:
        assert predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s, False).shape[1] == MAX_KERNEL_STEPS + 1
    finally:
        kernels.build_latency = build
    for ph in ("generate", "fast_score", "submit", "update"):
        c = getattr(cfg.pipeline, ph)
        c.kind, c.mean = "deterministic", 0.0
    assert np.isnan(predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s, False)).all()


EXTREME_FLOATS = (1e308, 5e-324, 2.2250738585072014e-308)  # the largest, the smallest subnormal, the smallest normal


@pytest.mark.long
def test_every_float_key_takes_extreme_floats_without_a_crash():
    """Every float key of the default and the fault (gpu_rm) configs set to each extreme float: the
    config is expanded (validated, the estimate computed) or refused with a ConfigError, nothing else."""
    from omegaconf import OmegaConf

    from racsim.analyses.grid import expand

    bases = [compose_config(), compose_config("scenario=capacity/judge_rm_faults")]
    seen = 0
    for base in bases:
        keys = [k for k, v in V.leaves(base) if isinstance(v, float)]
        for key in keys:
            for x in EXTREME_FLOATS:
                cfg = base.copy()
                OmegaConf.update(cfg, key, x)
                try:
                    expand(scenario(cfg))
                except ConfigError:
                    pass
                seen += 1
    assert seen > 80 * len(EXTREME_FLOATS)


def test_a_sweep_cell_too_big_is_refused_before_the_first_job():
    """The sweeper's cell check (validate_changed) runs the budgets too: the fuzz found
    ``-m learner.n_actions=1000000,2`` failing inside its job with a traceback."""
    from omegaconf import OmegaConf

    cfg = compose_config("limits.memory_gb=4")
    V.validate(cfg)
    OmegaConf.update(cfg, "learner.n_actions", 1000000)
    with pytest.raises(ConfigError) as ex:
        V.validate_changed(cfg, ["learner.n_actions"])
    assert ex.value.key == "learner.n_actions"


def test_a_bandit_response_space_past_int64_is_refused():
    from racsim.config.validate import validate_lm

    for vocab, longest in ((16, 15), (2, 62), (3, 39)):
        assert vocab ** longest < V.INT64 <= vocab ** (longest + 1)
        ok = compose_config("learner=lm", "learner.lm.policy=bandit", f"learner.lm.vocab={vocab}",
                            f"learner.lm.response_len={longest}")
        validate_lm(ok.learner.lm)
        ok.learner.lm.response_len = longest + 1
        with pytest.raises(ConfigError) as ex:
            validate_lm(ok.learner.lm)
        assert ex.value.key == "learner.lm.response_len" and f"at most {longest}" in str(ex.value)


def test_a_capacity_search_with_too_many_resamples_is_refused_naming_them():
    """capacity.resamples=1e8 was refused only once it ran out of memory, naming learner.horizon."""
    with pytest.raises(ConfigError) as info:
        V.check_limits(compose_config("scenario=capacity/code_verifier", "capacity.resamples=100000000", "limits.memory_gb=4"))
    assert info.value.key == "capacity.resamples" and "limits.memory_gb" in str(info.value)
    V.check_limits(compose_config("scenario=capacity/code_verifier", "limits.memory_gb=4"))  # its own 200: fine


@pytest.mark.long
@pytest.mark.parametrize("suffix, module", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_a_compressed_file_is_measured_by_what_it_expands_to(tmp_path, suffix, module):
    """limits.file_mb held the compressed size: a 40 KB .gz of 40 MB passed. Now the contents count."""
    import importlib

    opener = importlib.import_module(module).open
    big, small = tmp_path / f"big.csv{suffix}", tmp_path / f"small.csv{suffix}"
    with opener(big, "wb") as f:
        f.write(b"x\n" + b"1.0\n" * (3 << 20))  # 12 MB of text
    with opener(small, "wb") as f:
        f.write(b"x\n" + b"1.0\n" * 1000)
    key = "pipeline.channels.judge.latency"
    for path, refused in ((big, True), (small, False)):
        cfg = compose_config(f"{key}.kind=empirical", f"{key}.path={path}", f"{key}.column=x", "limits.file_mb=5")
        if refused:
            with pytest.raises(ConfigError, match="once decompressed") as info:
                V.check_data_files(cfg)
            assert info.value.key == f"{key}.path"
        else:
            V.check_data_files(cfg)


@pytest.mark.parametrize("over, want", [([], 16), (["capacity.max_count=11"], 11), (["capacity.max_count=8"], 8)])
def test_a_capacity_search_is_sized_at_the_largest_count_it_may_try(over, want):
    """The estimate charges the sized channel at the largest count the search may try above the
    list (search_top: capacity.max_count, null twice the largest listed), not the largest listed."""
    cfg = compose_config("scenario=capacity/judge_rm_h100", "capacity.counts=[2,8]", *over)
    assert V.run_sizes(cfg)[f"{J}.rm.gpus"] == want == V.search_top(cfg.capacity.max_count, [2, 8])
    assert V.search_top(None, [3]) == 6 and V.search_top(2, [3]) == 3  # never below the largest listed
