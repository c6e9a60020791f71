"""The ``racsim`` command end to end, in subprocesses (few and small).

Every run uses reduced sizes (SMALL), runs with cwd=tmp_path and puts Hydra's
run/sweep folders inside tmp_path, so nothing is written to the repository.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import messages

from racsim.config.schema import CORRECTORS

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RACSIM = str(BIN / "racsim") if (BIN / "racsim").exists() else "racsim"
SMALL = ["learner.trials=20", "learner.bootstrap=50", "learner.train.lanes=2", "pipeline.steps=10"]
NOPLOTS = ["output.plots=false"]
PNG = b"\x89PNG\r\n\x1a\n"

# What the README promises results.parquet holds, one row per corrector: steady-state
# bias and CIs, the theorem's prediction and its gap, the run-level bias and its
# end-of-run slack, VIF, RMSE, wall-clock and its ratio, seconds per step, slack per
# channel, injected/dropped/pending counts, training figures.
RESULT_COLUMNS = [
    "scenario", "corrector", "seed", "steps", "warmup_steps",
    "bias_mc", "mc_se", "bias_exact", "bias_theorem", "theorem_gap", "bias_ci_lo", "bias_ci_hi",
    "reduction_exact", "reduction_ci_lo", "reduction_ci_hi",
    "run_bias_mc", "run_bias_exact", "run_reduction_exact", "eta_end_of_run", "delay_past_warmup",
    "vif", "rmse", "wallclock_s", "wallclock_ratio", "step_s",
    "slack_eta", "eta_verifier", "eta_judge",
    "emitted", "injected", "dropped", "pending",
    "J_final", "J_at_naive_clock",
]


def _env(full_error: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["MPLBACKEND"] = "Agg"
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    return env


def racsim(cwd: Path, *args: str, module: bool = False, full_error: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "racsim"] if module else [RACSIM]
    return subprocess.run(cmd + list(args), cwd=cwd, env=_env(full_error), capture_output=True, text=True,
                          timeout=120)


def run_dir_args(d: Path) -> list:
    return [f"hydra.run.dir={d}", f"hydra.sweep.dir={d.parent / (d.name + '_sweep')}"]


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def table_rows(stdout: str) -> list:
    """The corrector column of the terminal table (header line first)."""
    lines = stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split() and ln.split()[0] == "corrector")
    rows = []
    for ln in lines[i + 1:]:
        if ln.startswith(("racsim:", "(")) or not ln.strip():  # "(": the note on what the screen leaves out
            break
        rows.append(ln.split()[0])
    return [lines[i]] + rows


def check_run_folder(out: Path, correctors: list, plots: bool) -> pd.DataFrame:
    for name in ("results.parquet", "results.csv", "summary.md", "config.yaml", "channels.csv"):
        assert (out / name).is_file(), f"{name} missing in {out}: {sorted(p.name for p in out.iterdir())}"
    df = pd.read_parquet(out / "results.parquet")
    assert list(df.corrector) == correctors
    missing = [c for c in RESULT_COLUMNS if c not in df.columns]
    assert not missing, f"results.parquet lacks {missing}"
    assert (df.emitted == df.injected + df.dropped + df.pending).all(), "every slow result accounted for"
    assert (df.emitted == 20 * 10 * 4 * 2).all()  # trials x steps x batch x K
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.corrector) == correctors and list(csv.columns) == list(df.columns)
    assert "# racsim run: default" in (out / "summary.md").read_text()
    cfg = (out / "config.yaml").read_text()
    assert "trials: 20" in cfg and "steps: 10" in cfg
    for png in ("pareto.png", "training.png", "queue.png"):
        if plots:
            assert (out / png).read_bytes()[:8] == PNG, f"{png} is not a PNG"
        else:
            assert not (out / png).exists()
    return df


# ----------------------------------------------------------------------------
# 1, 2: a run of the default scenario.


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``racsim`` on SMALL sizes, plots on (the default), run once: (its cwd, its folder, the process)."""
    tmp = tmp_path_factory.mktemp("default")
    out = tmp / "run"
    return tmp, out, ok(racsim(tmp, *SMALL, *run_dir_args(out)))


