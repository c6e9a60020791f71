"""Small helpers shared by the pipeline test files."""

import math

import numpy as np

from racsim.config.defaults import catalog
from racsim.config.schema import GpuConf, LatencyConf, RMModelConf
from racsim.progress import Progress

GPU_CATALOG, RM_CATALOG = catalog("gpu"), catalog("model")  # conf/rm/*/*.yaml

ARRAYS = ("delay", "status", "step_start", "submit_time", "service_start", "completion")
GPU_LOG = ("lane", "replica", "start", "end", "size", "tokens", "step", "work", "replicas")


def det(x: float) -> LatencyConf:
    """A deterministic duration of x seconds."""
    return LatencyConf(kind="deterministic", mean=float(x))


def det_phases(generate: float, fast_score: float, submit: float, update: float) -> dict:
    """The four phases of a PipelineConf as deterministic durations (the schema has no
    default for them: conf/pipeline/default.yaml holds the command's)."""
    return dict(generate=det(generate), fast_score=det(fast_score), submit=det(submit), update=det(update))


def gpu(name: str, /, **change) -> GpuConf:
    """A GPU of the catalog (conf/rm/gpu/), with some fields changed."""
    return GpuConf(**{**GPU_CATALOG[name], **change})


def rm_model(name: str, /, **change) -> RMModelConf:
    """An RM shape of the catalog (conf/rm/model/), with some fields changed."""
    return RMModelConf(**{**RM_CATALOG[name], **change})


def assert_same_schedule(a, b, label=""):
    """Two ArrivalSchedules equal to the last bit: every array, and the GPU batch logs if any."""
    assert a.blocking == b.blocking and a.channel_names == b.channel_names, label
    for f in ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.shape == y.shape, (label, f)
        assert x.dtype == y.dtype, (label, f)
        if not np.array_equal(x, y):
            bad = np.argwhere(x != y)[:5]
            raise AssertionError(f"{label}: {f} differs at {bad.tolist()}: {x[tuple(bad.T)]} vs {y[tuple(bad.T)]}")
    assert set(a.gpu_batches or {}) == set(b.gpu_batches or {}), label
    for nm in a.gpu_batches or {}:
        for k in GPU_LOG:
            assert np.array_equal(a.gpu_batches[nm][k], b.gpu_batches[nm][k]), (label, nm, k)
    assert set(a.background or {}) == set(b.background or {}), label
    for nm in a.background or {}:  # other tenants' requests served
        for k in ("lane", "arrival", "start", "end"):
            np.testing.assert_array_equal(a.background[nm][k], b.background[nm][k], err_msg=f"{label} {nm} {k}")


def unwritable_value(df):
    """(column, row) of the first value of a results table that must not be written (inf; NaN
    outside the columns racsim.report.finite declares may be NaN, and outside the other study
    mode's rows), or None: a slow and obvious loop."""
    for c in df.columns:
        for i in range(len(df)):
            v = df[c].iloc[i]
            if not isinstance(v, (float, np.floating)) or math.isfinite(v):
                continue
            if math.isinf(v):
                return c, i
            if "status" in df and str(df["status"].iloc[i]).startswith("overloaded"):
                continue  # a capacity count that is not simulated: no figure but its load and price
            if c in ("bias_theorem", "utilisation", "workers", "wait_mean_s", "wait_p95_s", "availability") or c.startswith(
                    ("theorem_ratio_", "eta_ch", "ratio_", "sojourn_")) or (c.startswith("delay_") and c.endswith("_steps")) \
                    or c in ("theorem_gap", "eta_nominal", "bias_vs_sync_theorem"):
                continue
            if c.startswith("background_") and not df["background_jobs"].iloc[i] > 0:
                continue  # a channel without background beside one with it, or none of its requests in the window
            if c == "response_dropped_mean" and df["groups_dropped"].iloc[i] == 0:
                continue  # asynchronous generation: no group dropped from the trainer's queue, no length to average
            if "mode" in df:  # NaN in every row of its mode, and not NaN in every row of the others
                mine = [j for j in range(len(df)) if df["mode"].iloc[j] == df["mode"].iloc[i]]
                others = [j for j in range(len(df)) if j not in mine]
                if all(math.isnan(df[c].iloc[j]) for j in mine) and not all(
                        isinstance(df[c].iloc[j], float) and math.isnan(df[c].iloc[j]) for j in others):
                    continue
            return c, i
    return None


