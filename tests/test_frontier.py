"""The throughput-staleness frontier of an asynchronous generation sweep (racsim/report/frontier.py, issue 46
point 3): the Pareto marking against a brute-force loop, the table against a hand loop over a gathered table
(means and t intervals over seeds, which side binds, the bias per corrector, J at equal wall-clock), and real
jobs through racsim.run and racsim-report (a multirun in the long stage)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import racsim
from racsim.generation.figures import binding
from racsim.report import frontier as F
from racsim.sweep.gather import answer_text, gather_and_write

# t(0.975, df) for df = 1..4, from a printed table
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def dominated_by_loop(thr, lag) -> list:
    """Point i is off the Pareto set when some other point has at least its throughput and at most its lag,
    one of them strictly; a point with a NaN is off it."""
    out = []
    for i in range(len(thr)):
        if math.isnan(thr[i]) or math.isnan(lag[i]):
            out.append(False)
            continue
        beaten = False
        for j in range(len(thr)):
            if j == i or math.isnan(thr[j]) or math.isnan(lag[j]):
                continue
            if thr[j] >= thr[i] and lag[j] <= lag[i] and (thr[j] > thr[i] or lag[j] < lag[i]):
                beaten = True
        out.append(not beaten)
    return out


def test_the_pareto_set_is_the_brute_force_loops():
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 30))
        # few distinct values, so that ties in throughput, in lag and in both occur; a few NaNs
        thr = rng.integers(0, 6, n).astype(float) * rng.choice([1.0, 37.5])
        lag = rng.integers(0, 5, n).astype(float) / rng.choice([1.0, 4.0])
        if n > 3 and seed % 3 == 0:
            thr[rng.integers(0, n)] = math.nan
            lag[rng.integers(0, n)] = math.nan
        assert F.pareto_set(thr, lag).tolist() == dominated_by_loop(thr.tolist(), lag.tolist()), seed


def test_pareto_edge_cases():
    assert F.pareto_set([], []).tolist() == []
    assert F.pareto_set([5.0, 5.0], [1.0, 1.0]).tolist() == [True, True]  # equal points: both on it
    assert F.pareto_set([5.0, 6.0], [1.0, 1.0]).tolist() == [False, True]
    assert F.pareto_set([5.0, 5.0], [1.0, 2.0]).tolist() == [True, False]
    assert F.pareto_set([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]).tolist() == [True, True, True]


def training_table(rng, lanes: int, steps: int, correctors) -> pd.DataFrame:
    """A job's training table: per corrector and lane, a clock from 0 by random steps and a J per step."""
    rows = []
    for c in correctors:
        for lane in range(lanes):
            clock = np.concatenate([[0.0], np.cumsum(rng.uniform(5, 15, steps))])
            for k in range(steps + 1):
                rows.append({"corrector": c, "lane": lane, "step": k, "wallclock_s": clock[k], "J": rng.uniform(),
                             "distance": 0.0})
    return pd.DataFrame(rows)


def j_by_hand(t: pd.DataFrame, corrector: str, seconds: float) -> float:
    """Mean over lanes of J at the last step whose clock is within ``seconds`` (step 0 when none)."""
    out = []
    for _, lane in t[t.corrector == corrector].groupby("lane"):
        lane = lane.sort_values("step")
        done = 0
        for k in range(1, len(lane)):
            if lane.wallclock_s.iloc[k] <= seconds + 1e-9:
                done = k
            else:
                break
        out.append(lane.J.iloc[done])
    return sum(out) / len(out)


def synthetic(seed: int):
    """A gathered table of async jobs: eta x concurrency cells, 1 to 4 seeds each, correctors naive, rac,
    wait_for_slow and wait_for_slow+tis (whose rows carry the blocking schedule's figures: never the frontier's);
    and each job's training table."""
    rng = np.random.default_rng(seed)
    rows, training, job = [], {}, 0
    for eta in (0, 2, 4):
        for conc in (32, 64):
            for s in range(int(rng.integers(1, 5))):
                figs = {f: rng.uniform(0.0, 1.0) if f in F.SHARES else rng.uniform(1, 500) for f in F.FIGURES}
                for name in ("naive", "rac", "wait_for_slow", "wait_for_slow+tis"):
                    mine = dict(figs) if not name.startswith("wait_for_slow") else {f: -1.0 for f in F.FIGURES}
                    rows.append({"job_dir": str(job), "pipeline.generation.admission.eta": eta,
                                 "pipeline.generation.engines.concurrency": conc, "override:seed": s,
                                 "scenario": "x", "corrector": name, "seed": s, "bias_exact": rng.lognormal(), **mine})
                training[str(job)] = training_table(rng, 2, 6, ("naive", "rac", "wait_for_slow"))
                job += 1
    axes = ["pipeline.generation.admission.eta", "pipeline.generation.engines.concurrency", "override:seed"]
    return pd.DataFrame(rows), axes, training


