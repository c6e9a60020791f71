"""learner=lm's progress (issue 26, point 4): the study tells the progress callback the seed-steps it
will run, ticks once per GRPO step of each seed batch (k = the batch's seeds), notes each corrector's
batch, adds each stage the seed rule adds, and ends at its total; through a pipe, racsim.app.cli's _Lines
prints a tenth at a time and each note."""

import pytest

from racsim.app.cli import _Lines


class Recorder:
    """The calls ``progress(k, note="", more=0)`` receives, in order."""

    def __init__(self):
        self.calls = []

    def __call__(self, k, note="", more=0):
        self.calls.append((k, note, more))

    def ticks(self):
        return [k for k, note, more in self.calls if k]

    def notes(self):
        return [note for k, note, more in self.calls if note]

    def total(self):
        return sum(more for _, _, more in self.calls)


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
    assert rec.calls[0] == (0, "", steps * len(names) * seeds)  # the whole run's total, first
    assert rec.ticks() == [seeds] * (steps * len(names))  # one tick per step of each corrector's one batch
    assert sum(rec.ticks()) == rec.total()
    assert rec.notes() == [f"{n}: seeds 0..{seeds - 1}" for n in names]
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
    assert rec.calls[0] == (0, "", 8 * len(names) * 3)
    assert set(rec.ticks()) == {1} and sum(rec.ticks()) == rec.total() == 8 * len(names) * n
    grown = [note for k, note, more in rec.calls if more and note]
    assert n == 6 and grown == ["the seed rule adds seeds 3..5"]  # 3 seeds leave a pair open
    assert rec.notes()[-1] == f"{names[-1]}: seeds 3..{n - 1}"


def test_lines_print_each_tenth_and_note_and_follow_a_growing_total(capsys):
    bar = _Lines(0, "GRPO (seed-steps)", "seed-step")
    bar.update(0, "", 20)
    assert capsys.readouterr().err == ""  # the total alone says nothing
    for _ in range(10):
        bar.update(2)
    shown = [int(ln.split(": ")[2].split("/")[0]) for ln in capsys.readouterr().err.splitlines()]
    assert shown == list(range(2, 21, 2))  # every tenth of 20, once
    bar.update(0, "rule", 20)
    bar.update(2)
    bar.update(2)  # 24/40: the next tenth of the grown total
    out = capsys.readouterr().err.splitlines()
    assert out == ["racsim: GRPO (seed-steps): 20/40 seed-steps - rule", "racsim: GRPO (seed-steps): 24/40 seed-steps"]
