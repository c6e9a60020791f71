"""The README and the docs site cannot go stale (issue 20).

Every shell command of README.md and docs/*.md (fenced ``bash`` blocks, and ``$`` lines of
``console`` blocks) runs here in a temporary folder, reduced by the table REDUCE where the full
run is long; it must exit 0, or the N of a trailing ``# exit N``, and a console block's shown
output must appear in what it prints. Install commands are checked, not run: the extras they
name exist. The fast, deterministic generated blocks are rerun and compared (timings masked).
"""

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from racsim.app import docs

ROOT = docs.ROOT
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
EXIT = re.compile(r"#\s*exit (\d+)")
SETUP = re.compile(r"^(python3 -m venv \S+|\. \S+/bin/activate)$")
PIP = re.compile(r"^pip install (-e )?(?P<spec>\S+)$")
# The test command runs the suite this file belongs to: checked against .ci/run instead.
SUITE = "python -m pytest -q -n auto"

# Commands not run here, with the reason; each must still match a documented command.
NOT_RUN = {
    "mutmut run": "mutation testing takes hours",
    "racsim-bench --capacity": "times every capacity knob at full size (tests/test_bench.py covers it reduced)",
    "racsim-bench --scale": "simulates up to 65,536 sequences a step (tests/test_bench.py covers it reduced)",
    "racsim-bench --sweep": "times two sweeps of 64 jobs (tests/test_bench.py covers it reduced)",
    "racsim-bench --paper": "the paper's full heavy-tail grid (tests/test_bench.py covers --paper's parts)",
    "racsim-bench --generation": "times 1,000 steps at the issue's size (tests/test_bench.py covers it reduced)",
    "python tests/golden.py check": "tests/test_golden.py runs the golden runs",
    "python -m racsim.app.docs": "rewrites the pages (test_deterministic_blocks_are_up_to_date reruns the fast blocks)",
    "mkdocs build": ".ci/run builds the site (test_ci_runs_the_readme_test_command_and_builds_the_site)",
}

# Documented commands that fail on this commit, each with why: an expected failure, strict, so the
# fix must remove its entry.
BROKEN: dict = {}  # documented commands known to fail: key -> why (a strict expected failure)

# How a long command is shortened: the first row whose pattern the command matches gives
# (regex, replacement) substitutions and overrides appended (each replacing the command's own
# override of that key); a command that matches none runs as written.
FEW = "learner.trials=20 learner.bootstrap=20 learner.train.enabled=false output.plots=false"
CAPACITY = ("learner.trials=4 learner.bootstrap=20 pipeline.steps=15 pipeline.warmup_steps=5 output.plots=false "
            "capacity.run_length=fixed capacity.resamples=20 capacity.benchmark=false")
# the sensitivity table (on for the judge's scenarios: ten more searches, half a reduced run's time) runs
# with the judge's plain command; its variants elsewhere are tests/test_capacity_sensitivity.py's
QUIET = CAPACITY + " capacity.sensitivity.enabled=false"
LM = ("learner.lm.seeds=2 learner.lm.max_seeds=4 learner.lm.checkpoints=0 pipeline.steps=6 pipeline.warmup_steps=2 "
      "output.plots=false")
# asynchronous generation: few trials of short runs; a pool split of one split, run once at a fixed length
ASYNC = "learner.trials=3 learner.bootstrap=20 learner.train.enabled=false output.plots=false pipeline.steps=24"
SPLIT = (ASYNC.replace("pipeline.steps=24", "pipeline.steps=60") + " pipeline.warmup_steps=20 capacity.run_length=fixed "
         "capacity.resamples=20 capacity.decide_steps=0 capacity.split.engines=[4] capacity.split.judge=[4]")