@pytest.mark.parametrize("seed", range(2))
def test_the_frontier_is_the_hand_loop(seed):
    df, axes, training = synthetic(seed)
    front = F.frontier_table(df, axes, training)
    keys = axes[:2]
    assert list(front.columns[:3]) == keys + ["n"] and len(front) == 6
    clock = min(float(t[t.corrector == "naive"].groupby("lane").wallclock_s.max().mean()) for t in training.values())
    assert front.clock_s.iloc[0] == clock
    for _, r in front.iterrows():
        cell = df[(df[keys[0]] == r[keys[0]]) & (df[keys[1]] == r[keys[1]])]
        jobs = cell[cell.corrector == "naive"]  # one row a job; never wait_for_slow's
        assert r.n == len(jobs)
        for f in F.FIGURES:
            x = jobs[f].tolist()
            mean = sum(x) / len(x)
            assert r[f] == pytest.approx(mean, rel=1e-12)
            if len(x) < 2:
                assert math.isnan(r[f"{f}_lo"]) and math.isnan(r[f"{f}_hi"])
                continue
            half = T975[len(x) - 1] * math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1)) / math.sqrt(len(x))
            top = 1.0 if f in F.SHARES else math.inf
            tol = 3e-4 * half  # the printed t table's rounding (3 decimals)
            assert r[f"{f}_lo"] == pytest.approx(max(mean - half, 0.0), abs=tol)
            assert r[f"{f}_hi"] == pytest.approx(min(mean + half, top), abs=tol)
        assert r.binds == binding(r.trainer_waiting, r.engine_idle)
        for c in ("naive", "rac", "wait_for_slow"):
            mine = cell[cell.corrector == c]
            assert r[f"bias_exact:{c}"] == pytest.approx(mine.bias_exact.mean(), rel=1e-12)
            js = [j_by_hand(training[d], c, clock) for d in mine.job_dir]
            assert r[f"J_at_clock:{c}"] == pytest.approx(sum(js) / len(js), rel=1e-12)
    assert front.pareto.tolist() == dominated_by_loop(front.steps_per_hour.tolist(), front.mean_lag.tolist())


def wins_by_loop(caps, lags, js):
    """The least cap whose J exceeds the J of the least cap, that one read only at a mean lag of 0."""
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    base = order[0]
    if lags[base] != 0 or math.isnan(js[base]):
        return None
    for i in order[1:]:
        if js[i] > js[base]:
            return caps[i]
    return None


def test_where_async_pays_is_the_hand_loop():
    """async_wins_from on 60 random frontiers over one cap (rows in any order, ties in J, a lockstep point or
    none, a NaN J) against the loop; a frontier without that corrector's J gives None."""
    rng = np.random.default_rng(46)
    found = set()
    for _ in range(60):
        n = int(rng.integers(1, 6))
        caps = rng.permutation([0.0, 0.1, 0.3, 1.0, 2.0, 4.0])[:n].tolist()
        lags = [0.0 if c == min(caps) and rng.uniform() < 0.8 else float(rng.uniform(0.5, 5)) for c in caps]
        js = [float(rng.choice([0.3, 0.31, 0.32])) for _ in caps]
        if rng.uniform() < 0.1:
            js[caps.index(min(caps))] = math.nan
        front = pd.DataFrame({"cap": caps, "mean_lag": lags, "J_at_clock:rac": js})
        want = wins_by_loop(caps, lags, js)
        assert F.async_wins_from(front, "cap", "rac") == want
        assert F.async_wins_from(front, "cap", "naive") is None
        found.add(want is None)
    assert found == {True, False}  # both answers reached


def test_the_frontier_text_fits_and_marks_the_pareto_set():
    df, axes, training = synthetic(1)
    front = F.frontier_table(df, axes, training)
    text = F.format_frontier(front, 120)
    lines = text.splitlines()
    assert all(len(ln) <= 120 for ln in lines)
    head = lines[0].split()
    assert head[:2] == ["eta", "concurrency"] and "steps/h" in head and "pareto" in head and "rac" in head
    assert sum(ln.rstrip().endswith("*") for ln in lines[1:]) == int(front.pareto.sum())
    full = F.format_frontier(front)
    assert "samples/h" in full and "J @ clock" in full and "bias rac" in full and "binds" in full


def test_lockstep_rows_make_no_frontier():
    df, axes, _ = synthetic(0)
    assert F.frontier_table(df.drop(columns=list(F.FIGURES)), axes).empty
    assert F.frontier_table(df.assign(steps_per_hour=math.nan), axes).empty


