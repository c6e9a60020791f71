"""Bad input generated, not listed.

Stage 0: hypothesis draws a config key of the default config and a value of any kind
(huge integers, NaN, inf, text, lists, null) and composes and expands it as ``racsim
KEY=VALUE`` would: accepted, or refused with a ConfigError or Hydra/OmegaConf's own
error, never another exception.

Stage 1 (issue 10): through the command itself (``racsim.app.cli.main`` in-process), it
generates overrides for every key of the schema (wrong types, extremes, NaN/inf,
negatives, huge ints), malformed scenario files (YAML) and malformed data files (CSV:
latency samples, RM profiles, probe pairs), and asserts per case: exit 0, or exit 2 with
one stderr line naming the key or the file, no traceback, no folder left, no pre-existing
file touched. Stage 2 runs a sample of generated cases as real subprocesses. Stage 3 (issue 27)
sets every numeric field of every spec (derived from the dataclasses of racsim/config/schema.py)
to 0, -1, a huge value, NaN and inf: accepted or refused in one line, and a budget of the accepted
run through the command. Fixed seed (derandomized), fixed budgets; the outcomes by class are
printed at the end (-s)."""

import collections
import math
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra.errors import HydraException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from helpers import main_in_process, messages, unwritable_value
from racsim.analyses.grid import expand
from racsim.app.cli import EXIT_INFEASIBLE
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.errors import ConfigError


def leaf_keys(cfg, prefix=""):
    for k in cfg.keys():
        node = None if OmegaConf.is_missing(cfg, k) else cfg[k]
        if isinstance(node, DictConfig):
            yield from leaf_keys(node, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


KEYS = sorted(set(leaf_keys(compose_config())))
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["null", "true", "abc", "[]", "[1,2]", "{}", "1e400", "-0", "''", "[a]", "-1", "0"]),
)


def refused_cleanly(override: str) -> bool:
    """True when racsim refuses the override as a user mistake, False when it accepts it;
    any other exception propagates (the test then fails with it)."""
    try:
        expand(scenario(compose_config(override)))
    except (ConfigError, OmegaConfBaseException, HydraException):
        return True
    return False


def test_the_keys_cover_every_group():
    assert len(KEYS) > 100
    assert {k.split(".")[0] for k in KEYS} >= {"pipeline", "corrector", "learner", "study", "capacity", "output"}


# 50 generated compositions (about a second each: Hydra composes from scratch), drawn afresh on every run,
# so that over runs they reach further than one fixed list; stage 1 takes every key through the command.
@pytest.mark.long  # the long stage (-m long), with stages 1 and 2
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(KEYS), VALUES)
def test_any_value_of_any_key_is_accepted_or_refused_cleanly(key, value):
    refused_cleanly(f"{key}={value}")


def test_refused_cleanly_can_tell(monkeypatch):
    assert refused_cleanly("learner.trials=-1") and refused_cleanly("pipeline.steps=abc")
    assert not refused_cleanly("learner.trials=10")

    def crash(cfg):
        raise OverflowError("a traceback the user would see")

    monkeypatch.setattr(__import__(__name__), "expand", crash)
    with pytest.raises(OverflowError):
        refused_cleanly("learner.trials=10")


# ------------------------------------------------------------------ stage 1: through the command
# Stages 0, 1 and 2 (and their tally) run in the long stage: python -m pytest -q -n auto -m long
LONG = pytest.mark.long


TINY = ["learner.trials=4", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=3",
        "output.plots=false", "output.progress=false", "limits.hours=0.001"]  # an accepted case runs in ~1 s
OUTCOMES = collections.Counter()
def seeded(n: int):
    """A fixed seed (derandomized) and a budget of ``n`` cases."""
    return settings(max_examples=n, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                    database=None)

EXTREME_INTS = [2**63, 2**63 - 1, -(2**63) - 1, 2**64, 10**30, -1, 0]
EXTREME_FLOATS = ["nan", "inf", "-inf", "1e308", "-1e308", "5e-324", "1e-320", "2.2250738585072014e-308", "1e400",
                  "-0.0"]  # subnormals: 5e-324, 1e-320