REDUCE = [
    (r"^racsim-report", [], ""),
    (r"scenario=async/pool_split", [], SPLIT),
    (r"scenario=async/", [(r"staleness=\S+", "staleness=0,0.3"), (r"seed=0,1", "seed=0")], ASYNC),
    # small cells, but far enough apart (16 and 256 tokens), timed on one thread and the fastest
    # of 5, that a machine busy with the other tests does not make the larger one seem faster
    (r"^racsim-profile", [(r"batch_sizes=\S+", "batch_sizes=[1,2]"), (r"seq_lens=\S+", "seq_lens=[16,128]")],
     "repeats=5 threads=1"),
    (r"^racsim-bench --set", [(r"--set", "--quick --set")], ""),
    (r"^racsim-bench --gpu-rm", [(r"--gpu-rm", "--quick --gpu-rm")], ""),
    (r"^racsim-bench$", [(r"$", " --quick")], ""),
    # two stable counts far apart (the run length found: a fixed short run is not stationary) show the bias
    # target out of reach, as the full list does (exit 3)
    (r"capacity.max_bias_vs_naive=0.0001", [],
     "learner.trials=4 learner.bootstrap=20 output.plots=false capacity.resamples=20 capacity.benchmark=false "
     "capacity.counts=[4,5,12]"),
    # every shipped GPU capacity scenario under five service models: each run as small as the others here
    (r"racsim.tools.kernels answers", [], CAPACITY + " capacity.counts=[4]"),
    (r"scenario=capacity/code_verifier", [], QUIET + " capacity.counts=[64]"),
    (r"scenario=capacity/judge_rm_h100$", [], CAPACITY + " capacity.counts=[4]"),
    (r"scenario=capacity/", [], QUIET + " capacity.counts=[4]"),
    (r"scenario=adaptive_tau", [], "learner.trials=20 learner.bootstrap=20 pipeline.steps=30 pipeline.warmup_steps=10 output.plots=false"),
    (r"scenario=two_lags", [], "learner.trials=4 learner.bootstrap=20 learner.horizon=5 pipeline.steps=10 "
                               "pipeline.warmup_steps=4 learner.train.lanes=2 output.plots=false"),
    (r"scenario=lm/", [], LM),
    (r"learner=lm", [], LM + " corrector.names=[naive,rac]"),
    (r"scenario=paper/k_sweep,", [(r"scenario=\S+", "scenario=paper/tv_bound,paper/identity_kernel")], "study.fast=true"),
    (r"scenario=paper/", [], "learner.trials=20 output.plots=false"),
    (r"^racsim -m", [(r"range\(\d+\)", "range(2)")], FEW),
    (r"^racsim\b", [], FEW),
]


def documented():
    """(page, block number, command, expected output) of every command, in page order."""
    for page in docs.pages():
        for i, (kind, body) in enumerate(FENCE.findall(page.read_text())):
            if kind == "bash":
                lines = body.replace("\\\n", " ").splitlines()
                yield from ((page, i, line.strip(), "") for line in lines if line.strip() and not line.startswith("#"))
            elif kind == "console":
                for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                    cmd, _, shown = chunk.partition("\n")
                    yield page, i, cmd.strip(), shown.strip()


COMMANDS = list(documented())


def parts(cmd):
    """The command without its comment, split on &&, and the exit status it is documented with."""
    code, _, comment = cmd.partition(" #")
    m = EXIT.search("#" + comment)
    return [p.strip() for p in code.split("&&")], int(m[1]) if m else 0


def reduced(cmd):
    for pattern, subs, extra in REDUCE:
        if re.search(pattern, cmd):
            for old, new in subs:
                cmd = re.sub(old, new, cmd)
            for key in (o.split("=")[0] for o in extra.split()):
                cmd = re.sub(rf"\s'?{re.escape(key)}=\S+", "", cmd)
            return f"{cmd} {extra}".strip()
    return cmd


def runnable(cmd):
    """The parts of a command this test runs (setup, installs and the suite itself are checked instead)."""
    return [p for p in parts(cmd)[0] if not SETUP.match(p) and not PIP.match(p) and p != SUITE]


def block_cases():
    """One case per fenced block: its commands run in order in one folder (a command may use a file
    the one before it made)."""
    cases = {}
    for page, i, cmd, shown in COMMANDS:
        if not any(key in cmd for key in NOT_RUN) and runnable(cmd):
            cases.setdefault(f"{page.name}:{i}", []).append((cmd, shown))
    return cases


CASES = block_cases()