ASYNC_TINY = ["scenario=async/areal", "pipeline.steps=8", "pipeline.batch_size=16",
              "pipeline.generation.engines.gpus=2", "pipeline.generation.engines.concurrency=8", "pipeline.generation.engines.response_tokens.mean=256",
              "pipeline.generation.engines.max_response_tokens=1024", "learner.trials=3", "learner.bootstrap=0",
              "learner.train.enabled=false", "output.plots=false", "output.progress=false",
              "corrector.names=[naive,rac]"]


def test_a_grid_job_of_async_runs_gathers_into_a_frontier(tmp_path):
    """A study grid over eta and seed written by racsim.run: racsim-report's frontier has a point per eta, the
    seeds averaged, the figures those of the runs' results, and report.md a section for it."""
    t = racsim.run(overrides=ASYNC_TINY + ["study.grid={pipeline.generation.admission.eta:[0,3],seed:[0,1]}"],
                   out=tmp_path / "job")
    g = gather_and_write(tmp_path / "job", out=tmp_path / "report", plots=True)
    front = g.frontier
    assert list(front["pipeline.generation.admission.eta"]) == [0, 3] and (front.n == 2).all()
    res = t.results[t.results.corrector == "naive"]
    for _, r in front.iterrows():
        mine = res[res["pipeline.generation.admission.eta"] == r["pipeline.generation.admission.eta"]]
        assert r.steps_per_hour == pytest.approx(mine.steps_per_hour.mean(), rel=1e-12)
        assert r.mean_lag == pytest.approx(mine.mean_lag.mean(), rel=1e-12)
        assert r.mean_lag == pytest.approx(r.mean_lag_before_queue + r.mean_lag_in_queue, rel=1e-9)
    assert front.mean_lag.iloc[0] == 0.0 and front.mean_lag.iloc[1] > 0  # eta 0 is lockstep
    assert "## Throughput against staleness" in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert pd.read_csv(tmp_path / "report" / "frontier.csv").shape[0] == 2
    assert "throughput against staleness (frontier.csv)" in answer_text(g)


@pytest.mark.long
def test_a_multirun_prints_its_frontier(tmp_path):
    """`racsim -m` over the cap and the engines, two seeds: the sweep's answer ends with the frontier, one row
    per cell, and frontier.csv holds J at equal wall-clock from each job's training."""
    args = [a for a in ASYNC_TINY if a not in ("learner.train.enabled=false", "pipeline.generation.engines.gpus=2")]
    args += ["learner.train.lanes=2"]
    cmd = [sys.executable, "-m", "racsim", "-m", *args, "pipeline.generation.admission.eta=0,2",
           "pipeline.generation.engines.gpus=1,2", "seed=0,1", "hydra.sweep.dir=sweep"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout[proc.stdout.index("throughput against staleness"):]
    head = next(ln for ln in out.splitlines() if ln.split()[:2] == ["eta", "gpus"])
    assert "pareto" in head.split()
    front = pd.read_csv(tmp_path / "sweep" / "frontier.csv")
    assert len(front) == 4 and (front.n == 2).all() and front["J_at_clock:rac"].notna().all()
    assert (front.clock_s > 0).all() and front.pareto.any()


@pytest.mark.long
def test_the_cap_block_reads_the_learner_against_the_cap(tmp_path):
    """docs/generation.md's generation.cap block, from a small sweep of its command (2 caps, few trials, short
    runs): one row per cap with each corrector's bias and J at equal wall-clock as frontier.csv has them, and
    where J beats lockstep's as async_wins_from reads it."""
    from racsim.app import docs

    small = ["pipeline.steps=12", "pipeline.warmup_steps=4", "pipeline.batch_size=16",
             "pipeline.generation.engines.concurrency=8", "pipeline.generation.engines.response_tokens.mean=256",
             "pipeline.generation.engines.max_response_tokens=1024", "learner.trials=2", "learner.bootstrap=0",
             "learner.train.lanes=2", "output.plots=false", "output.progress=false"]
    cmd = docs.CAP.replace("staleness=0,0.1,0.3,1", "staleness=0,1") + " " + " ".join(small)
    proc = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = docs.cap_table(docs.Run(tmp_path, (cmd,), (proc.stdout,)))
    front = pd.read_csv(tmp_path / docs.CAP_DIR / "frontier.csv")
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| s ")]
    assert len(rows) == len(front) == 2 and front.mean_lag.iloc[0] == 0 and front.mean_lag.iloc[1] > 0
    for c in docs.CAP_CORRECTORS:
        assert f"| bias {c} |" in text and f"| J {c} |" in text and front[f"J_at_clock:{c}"].notna().all()
        w = F.async_wins_from(front, docs.CAP_AXIS, c)
        assert (f"{c} from s = 1" if w == 1 else f"{c} at no cap swept") in text
