"""The one progress model (racsim.progress; issue 43, point 2): a phase's count never passes its total
and never reads 100% while the phase runs; through a pipe a line comes at least every ``every_s``
seconds whatever runs; on a terminal one line is redrawn and taken away; the time left follows the
phase's pace; a sweep's job counter counts the jobs running (in the folder, and computed ahead by
racsim's launcher) and estimates the time left from the finished jobs and those side by side."""

import io
import json
import os
import re
import threading
import time

import pytest

from racsim.progress import Progress, hms
from racsim.sweep import callback as S
from racsim.sweep.markers import DONE


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def lines(mode="lines", **kw):
    """A progress writing to a string, on a fake clock, ticked by hand."""
    out, now = io.StringIO(), Clock()
    p = Progress("run", mode=mode, stream=out, clock=now, ticking=False, quiet_s=0, **kw)
    return p, out, now


PERCENT = re.compile(r"\((\d+)%\)")


def shown(p):
    """(done, total, percent in the text) of the phase now."""
    m = PERCENT.search(p.text())
    return p.phase.done, p.phase.total, int(m.group(1)) if m else None


def test_a_scripted_run_never_passes_its_total_nor_reads_100_while_a_phase_runs():
    """Phases as a capacity search runs them: a search whose total grows (said), work past a total
    (grown, said), a bounded phase that ends short of its bound, a phase whose last unit is done while
    it still runs; after every call, done <= total, and the share reads 100% only once a phase ended."""
    p, out, now = lines(tail=["writing the files"])
    p.plan("capacity search", "deciding replications", "sensitivity")
    seen = []

    def check():
        done, total, pct = shown(p)
        assert done <= total
        if p.phase.ended is None:
            assert pct is None or pct <= 99, p.text()
        seen.append((p.phase.name, done, total, pct))

    script = [("start", "capacity search", 12, "count"), *[("advance",)] * 12,
              ("grow", 3, "counts not listed"), *[("advance",)] * 2,
              ("start", "deciding replications", 12000, "replicated step", True), ("update", 80), ("update", 120),
              ("start", "sensitivity", 6, "variant"), *[("advance",)] * 8,
              ("start", "writing the files", 1, "step")]
    for step in script:
        now.t += 7.0
        if step[0] == "start":
            p.start(step[1], step[2], step[3], upto=len(step) > 4)
        elif step[0] == "advance":
            p.advance(1, "a count")
        elif step[0] == "grow":
            p.grow(step[1], step[2], upto=True)
        else:
            p.update(step[1])
        check()
    p.finish()
    text = out.getvalue()
    flat = " ".join(text.split())  # a line past 120 columns goes on below, indented
    assert "total now 15 counts at most: counts not listed" in flat
    assert "capacity search (1/4): 14 counts of at most 15 needed, done in" in flat  # ended short of its bound
    assert "deciding replications (2/4): 120 replicated steps of at most 12,000 needed" in flat
    assert "total now 7 variants: more than the 6 variants planned" in flat and "8/8 variants (100%), done" in flat
    # its 12 units done, the phase not over: neither 100% nor "12/12 (99%)" (issue 49, point 7), but finishing
    assert ("capacity search", 12, 12, None) in seen and "12/12 counts (finishing)" in flat
    assert max(len(ln) for ln in text.splitlines()) <= 120  # racsim.errors.WIDTH
    assert all(pct <= 99 for name, _, _, pct in seen if pct is not None and name != "writing the files")


def test_through_a_pipe_a_line_at_least_every_every_s_of_work():
    """One unit taking 95 s, another 3 s, a long phase without units: ticked each second (as the thread
    does), a line is written at least every 10 s, and no more often than the work says something."""
    p, out, now = lines(every_s=10.0)
    written = []
    p._write = (lambda write: lambda: (written.append(now.t), write()))(p._write)
    p.start("capacity search", 3, "count")
    for seconds, note in ((95, "6 GPUs: load 0.86"), (3, "7 GPUs: load 0.74"), (40, "8 GPUs")):
        for _ in range(seconds):
            now.t += 1.0
            p.tick()
        p.advance(1, note)
    p.start("writing the files", 1)
    for _ in range(33):
        now.t += 1.0
        p.tick()
    gaps = [b - a for a, b in zip(written, written[1:])]
    assert max(gaps) <= 10.0 and len(written) >= 17
    assert sum(1 for g in gaps if g < 10.0) <= 5  # the lines between heartbeats: a start, three counts, the end
    assert "racsim: run: capacity search: 0/3 counts (0%) in 1:30\n" in out.getvalue()  # a heartbeat: where it stands
    assert "racsim: run: writing the files (2/2): running for 0:30\n" in out.getvalue()


