"""The docs' generated blocks: every figure of README.md and docs/*.md comes from a fresh run.

A block is the text between ``<!-- generated:NAME -->`` and ``<!-- /generated -->``.
``python -m racsim.app.docs`` reruns the commands of every block (``python -m racsim.app.docs NAME ...``:
of those blocks only), each in a temporary folder, and rewrites the blocks from their output.
Run it from the repository's root with racsim installed; it takes minutes.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import pandas as pd

from racsim.errors import Parser, interruptible
from racsim.io import fmt, write_text
from racsim.report.frontier import async_wins_from
from racsim.report.lm import value_label
from racsim.report.tables import answer_line

ROOT = Path(__file__).resolve().parents[2]  # the repository (racsim/app/docs.py)
BLOCK = re.compile(r"(<!-- generated:(?P<name>[\w.]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)
RESULTS_IN = re.compile(r"^racsim: results in\s+(\S+)$", re.M)  # the path on a line of its own when long (errors.wrapped)
# Wall-clock figures in a block: the only part of a fresh block that may differ run to run.
TIMING = re.compile(r"\b\d[\d.,e+]*(?= s\b| (?:requests|trajectories|trials|cells)/s\b)")


class DocsError(Exception):
    """A block that cannot be made: a command failed, or a name without a recipe."""


@dataclass(frozen=True)
class Run:
    """The commands of a block, run in order in one folder: that folder and each command's stdout."""

    cwd: Path
    commands: Tuple[str, ...]
    stdout: Tuple[str, ...]

    def folder(self, i: int = -1) -> Path:
        """The results folder command i printed ("racsim: results in DIR")."""
        found = RESULTS_IN.findall(self.stdout[i])
        if not found:
            raise DocsError(f"`{self.commands[i]}` printed no results folder")
        return self.cwd / found[-1]

    def csv(self, name: str, i: int = -1) -> pd.DataFrame:
        return pd.read_csv(self.folder(i) / name)


@dataclass(frozen=True)
class Recipe:
    """How a block is made: the commands to run, and the block's text from their run.

    ``fresh``: deterministic and quick, so a test reruns it and compares (timings masked), its numbers
    within ``tolerance`` (relative, absolute: each pair of numbers within the looser of the two; (0, 0):
    the same text). ``figures``: files of the run's last results folder (or, named from ``outputs/``, of the
    folder the commands ran in: a sweep's) copied to docs/ under a name.
    ``exit_status``: the status each command exits with (3: a capacity plan whose targets no count meets)."""

    commands: Tuple[str, ...]
    render: Callable[[Run], str]
    fresh: bool = False
    figures: Tuple[Tuple[str, str], ...] = ()
    tolerance: Tuple[float, float] = (0.0, 0.0)
    exit_status: int = 0


