"""Fuzz the command line and the scenario YAML: every malformed input ends with
exit status 2, one line on stderr that names the key (or the file), no
traceback, and no output folder left behind.

The bulk runs the CLI in-process (``racsim.app.cli.main()`` with a patched
``sys.argv``; Hydra's global state cleared between calls); a handful of cases
go through a real ``racsim`` subprocess. Malformed scenario files live in a
temporary folder put on Hydra's search path (``DIR/scenario/NAME.yaml``,
selected as ``scenario=NAME``).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import messages, spread

SMALL = ["learner.trials=20", "learner.bootstrap=20", "learner.train.enabled=false", "pipeline.steps=8",
         "pipeline.warmup_steps=null",
         "output.plots=false", "output.progress=false"]

# ----------------------------------------------------------------------------
# Malformed overrides: (override(s), a word the message must contain)

INT_KEYS = ["pipeline.steps", "pipeline.batch_size", "learner.trials", "learner.bootstrap", "learner.horizon",
            "learner.n_states", "learner.n_actions", "learner.train.lanes", "seed",
            "pipeline.channels.judge.workers", "pipeline.channels.verifier.max_delay"]
FLOAT_KEYS = ["corrector.alpha", "corrector.tau_age", "corrector.rho_bar", "corrector.retrace_gamma",
              "learner.gamma", "learner.theta_scale", "learner.train.lr", "learner.slow_bump",
              "learner.fast_noise_std", "pipeline.channels.judge.share", "pipeline.channels.verifier.share",
              "pipeline.channels.judge.latency.mean", "pipeline.generate.mean", "pipeline.update.mean",
              "pipeline.generate.std", "pipeline.channels.judge.latency.sigma", "corrector.wait_timeout_s"]
BOOL_KEYS = ["output.plots", "output.progress", "resume", "learner.train.enabled"]


def _override_cases():
    cases = []
    # wrong types
    for k in INT_KEYS:
        for v in ("abc", "1.5", "[1,2]", "nan"):
            cases.append(([f"{k}={v}"], k))
    for k in FLOAT_KEYS:
        for v in ("abc", "{a:1}"):
            cases.append(([f"{k}={v}"], k))
    for k in BOOL_KEYS:
        for v in ("maybe", "[true]", "nan"):
            cases.append(([f"{k}={v}"], k))
    # NaN where a number is expected
    for k in FLOAT_KEYS:
        cases.append(([f"{k}=nan"], k))
    # out of range
    for args, key in [
        ("pipeline.steps=0", "pipeline.steps"), ("pipeline.steps=-1", "pipeline.steps"),
        ("pipeline.batch_size=0", "pipeline.batch_size"), ("learner.trials=1", "learner.trials"),
        ("learner.trials=-5", "learner.trials"), ("learner.bootstrap=-1", "learner.bootstrap"),
        ("learner.horizon=0", "learner.horizon"), ("learner.n_states=0", "learner.n_states"),
        ("learner.n_actions=1", "learner.n_actions"), ("learner.train.lanes=0", "learner.train.lanes"),
        ("seed=-1", "seed"), ("corrector.alpha=0", "corrector.alpha"), ("corrector.alpha=-1", "corrector.alpha"),
        ("corrector.alpha=inf", "corrector.alpha"), ("corrector.tau_age=0", "corrector.tau_age"),
        ("corrector.tau_age=-inf", "corrector.tau_age"), ("corrector.rho_bar=0", "corrector.rho_bar"),
        ("corrector.retrace_gamma=2", "corrector.retrace_gamma"),
        ("corrector.retrace_gamma=-0.1", "corrector.retrace_gamma"),
        ("corrector.wait_timeout_s=0", "corrector.wait_timeout_s"),
        ("corrector.wait_timeout_s=-3", "corrector.wait_timeout_s"), ("learner.gamma=1", "learner.gamma"),
        ("learner.gamma=-0.5", "learner.gamma"), ("learner.theta_scale=-1", "learner.theta_scale"),
        ("learner.theta_scale=inf", "learner.theta_scale"), ("learner.train.lr=0", "learner.train.lr"),
        ("learner.fast_noise_std=-1", "learner.fast_noise_std"), ("learner.slow_bump=inf", "learner.slow_bump"),
        ("pipeline.channels.judge.share=-1", "pipeline.channels.judge.share"),
        ("pipeline.channels.judge.share=inf", "pipeline.channels.judge.share"),
        ("pipeline.channels.judge.max_delay=-1", "pipeline.channels.judge.max_delay"),
        ("pipeline.channels.judge.latency.mean=-1", "pipeline.channels.judge.latency.mean"),
        ("pipeline.channels.judge.latency.mean=inf", "pipeline.channels.judge.latency.mean"),
        ("pipeline.channels.judge.latency.kind=weibull", "pipeline.channels.judge.latency.kind"),
        ("pipeline.channels.judge.latency.kind=pareto pipeline.channels.judge.latency.alpha=1",
         "pipeline.channels.judge.latency.alpha"),
        ("pipeline.channels.judge.latency.kind=lognormal pipeline.channels.judge.latency.sigma=0",
         "pipeline.channels.judge.latency.sigma"),
        ("pipeline.channels.judge.latency.low=5 pipeline.channels.judge.latency.high=1",
         "pipeline.channels.judge.latency.high"),
        ("pipeline.update.kind=gaussian pipeline.update.std=-1", "pipeline.update.std"),
        ("pipeline.generate.mean=-2", "pipeline.generate.mean"), ("pipeline.engine=fast", "pipeline.engine"),
        ("learner.kind=deep", "learner.kind"), ("corrector.names=[]", "corrector.names"),
        ("corrector.names=[foo]", "corrector.names"), ("corrector.names=[naive,naive]", "corrector.names"),
        ("corrector.names=rac", "corrector.names"),
        ("pipeline.channels.judge.share=0 pipeline.channels.verifier.share=0", "share"),
    ]:
        cases.append((args.split(), key))
    # negative (and zero) worker counts
    for ch in ("judge", "verifier"):
        for v in ("-1", "-100", "0"):
            cases.append(([f"pipeline.channels.{ch}.workers={v}"], f"pipeline.channels.{ch}.workers"))
    # kernels: rows above 1, negative or NaN entries, empty, not numbers
    for ch, values in (("judge", ("[0.7,0.6]", "[1.0,0.1]", "[0.5,0.5,0.5]", "[2]", "[-0.1,0.5]", "[nan]",
                                   "[0.5,nan]", "[]", "[inf]", "[a,b]", "0.5")),
                       ("verifier", ("[0.6,0.6]", "[1.5]", "[-1]", "[nan,0.1]"))):
        for v in values:
            cases.append(([f"pipeline.channels.{ch}.kernel={v}"], f"pipeline.channels.{ch}.kernel"))
    # unknown keys
    for args, key in [
        ("foo=1", "foo"), ("pipeline.foo=1", "pipeline.foo"), ("learner.bar=2", "learner.bar"),
        ("corrector.alphas=1", "corrector.alphas"), ("output.plot=false", "output.plot"),
        ("learner.train.epochs=3", "learner.train.epochs"), ("pipeline.channels.nope.workers=1", "nope"),
        ("pipeline.channels.judge.latency.shape=2", "pipeline.channels.judge.latency.shape"),
        ("+foo=1", "foo"), ("+pipeline.foo=1", "pipeline.foo"), ("++corrector.bogus=1", "corrector.bogus"),
        ("+pipeline.channels.judge.bogus=1", "pipeline.channels.judge.bogus"),
        ("+learner.train.bogus=x", "learner.train.bogus"), ("+output.colour=red", "output.colour"),
        ("+pipeline.generate.shape=2", "pipeline.generate.shape"),
    ]:
        cases.append(([args], key))
    # unknown scenario and group names, and group choices that are not names
    for args, key in [
        ("scenario=nope", "scenario"), ("scenario=Default", "scenario"),
        ("scenario=../default", "scenario"), ("scenario=paper/nope", "scenario"), ("scenario=1", "scenario"),
        ("scenario=nan", "scenario"), ("corrector=nope", "corrector"), ("learner=nope", "learner"),
        ("pipeline=nope", "pipeline"), ("+channel@pipeline.channels.x=nope", "channel"),
        ("hydra/launcher=nope", "launcher"), ("=5", "=5"),
    ]:
        cases.append(([args], key))
    # malformed override syntax
    for args, key in [
        ("pipeline.steps=[", "["), ("'unbalanced", "unbalanced"), ("pipeline..steps=3", "pipeline..steps"),
        ("pipeline.steps={", "{"), ("pipeline.steps=]", "]"), ("corrector.names=[naive,", "["),
    ]:
        cases.append(([args], key))
    return cases


# ----------------------------------------------------------------------------
# Malformed scenario files: name -> (text or bytes, a word the message must contain)

_HEAD = "# @package _global_\n"
_CHANNELS = ("defaults:\n  - /channel@pipeline.channels.verifier: code_verifier\n"
             "  - /channel@pipeline.channels.judge: judge_rm\n")


def _scenario_files():
    files = {
        "s_empty": ("", "scenario"),
        "s_blank": ("\n\n   \n", "scenario"),
        "s_comment": ("# nothing here\n", "scenario"),
        "s_header_only": (_HEAD, "pipeline.channels"),
        "s_scalar": ("hello\n", "scenario"),
        "s_list": ("- 1\n- 2\n", "scenario"),
        "s_no_header": ("pipeline:\n  steps: 3\n", "scenario"),
        "s_unbalanced": (_HEAD + "corrector:\n  names: [naive, rac\n", "s_unbalanced"),
        "s_tabs": (_HEAD + "pipeline:\n\tsteps: 3\n", "s_tabs"),
        "s_dup_key": (_HEAD + "seed: 1\nseed: 2\n", "s_dup_key"),
        "s_bad_indent": (_HEAD + "pipeline:\n  steps: 3\n batch_size: 2\n", "s_bad_indent"),
        "s_empty_key": (_HEAD + ": 5\n", "s_empty_key"),
        "s_quote": (_HEAD + "name: 'unterminated\n", "s_quote"),
        "s_binary": (b"\xff\xfe\x00bad", "s_binary"),
        "s_unknown_top": (_HEAD + _CHANNELS + "bogus_key: 3\n", "bogus_key"),
        "s_unknown_nested": (_HEAD + _CHANNELS + "pipeline:\n  bogus: 3\n", "pipeline.bogus"),
        "s_unknown_channel_key": (_HEAD + _CHANNELS + "pipeline:\n  channels:\n    judge:\n      bogus: 1\n",
                                  "pipeline.channels.judge.bogus"),
        "s_unknown_latency_key": (_HEAD + _CHANNELS + "pipeline:\n  generate:\n    shape: 1\n",
                                  "pipeline.generate.shape"),
        "s_steps_str": (_HEAD + _CHANNELS + "pipeline:\n  steps: abc\n", "pipeline.steps"),
        "s_steps_float": (_HEAD + _CHANNELS + "pipeline:\n  steps: 2.5\n", "pipeline.steps"),
        "s_alpha_list": (_HEAD + _CHANNELS + "corrector:\n  alpha: [1]\n", "corrector.alpha"),
        "s_names_str": (_HEAD + _CHANNELS + "corrector:\n  names: rac\n", "corrector.names"),
        "s_names_unknown": (_HEAD + _CHANNELS + "corrector:\n  names: [naive, magic]\n", "corrector.names"),
        "s_pipeline_scalar": (_HEAD + "pipeline: 5\n", "pipeline"),
        "s_channels_list": (_HEAD + "pipeline:\n  channels: [1, 2]\n", "s_channels_list"),
        "s_no_channels": (_HEAD + "name: lonely\n", "pipeline.channels"),
        "s_bad_default": (_HEAD + "defaults:\n  - /channel@pipeline.channels.x: nope\n", "channel"),
        "s_plots_str": (_HEAD + _CHANNELS + "output:\n  plots: sometimes\n", "output.plots"),
        "s_gamma_one": (_HEAD + _CHANNELS + "learner:\n  gamma: 1.0\n", "learner.gamma"),
        "s_inf_alpha": (_HEAD + _CHANNELS + "corrector:\n  alpha: .inf\n", "corrector.alpha"),
    }
    for i, k in enumerate(["[0.8, 0.5]", "[1.0, 0.0, 0.2]", "[0.34, 0.33, 0.34]", "[3]", "[-0.2, 0.9]", "[.nan]",
                           "[]"]):
        files[f"s_kernel_{i}"] = (_HEAD + _CHANNELS + f"pipeline:\n  channels:\n    judge:\n      kernel: {k}\n",
                                  "pipeline.channels.judge.kernel")
    for i, w in enumerate(["-3", "-1", "0"]):
        files[f"s_workers_{i}"] = (_HEAD + _CHANNELS + f"pipeline:\n  channels:\n    verifier:\n      workers: {w}\n",
                                   "pipeline.channels.verifier.workers")
    for key in ["corrector.alpha", "corrector.rho_bar", "learner.gamma", "pipeline.channels.judge.share",
                "pipeline.channels.judge.latency.mean", "pipeline.generate.std", "learner.train.lr"]:
        body = ""
        for depth, part in enumerate(key.split(".")[:-1]):
            body += "  " * depth + part + ":\n"
        body += "  " * (key.count(".")) + key.split(".")[-1] + ": .nan\n"
        files["s_nan_" + key.replace(".", "_")] = (_HEAD + _CHANNELS + body, key)
    return files


OVERRIDE_CASES = _override_cases()
SCENARIO_FILES = _scenario_files()


@pytest.fixture(scope="module")
def scenario_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_search_path")
    (root / "scenario").mkdir()
    for name, (text, _) in SCENARIO_FILES.items():
        path = root / "scenario" / f"{name}.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
    return root


def _search_path(root: Path) -> str:
    return f"hydra.searchpath=[pkg://racsim.scenarios,file://{root}]"


def run_in_process(args):
    """``racsim ARGS`` in this process: (exit status, stdout, stderr)."""
    from hydra.core.global_hydra import GlobalHydra

    import racsim.app.cli as cli

    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["racsim", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as ex:
        code = ex.code
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    return code, out.getvalue(), err.getvalue()


def check_failure(code, stdout, stderr, word, cwd: Path) -> None:
    lines = messages(stderr)
    assert code not in (0, None), f"accepted; stdout: {stdout[-300:]}"
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{stderr}"
    assert lines[0].startswith("racsim: error: "), lines[0]
    assert word in lines[0], f"{word!r} not named in: {lines[0]}"
    assert not (cwd / "outputs").exists(), f"output left behind: {list((cwd / 'outputs').rglob('*'))}"


@pytest.fixture
def clean_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    return tmp_path


def test_fuzz_has_enough_cases():
    assert len(OVERRIDE_CASES) + len(SCENARIO_FILES) >= 200


# Every value fast (each reaches its branch of the refusal: a wrong type, NaN, out of range, an unknown choice, a
# malformed list); every key, through the same path with its own rule, in the long stage.
@pytest.mark.parametrize("args,word", spread(OVERRIDE_CASES, key=lambda case: ""))
def test_bad_override(args, word, clean_cwd):
    code, out, err = run_in_process(SMALL + args)
    check_failure(code, out, err, word, clean_cwd)


# the first file that each word's check refuses in the README's command, every file in the long stage
@pytest.mark.parametrize("name", spread([(n,) for n in sorted(SCENARIO_FILES)], key=lambda c: SCENARIO_FILES[c[0]][1],
                                        value=lambda c: SCENARIO_FILES[c[0]][1], ids=lambda c: c[0]))
def test_bad_scenario_file(name, scenario_dir, clean_cwd):
    code, out, err = run_in_process(SMALL + [_search_path(scenario_dir), f"scenario={name}"])
    check_failure(code, out, err, SCENARIO_FILES[name][1], clean_cwd)


def test_in_process_harness_runs_a_good_config(clean_cwd):
    """The harness itself: a valid run succeeds in-process and leaves its folder."""
    code, out, err = run_in_process(SMALL + ["hydra.run.dir=good"])
    assert code in (0, None), err
    assert (clean_cwd / "good" / "done.json").is_file()
    assert "HYDRA_FULL_ERROR" not in os.environ  # main() leaves the environment as it found it


FAST_SUBPROCESS = ("pipeline.steps=abc", "scenario=s_tabs")
SUBPROCESS_CASES = [
    (["pipeline.steps=abc"], "pipeline.steps"),
    (["scenario=nope"], "scenario"),
    (["+pipeline.channels.judge.bogus=1"], "pipeline.channels.judge.bogus"),
    (["corrector.alpha=nan"], "corrector.alpha"),
    (["scenario=s_tabs"], "s_tabs"),
    (["scenario=s_kernel_0"], "pipeline.channels.judge.kernel"),
]


# through a real process: a type mistake and a malformed file in the README's command, the rest in the long stage
@pytest.mark.parametrize("args,word", [pytest.param(*c, id=" ".join(c[0]), marks=() if c[0][0] in FAST_SUBPROCESS
                                                    else pytest.mark.long) for c in SUBPROCESS_CASES])
def test_bad_input_real_command(args, word, scenario_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", "racsim", *SMALL, _search_path(scenario_dir), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    check_failure(proc.returncode, proc.stdout, proc.stderr, word, tmp_path)