def test_the_thread_writes_while_the_work_says_nothing():
    """The real clock and thread: a unit that runs 1.2 s without a word still gets lines (every_s 0.2)."""
    out = io.StringIO()
    with Progress("run", mode="lines", stream=out, every_s=0.2, quiet_s=0) as p:
        p.start("one long unit", 1, "count", note="simulating")
        time.sleep(1.2)
    said = out.getvalue().splitlines()
    assert len(said) >= 4 and said[-1].endswith("- simulating") and not p._thread.is_alive()


def test_quick_work_through_a_pipe_says_only_what_it_asks_for_and_off_says_nothing_ever():
    """Within QUIET_S of the start, a phase's start, tenths and end write nothing; a line the work asks
    for (a count evaluated) is written, and then its phase's end too (a quick sweep that said its count
    says that it ended); past QUIET_S, every phase start is."""
    p, out, now = lines()
    p.quiet_s = 2.0
    p.start("bias benchmark", 10, "trial")
    p.advance(10)
    p.finish()
    assert out.getvalue() == ""
    p.start("capacity search", 2, "count")
    p.advance(1, "5 GPUs: meets the targets")
    assert out.getvalue() == "racsim: run: capacity search (2/2): 1/2 counts (50%) in 0:00 - 5 GPUs: meets the targets\n"
    now.t += 1.0
    p.start("training", 2, "corrector")  # held back: the work is 1 s old; the search, which spoke, ends aloud
    p.tick()
    assert out.getvalue().splitlines()[1:] == ["racsim: run: capacity search (2/2): 1/2 counts (50%), done in 0:01"]
    now.t += 1.5
    p.tick()  # past QUIET_S, the phase still running: the line held back is said now
    assert out.getvalue().splitlines()[-1] == "racsim: run: training (3/3): 0/2 correctors (0%) in 0:02"
    now.t += 1.0
    p.tick()
    p.start("static study", 1, "cell")
    assert [ln.split(": ")[2] for ln in out.getvalue().splitlines()[3:]] == ["training (3/3)", "static study (4/4)"]
    off = Progress.off()
    off.start("x", 3, "count")
    off.advance(5)
    assert off.phase.done == off.phase.total == 5 and off.mode == "off" and off._thread is None