def run(cmd, cwd):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MPLBACKEND": "Agg"}
    return subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def case(block):
    why = [reason for key, reason in BROKEN.items() if any(key in cmd for cmd, _ in CASES[block])]
    return pytest.param(block, marks=[pytest.mark.xfail(strict=True, reason=why[0])] if why else [])


@pytest.mark.long
@pytest.mark.parametrize("block", [case(b) for b in sorted(CASES)])
def test_every_documented_command_runs(block, tmp_path):
    for name in ("scenarios", "docs"):  # as from the repository's root
        os.symlink(ROOT / name, tmp_path / name)
    for cmd, shown in CASES[block]:
        want = parts(cmd)[1]
        for part in runnable(cmd):
            p = run(reduced(part), tmp_path)
            assert p.returncode == want, f"{block}: `{reduced(part)}` exited {p.returncode}, documented {want}:\n{p.stderr[-2000:]}"
            for line in shown.splitlines():
                assert line.strip() in p.stdout + p.stderr, f"{block}: `{part}` did not print the documented\n{line}"


def test_the_table_leaves_out_only_documented_commands():
    text = "\n".join(c for _, _, c, _ in COMMANDS)
    assert [key for key in {**NOT_RUN, **BROKEN} if key not in text] == []
    run_parts = [p for _, _, c, _ in COMMANDS for p in runnable(c)]
    assert [r[0] for r in REDUCE if not any(re.search(r[0], p) for p in run_parts)] == []


def test_install_commands_name_extras_that_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    specs = [PIP.match(p)["spec"] for _, _, c, _ in COMMANDS for p in parts(c)[0] if PIP.match(p)]
    assert specs, "no install command found"
    for spec in specs:
        m = re.fullmatch(r'"?\.(?:\[(?P<extras>[\w,]+)\])?"?', spec)
        assert m, f"pip install {spec}: install racsim itself, '.' or '\".[extra]\"'"
        assert set((m["extras"] or "").split(",")) - {""} <= set(extras), f"pip install {spec}: extras {sorted(extras)}"


def test_ci_runs_the_readme_test_command_and_builds_the_site():
    readme = [c for p, _, c, _ in COMMANDS if p.name == "README.md" and SUITE in c]
    assert len(readme) == 1
    install_and_test = " && ".join(parts(readme[0])[0][2:])  # less the venv and its activation
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci
    assert any(re.search(r"\bmkdocs build --strict --site-dir \S+", line) for line in ci)


def test_readme_is_a_front_door():
    # 250, and the 9 lines the runs' printed answers add to its blocks (issue 49: job 1's answer, a plan's margin)
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260


def test_every_block_has_a_recipe_and_every_recipe_a_block():
    assert set(docs.blocks()) == set(docs.RECIPES)


def test_every_block_shows_the_commands_its_page_documents():
    """A block's numbers come from the commands shown on its page, not from others."""
    for name, places in docs.blocks().items():
        for page, _ in places:
            for cmd in docs.RECIPES[name].commands:
                assert cmd in page.read_text(), f"block {name}: `{cmd}` is not on {page.name}"


FRESH = sorted({r.commands: None for r in docs.RECIPES.values() if r.fresh})


@pytest.mark.long
@pytest.mark.parametrize("commands", FRESH, ids=lambda c: c[-1].split(" pipeline")[0])
def test_deterministic_blocks_are_up_to_date(commands, tmp_path):
    """Rerun the commands of the quick, deterministic blocks once and compare every block they make (within the
    recipe's tolerance: the LM verdict's numbers, which another CPU rounds differently)."""
    names = [n for n, r in docs.RECIPES.items() if r.commands == commands]
    for name, text, run in docs.made(names, tmp_path):
        assert text is not None, f"block {name}: {run}"
        for page, body in docs.blocks()[name]:
            assert docs.agree(body, text, docs.RECIPES[name].tolerance), \
                f"{page.name}: block {name} is stale: run python -m racsim.app.docs {name}\n{body}\n{text}"