@pytest.mark.long
def test_racsim_default_scenario_with_plots(default_run):
    tmp_path, out, p = default_run
    rows = table_rows(p.stdout)
    assert "clock x" in rows[0] and "bias (exact)" in rows[0]
    assert rows[1:] == list(CORRECTORS)
    assert f"racsim: results in {out}" in p.stdout
    check_run_folder(out, list(CORRECTORS), plots=True)
    assert not (tmp_path / "outputs").exists()


def test_the_table_fits_a_terminal_and_the_files_keep_every_column(default_run):
    _, out, p = default_run
    rows = table_rows(p.stdout)
    table = p.stdout.splitlines()[p.stdout.splitlines().index(rows[0]):][: len(rows)]
    assert max(map(len, table)) <= 120, table
    assert max(map(len, p.stdout.splitlines())) <= 120  # the note too, on as many lines as it takes
    note = " ".join(p.stdout.split()).split("(to fit 120 columns, left out here: ")[1]
    left_out = note.split(";")[0].split(", ")
    summary = (out / "summary.md").read_text()
    assert left_out and all(h not in rows[0] and h in summary for h in left_out)


@pytest.mark.long
def test_python_m_racsim_scenario_default(tmp_path):
    out = tmp_path / "run"
    p = ok(racsim(tmp_path, "scenario=default", *SMALL, *NOPLOTS, *run_dir_args(out), module=True))
    assert table_rows(p.stdout)[1:] == list(CORRECTORS)
    check_run_folder(out, list(CORRECTORS), plots=False)


# ----------------------------------------------------------------------------
# 3: a sweep.


@pytest.mark.long  # a sweep in a subprocess: 3.7 CPU s (tests/test_sweep.py's serial sweep runs fast)
def test_multirun_sweep_one_folder_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    p = ok(racsim(tmp_path, "-m", "corrector.tau_age=20,1000", "corrector.names=[naive,rac]", *SMALL, *NOPLOTS,
                  f"hydra.sweep.dir={sweep}", f"hydra.run.dir={tmp_path / 'unused'}"))
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert [d.name for d in jobs] == ["0", "1"], p.stdout
    res = {}
    for d, tau in zip(jobs, (20.0, 1000.0)):
        assert not (d / "config.yaml").exists()  # a lean job folder (output.job_files=auto, racsim's launcher)
        assert f"corrector.tau_age={tau:g}" in (d / ".hydra" / "overrides.yaml").read_text()
        res[tau] = pd.read_parquet(d / "results.parquet").set_index("corrector")
        assert list(res[tau].index) == ["naive", "rac"]
    a, b = res[20.0], res[1000.0]
    pd.testing.assert_series_equal(a.loc["naive"], b.loc["naive"])  # naive ignores the age kernel
    assert a.loc["rac", "bias_exact"] != b.loc["rac", "bias_exact"]
    assert a.loc["rac", "bias_mc"] != b.loc["rac", "bias_mc"]
    assert a.loc["rac", "slack_eta"] > b.loc["rac", "slack_eta"]  # a shorter age kernel puts back less
    assert not (tmp_path / "unused").exists()


# ----------------------------------------------------------------------------
# 4: bad overrides. Each command runs once (cached); several tests read it.

BAD = {
    # override: text the error line must contain (the key)
    "corrector.rho_bar=0": "corrector.rho_bar",
    "pipeline.steps=abc": "pipeline.steps",
    "pipeline.nosuchkey=1": "pipeline.nosuchkey",
    "scenario=nosuchscenario": "scenario",
    "corrector.names=[naive,bogus]": "corrector.names",
    "pipeline.channels.judge.latency.mean=-1": "pipeline.channels.judge.latency.mean",
    "learner.gamma=1.5": "learner.gamma",
}
_bad_cache: dict = {}


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    def get(override: str):
        if override not in _bad_cache:
            cwd = tmp_path_factory.mktemp("bad")
            (cwd / "keep").write_text("")  # see test_bad_value_keeps_the_users_empty_cwd
            out = cwd / "run"
            p = racsim(cwd, override, *SMALL, *NOPLOTS, *run_dir_args(out))
            _bad_cache[override] = (p, cwd, out)
        return _bad_cache[override]
    return get