BAD_VALUES = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.sampled_from(EXTREME_INTS).map(str),
    st.sampled_from(EXTREME_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**6), max_value=-1).map(str),
    st.text(alphabet="abcxyz019 _-.", min_size=0, max_size=8).map(lambda t: f"'{t}'"),
    st.sampled_from(["null", "true", "[]", "[1,2]", "[a,b]", "{}", "{a:1}", "[[1]]", "[nan]", "[1e400]"]),
)


def the_command(tmp_path, monkeypatch, capsys, args, config_dir=None):
    """``racsim ARGS`` in-process in a folder holding the user's files: (exit code, stderr lines),
    after checking that the user's files are untouched and, on a refusal, that nothing is left (an
    infeasible capacity plan, exit 3, is an accepted run: 0 here)."""
    work = tmp_path / "work"
    if work.exists():
        import shutil
        shutil.rmtree(work)
    (work / "mine").mkdir(parents=True)
    users = {work / "keep.txt": b"the user's", work / "mine" / "results.csv": b"a,b"}
    for path, data in users.items():
        path.write_bytes(data)
    monkeypatch.chdir(work)
    extra = ["--config-dir", str(config_dir)] if config_dir else []
    code, out, err = main_in_process(monkeypatch, capsys, [*extra, *TINY, *args])
    lines = messages(err)
    assert "Traceback" not in out + err
    assert all(path.read_bytes() == data for path, data in users.items()), "a file of the user's was touched"
    assert code in (0, 2, EXIT_INFEASIBLE), (code, err)
    if code == EXIT_INFEASIBLE:  # accepted: a capacity plan whose targets no count meets (its files all written)
        assert "Infeasible: capacity." in out, out
        code = 0
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("racsim: error: "), err
        assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "mine"], "a folder was left behind"
        assert sorted(p.name for p in (work / "mine").iterdir()) == ["results.csv"]
    else:  # accepted: every table it wrote is finite where a number must be
        for table in (work / "outputs").rglob("*.parquet"):  # the CSVs hold the same tables, typed less
            df = pd.read_parquet(table)
            assert unwritable_value(df) is None, (table, unwritable_value(df))
    return code, lines


def names(line: str, key: str) -> bool:
    """The error line names ``key`` or a block above it, or the key its value made wrong
    (``capacity.enabled=1`` -> ``capacity.channel = None: ...``), or a limits.* budget."""
    parts = key.split(".")
    shortest = min(2, len(parts))  # a block, not just the top group ("pipeline")
    if any(".".join(parts[:i]) in line for i in range(len(parts), shortest - 1, -1)) or "limits." in line:
        return True
    return re.search(r"error: [A-Za-z_][\w.\[\]]* = ", line) is not None


SCHEMA_KEYS = sorted(set(KEYS))


@LONG
@seeded(16)
@given(st.sampled_from(SCHEMA_KEYS), BAD_VALUES)
def test_generated_overrides_through_the_command(tmp_path_factory, monkeypatch, capsys, key, value):
    tmp = tmp_path_factory.mktemp("o")
    code, lines = the_command(tmp, monkeypatch, capsys, [f"{key}={value}"])
    OUTCOMES["override: accepted" if code == 0 else "override: refused"] += 1
    if code == 2:
        assert names(lines[0], key) or f"{key}={value}" in lines[0], (key, value, lines)


DEFAULTS = compose_config()  # once: each call deep-copies the composition (40 ms)
FLOAT_KEYS = sorted(k for k in SCHEMA_KEYS if isinstance(OmegaConf.select(DEFAULTS, k), float))
EXTREMES = ["1e300", "-1e300", "1e-300", "5e-324", "1e-320", "0", "-0.0", "1e15", "1e-15", "1e308",
            str(2**63 - 1)]  # finite, but far out