def test_rewrite_replaces_the_named_blocks_and_nothing_else(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("a 1\n<!-- generated:x -->\nold x\n<!-- /generated -->\nb 2\n<!-- generated:y -->\nold y\n<!-- /generated -->\n")
    docs.rewrite(page, {"x": "new x\n"})
    assert page.read_text() == ("a 1\n<!-- generated:x -->\nnew x\n<!-- /generated -->\nb 2\n"
                                "<!-- generated:y -->\nold y\n<!-- /generated -->\n")


def test_agree_holds_numbers_within_the_tolerance_and_everything_else_exactly():
    old = "racsim: rac vs naive: better, decided at 8 seeds (+0.753 [+0.216, +1.290]; about 42 seeds) in 80.1 s"
    assert docs.agree(old, old) and docs.agree(old, old.replace("80.1 s", "99.9 s"))
    assert not docs.agree(old, old.replace("+0.753", "+0.755"))  # no tolerance: the same text
    tol = docs.LM_TOLERANCE
    assert docs.agree(old, old.replace("+0.753", "+0.768").replace("42 seeds", "44 seeds"), tol)
    assert not docs.agree(old, old.replace("+0.753", "+0.81"), tol)  # past 0.02 and 5%
    assert not docs.agree(old, old.replace("8 seeds", "16 seeds"), tol)
    assert not docs.agree(old, old.replace("+0.216", "-0.216"), tol)  # a sign is text
    assert not docs.agree(old, old.replace("better", "worse"), tol)
    assert not docs.agree(old, old.replace("(+0.753", "(+0.753 +0.1"), tol)  # a number more


def test_an_lm_answer_is_its_verdicts_and_seed_rule_with_their_wrapped_lines():
    out = ("racsim: default: GRPO (transformer), 8 seeds per corrector in 80.1 s\n"
           "racsim: rac vs naive: better, decided at 8 seeds (+0.753 [+0.216, +1.290])\n"
           "racsim: seed rule (one stage of 8 seeds): stopped at 8 seeds, rac vs naive\n  decided; each interval 98.33%\n"
           "racsim: rac vs wait_for_slow: undecided after 8 seeds: [-0.293, +0.613] (+0.160; about 42 seeds\n"
           "  would decide it)\n"
           "  corrector clock x\n        naive       1\n  sync_oracle     1\nracsim: results in out\n")
    run = docs.Run(Path("."), ("racsim learner=lm",), (out,))
    lines = out.splitlines()
    assert docs.answer_lines(run) == lines[1:6]
    assert docs.verdicts(run) == docs.fenced("\n".join(["$ racsim learner=lm", *lines[:6]]))
    with pytest.raises(docs.DocsError):
        docs.answer_lines(docs.Run(Path("."), ("racsim",), ("racsim: default: K=2\n",)))


def test_masked_blanks_wall_clock_figures_only():
    one = "racsim: default: K=2, 1000 trials, 200000 trajectories in 4.6 s\nrac 0.04446"
    assert docs.masked(one) == docs.masked(one.replace("4.6 s", "55.1 s"))
    assert docs.masked(one) != docs.masked(one.replace("0.04446", "0.04447"))
    assert docs.masked(one) != docs.masked(one.replace("1000 trials", "100 trials"))


def test_a_capacity_answer_is_its_recommendation():
    out = ("racsim: judge: capacity\nGPUs bias\n   4  0.1\nRecommended: 4 GPUs\n  for judge\n(0.09 x naive's)\n"
           "racsim: speed: 1e6 requests/s (the draws,\n  0.5 s) vs raw SimPy\nHow the answer moves\n  6 if MFU is 0.3\n"
           "racsim: results in out\n")
    # racsim's own lines go with the lines they wrapped onto (a speed line of two once left "  0.5 s) vs ...")
    assert docs.recommendation(out) == ("Recommended: 4 GPUs\n  for judge\n(0.09 x naive's)\nHow the answer moves\n"
                                        "  6 if MFU is 0.3\n")
    with pytest.raises(docs.DocsError):
        docs.recommendation("racsim: error: nothing\n")


def test_unknown_blocks_are_refused_before_anything_runs():
    with pytest.raises(docs.DocsError, match="no such block: nosuch"):
        next(docs.regenerate(["nosuch"]))