def test_on_a_terminal_one_line_redrawn_with_its_bar_then_taken_away(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the terminal's width (shutil.get_terminal_size)
    p, out, now = lines(mode="bar")
    p.start("capacity search", 4, "count")
    now.t += 5.0
    p.advance(1, "5 GPUs: meets the targets")
    now.t += 5.0
    p.tick()  # the clock moves without an update
    frames = out.getvalue().split("\r")
    assert frames[-1].startswith("racsim: run: capacity search |#####               | 1/4 counts (25%) in 0:10, ~0:30")
    p.say("a row of a table")  # printed past the bar, on stdout: the bar taken away first, drawn again after
    p.close()
    assert out.getvalue().endswith("\r" + " " * len(frames[-1]) + "\r") and p._drawn == 0
    long = Progress("x" * 200, mode="bar", stream=io.StringIO(), ticking=False)
    long.start("phase", 2, "unit")
    assert len(long.bar(width=80)) < 80


def test_the_time_left_follows_the_phase_pace_within_a_factor():
    """A phase of 100 units at 2 s each, give or take 50%: from a tenth on, the estimate is within a
    factor 1.5 of the time truly left; an upper-bound phase says 'at most'."""
    import random

    rnd = random.Random(3)
    p, out, now = lines()
    p.start("sensitivity", 100, "variant")
    steps = [2.0 * rnd.uniform(0.5, 1.5) for _ in range(100)]
    for i, s in enumerate(steps):
        now.t += s
        p.advance()
        truth = sum(steps[i + 1:])
        if i >= 9 and truth > 10:
            assert truth / 1.5 <= p.phase.left(now.t) <= truth * 1.5, (i, p.phase.left(now.t), truth)
    q, _, qnow = lines()
    q.start("deciding replications", 100, "replicated step", upto=True)
    qnow.t += 10
    q.update(20)
    assert q.text().endswith("20 of at most 100 replicated steps (20%) in 0:10, at most 0:40 left")
    assert hms(59.6) == "1:00" and hms(3725) == "1:02:05"


def test_phases_planned_last_stay_after_those_planned_later():
    """A search's sensitivity table is planned before the search plans its own phases, and the run's
    writing is the tail: the phases' places follow the work's order."""
    p, _, _ = lines(tail=["writing the files"])
    p.plan("sensitivity", last=True)
    p.plan("capacity search", "deciding replications")
    p.plan("capacity search")  # planned already: stays where it is
    assert p.order == ["capacity search", "deciding replications", "sensitivity", "writing the files"]
    p.start("an unplanned phase", 1)
    assert p.order[-3:] == ["an unplanned phase", "sensitivity", "writing the files"]


def sweep_folder(root, jobs):
    """Job folders as launchers leave them: (started s ago or None, finished s ago or None, job number)."""
    now = time.time()
    for name, (began, ended, num) in jobs.items():
        d = root / name
        (d / ".hydra").mkdir(parents=True)
        o = d / ".hydra" / "overrides.yaml"
        o.write_text("x")
        if began is not None:
            os.utime(o, (now - began, now - began))
        if ended is not None:
            (d / DONE).write_text(json.dumps({"job": num, "runtime_s": began - ended}))
            os.utime(d / DONE, (now - ended, now - ended))
    return now


def test_the_sweep_counts_the_jobs_running_in_its_folder_and_computed_ahead(tmp_path, monkeypatch):
    """Two jobs done, one running in another process (its folder, no marker), one left over from an
    earlier sweep, three computed ahead by racsim's launcher in this process and two computed and not
    yet written: 6 running, the rest left."""
    now = sweep_folder(tmp_path, {"0": (30, 20, 0), "1": (25, 15, 1), "2": (5, None, 2), "9": (500, None, 9)})
    monkeypatch.setattr(S, "AHEAD", {3: now - 4, 4: now - 4, 5: now - 4})
    monkeypatch.setattr(S, "PREPARED", {6: None, 7: None})
    counts = S.JobCounts(tmp_path, total=12, started=now - 60)
    c = counts.counts(now)
    assert (c["done"], c["running"], c["left"]) == (2, 6, 4)
    assert counts.side_by_side == 2  # the job in its folder and the batch computed here
    monkeypatch.setattr(S, "AHEAD", {})
    monkeypatch.setattr(S, "PREPARED", {})
    assert S.JobCounts(tmp_path, total=None, started=now - 60).counts(now)["left"] is None


def test_the_sweep_estimate_on_a_scripted_sweep_is_within_a_factor(tmp_path):
    """24 jobs of 10 s each, 4 at a time, after 5 s of start-up: after two rounds (8 done) and 5 s of the
    third (4 running), 12 are left; the estimate is within a factor 1.5 of the 35 s truly left (the 4
    running: 5 s; the 12 left: 3 rounds of 10 s); the old one, (left + running) x elapsed / done, read 60 s."""
    now = time.time()
    jobs = {str(i): (25 - 10 * (i // 4), 15 - 10 * (i // 4), i) for i in range(8)}  # (began, ended) s ago
    jobs.update({str(i): (5, None, i) for i in range(8, 12)})
    sweep_folder(tmp_path, jobs)
    counts = S.JobCounts(tmp_path, total=24, started=now - 30)
    c = counts.counts(now)
    assert (c["done"], c["running"], c["left"]) == (8, 4, 12)
    assert 35 / 1.5 <= c["left_s"] <= 35 * 1.5, c["left_s"]


def test_a_sweep_progress_line_from_its_counter(tmp_path):
    """The sweep's lines: the model's text with the counter's note, and its estimate."""
    now = sweep_folder(tmp_path, {"0": (20, 10, 0), "1": (5, None, 1)})
    out = io.StringIO()
    p = Progress("sweep", mode="lines", stream=out, quiet_s=0, ticking=False,
                 poll=S._Poll(S.JobCounts(tmp_path, total=4, started=now - 30), every_s=2.0))
    p.start("sweep", 4, "job")
    p.tick()
    assert re.search(r"^racsim: sweep: 1/4 jobs \(25%\) in 0:00, ~0:\d\d left - 1 running, 2 left$", out.getvalue(), re.M)
    assert threading.active_count() >= 1


@pytest.mark.parametrize("n", range(1, 70))
def test_the_bound_a_search_announces_holds(n):
    """The counts racsim.analyses.capacity.fewest_from may evaluate among n (the growth a search
    announces before it runs them): at most search_bound(n), wherever the answer lies."""
    from racsim.analyses.capacity.search import fewest_from, search_bound

    worst = 0
    for answer in range(n + 1):
        tried = set()
        fewest_from(list(range(n)), 0, lambda i: tried.add(i) or i >= answer)
        worst = max(worst, len(tried))
    assert worst <= search_bound(n) <= n


def test_a_ctrl_c_while_the_ticking_thread_starts_leaves_the_progress_closable():
    """A Ctrl-C inside ``Thread.start`` (it waits for the thread to run) left a thread never started,
    and closing the progress then raised "cannot join thread before it is started" over the interrupt."""
    p = Progress("x", mode="lines")
    p._thread = threading.Thread(target=lambda: None)  # as Progress.start leaves it when interrupted there
    p.close()
    assert p.mode == "off"