@LONG
@seeded(8)
@given(st.sampled_from(FLOAT_KEYS), st.sampled_from(EXTREMES))
def test_generated_extremes_give_an_error_or_finite_tables(tmp_path_factory, monkeypatch, capsys, key, value):
    """Finite values far out (``corrector.alpha=1e300`` once gave NaN results): refused with
    one line, or run to tables without NaN/inf where a number must be (checked in the_command)."""
    code, lines = the_command(tmp_path_factory.mktemp("x"), monkeypatch, capsys, [f"{key}={value}"])
    OUTCOMES["extreme: accepted, finite tables" if code == 0 else "extreme: refused"] += 1
    if code == 2:
        assert names(lines[0], key) or "column" in lines[0], (key, value, lines)


def test_the_float_keys_reach_the_correctors_and_latencies():
    assert "corrector.alpha" in FLOAT_KEYS and "pipeline.channels.judge.latency.mean" in FLOAT_KEYS
    assert len(FLOAT_KEYS) > 30


JUDGE = ["scenario=capacity/judge_rm_autoscale", "capacity.counts=[2]", "capacity.benchmark=false",
         "capacity.run_length=fixed", "learner.trials=6", "capacity.resamples=20"]
J = "pipeline.channels.judge"
# issue 11's knobs as a capacity user sets them: the judge's rm (batching, chunked prefill),
# autoscale, faults and bursts keys, and the arrivals block
CAPACITY_KEYS = sorted(k for k in leaf_keys(compose_config(*JUDGE))
                       if k.startswith((f"{J}.rm.batching", f"{J}.rm.chunked", f"{J}.autoscale.", f"{J}.faults.",
                                        f"{J}.degraded", f"{J}.p_", "pipeline.arrivals.")))


def test_the_capacity_keys_reach_every_new_knob():
    for k in (f"{J}.rm.batching", f"{J}.rm.chunked_prefill", f"{J}.autoscale.startup_s", f"{J}.faults.mtbf_s",
              f"{J}.degraded_factor", "pipeline.arrivals.mode"):
        assert k in CAPACITY_KEYS, k


@LONG
@seeded(12)
@given(st.sampled_from(CAPACITY_KEYS), BAD_VALUES)
def test_generated_capacity_knobs_through_the_command(tmp_path_factory, monkeypatch, capsys, key, value):
    """Bad values of the capacity knobs on the autoscaled judge scenario: exit 2 with one line
    naming the key, no folder left, no file of the user's touched; or a run with finite tables."""
    code, lines = the_command(tmp_path_factory.mktemp("c"), monkeypatch, capsys, [*JUDGE, f"{key}={value}"])
    OUTCOMES["capacity knob: accepted" if code == 0 else "capacity knob: refused"] += 1
    if code == 2:
        assert names(lines[0], key) or f"{key}={value}" in lines[0], (key, value, lines)


def yaml_scalar():
    return st.one_of(BAD_VALUES, st.sampled_from(["~", "'x'", "&a 1", "*a", "!!binary aGk=", "[", "{", "1:2"]))


@st.composite
def scenario_texts(draw):
    """A scenario file: header or not, some keys of the schema with bad values, then a
    malformation (tabs, unclosed brackets, duplicate keys, a self-include, an alias bomb...)."""
    keys = draw(st.lists(st.sampled_from(SCHEMA_KEYS), min_size=0, max_size=3, unique=True))
    rows = ["# @package _global_"] if draw(st.booleans()) else []
    rows += [f"{k}: {draw(yaml_scalar())}" for k in keys]
    breakage = draw(st.sampled_from(["none", "tab", "unclosed", "duplicate", "self", "bomb", "not_mapping",
                                     "binary", "empty", "deep"]))
    if breakage == "tab":
        rows.append("\tseed: 1")
    elif breakage == "unclosed":
        rows.append("seed: [1, 2")
    elif breakage == "duplicate":
        rows += ["seed: 1", "seed: 2"]
    elif breakage == "self":
        rows[1:1] = ["defaults:", "  - /scenario/gen"]
    elif breakage == "bomb":
        rows.append("b0: &b0 [x, x, x, x, x, x, x, x, x, x]")
        rows += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 8)]
    elif breakage == "not_mapping":
        rows = ["- 1", "- 2"]
    elif breakage == "empty":
        rows = []
    elif breakage == "deep":
        rows.append("x: " + "[" * 200 + "]" * 200)
    text = "\n".join(rows) + "\n"
    return (text.encode() + b"\xff\xfe") if breakage == "binary" else text.encode()