def fenced(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```\n"


def shown(cmd: str, out: str) -> str:
    """A command and what it printed, less the results folder (a time stamp)."""
    body = RESULTS_IN.sub("", out).strip("\n")
    return f"$ {cmd}\n" + (body + "\n" if body else "")


def console(run: Run) -> str:
    """Every command and its whole output."""
    return fenced("".join(shown(c, o) for c, o in zip(run.commands, run.stdout)))


ANSWERS = ("Recommended", "Infeasible", "No count")  # how a capacity run's answer begins (racsim.report.capacity)


def recommendation(out: str) -> str:
    """The capacity run's answer: its lines from "Recommended" (or "Infeasible", "No count") on, less racsim's
    own lines (speed, folder), each with the indented lines it wrapped onto."""
    lines, own = [], False
    for line in out.strip("\n").splitlines():
        own = line.startswith("racsim:") or (own and line.startswith("  "))
        if not own:
            lines.append(line)
    start = next((i for i, line in enumerate(lines) if line.startswith(ANSWERS)), None)
    if start is None:
        raise DocsError("a capacity run printed no recommendation")
    return "\n".join(lines[start:]) + "\n"


def recommendations(run: Run) -> str:
    """Each capacity command with its answer."""
    return fenced("\n".join(f"$ {c}\n{recommendation(o)}" for c, o in zip(run.commands, run.stdout)))


SHIPPED_CAPACITY = ("judge_rm_h100", "code_verifier", "human_review", "judge_rm_faults", "judge_rm_bursts",
                    "judge_rm_autoscale", "judge_rm_preempt")
SEEDS = ("python -m racsim.tools.seeds scenario=capacity/{} --seeds 20 --jobs 2 capacity.sensitivity.enabled=false "
         "capacity.benchmark=false")


def seed_table(run: Run) -> str:
    """Each shipped capacity scenario's answer over seeds 0-19 (the seeds tool's last line), and the
    CPU seconds and seconds a seed took on average and at most."""
    rows = []
    for name, out in zip(SHIPPED_CAPACITY, run.stdout):
        lines = out.strip().splitlines()
        secs = [float(ln.split()[-1]) for ln in lines[1:-1]]
        cpus = [float(ln.split()[-2]) for ln in lines[1:-1]]
        rows.append({"scenario": f"capacity/{name}", "answer over seeds 0-19": lines[-1],
                     "CPU s per seed (most)": f"{sum(cpus) / len(cpus):.0f} ({max(cpus):.0f})",
                     "s per seed": f"{sum(secs) / len(secs):.0f}"})
    return fenced("\n".join(f"$ {c}" for c in run.commands)) + "\n" + markdown_table(pd.DataFrame(rows))


def markdown_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, df.columns)) + " |\n"
    rule = "|" + "---|" * len(df.columns) + "\n"
    return head + rule + "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in df.itertuples(index=False))


def reading(run: Run) -> str:
    """A run's answer in one sentence, from its results.csv: the line the run prints after its table
    (racsim.report.tables.answer_line: which corrector, why, at what cost)."""
    said = answer_line(run.csv("results.csv"))
    return f"Here: {said}.\n"


def by_law(run: Run) -> str:
    """adaptive_tau's steady-state exact bias per delay law: RAC at each fixed tau_age, rac_adaptive
    at its worst prior (its rows hardly depend on the prior), the synchronous oracle."""
    df, law, tau = run.csv("results.csv"), "pipeline.delay_distribution.kind", "corrector.tau_age"
    rac = df[df["corrector"] == "rac"].pivot_table(index=law, columns=tau, values="bias_exact")
    rac.columns = [f"rac, tau_age={fmt(float(t))}" for t in rac.columns]
    rest = df[df["corrector"].isin(["rac_adaptive", "sync_oracle"])].groupby([law, "corrector"])["bias_exact"].max()
    rest = rest.unstack().rename(columns={"rac_adaptive": "rac_adaptive (worst prior)"})
    return markdown_table(rac.join(rest).reset_index().rename(columns={law: "delay law"}))


def lags_reading(run: Run) -> str:
    """two_lags's answer in a few sentences, from its results.csv, lags.csv and first_order.csv: per reward
    delay, the least-biased pair at naive's wall-clock at the smallest and the largest lag; what RAC's ratio
    composed with truncated IS does; the first-order slopes measured beside the predicted ones."""
    lags, first, results = run.csv("lags.csv"), run.csv("first_order.csv"), run.csv("results.csv")
    free = set(results.loc[results["wallclock_ratio"] <= 1.001, "corrector"])
    values = [c[len("bias_L"):] for c in lags.columns if c.startswith("bias_L")]
    low, high = values[0], values[-1]
    delay = lags.columns[0]
    said = []
    for d, rows in lags[lags["corrector"].isin(free)].groupby(delay, sort=False):
        best = {v: rows.loc[rows[f"bias_L{v}"].idxmin()] for v in (low, high)}
        said.append(f"With a mean Delta of {fmt(d)}, the least-biased pair at naive's wall-clock is "
                    f"{best[low]['corrector']} "
                    f"at L = {low} ({fmt(best[low][f'bias_L{low}'])}) and {best[high]['corrector']} at L = {high} "
                    f"({fmt(best[high][f'bias_L{high}'])}).")
    first_delay = lags[delay].iloc[0]
    one = lags[lags[delay] == first_delay].set_index("corrector")
    said.append(f"RAC with truncated IS carries the behaviour ratio twice: at a mean Delta of {fmt(first_delay)} "
                f"and L = {high} its bias is {fmt(one.loc['rac+tis', f'bias_L{high}'])} against RAC's "
                f"{fmt(one.loc['rac', f'bias_L{high}'])}, while bare_additive+tis, which carries it once, has "
                f"{fmt(one.loc['bare_additive+tis', f'bias_L{high}'])}.")
    slopes = first.groupby("rollout", sort=False)[["slope_measured", "slope_predicted"]].first().dropna()
    said.append("The first-order law's slope, measured on the exact figure (predicted): " + "; ".join(
        f"{r} {fmt(v.slope_measured)} ({fmt(v.slope_predicted)})" for r, v in slopes.iterrows()) + ".")
    return " ".join(said) + "\n"


def final_reward(run: Run) -> str:
    """The LM delay sweep's final true reward per delay law (rows) and corrector (columns)."""
    df = run.csv("results.csv")
    law = [c for c in df.columns if c.startswith("pipeline.delay_distribution")][0]
    table = df.pivot_table(index=law, columns="corrector", values="true_final", sort=False).reset_index()
    table[law] = [value_label(v) for v in table[law]]  # the law's kind, never a dict
    return markdown_table(table.rename(columns={law: "delay law"}))


RANKING = "racsim scenario=lm/ranking"
# The LM verdict with torch's CPU kernels pinned (racsim.learner.lm.CPU_KERNELS), then with each kernel set this
# machine can run chosen by hand (an empty MKL_CBWR: MKL's own dispatch, no reproducibility mode), at 2 threads and
# with NumPy's AVX-512 loops left out: what the pin holds fixed, measured (docs/lm.md, lm.kernels).
UNPINNED = "MKL_CBWR= ONEDNN_MAX_CPU_ISA=ALL ATEN_CPU_CAPABILITY={} racsim learner=lm"
KERNELS = ("racsim learner=lm", "racsim learner=lm learner.lm.threads=2",
           'NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" racsim learner=lm',
           *(UNPINNED.format(isa) for isa in ("avx512", "avx2", "default")),
           "MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=ALL ATEN_CPU_CAPABILITY=avx512 racsim learner=lm")
# an LM run's answer: its pairs (from rac's rows: rac, rac+tis) and its seed rule
VERDICT = re.compile(r"^racsim: (rac(\+\w+)? vs |seed rule |seed count )")
# The LM verdict's figures on another x86-64 CPU: torch's kernels round differently there, so that a token sampled
# near a boundary may flip and a seed's run differ; docs/lm.md states this tolerance.
LM_TOLERANCE = (0.05, 0.02)


def answer_lines(run: Run) -> List[str]:
    """An LM run's answer: the lines of its verdicts and its seed rule, each with the lines it wrapped onto
    (indented by two spaces: racsim.errors.wrapped; the table that follows starts with its header)."""
    lines, own = [], False
    for line in run.stdout[-1].splitlines():
        wrapped = re.match(r"  \S", line) is not None and not line.lstrip().startswith("corrector ")
        own = bool(VERDICT.match(line)) or (own and wrapped)
        if own:
            lines.append(line)
    if not lines:
        raise DocsError(f"`{run.commands[-1]}` printed no verdict")
    return lines


def verdicts(run: Run) -> str:
    """An LM run's answer: its command, the line saying how many seeds it ran in what time, its verdict lines
    (rac against each other corrector) and its seed rule's."""
    ran = [ln for ln in run.stdout[-1].splitlines() if "seeds per corrector in" in ln]
    return fenced("\n".join([f"$ {run.commands[-1]}", *ran, *answer_lines(run)]))


def kernel_table(run: Run) -> str:
    """Each command of :data:`KERNELS` with what it answered: rac vs naive's difference and interval, the seeds a
    projection gives rac vs rac_no_age (the figure that moves most), and whether its whole verdict is the first
    command's (the pinned kernels') to the last digit."""
    pinned = answer_lines(Run(run.cwd, run.commands[:1], run.stdout[:1]))
    rows = []
    for cmd, out in zip(run.commands, run.stdout):
        said = answer_lines(Run(run.cwd, (cmd,), (out,)))
        text = " ".join(" ".join(said).split())
        naive = re.search(r"rac vs naive: \w+, decided at \d+ seeds \(([^\]]+\])", text)
        no_age = re.search(r"rac vs rac_no_age: [^;]*; about (\d+) seeds", text)
        rows.append({"command": f"`{cmd}`", "rac vs naive": naive.group(1) if naive else "-",
                     "rac vs rac_no_age: seeds to decide": no_age.group(1) if no_age else "-",
                     "the pinned verdict": "the same" if said == pinned else "differs"})
    return markdown_table(pd.DataFrame(rows))


def sweep_rows(run: Run) -> str:
    """RAC's rows of the sweep's answer (aggregate.csv): one per cell, the mean over seeds and its
    95% t interval."""
    df = pd.read_csv(run.cwd / SWEEP_DIR / "aggregate.csv")
    rac = df[df["corrector"] == "rac"]
    out = pd.DataFrame({"corrector.tau_age": rac["corrector.tau_age"], "seeds": rac["n"]})
    for m in ("bias_exact", "reduction_exact", "slack_eta", "wallclock_ratio"):
        out[m] = [f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]" for v, lo, hi in zip(rac[m], rac[f"{m}_lo"], rac[f"{m}_hi"])]
    return markdown_table(out)


def script(run: Run) -> str:
    """The Python file the block's command runs, as it is."""
    path = run.cwd / run.commands[-1].split()[-1]
    return f"```python\n{path.read_text().rstrip()}\n```\n"


FRONTIER_MARK = "throughput against staleness"  # the line before a sweep's frontier table (racsim.sweep.gather)


def frontier_lines(run: Run) -> str:
    """An async sweep's frontier as its last command printed it: the commands, then the frontier's line and table
    (up to the next line of racsim's own)."""
    out = run.stdout[-1]
    if FRONTIER_MARK not in out:
        raise DocsError(f"`{run.commands[-1]}` printed no frontier")
    lines = []
    for line in out[out.index(FRONTIER_MARK):].splitlines():
        if line.startswith("racsim"):
            break
        lines.append(line)
    return fenced("\n".join([*(f"$ {c}" for c in run.commands), *lines]))


GEN_COLUMNS = {"steps_per_hour": "steps/h", "mean_lag": "mean lag", "mean_lag_before_queue": "before the queue",
               "mean_lag_in_queue": "in the queue", "head_lag_p95": "head lag p95", "engine_idle": "engines idle",
               "trainer_waiting": "trainer waiting", "binds": "binds", "dropped_share": "dropped",
               "response_trained_mean": "response trained", "response_generated_mean": "response generated"}


def lag_split(run: Run) -> str:
    """Each run's generation figures (generation.csv's async row), one row a scenario: the rates, the lag split
    before and in the queue, the idle shares and which side binds, the drops and the length bias."""
    rows = []
    for i, cmd in enumerate(run.commands):
        g = run.csv("generation.csv", i)
        r = g[g.schedule == "async"].iloc[0]
        row = {"scenario": cmd.split("scenario=")[1].split()[0]}
        row.update({h: (f"{r[k]:.0%}" if k in ("engine_idle", "trainer_waiting", "dropped_share") else r[k])
                    for k, h in GEN_COLUMNS.items()})
        rows.append(row)
    return markdown_table(pd.DataFrame(rows))


def gate_table(run: Run) -> str:
    """The slow-judge sweep's two cells (gate fast, gate all) from its frontier.csv: steps per hour and the lags
    with their intervals over the seeds, the idle shares, each corrector's bias and J at equal wall-clock."""
    f = pd.read_csv(run.cwd / GATE_DIR / "frontier.csv")
    ci = lambda r, k: f"{fmt(r[k])} [{fmt(r[k + '_lo'])}, {fmt(r[k + '_hi'])}]"  # noqa: E731
    rows = [{"gate": r["pipeline.generation.gate"], "seeds": r.n, "steps/h": ci(r, "steps_per_hour"),
             "mean lag": ci(r, "mean_lag"), "before the queue": fmt(r.mean_lag_before_queue),
             "in the queue": fmt(r.mean_lag_in_queue), "engines idle": f"{r.engine_idle:.0%}",
             "trainer waiting": f"{r.trainer_waiting:.0%}", "bias naive": fmt(r["bias_exact:naive"]),
             "bias rac": fmt(r["bias_exact:rac"]), "J naive": fmt(r["J_at_clock:naive"]),
             "J rac": fmt(r["J_at_clock:rac"])} for _, r in f.iterrows()]
    clock = f"J at {fmt(float(f.clock_s.iloc[0]))} s of simulated wall-clock, the shorter run's.\n"
    return fenced("\n".join(f"$ {c}" for c in run.commands)) + "\n" + markdown_table(pd.DataFrame(rows)) + "\n" + clock


def cap_table(run: Run) -> str:
    """The learner against the staleness cap (issue 47 point 5), from the cap sweep's frontier.csv: per cap the
    steps per hour and the mean lag, each corrector's steady-state bias under the moving policy (the schedule's
    lags: racsim.learner.drift) and its J(theta) at equal wall-clock; then, per corrector, the least cap at which
    that J beats its own at lockstep (racsim.report.frontier.async_wins_from)."""
    f = pd.read_csv(run.cwd / CAP_DIR / "frontier.csv")
    rows = [{"s": r[CAP_AXIS], "steps/h": r.steps_per_hour, "mean lag": r.mean_lag,
             **{f"bias {c}": r[f"bias_exact:{c}"] for c in CAP_CORRECTORS},
             **{f"J {c}": r[f"J_at_clock:{c}"] for c in CAP_CORRECTORS}} for _, r in f.iterrows()]
    wins = [(c, async_wins_from(f, CAP_AXIS, c)) for c in CAP_CORRECTORS]
    said = "; ".join(f"{c} from s = {fmt(w)}" if w is not None else f"{c} at no cap swept" for c, w in wins)
    return (fenced("\n".join(f"$ {c}" for c in run.commands)) + "\n" + markdown_table(pd.DataFrame(rows)) + "\n"
            + f"J at {fmt(float(f.clock_s.iloc[0]))} s of simulated wall-clock, the shortest job's. J beats its own "
              f"at lockstep (s 0) for {said}.\n")


FRONTIER_DIR, GATE_DIR, CAP_DIR = "outputs/frontier", "outputs/slow_judge", "outputs/cap"
FRONTIER = (f"racsim -m scenario=async/verl_fully_async pipeline.generation.admission.staleness=0,0.1,0.3,1 "
            f"pipeline.generation.engines.gpus=4,6 seed=0,1 'corrector.names=[naive,rac]' hydra.sweep.dir={FRONTIER_DIR}")
GATE = (f"racsim -m scenario=async/slow_judge pipeline.generation.gate=fast,all seed=0,1 'corrector.names=[naive,rac]' "
        f"hydra.sweep.dir={GATE_DIR}")
CAP_AXIS, CAP_CORRECTORS = "pipeline.generation.admission.staleness", ("naive", "rac", "naive+tis", "rac+tis")
CAP = (f"racsim -m scenario=async/verl_fully_async {CAP_AXIS}=0,0.1,0.3,1 'corrector.names=[naive,rac]' "
       f"'corrector.rollout=[none,tis]' hydra.sweep.dir={CAP_DIR}")
SWEEP_DIR = "outputs/tau_sweep"
PYTHON = "python docs/examples/python_quickstart.py"
OWN_DELAYS = ('python -c "import numpy as np; np.savetxt(\'my_delays.csv\', np.random.default_rng(1).lognormal(2.5, 0.6, 500), '
              'header=\'seconds\', comments=\'\')"',
              "racsim pipeline.channels.judge.latency.kind=empirical pipeline.channels.judge.latency.path=my_delays.csv "
              "pipeline.channels.judge.latency.column=seconds pipeline.channels.judge.latency.mean=null")
JUDGE = "racsim scenario=capacity/judge_rm_h100"
# The leave-one-out refits on another CPU (its BLAS rounds the least squares otherwise): a percent either way.
KERNEL_FIT = (0.0, 1.0)
SHARED = " 'pipeline.channels.judge.background={rate_per_s: 20}'"
BURSTS = " pipeline.channels.judge.degraded_factor=2 pipeline.channels.judge.p_degrade=0.05 pipeline.channels.judge.p_recover=0.2"
RECIPES: Dict[str, Recipe] = {
    "default": Recipe(("racsim",), console, fresh=True,
                      figures=(("pareto.png", "pareto.png"), ("training.png", "training.png"), ("gantt.png", "gantt.png"))),
    "default.reading": Recipe(("racsim",), reading, fresh=True),
    "own_delays": Recipe(OWN_DELAYS, console, fresh=True),
    "own_delays.reading": Recipe(OWN_DELAYS, reading, fresh=True),
    "sweep": Recipe((f"racsim -m seed=0,1,2 corrector.tau_age=20,1000 hydra.sweep.dir={SWEEP_DIR}",
                     f"racsim-report {SWEEP_DIR}"), sweep_rows),
    "adaptive_tau": Recipe(("racsim scenario=adaptive_tau",), by_law),
    "two_lags": Recipe(("racsim scenario=two_lags",), console, figures=(("lags.png", "lags.png"),)),
    "two_lags.reading": Recipe(("racsim scenario=two_lags",), lags_reading),
    "capacity.judge": Recipe((JUDGE,), console, figures=(("capacity.png", "capacity.png"),)),
    "capacity.code_verifier": Recipe(("racsim scenario=capacity/code_verifier",), recommendations),
    "capacity.human_review": Recipe(("racsim scenario=capacity/human_review",), recommendations),
    "capacity.cancel": Recipe(("racsim scenario=capacity/code_verifier pipeline.channels.verifier.cancel_on_drop=true",),
                              recommendations),
    "capacity.route": Recipe(("racsim scenario=capacity/code_verifier pipeline.channels.verifier.route_prob=0.5",),
                             recommendations),
    "capacity.bursts": Recipe((JUDGE + BURSTS, JUDGE + " pipeline.channels.judge.rm.mfu_scale=0.8333"), recommendations),
    "capacity.arrivals": Recipe((JUDGE + " pipeline.arrivals.mode=poisson",
                                 JUDGE + " pipeline.arrivals.mode=stream pipeline.arrivals.length.mean=4 "
                                         "pipeline.arrivals.length.sigma=0.3",
                                 "racsim scenario=capacity/code_verifier pipeline.arrivals.mode=poisson",
                                 "racsim scenario=capacity/code_verifier pipeline.arrivals.mode=open_poisson"),
                                recommendations),
    "capacity.autoscale": Recipe(("racsim scenario=capacity/judge_rm_autoscale",
                                  "racsim scenario=capacity/judge_rm_autoscale pipeline.arrivals.mode=poisson"),
                                 recommendations),
    "capacity.faults": Recipe(("racsim scenario=capacity/judge_rm_faults",
                               "racsim scenario=capacity/code_verifier pipeline.channels.verifier.faults.mtbf_s=600 "
                               "pipeline.channels.verifier.faults.mttr_s=60 'capacity.counts=[64,72,80,88,96,104,112,128]' "
                               "capacity.max_dropped=0.05"),
                              recommendations),
    "capacity.preempt": Recipe(("racsim scenario=capacity/judge_rm_preempt",), recommendations),
    "capacity.shared": Recipe((JUDGE + SHARED + " capacity.sensitivity.enabled=false",
                               JUDGE + SHARED + " capacity.max_background_sojourn_p95_s=5 capacity.sensitivity.enabled=false"),
                              recommendations),
    "capacity.continuous": Recipe((JUDGE + " pipeline.channels.judge.rm.batching=continuous",
                                   JUDGE + " pipeline.channels.judge.rm.padded=false"), recommendations),
    "capacity.seeds": Recipe(tuple(SEEDS.format(n) for n in SHIPPED_CAPACITY), seed_table),
    # issue 41's search above the list, at the flat MFU of 0.4 that racsim used then (docs/capacity.md)
    "capacity.above": Recipe(("racsim scenario=capacity/judge_rm_faults seed=5",),
                             recommendations),
    "capacity.impossible": Recipe((JUDGE + " capacity.max_bias_vs_naive=0.0001",), recommendations, exit_status=3),
    "generation": Recipe(("racsim scenario=async/areal",), console, figures=(("lag.png", "generation_lag.png"),)),
    "generation.frontier": Recipe((FRONTIER, f"racsim-report {FRONTIER_DIR}"), frontier_lines,
                                  figures=((f"{FRONTIER_DIR}/frontier.png", "generation_frontier.png"),)),
    "generation.lags": Recipe(tuple(f"racsim scenario=async/{n}" for n in ("verl_one_step_off", "verl_fully_async",
                                                                          "pipelinerl")), lag_split),
    "generation.gate": Recipe((GATE,), gate_table),
    "generation.cap": Recipe((CAP,), cap_table),
    "generation.split": Recipe(("racsim scenario=async/pool_split",), console),
    "lm.delay_sweep": Recipe(("racsim scenario=lm/delay_sweep",), final_reward),
    "lm.verdict": Recipe(("racsim learner=lm",), verdicts, fresh=True, tolerance=LM_TOLERANCE),
    "lm.ranking": Recipe((RANKING,), verdicts),
    "lm.stale": Recipe(("racsim scenario=lm/stale",), verdicts),
    "lm.kernels": Recipe(KERNELS, kernel_table),
    "python.script": Recipe((PYTHON,), script, fresh=True),
    "python.output": Recipe((PYTHON,), lambda run: fenced(run.stdout[-1]), fresh=True),
    "layout": Recipe(("python -m racsim.app.layout",), lambda run: fenced(run.stdout[0]), fresh=True),
    "layout.knob": Recipe(("python -m racsim.app.layout --knob max_load",), lambda run: fenced(run.stdout[0]),
                          fresh=True),
    "kernels.fit": Recipe(("python -m racsim.tools.kernels fit",), console, fresh=True, tolerance=KERNEL_FIT),
    "kernels.catalog": Recipe(("python -m racsim.tools.kernels catalog",), console, fresh=True),
    "kernels.decode": Recipe(("python -m racsim.tools.kernels decode --out outputs/kernels",), console, fresh=True,
                             figures=(("decode.png", "decode.png"),)),
    "capacity.services": Recipe(("python -m racsim.tools.kernels answers",), console),
    "bench.default": Recipe(("racsim-bench",), console),
    "bench.paper": Recipe(("racsim-bench --paper",), console),
    "bench.generation": Recipe(("racsim-bench --generation",), console),
}


def pages(root: Path = ROOT) -> List[Path]:
    """The files that may hold generated blocks: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(root: Path = ROOT) -> Dict[str, List[Tuple[Path, str]]]:
    """Every block's name -> (page, text) of each place it appears (a block may appear on several pages)."""
    found: Dict[str, List[Tuple[Path, str]]] = {}
    for page in pages(root):
        for m in BLOCK.finditer(page.read_text()):
            found.setdefault(m["name"], []).append((page, m["body"]))
    return found


def execute(commands: Sequence[str], cwd: Path, root: Path = ROOT, exit_status: int = 0) -> Run:
    """Run the commands in order in cwd (with the repository's scenarios/ and docs/ beside them, as from its root),
    each expected to exit with ``exit_status``."""
    for name in ("scenarios", "docs"):
        if not (cwd / name).exists():
            os.symlink(root / name, cwd / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outs = []
    for cmd in commands:
        p = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
        if p.returncode != exit_status:
            tail = (p.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise DocsError(f"`{cmd}` exited {p.returncode}: {tail}")
        outs.append(p.stdout)
    return Run(cwd, tuple(commands), tuple(outs))


def made(names: Sequence[str], workdir: Path, root: Path = ROOT) -> Iterator[Tuple[str, str | None, Run | DocsError]]:
    """(name, new text or None, its run or why not) of each named block as soon as it is made; blocks of
    the same commands share one run."""
    runs: Dict[Tuple[str, ...], Run | DocsError] = {}
    for name in names:
        recipe = RECIPES[name]
        if recipe.commands not in runs:
            cwd = workdir / f"run{len(runs)}"
            cwd.mkdir()
            try:
                runs[recipe.commands] = execute(recipe.commands, cwd, root, recipe.exit_status)
            except DocsError as e:
                runs[recipe.commands] = e
        run = runs[recipe.commands]
        try:
            if isinstance(run, DocsError):
                raise run
            yield name, recipe.render(run), run
        except (DocsError, LookupError, FileNotFoundError) as e:  # LookupError: a column or row the output lacks
            yield name, None, e if isinstance(e, DocsError) else DocsError(f"{type(e).__name__}: {e}")


def masked(text: str) -> str:
    """The block's text with its wall-clock figures blanked: what must match run to run."""
    return TIMING.sub("T", text)


NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def agree(old: str, new: str, tolerance: Tuple[float, float] = (0.0, 0.0)) -> bool:
    """Whether two texts of a block say the same: equal once their wall-clock figures are masked, but
    that each number of one may differ from the other's at its place by the looser of ``tolerance``
    (relative to the larger, absolute); a sign, a word or a number's place that differs is a difference."""
    a, b = masked(old), masked(new)
    if NUMBER.split(a) != NUMBER.split(b):
        return False
    rel, tol = tolerance
    return all(math.isclose(float(x), float(y), rel_tol=rel, abs_tol=tol)
               for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)))


def rewrite(page: Path, texts: Dict[str, str]) -> None:
    """Replace the named blocks of a page with their new texts."""
    old = page.read_text()
    new = BLOCK.sub(lambda m: m[1] + texts[m["name"]] + m[4] if m["name"] in texts else m[0], old)
    if new != old:
        write_text(page, new)


def regenerate(names: Sequence[str], root: Path = ROOT) -> Iterator[Tuple[str, str | None]]:
    """Rerun the named blocks (all when none) and rewrite each, and copy its figures, as soon as it is
    made, so that an interrupted regeneration keeps what it finished; a block that cannot be made keeps
    its text. Yields (name, None) for each block rewritten, (name, why) for each that failed."""
    found = blocks(root)
    unknown = sorted({n for n in names or found if n not in RECIPES or n not in found})
    if unknown:
        raise DocsError(f"no such block: {', '.join(unknown)} (blocks: {', '.join(sorted(found))})")
    with tempfile.TemporaryDirectory(prefix="racsim-docs-") as tmp:
        for name, text, run in made(names or list(found), Path(tmp), root):
            if text is None:
                yield name, str(run)
                continue
            for page in pages(root):
                rewrite(page, {name: text})
            for src, dst in RECIPES[name].figures:  # in the last results folder, or under outputs/ (a sweep's)
                shutil.copyfile((run.cwd if src.startswith("outputs/") else run.folder()) / src, root / "docs" / dst)
            yield name, None


@interruptible("python -m racsim.app.docs", "interrupted; the blocks printed as rewritten are kept, the others unchanged")
def main(argv: Sequence[str] | None = None) -> None:
    ap = Parser(prog="python -m racsim.app.docs", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"blocks to rewrite (default: all): {', '.join(RECIPES)}")
    args = ap.parse_args(argv)
    failed = []
    try:
        for name, why in regenerate(args.names):
            print(f"racsim.app.docs: {name}: " + ("rewritten" if why is None else f"not rewritten: {why}"), flush=True)
            failed += [name] if why else []
    except DocsError as e:
        print(f"racsim.app.docs: error: {e}", file=sys.stderr)
        sys.exit(2)
    if failed:
        print(f"racsim.app.docs: {len(failed)} blocks not rewritten: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