def main_in_process(monkeypatch, capsys, argv):
    """``racsim ARGV`` through racsim.app.cli.main in this process (the caller sets the cwd):
    (exit status, stdout, stderr)."""
    import sys

    from racsim.app import cli

    monkeypatch.setattr(sys, "argv", ["racsim", *argv])
    capsys.readouterr()
    code = 0
    try:
        cli.main()
    except SystemExit as ex:
        code = ex.code
    out, err = capsys.readouterr()
    return code, out, err


def recall_logged(kind: str, key: str, log_dir: str, seconds: float = 0.0, wait: bool = True):
    """racsim.io.recall of a value whose computing leaves a file in ``log_dir`` (one per computation)
    and takes ``seconds``: (its sum, its state, whether it is writeable, the process), or None
    (``wait=False``, another process computing it). A pool's job: a function its spawned processes
    can import."""
    import os
    import time
    from pathlib import Path

    from racsim.io import recall

    def compute():
        Path(log_dir, f"{kind}-{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(seconds)
        return np.arange(1000.0) * len(key), {"after": key}

    got = recall(kind, key, compute, wait)
    return None if got is None else (float(got[0].sum()), got[1], bool(got[0].flags.writeable), os.getpid())


def spread(cases, key=lambda case: case[1], value=lambda case: case[0][-1].split("=", 1)[-1], ids=None):
    """A parametrized grid thinned for the README's test command: a few cases that between them reach every
    key and every value (a greedy cover: each pick the case naming the most not yet reached) run there, the
    others are marked ``long``, so that each branch a key or a value reaches still runs fast and the whole
    grid in the long stage. ``ids``: a case's test id (default: its arguments joined)."""
    import pytest

    need = {("k", key(c)) for c in cases} | {("v", value(c)) for c in cases}
    reach = [{("k", key(c)), ("v", value(c))} for c in cases]
    fast = set()
    while need:
        best = max(range(len(cases)), key=lambda i: (len(reach[i] & need), -i))
        fast.add(best)
        need -= reach[best]
    return [pytest.param(*c, marks=() if i in fast else (pytest.mark.long,), id=ids(c) if ids else " ".join(c[0]))
            for i, c in enumerate(cases)]


def messages(text: str) -> list:
    """The messages of printed ``text``: each non-blank line with the indented lines that continue it
    joined on (racsim.errors.wrapped breaks a line wider than 120 columns), so that one error is one item."""
    out: list = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if out and line.startswith(" ") and len(line) - len(line.lstrip()) > len(out[-1]) - len(out[-1].lstrip()):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


class Lazy:
    """A module imported at its first use, not when a test file is collected (every xdist worker collects
    every file: torch alone costs seconds each); where it is missing, the test using it is skipped."""

    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attr: str):
        if attr.startswith("_") or attr == "pytestmark":  # pytest looking at what the file holds: not an import
            raise AttributeError(attr)
        if self._module is None:
            import pytest

            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)


class Recorder(Progress):
    """A progress that shows nothing and keeps what the work told it, in order: ``calls`` holds
    (method, phase, its done, its total, note) after each call (racsim.progress)."""

    def __init__(self):
        super().__init__(mode="off", ticking=False)
        self.calls = []

    def _keep(self, method, note=""):
        p = self.phase
        self.calls.append((method, p and p.name, p and p.done, p and p.total, note or ""))

    def start(self, name, total, unit="step", *, upto=False, note=""):
        super().start(name, total, unit, upto=upto, note=note)
        self._keep("start", note)

    def update(self, done, note=None, line=False, left_s=None):
        super().update(done, note, line, left_s)
        self._keep("update", note)

    def grow(self, more, why, upto=None):
        super().grow(more, why, upto)
        self._keep("grow", why)

    def note(self, text, line=False):
        super().note(text, line)
        self._keep("note", text)

    def notes(self, method=None):
        """The notes told, by ``method`` (``update``: with units done; ``note``: what runs) or all."""
        return [c[4] for c in self.calls if c[4] and (method is None or c[0] == method)]