@LONG
@seeded(10)
@given(scenario_texts())
def test_generated_scenario_files(tmp_path_factory, monkeypatch, capsys, text):
    conf = tmp_path_factory.mktemp("conf")
    (conf / "scenario").mkdir()
    (conf / "scenario" / "gen.yaml").write_bytes(text)
    code, lines = the_command(conf, monkeypatch, capsys, ["scenario=gen"], config_dir=conf)
    OUTCOMES["scenario file: accepted" if code == 0 else "scenario file: refused"] += 1
    if code == 2:
        assert "gen" in lines[0] or "scenario" in lines[0] or ":" in lines[0], lines


CSV_CELLS = st.one_of(st.sampled_from(["", "abc", "nan", "inf", "-inf", "0", "-1", "1e400", "1.5", '"', "1,2"]),
                      st.integers(-5, 5000).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr))
DATA_USES = {  # which knob reads the file, and its columns
    "latency": (["x"], lambda p: ["pipeline.channels.judge.latency.kind=empirical",
                                  f"pipeline.channels.judge.latency.path={p}", "pipeline.channels.judge.latency.column=x"],
                "pipeline.channels.judge.latency.path"),
    "profile": (["batch_size", "seq_len", "seconds"],
                lambda p: ["channel@pipeline.channels.judge=judge_gpu_rm", "pipeline.channels.judge.rm.service=profiled",
                           f"pipeline.channels.judge.rm.profile={p}"], "pipeline.channels.judge.rm.profile"),
    "pairs": (["r_fast", "r_slow"], lambda p: ["study.kind=probe", f"study.probe.pairs={p}"], "study.probe.pairs"),
}


@st.composite
def data_files(draw):
    use = draw(st.sampled_from(sorted(DATA_USES)))
    cols = list(DATA_USES[use][0])
    if draw(st.booleans()):  # a wrong or missing header
        cols = draw(st.lists(st.sampled_from(cols + ["y", ""]), min_size=0, max_size=4))
    n = draw(st.integers(0, 6))
    rows = [",".join(draw(st.lists(CSV_CELLS, min_size=len(cols), max_size=len(cols) + 1))) for _ in range(n)]
    return use, (",".join(cols) + "\n" + "\n".join(rows) + "\n").encode()


@LONG
@seeded(10)
@given(data_files())
def test_generated_data_files(tmp_path_factory, monkeypatch, capsys, case):
    use, data = case
    tmp = tmp_path_factory.mktemp("d")
    path = tmp / "data.csv"
    path.write_bytes(data)
    code, lines = the_command(tmp, monkeypatch, capsys, DATA_USES[use][1](path))
    OUTCOMES[f"{use} file: accepted" if code == 0 else f"{use} file: refused"] += 1
    if code == 2:
        block = DATA_USES[use][2].rpartition(".")[0]  # the knob, or its block (the column read from the file)
        assert block in lines[0] or str(path) in lines[0], lines


SCHEDULE = "pipeline.channels.judge.faults.schedule"
SCHEDULE_USE = ["channel@pipeline.channels.judge=judge_gpu_rm"]  # 4 replicas: servers 0..3


@st.composite
def schedule_files(draw):
    """A preemption schedule (columns server, down_s, up_s) that is mostly plausible: servers
    around the pool's 0..3, outages of any length, some cells generated bad (text, NaN,
    negative, a server out of range, down_s >= up_s, overlapping outages, a missing column)."""
    cols = ["server", "down_s", "up_s"]
    if draw(st.integers(0, 4)) == 0:
        cols = draw(st.permutations(cols))[: draw(st.integers(0, 3))]
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        server = draw(st.one_of(st.integers(-1, 5).map(str), CSV_CELLS))
        down = draw(st.floats(0, 100, allow_nan=False))
        up = draw(st.one_of(st.floats(-10, 100, allow_nan=False).map(lambda x: down + x), st.just(math.nan)))
        cells = {"server": server, "down_s": repr(down), "up_s": draw(st.one_of(st.just(repr(up)), CSV_CELLS))}
        rows.append(",".join(cells[c] for c in cols))
    return (",".join(cols) + "\n" + "\n".join(rows) + "\n").encode()