# Through a real process in the long stage (tests/test_fuzz.py runs a type mistake and a malformed file through
# one fast, and each of these in-process fast).
@pytest.mark.long
@pytest.mark.parametrize("override", BAD)
def test_bad_override_fails_cleanly(bad_run, override):
    p, cwd, out = bad_run(override)
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr}"
    assert "Traceback" not in p.stdout + p.stderr
    err = messages(p.stderr)  # one message, wrapped to 120 columns
    assert len(err) == 1 and err[0].startswith("racsim: error:"), p.stderr
    assert BAD[override] in err[0], err[0]
    assert "racsim: results in" not in p.stdout
    assert not out.exists() or not list(out.rglob("*.parquet")), "results written despite the error"
    assert not out.exists(), f"run folder left behind: {sorted(p.name for p in out.iterdir())}"
    assert not (cwd / "outputs").exists()


def test_unknown_scenario_lists_every_scenario(bad_run):
    p, _, _ = bad_run("scenario=nosuchscenario")
    line = messages(p.stderr)[-1]
    assert "nosuchscenario" in line
    listed = line.rsplit(": ", 1)[1].split(", ")
    root = REPO / "scenarios"  # every folder: capacity/, lm/, paper/ too
    assert sorted(listed) == sorted(str(f.relative_to(root).with_suffix("")) for f in root.rglob("*.yaml")), line


@pytest.mark.long
def test_python_m_bad_value_leaves_no_run_folder(tmp_path):
    """The job's log is named after hydra.job.name (racsim), not after sys.argv[0] (__main__.py)."""
    (tmp_path / "keep").write_text("")
    out = tmp_path / "run"
    p = racsim(tmp_path, "corrector.rho_bar=0", *SMALL, *NOPLOTS, *run_dir_args(out), module=True)
    assert p.returncode == 2
    assert not out.exists(), sorted(x.name for x in out.iterdir())


@pytest.mark.long
def test_bad_value_with_default_run_dir_leaves_no_outputs_folder(tmp_path):
    """outputs/default/<date_time> is Hydra's; none of it may stay behind."""
    (tmp_path / "keep").write_text("")
    p = racsim(tmp_path, "corrector.rho_bar=0", *SMALL, *NOPLOTS)
    assert p.returncode == 2
    assert not (tmp_path / "outputs").exists(), sorted(str(x) for x in (tmp_path / "outputs").rglob("*"))
    assert (tmp_path / "keep").exists()


@pytest.mark.long  # a subprocess run: 2.6 CPU s
def test_bad_value_keeps_the_users_empty_cwd(tmp_path):
    work = tmp_path / "project" / "work"
    work.mkdir(parents=True)
    p = racsim(work, "corrector.rho_bar=0", "hydra.run.dir=run", *SMALL, *NOPLOTS)
    assert p.returncode == 2
    assert not (work / "run").exists()
    assert (tmp_path / "project").is_dir(), "the user's (empty) parent folder was deleted"
    assert work.is_dir(), "the user's (empty) working folder was deleted"


# ----------------------------------------------------------------------------
# 5: byte-identical reproducibility.


