"""learner=lm's progress (issue 26, point 4; issue 43, point 2): the study starts its phase with the
seed-steps it will run, advances once per GRPO step of each seed batch (k = the batch's seeds), notes
each corrector's batch, grows its total by each stage the seed rule adds, and ends at its total."""

import pytest

from helpers import Recorder


def advances(rec):
    """The units each advance added, in order."""
    done, out = 0, []
    for method, _, now, _, _ in rec.calls:
        if method == "update":
            out.append(now - done)
            done = now
    return out


def test_transformer_run_ticks_once_per_step_of_each_corrector_batch_and_reaches_its_total():
    pytest.importorskip("torch")
    from racsim.analyses.dispatch import run
    from racsim.config.defaults import default_config

    steps, seeds, names = 4, 3, ["naive", "rac", "wait_for_slow"]
    cfg = default_config("learner=lm", f"pipeline.steps={steps}", f"learner.lm.seeds={seeds}",
                         "learner.lm.checkpoints=1", "learner.lm.d_model=16", "learner.lm.layers=1",
                         "learner.lm.vocab=6", "learner.lm.response_len=3", "learner.lm.group_size=4",
                         "learner.lm.device=cpu", f"corrector.names=[{','.join(names)}]", "learner.lm.decide=[]")
    rec = Recorder()
    res = run(cfg, rec)
    assert rec.calls[0][:4] == ("start", "GRPO", 0, steps * len(names) * seeds)  # the whole run's total, first
    assert advances(rec) == [seeds] * (steps * len(names))  # one tick per step of each corrector's one batch
    assert rec.phase.done == rec.phase.total
    assert rec.notes("note") == [f"{n}: seeds 0..{seeds - 1}" for n in names]
    assert int(res.results.seeds.iloc[0]) == seeds


def test_the_seed_rule_adds_its_stages_and_bandit_ticks_per_seed():
    """A first stage of 3 seeds that leaves a pair open (max_seeds 6): the total grows by the next stage's
    seed-steps before they run, and the ticks end exactly at it; the bandit trains seed by seed (k = 1)."""
    from racsim.analyses.dispatch import run
    from racsim.config.defaults import default_config

    cfg = default_config("scenario=lm/ranking", "pipeline.steps=8", "learner.lm.seeds=3",
                         "learner.lm.max_seeds=6", "learner.lm.n_responses=16", "learner.lm.vocab=4",
                         "learner.lm.response_len=3", "learner.lm.policy=bandit")
    rec = Recorder()
    res = run(cfg, rec)
    n, names = int(res.results.seeds.iloc[0]), list(res.results.corrector)
    assert rec.calls[0][:4] == ("start", "GRPO", 0, 8 * len(names) * 3)
    assert set(advances(rec)) == {1} and rec.phase.done == rec.phase.total == 8 * len(names) * n
    grown = [(done, total, why) for method, _, done, total, why in rec.calls if method == "grow"]
    assert n == 6 and grown == [(8 * len(names) * 3, 8 * len(names) * n, "the seed rule adds seeds 3..5")]  # 3 leave a pair open
    assert rec.notes("note")[-1] == f"{names[-1]}: seeds 3..{n - 1}"
