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