@pytest.mark.long
def test_same_command_gives_byte_identical_results(tmp_path):
    def results(name: str, *extra: str) -> Path:
        out = tmp_path / name
        ok(racsim(tmp_path, "corrector.names=[naive,rac,wait_for_slow]", *SMALL, *NOPLOTS, *extra,
                  *run_dir_args(out)))
        return out

    a, b, c = results("a"), results("b"), results("c", "seed=1")
    assert (a / "results.parquet").read_bytes() == (b / "results.parquet").read_bytes()
    assert (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()
    assert (a / "results.parquet").read_bytes() != (c / "results.parquet").read_bytes()
    ra, rc = pd.read_parquet(a / "results.parquet"), pd.read_parquet(c / "results.parquet")
    assert (ra.bias_mc != rc.bias_mc).all(), "a different seed must change the Monte-Carlo figures, not just the seed column"


# ----------------------------------------------------------------------------
# 6: HYDRA_FULL_ERROR=1 restores Hydra's report.


@pytest.mark.parametrize("override,exc", [pytest.param("corrector.rho_bar=0", "ConfigError", marks=pytest.mark.long),
                                          ("pipeline.steps=abc", "ConfigCompositionException")])  # the cheaper fast
def test_hydra_full_error_restores_traceback(tmp_path, override, exc):
    out = tmp_path / "run"
    p = racsim(tmp_path, override, *SMALL, *NOPLOTS, *run_dir_args(out), full_error=True)
    assert p.returncode != 0
    assert "Traceback (most recent call last)" in p.stderr
    assert exc in p.stderr
    assert "racsim: error:" not in p.stderr


def test_matplotlibs_first_run_notice_is_dropped_and_nothing_else(caplog):
    """A first run on a machine logs matplotlib's "generated new fontManager" (Hydra prints INFO): dropped."""
    import logging

    from racsim.report.plots import _plt

    _plt()
    log = logging.getLogger("matplotlib.font_manager")
    with caplog.at_level(logging.INFO, logger="matplotlib.font_manager"):
        log.info("generated new fontManager")
        log.warning("Matplotlib is building the font cache; this may take a moment.")
        log.warning("findfont: Font family 'Nope' not found.")
    assert [r.getMessage() for r in caplog.records] == ["findfont: Font family 'Nope' not found."]


def test_a_grid_cell_reads_as_a_law_not_a_dict_and_long_tables_are_cut():
    from racsim.report.tables import cell_text, format_table

    law = {"kind": "cauchy", "mean": None, "median": 18.0, "scale": 4.0, "discrete": True, "cauchy_bounds": "clip",
           "low": 1.0}
    assert cell_text(repr(law)) == cell_text(law) == "cauchy(median=18, scale=4, discrete, cauchy_bounds=clip, low=1)"
    assert cell_text(20.0) == "20" and cell_text("{not a dict") == "{not a dict"
    rows = pd.DataFrame({"cell": range(90), "pipeline.delay_distribution": [repr(law)] * 90, "scenario": "x",
                         "corrector": "rac", "bias_exact": 0.5})
    text = format_table(rows, max_rows=60)
    assert len(text.splitlines()) == 1 + 60 + 1 and "the first 60 of 90 rows" in text.splitlines()[-1]
    assert "{" not in text and len(format_table(rows).splitlines()) == 91  # summary.md: every row


def said_lines(stderr: str, head: str) -> list:
    """The progress lines of ``stderr`` of the phase ``head`` (``racsim: NAME: PHASE``), each from after its
    place (``(1/3): ``), its wrapped rest joined back."""
    joined = re.sub(r"\n {2,}", " ", stderr)  # racsim.errors.wrapped: the rest of a long line below, indented
    return [ln[len(head):].split(": ", 1)[1] for ln in joined.splitlines() if ln.startswith(head)]


# a running phase's line: done, total (or bound), unit, note (a phase's end, 'N of at most M needed', is not one)
UNITS = re.compile(r"(\d+)(?:/| of at most )([\d,]+) ([\w -]+?)s? \((?:\d+%|finishing)\).*?(?: - (.*))?$")


@pytest.mark.long
def test_progress_through_a_pipe_moves_one_line_at_a_time(tmp_path):
    """stderr is a pipe here (racsim.progress): a capacity search says each count it evaluates on a line
    of its own (a unit of its progress when simulated), its count of the total never past it (the search
    grows the total first when it adds the counts the list skips), and each doubling of a count's run on
    one more; its sensitivity phase counts the variants announced before the first; a GRPO run's phase
    counts its seed-steps, each corrector noted."""
    p = ok(racsim(tmp_path, "scenario=capacity/judge_rm_h100", "learner.trials=4", "learner.bootstrap=0",
                  "pipeline.steps=12", "capacity.benchmark=false", "capacity.resamples=20", "capacity.counts=[4,8]",
                  *NOPLOTS, *run_dir_args(tmp_path / "cap")))
    search = [m.groups() for m in map(UNITS.match, said_lines(p.stderr, "racsim: judge_rm_h100: capacity search")) if m]
    assert all(int(done) <= int(total.replace(",", "")) and unit == "simulated count" for done, total, unit, _ in search)
    counted = [(int(done), note) for done, _, _, note in search if note and " GPUs: load " in note and " steps, " in note]
    curve = pd.read_parquet(tmp_path / "cap" / "capacity.parquet").drop_duplicates("count")
    simulated = curve[~curve.status.str.startswith("overloaded")]
    assert [done for done, _ in counted] == list(range(1, len(simulated) + 1)) and len(simulated) >= 2
    assert sorted(int(note.split(" GPUs")[0]) for _, note in counted) == sorted(simulated["count"])
    noted = [int(note.split(" GPUs")[0]) for *_, note in search if note and note.endswith("fails load")]
    assert sorted(noted) == sorted(set(curve["count"]) - set(simulated["count"])) and noted  # overloaded: a line
    doublings = sum(round(math.log2(s / 12)) for s in curve.steps.dropna())
    assert sum(1 for *_, note in search if note and "not stationary" in note) == doublings > 0
    table = pd.read_csv(tmp_path / "cap" / "sensitivity.csv")
    variants = int((table.change != 0).sum())
    sens = [m.groups() for m in map(UNITS.match, said_lines(p.stderr, "racsim: judge_rm_h100: sensitivity")) if m]
    done = [int(d) for d, total, unit, note in sens if note and re.match(r"\w+ [+-][\d.]+%: \d+ GPUs$", note)]
    assert done == list(range(1, variants + 1)) and variants >= 6
    assert {int(total) for _, total, _, _ in sens} == {variants}  # announced before the first variant ran
    p = ok(racsim(tmp_path, "learner=lm", "learner.lm.policy=bandit", "pipeline.steps=6", "learner.lm.seeds=4",
                  "learner.lm.decide=[]", *NOPLOTS,
                  *run_dir_args(tmp_path / "lm")))
    assert p.stdout.startswith("racsim: default: GRPO (bandit), 4 seeds per corrector in ")
    assert "bias benchmark" not in p.stderr  # no phase that would not move: GRPO's seed-steps, each corrector noted
    names = pd.read_csv(tmp_path / "lm" / "results.csv").corrector
    grpo = [m.groups() for m in map(UNITS.match, said_lines(p.stderr, "racsim: default: GRPO")) if m]
    assert [note for *_, note in grpo if note and ": seeds " in note] == [f"{n}: seeds 0..3" for n in names]
    assert {int(total) for _, total, _, _ in grpo} == {6 * len(names) * 4}


@pytest.mark.parametrize("override,said", [
    ("capacity.sensitivity=null", "capacity.sensitivity: a block, never null; set its keys instead: enabled, spread, "
                                  "inputs (capacity.sensitivity.enabled=false turns it off)"),
    ("pipeline.steps=null", "pipeline.steps: never null; give it a value (an integer)"),
    ("pipeline.channels.judge.share=null", "pipeline.channels.judge.share: never null; give it a value (a number)"),
    ("pipeline.generate=null", "pipeline.generate: a block, never null; set its keys instead: kind, mean,"),
])
def test_a_null_where_none_may_be_says_what_to_set(override, said):
    """OmegaConf says only "field '...' is not Optional": the line names the block's keys or the value's kind."""
    from racsim.app.cli import error_line
    from racsim.config.defaults import compose_config

    with pytest.raises(Exception) as info:
        compose_config("scenario=capacity/judge_rm_h100", override)
    assert error_line(info.value).startswith(said)


def test_the_time_a_run_prints_is_the_time_its_user_waited(tmp_path, monkeypatch, capsys):
    """"in X s" counts from the command's start (issue 43, point 6: it said 6.5 s of a 15.9 s wait): at
    least the composition, the simulation and the files, nearly all of what the call took."""
    import re
    import time

    from helpers import main_in_process

    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    code, out, _ = main_in_process(monkeypatch, capsys, [*SMALL, *NOPLOTS, f"hydra.run.dir={tmp_path / 'r'}"])
    wall = time.perf_counter() - t0
    said = float(re.search(r"trajectories in ([\d.]+) s", out).group(1))
    assert code in (0, None) and 0.8 * wall - 0.15 <= said <= wall + 0.05, (said, wall)
