"""Ctrl-C at any instant of the command (issue 43, point 10): while Python imports the simulator,
before Hydra starts, during the run, and twice in quick succession, the command ends with exit 130,
its own line and no traceback (racsim.__main__ answers it from the start; racsim.app.cli.main then, and
a second Ctrl-C while the first is answered ends it quietly)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import messages

SLOW = ["learner.trials=20000", "learner.train.enabled=false", "output.progress=false", "output.plots=false"]


def interrupted(tmp_path, delays):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    p = subprocess.Popen([sys.executable, "-m", "racsim", *SLOW, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for d in delays:
        time.sleep(d)
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


@pytest.mark.long
@pytest.mark.parametrize("delays", [(0.15,), (0.6,), (2.5,), (2.5, 0.05), (2.5, 0.0, 0.0)],
                         ids=["importing", "starting", "running", "twice", "three times"])
def test_ctrl_c_at_any_instant_is_one_line_and_130(tmp_path, delays):
    code, out, err = interrupted(tmp_path, delays)
    assert code == 130, (code, err[-2000:])
    assert "Traceback" not in out + err, err[-2000:]
    lines = [ln for ln in messages(err) if ln.startswith("racsim: ")]
    assert len(lines) == 1 and "interrupted" in lines[0], err




MANGLED = '''
import signal
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from racsim.app import cli

where, apply, calls = sys.argv[1], ConfigLoaderImpl._apply_overrides_to_config, []


def interrupted():
    """A Ctrl-C inside a string exec (as in a method dataclasses make), turned by the library into another error."""
    try:
        exec("import signal; signal.raise_signal(signal.SIGINT)")
    except KeyboardInterrupt:
        raise AttributeError("'NoneType' object has no attribute '_flags_cache'") from None


def overrides_applied(overrides, cfg):
    """Hydra applying the overrides: the first time (in Hydra's get_mode, which swallows any error) a
    Ctrl-C comes; then the config it left half made fails ("failing") or not ("swallowed")."""
    calls.append(overrides)
    if len(calls) == 1:
        interrupted()
    if where == "failing":
        raise AttributeError("'NoneType' object has no attribute '_flags_cache'")
    apply(overrides, cfg)


if where == "running":  # in the run's job, its folder made
    cli.replace_grid = lambda *args: interrupted()
elif where == "registering":  # before Hydra starts: a plain Ctrl-C
    registered = cli.register_configs
    cli.register_configs = lambda: (registered(), signal.raise_signal(signal.SIGINT))
else:
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(overrides_applied)
sys.argv = ["racsim", *sys.argv[2:]]
cli.main()
'''


@pytest.mark.parametrize("where, sweep, line", [
    ("registering", False, "racsim: interrupted before the run began; nothing was written"),
    ("failing", False, "racsim: interrupted before the run began; nothing was written"),
    ("swallowed", False, "racsim: interrupted before the run began; nothing was written"),
    ("swallowed", True, "racsim: interrupted before the sweep began; nothing was written"),
    ("running", False, "racsim: interrupted: the run did not finish, and its folder {run} is removed (run it again)")])
def test_a_ctrl_c_a_library_turns_into_another_error_is_still_the_interrupt(tmp_path, where, sweep, line):
    """The Ctrl-C is what happened, not the library's AttributeError (exit 2, "hydra.mode=RUN: cannot be
    applied", as CI once saw while Hydra composed), nor a run or a sweep that starts after Hydra
    swallowed it; and ``python -m`` ends with 130, not killed by SIGINT as CPython 3.11 does after a
    KeyboardInterrupt ended any string exec, even one caught."""
    (tmp_path / "mangled.py").write_text(MANGLED)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    run = tmp_path / "run"
    args = ["-m", *SLOW, "seed=1,2", f"hydra.sweep.dir={run}"] if sweep else [*SLOW, f"hydra.run.dir={run}"]
    p = subprocess.run([sys.executable, "-m", "mangled", where, *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-2000:]
    assert [ln for ln in messages(p.stderr) if ln.startswith("racsim: ")] == [line.format(run=run)], p.stderr
    assert not run.exists() and not (tmp_path / "outputs").exists()


TOOLS = {
    "seeds in a pool": ["-m", "racsim.tools.seeds", "scenario=capacity/judge_rm_bursts", "--seeds", "2", "--jobs", "2"],
    "benchmark": ["-m", "racsim.tools.bench"],
    "kernels": ["-m", "racsim.tools.kernels", "answers"],
}


@pytest.mark.long
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_ctrl_c_ends_a_tool_with_one_line_and_130(tmp_path, tool):
    """The other commands answer a Ctrl-C as racsim does (one line, exit 130, no traceback), sent once
    each has printed its first progress line; a pool's seeds end with it, not after their runs (a
    seed of judge_rm_bursts takes 10 s or more on one core, and none has finished)."""
    p = subprocess.Popen([sys.executable, *TOOLS[tool]], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()
    if tool == "seeds in a pool":  # once its two processes are at work
        children = f"/proc/{p.pid}/task/{p.pid}/children"
        for _ in range(600):
            if len(open(children).read().split()) >= 2:
                break
            time.sleep(0.1)
        time.sleep(2.0)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    took = time.monotonic() - sent
    err = first + err
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "Traceback" not in out + err, err[-2000:]
    lines = [ln for ln in messages(err) if ": interrupted" in ln]
    assert len(lines) == 1 and lines[0].startswith(("python -m racsim.tools.", "racsim-bench")), err
    if tool == "seeds in a pool":
        assert "seed 0:" not in err and took < 8, (took, err)
