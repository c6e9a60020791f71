"""The plain answers a run prints (issue 49, point 10): which corrector to use, why and at what cost
(job 1's line after its table); a capacity plan's margin (what the next count buys, how busy the pool
runs) and its counts without a steady state folded into ranges; a what-if's output folder named after
its overrides. Each checked against a slow loop over random inputs that reach every branch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from racsim.io import fmt
from racsim.report.tables import FREE_CLOCK, answer_line

NAMES = ["naive", "wait_for_slow", "retrace_a", "rac", "rac_no_age", "sync_oracle"]


def _results(rng, names):
    n = len(names)
    bias = rng.uniform(1e-4, 0.05, n)
    clock = np.where(rng.random(n) < 0.7, 1.0, rng.uniform(1.5, 6.0, n))
    out = pd.DataFrame({"corrector": names, "mode": "pipeline", "bias_exact": bias, "wallclock_ratio": clock,
                        "J_at_naive_clock": rng.uniform(0.2, 0.35, n)})
    naive = out.bias_exact[out.corrector == "naive"]
    out["reduction_exact"] = (naive.iloc[0] if len(naive) else 0.05) / out.bias_exact
    out["reduction_ci_lo"], out["reduction_ci_hi"] = 0.9 * out.reduction_exact, 1.1 * out.reduction_exact
    return out


@pytest.mark.long
def test_the_answer_names_the_least_biased_corrector_that_costs_no_clock():
    rng = np.random.default_rng(49)
    seen = {"a corrector": 0, "naive": 0, "none free": 0, "no wait": 0, "no training": 0}
    for _ in range(300):
        names = [n for n in NAMES if n == "naive" or rng.random() < 0.7]
        r = _results(rng, names)
        if rng.random() < 0.2:
            r = r.drop(columns="J_at_naive_clock")
        said = answer_line(r)
        best, low = None, np.inf  # the oracle: a plain loop over the rows
        for row in r.itertuples():
            if row.corrector != "sync_oracle" and row.wallclock_ratio <= FREE_CLOCK and row.bias_exact < low:
                best, low = row, row.bias_exact
        if best is None:
            assert said == ""
            seen["none free"] += 1
            continue
        if best.corrector == "naive":
            assert said.startswith("use naive: no corrector that costs no wall-clock has less bias")
            seen["naive"] += 1
        else:
            assert said.startswith(f"use {best.corrector}: the least-biased corrector at naive's wall-clock, "
                                   f"{fmt(best.reduction_exact)}x [{fmt(best.reduction_ci_lo)}, "
                                   f"{fmt(best.reduction_ci_hi)}] less bias than naive"), said
            seen["a corrector"] += 1
        wait = r[r.corrector == "wait_for_slow"]
        if not len(wait) or best.corrector == "wait_for_slow":  # nothing to weigh it against
            assert "removes" not in said
            seen["no wait"] += 1
            continue
        w = wait.iloc[0]
        assert f"wait_for_slow removes {fmt(w.reduction_exact)}x but takes {fmt(w.wallclock_ratio)}x" in said
        assert ("trains to J = " in said) == ("J_at_naive_clock" in r), said
        seen["no training"] += "J_at_naive_clock" not in r
    assert min(seen.values()) >= 5, seen
    assert answer_line(_results(rng, NAMES).assign(cell=0)) == ""  # a grid: per cell, in its table


def test_the_run_prints_its_answer_after_its_table(tmp_path):
    import racsim
    from racsim.app.job import run_text
    from racsim.config.defaults import compose_config

    over = ["learner.trials=40", "learner.train.enabled=false", "output.plots=false"]
    t = racsim.run(overrides=over)
    text = run_text(compose_config(*over), t.raw)
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("racsim: answer: use "))
    assert lines[at - 1].startswith("(to fit") or lines[at - 1].split()[0] in set(t.results.corrector)
    assert " ".join(text[text.index("racsim: answer: "):].split()).startswith(
        "racsim: answer: " + " ".join(answer_line(t.results).split()))


def _curve(rng, counts, max_load):
    """One corrector's curve rows (rac) over ``counts``: the load falling as 1 / count, overloaded at max_load or
    more, some of the others not stationary, every figure with an interval around it."""
    rows = []
    scale = rng.uniform(2.0, 6.0)
    for n in counts:
        load = scale / n
        status = (f"overloaded: load {load:.3g} >= capacity.max_load {max_load:g}" if load >= max_load
                  else f"not stationary at {rng.choice([40, 80])} steps (capacity.max_steps 640)"
                  if rng.random() < 0.3 else "ok")
        row = {"count": n, "corrector": "rac", "load": load, "status": status, "cost_per_hour": 2.5 * n}
        for fig, v in (("sojourn_p95_s", 10 / (1.01 - min(load, 1))), ("dropped_frac", rng.uniform(0, 0.02)),
                       ("bias_exact", rng.uniform(5e-4, 1e-3)), ("utilisation", min(load, 1) * rng.uniform(0.9, 1))):
            row.update({fig: v, f"{fig}_lo": 0.9 * v, f"{fig}_hi": min(1.1 * v, 1) if fig == "utilisation" else 1.1 * v})
        rows.append(row)
    return pd.DataFrame(rows)


def test_counts_without_a_steady_state_fold_into_ranges():
    from racsim.report.capacity import without_steady_state

    rng = np.random.default_rng(7)
    seen = {"range": 0, "single": 0, "other": 0, "folded": 0}
    for _ in range(200):
        counts = sorted(set(rng.integers(1, 17, int(rng.integers(2, 10))).tolist()))
        c = _curve(rng, counts, 0.95)
        bad = c[c.status != "ok"]
        said = without_steady_state(bad, 0.95)
        over = [int(n) for n, s in zip(bad["count"], bad.status) if s.startswith("overloaded")]  # the lowest counts
        parts = said.split("; ") if said else []
        if len(over) > 1:
            loads = bad.set_index("count").load
            assert parts[0] == (f"{over[0]} to {over[-1]} ({len(over)} counts): overloaded, load "
                                f"{loads[over[0]]:.3g} down to {loads[over[-1]]:.3g}, each >= capacity.max_load 0.95")
            seen["range"] += 1
        elif over:
            assert parts[0].startswith(f"{over[0]}: overloaded: load ")
            seen["single"] += 1
        others, runs = [(int(n), s) for n, s in zip(bad["count"], bad.status) if not s.startswith("overloaded")], []
        for n, s in others:  # a loop oracle: each run of one status, its counts listed
            if runs and runs[-1][1] == s:
                runs[-1][0].append(n)
            else:
                runs.append(([n], s))
        assert parts[1 if over else 0:] == [", ".join(map(str, ns)) + (f" ({len(ns)} counts)" if len(ns) > 1 else "")
                                            + f": {s}" for ns, s in runs]
        seen["other"] += bool(others)
        seen["folded"] += any(len(ns) > 1 for ns, _ in runs)
        assert said.count("overloaded") == (1 if over else 0)
    assert min(seen.values()) >= 5, seen


def test_the_margin_says_what_the_next_count_buys_and_warns_of_a_hot_pool():
    from racsim.analyses.capacity import CapacityResult
    from racsim.report.capacity import HOT, margin_text

    rng = np.random.default_rng(11)
    seen = {"hot": 0, "cool": 0, "none above": 0}
    for _ in range(200):
        counts = sorted(set(rng.integers(1, 17, int(rng.integers(2, 8))).tolist()))
        c = _curve(rng, counts, 0.95)
        ok = c[c.status == "ok"]
        if ok.empty:
            continue
        rec = int(rng.choice(ok["count"]))
        res = CapacityResult(c, "judge", "GPUs", "k", rec, pd.DataFrame(), {"corrector": "rac"})
        said = margin_text(res)
        above = [n for n in ok["count"] if n > rec]
        if not above:
            assert said == ""
            seen["none above"] += 1
            continue
        here, nxt = c.set_index("count").loc[rec], c.set_index("count").loc[min(above)]
        assert said.startswith(f" Margin: {min(above)} GPUs, the next count evaluated, give sojourn p95 "
                               f"{nxt.sojourn_p95_s:.3g} [{nxt.sojourn_p95_s_lo:.3g}, {nxt.sojourn_p95_s_hi:.3g}] s")
        assert f"${nxt.cost_per_hour - here.cost_per_hour:.2f} more per training hour" in said
        hot = here.utilisation_hi >= HOT or here.load >= HOT
        assert (f"Warning: at {rec} GPUs the pool runs hot" in said) == hot, said
        seen["hot" if hot else "cool"] += 1
    assert min(seen.values()) >= 5, seen


def test_a_what_if_names_its_folder():
    from racsim.config.names import WHAT_IF_MAX, what_if_name

    assert what_if_name([]) == "" and what_if_name(["output.plots=false", "scenario=capacity/judge_rm_h100"]) == ""
    assert what_if_name(["rm/gpu@pipeline.channels.judge.rm.gpu=A100", "rm/model@pipeline.channels.judge.rm.model=70B"]) \
        == "_rm.gpu=A100,rm.model=70B"
    assert what_if_name(["pipeline.channels.judge.latency.mean=3", "pipeline.channels.verifier.latency.mean=4",
                         "seed=2"]) == "_judge.latency.mean=3,verifier.latency.mean=4,seed=2"  # alike keys lengthen
    assert what_if_name(["capacity.counts=[1,2,4]", "pipeline.channels.judge.background={rate_per_s: 20}",
                         "+learner.lm.checkpoint=/models/my lm"]) \
        == "_capacity.counts=1,2,4,judge.background=rate_per_s_20,lm.checkpoint=_models_mylm"
    rng = np.random.default_rng(3)
    names = set()
    for _ in range(200):  # any overrides: one path component, of safe characters, bounded, distinct per what-if
        over = [f"pipeline.channels.judge.k{int(rng.integers(0, 30))}={rng.integers(0, 10 ** int(rng.integers(1, 12)))}"
                for _ in range(int(rng.integers(1, 8)))]
        name = what_if_name(over)
        assert name.startswith("_") and len(name) <= WHAT_IF_MAX + 1 and "/" not in name
        assert all(c.isalnum() or c in "._=,+-~" for c in name), name
        names.add((tuple(over), name))
    assert len({n for _, n in names}) == len({o for o, _ in names})


def test_a_single_runs_folder_says_its_what_if(tmp_path, monkeypatch, capsys):
    from helpers import main_in_process, messages

    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, ["learner.trials=5", "learner.train.enabled=false",
                                                           "output.plots=false", "output.progress=false"])
    assert code == 0, err
    run = Path(messages(out)[-1].split("results in ", 1)[1])
    assert run.parent == tmp_path / "outputs" / "default" and (run / "results.csv").is_file()
    assert run.name.endswith("_learner.trials=5,train.enabled=false"), run.name