@LONG
@seeded(8)
@given(schedule_files())
def test_generated_schedule_files(tmp_path_factory, monkeypatch, capsys, data):
    tmp = tmp_path_factory.mktemp("s")
    path = tmp / "outages.csv"
    path.write_bytes(data)
    code, lines = the_command(tmp, monkeypatch, capsys, [*SCHEDULE_USE, f"{SCHEDULE}={path}"])
    OUTCOMES["schedule file: accepted" if code == 0 else "schedule file: refused"] += 1
    if code == 2:
        assert SCHEDULE in lines[0] and str(path) in lines[0], lines


# ------------------------------------------------------------------ stage 2: real subprocesses under a 4 GB cap
# Issue 21: each generated case runs as ``racsim ARGS`` in its own process under an address-space
# cap of 4 GB (RLIMIT_AS) and a 60 s timeout, over every key of the schema, the capacity, fault and
# LM keys and a sweep (-m); per case: exit 0 or 2, on a refusal one stderr line and no folder left,
# no file of the user's touched, no traceback. CI runs CAPPED_CASES of them (derandomized); the big
# run is manual, every case tallied and the counts printed at the end (a bad one fails it there):
# RACSIM_FUZZ_CASES=700 python -m pytest -p no:xdist -s tests/test_fuzz_generated.py -m long -k "capped or zz"

CAP_BYTES = 4 * 2**30
CAP_TIMEOUT_S = 60
CAPPED_CASES = int(os.environ.get("RACSIM_FUZZ_CASES", "3"))
TALLY = "RACSIM_FUZZ_CASES" in os.environ  # the big run tallies every case before it fails
CLEAN = ("clean refusal", "accepted")
FAULTS = ["scenario=capacity/judge_rm_faults", "capacity.counts=[3]", "capacity.benchmark=false"]
FAULT_KEYS = sorted(k for k in leaf_keys(compose_config(*FAULTS)) if k.startswith((f"{J}.faults.", f"{J}.rm.")))
LM = ["learner=lm", "learner.lm.policy=bandit", "learner.lm.seeds=2", "learner.lm.n_prompts=2", "learner.lm.decide=[]"]
LM_KEYS = sorted(k for k in KEYS if k.startswith("learner.lm."))
FAULT_EXTREMES = ["1e-320", "5e-324", "1e-9", "0.001", "1e9", "1e308", "1000000", "2.2250738585072014e-308"]
EXTREME_VALUES = st.one_of(BAD_VALUES, st.sampled_from(FAULT_EXTREMES + EXTREMES))


@st.composite
def capped_cases(draw):
    """(what, racsim arguments, scenario text or None): one bad or extreme value of a key of the
    schema, of the capacity/fault knobs on the fault scenario, of the LM keys, a sweep over two
    values of a key, or a generated scenario file."""
    kind = draw(st.sampled_from(["schema", "fault", "capacity", "lm", "sweep", "scenario"]))
    if kind == "scenario":
        return kind, ["scenario=gen"], draw(scenario_texts())
    keys = {"schema": SCHEMA_KEYS, "fault": FAULT_KEYS, "capacity": CAPACITY_KEYS, "lm": LM_KEYS,
            "sweep": SCHEMA_KEYS}[kind]
    key, value = draw(st.sampled_from(keys)), draw(EXTREME_VALUES)
    base = {"fault": FAULTS, "capacity": JUDGE, "lm": LM}.get(kind, [])
    if kind == "sweep":  # a good value beside the generated one: the sweeper checks every cell first
        return kind, ["-m", *base, f"{key}={value},{OmegaConf.select(compose_config(), key)}"], None
    return kind, [*base, f"{key}={value}"], None


def run_capped(work: Path, args: list, timeout: float = CAP_TIMEOUT_S) -> str:
    """``racsim ARGS`` in ``work`` under the 4 GB cap: the outcome's class (clean refusal, accepted,
    traceback, hang, folder left, user file touched, bad exit)."""
    users = {work / "keep.txt": b"the user's", work / "mine" / "results.csv": b"a,b"}
    (work / "mine").mkdir(exist_ok=True)
    for path, data in users.items():
        path.write_bytes(data)
    before = sorted(p.name for p in work.iterdir())

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    try:
        flags = [a for i, a in enumerate(args) if a.startswith("-") or (i and args[i - 1] == "--config-dir")]
        p = subprocess.run([sys.executable, "-m", "racsim", *flags, *TINY, *(a for a in args if a not in flags)],
                           cwd=work, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return "hang"
    touched = any(path.read_bytes() != data for path, data in users.items())
    left = sorted(x.name for x in work.iterdir()) != before
    return outcome(p.returncode, p.stdout, p.stderr, touched, left)


def outcome(code: int, out: str, err: str, touched: bool, left: bool) -> str:
    """The class of a finished case (see :func:`run_capped`)."""
    lines = messages(err)
    if "Traceback" in out + err:
        return "traceback"
    if touched:
        return "user file touched"
    if code == 0:
        return "accepted"
    if code != 2 or len(lines) != 1 or not lines[0].startswith("racsim: error: "):
        return "bad exit"
    return "folder left" if left else "clean refusal"


@settings(max_examples=CAPPED_CASES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
          database=None)
@LONG
@given(capped_cases())
def test_capped_subprocesses(tmp_path_factory, case):
    kind, args, text = case
    work = tmp_path_factory.mktemp("p")
    if text is not None:
        (work / "conf" / "scenario").mkdir(parents=True)
        (work / "conf" / "scenario" / "gen.yaml").write_bytes(text)
        args = ["--config-dir", str(work / "conf"), *args]
    result = run_capped(work, args)
    OUTCOMES[f"capped {kind}: {result}"] += 1
    OUTCOMES[f"capped: {result}"] += 1
    if TALLY:  # the big run: every case tallied, a bad one named here and failed at the end (test_zz_...)
        print(f"capped case {sum(v for k, v in OUTCOMES.items() if k.startswith('capped: '))}: {result}: {args}",
              flush=True)
        return
    assert result in CLEAN, (result, args)


@LONG
def test_the_outcome_classes_can_tell(tmp_path):
    one = "racsim: error: learner.trials = -1: an integer >= 2\n"
    assert outcome(2, "", one, False, False) == "clean refusal"
    assert outcome(2, "", one, False, True) == "folder left"
    assert outcome(2, "", one + "a warning\n", False, False) == "bad exit"
    assert outcome(1, "", "Traceback (most recent call last):\n", False, False) == "traceback"
    assert outcome(0, "", "", True, False) == "user file touched"
    assert outcome(0, "results", "", False, True) == "accepted"
    assert run_capped(tmp_path, ["learner.trials=-1"]) == "clean refusal"
    assert run_capped(tmp_path, ["learner.trials=-1"], timeout=0.01) == "hang"


@LONG
def test_zz_outcomes_by_class(capsys):
    """Prints how many cases each stage generated, by outcome (run with -s to see it)."""
    with capsys.disabled():
        print("\nfuzz outcomes:", dict(sorted(OUTCOMES.items())), "total", sum(OUTCOMES.values()))
    bad = {k: v for k, v in OUTCOMES.items() if k.startswith("capped: ") and k[len("capped: "):] not in CLEAN}
    assert not bad, bad


# ------------------------------------------------------------------ stage 3: every numeric field at its bounds
# Issue 27, point 9: the cases come from the specs themselves. Every numeric field (int or float, optional or not)
# of every dataclass reachable from RacsimConf (racsim/config/schema.py), at every path it takes in a config
# (each channel's and phase's latency law, the rm blocks...), set to 0, -1, a huge value, NaN and inf on a composed
# config, then through the config boundary (scenario, expand): accepted, or refused with one short line naming the
# key (racsim.app.cli.error_line), never another exception. A budget of the accepted cases then runs through the
# command. The outcomes by class are printed with the others (test_zz_outcomes_by_class).

import dataclasses  # noqa: E402
import typing  # noqa: E402

from racsim.app.cli import error_line  # noqa: E402
from racsim.config import schema  # noqa: E402

BOUND_VALUES = {float: [0.0, -1.0, 1e308, math.nan, math.inf], int: [0, -1, 2**63 - 1, math.nan, math.inf]}
# how a user switches on an optional block that the default config leaves out (None): the first of these whose
# composed config has a field's block is the base its cases are set on
BLOCK_BASES = [(), ("channel@pipeline.channels.judge=judge_gpu_rm",), ("scenario=capacity/judge_rm_autoscale",),
               ("scenario=adaptive_tau",), ("channel@pipeline.channels.judge=judge_gpu_rm",
                                            "+rm/model@pipeline.fast_rm.model=8b", "+rm/gpu@pipeline.fast_rm.gpu=H100"),
               ("+pipeline.channels.judge.background={rate_per_s: 3.0, latency: {kind: lognormal, mean: 20.0}}",),
               ("channel@pipeline.channels.judge=judge_gpu_rm",  # a judge shared with other tenants
                "+pipeline.channels.judge.background={rate_per_s: 3.0, prompt_tokens: {kind: lognormal, mean: 150.0}, "
                "response_tokens: {kind: lognormal, mean: 300.0}}"),
               ("pipeline.generation.lag={kind: geometric, mean: 2.0}",),  # stale samples: a lag law
               ("scenario=async/areal",)]  # asynchronous generation: engines, trainer, admission


def _bare(t):
    """``t`` less an Optional around it."""
    if typing.get_origin(t) is typing.Union:
        return next(a for a in typing.get_args(t) if a is not type(None))
    return t


def numeric_fields(dc=schema.RacsimConf, prefix="", channels=("judge",)):
    """(key, type, dataclass name) of every int or float field under ``dc``, at every path: nested dataclasses
    (optional ones too) followed, a dict of dataclasses (``pipeline.channels``) at each of ``channels``."""
    hints = typing.get_type_hints(dc)
    for f in dataclasses.fields(dc):
        t = _bare(hints[f.name])
        if dataclasses.is_dataclass(t):
            yield from numeric_fields(t, f"{prefix}{f.name}.", channels)
        elif typing.get_origin(t) is dict and dataclasses.is_dataclass(typing.get_args(t)[1]):
            for name in channels:
                yield from numeric_fields(typing.get_args(t)[1], f"{prefix}{f.name}.{name}.", channels)
        elif t in (int, float):
            yield f"{prefix}{f.name}", t, dc.__name__


BOUND_FIELDS = list(numeric_fields())


def test_the_bound_fields_are_every_numeric_field_of_every_spec():
    """Derived, not listed: each dataclass of schema.py with an int or float field has each of them here,
    nested and optional blocks included."""
    classes = [c for c in vars(schema).values() if dataclasses.is_dataclass(c) and c.__module__ == schema.__name__]
    for c in classes:
        hints = typing.get_type_hints(c)
        want = {f.name for f in dataclasses.fields(c) if _bare(hints[f.name]) in (int, float)}
        got = {k.rsplit(".", 1)[-1] for k, _, owner in BOUND_FIELDS if owner == c.__name__}
        assert got == want, c.__name__
    keys = [k for k, _, _ in BOUND_FIELDS]
    for k in ("learner.trials", "pipeline.channels.judge.rm.model.params_b", "pipeline.fast_rm.gpu.tflops",
              "pipeline.channels.judge.background.latency.mean", "pipeline.generate.mean", "limits.memory_gb"):
        assert any(key.startswith(k.rsplit(".", 1)[0]) for key in keys), k
    assert len(keys) == len(set(keys)) > 200


def _bases():
    return [(b, compose_config(*b)) for b in BLOCK_BASES]


def has_block(cfg, key: str) -> bool:
    """Whether the composed ``cfg`` has the block ``key`` (every block above it set, not None)."""
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
        if node is None:
            return False
    return True


def bound_outcome(cfg, key: str, value) -> tuple:
    """(accepted | refused, the error line): ``key`` set to ``value`` on the composed ``cfg``, through
    the config boundary, and set back after (a copy of the whole config a case took a third of the
    test's time; the caller checks that each base comes back whole). Anything but a user's mistake
    propagates."""
    before = OmegaConf.select(cfg, key)
    try:
        OmegaConf.update(cfg, key, value, merge=False)
        expand(scenario(cfg))
    except (ConfigError, OmegaConfBaseException, HydraException) as ex:
        return "refused", error_line(ex)
    finally:
        OmegaConf.update(cfg, key, before, merge=False)
    return "accepted", ""


BOUND_RUNS = 12  # accepted cases run through the command (about a second each)


@LONG
def test_every_numeric_field_at_its_bounds(tmp_path_factory, monkeypatch, capsys):
    bases = _bases()
    whole = [OmegaConf.to_yaml(c) for _, c in bases]
    accepted = []
    for key, kind, _ in BOUND_FIELDS:
        parent = key.rsplit(".", 1)[0]
        base, cfg = next(((b, c) for b, c in bases if has_block(c, parent)), (None, None))
        assert cfg is not None, f"no base has {parent}: add one to BLOCK_BASES"
        for value in BOUND_VALUES[kind]:
            result, line = bound_outcome(cfg, key, value)
            OUTCOMES[f"bounds: {result}"] += 1
            if result == "refused":
                assert line and "\n" not in line and len(line) < 600, (key, value, line)
                assert names(f"error: {line}", key) or key in line, (key, value, line)
            else:
                accepted.append((base, key, value))
    assert [OmegaConf.to_yaml(c) for _, c in bases] == whole  # every case's value was set back
    # the accepted values that are not 0 first (extremes): every k-th, a budget of them through the command
    far = [a for a in accepted if a[2] != 0] or accepted
    for base, key, value in far[:: max(1, len(far) // BOUND_RUNS)][:BOUND_RUNS]:
        text = "nan" if value != value else repr(value)
        code, lines = the_command(tmp_path_factory.mktemp("b"), monkeypatch, capsys, [*base, f"{key}={text}"])
        OUTCOMES["bounds, run: accepted" if code == 0 else "bounds, run: refused"] += 1


def test_a_null_block_can_be_set_whole_from_the_command_line():
    """Found by stage 3: ``pipeline.channels.judge.background={...}`` (what racsim's own error asks
    for, when a key under the null block is set alone) failed with OmegaConf's AttributeError on 4 lines."""
    cfg = compose_config("pipeline.channels.judge.background={rate_per_s: 3.0, latency: {kind: lognormal, mean: 20.0}}")
    assert cfg.pipeline.channels.judge.background.rate_per_s == 3.0
    assert cfg.pipeline.channels.judge.background.latency.mean == 20.0
    assert refused_cleanly("pipeline.channels.judge.background={}")  # its rate has no default: named, one line
    assert compose_config().pipeline.channels.judge.background is None


def test_the_fast_scorers_gpus_are_charged_to_memory():
    """Found by stage 3: ``pipeline.fast_rm.gpus=2**63-1`` passed the memory check and ended in NumPy's
    "array is too big" traceback; its replicas and sequences are charged to their keys as a channel's are."""
    base = ["+rm/model@pipeline.fast_rm.model=8b", "+rm/gpu@pipeline.fast_rm.gpu=H100"]
    for key, value in (("gpus", 2**63 - 1), ("sequences_per_sample", 10**8)):
        with pytest.raises(ConfigError, match=f"pipeline.fast_rm.{key} = {value}: smaller: .*largest arrays: "
                                              f"pipeline.fast_rm.{key}"):
            expand(scenario(compose_config(*base, f"pipeline.fast_rm.{key}={value}")))
    assert len(expand(scenario(compose_config(*base, "pipeline.fast_rm.gpus=2")))) == 1
