"""racsim-profile: real forward passes of a tiny transformers reward model with
torch on this machine, written as the CSV that the profiled service model reads.

torch and transformers are optional (the ``rm`` extra): the tests that run
them are skipped where they are missing, except in CI (``CI=true``), which
installs the ``test`` extra (torch and transformers included) and fails there
instead of skipping silently. The other tests run everywhere."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from racsim.config.defaults import catalog
from racsim.config.schema import GpuConf, RMConf, RMModelConf
from racsim.errors import ConfigError
from racsim.pipeline.service import (
    Profiled,
    build_service,
    read_profile,
)
from racsim.tools.profile import parse

GPU_CATALOG, RM_CATALOG = catalog("gpu"), catalog("model")  # conf/rm/*/*.yaml

BATCHES = [1, 4, 16]
SEQS = [16, 64, 256]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(module: str):
    """``module`` imported; where it is missing, a skip, or in CI a failure."""
    try:
        return importlib.import_module(module)
    except ImportError as ex:
        if in_ci():
            pytest.fail(f"{module} is not installed but CI={os.environ['CI']}: CI installs racsim[test] "
                        f"(torch, transformers) and must run the racsim-profile tests ({ex})", pytrace=False)
        pytest.skip(f"{module} is not installed (pip install -e '.[rm]'); in CI this test fails instead")


@pytest.fixture(scope="module")
def torch_stack():
    """torch and transformers, for the tests that run real forward passes."""
    return require("torch"), require("transformers")


@pytest.fixture(scope="module")
def profile_csv(torch_stack, tmp_path_factory):
    """One real run of the command (in-process: the console script's main)."""
    from racsim.tools.profile import main

    out = tmp_path_factory.mktemp("profile") / "tiny.csv"
    main([f"out={out}", f"batch_sizes={BATCHES}".replace(" ", ""), f"seq_lens={SEQS}".replace(" ", ""),
          "repeats=3", "warmup=1", "threads=1"])
    return out


def test_profile_writes_a_csv_with_its_provenance(profile_csv, torch_stack):
    torch, transformers = torch_stack
    header, table = read_profile(str(profile_csv))
    assert header["device"].startswith("cpu") or header["device"].startswith("cuda")
    assert header["dtype"] in ("float32", "bfloat16")
    assert header["torch"] == torch.__version__ and header["transformers"] == transformers.__version__
    assert "tiny-llama-rm" in header["model"] and "parameters" in header["model"]
    assert sorted(zip(table.batch_size, table.seq_len)) == [(b, s) for b in BATCHES for s in SEQS]
    assert np.all(table.seconds > 0) and np.all(table.seconds <= table.seconds_median)
    assert np.all(table.seconds_median <= table.seconds_max)


def test_profiled_times_grow_where_the_work_must(profile_csv):
    """16x more tokens (batch 1 -> 16, or length 16 -> 256) cannot be faster; the
    cells in between are left to noise, which the model's envelope absorbs."""
    _, t = read_profile(str(profile_csv))
    sec = t.set_index(["batch_size", "seq_len"]).seconds
    for s in SEQS:
        assert sec[(16, s)] > sec[(1, s)], s
    for b in BATCHES:
        assert sec[(b, 256)] > sec[(b, 16)], b
    assert sec[(16, 256)] == sec.max()  # the most work takes the longest


def test_profiled_model_reproduces_the_measured_times(profile_csv):
    _, t = read_profile(str(profile_csv))
    m = build_service(RMConf(model=RMModelConf(**RM_CATALOG["8B"]), gpu=GpuConf(**GPU_CATALOG["H100"]),
                             service="profiled", profile=str(profile_csv)))
    assert isinstance(m, Profiled)
    got = m.at(t.batch_size.to_numpy(), t.seq_len.to_numpy())
    measured = t.seconds.to_numpy()
    # at every cell: the monotone envelope of the measurements, never below them
    assert np.all(got >= measured)
    env = pd.Series(got, index=pd.MultiIndex.from_arrays([t.batch_size, t.seq_len]))
    meas = pd.Series(measured, index=env.index)
    for (b, s), v in meas.items():
        below = meas[(meas.index.get_level_values(0) <= b) & (meas.index.get_level_values(1) <= s)]
        assert env[(b, s)] == pytest.approx(below.max(), rel=1e-12)
    assert got[np.argmax(measured)] == measured.max()
    # between cells: between the neighbours
    mid = float(m.at(8, 128))
    assert float(m.at(4, 64)) <= mid <= float(m.at(16, 256))


def test_profile_arguments_are_checked():
    with pytest.raises(ConfigError) as info:
        parse(["batch_sizes=[0,2]"])
    assert info.value.key == "batch_sizes"
    with pytest.raises(ConfigError) as info:
        parse(["dtype=int8"])
    assert info.value.key == "dtype"
    with pytest.raises(ConfigError):
        parse(["nonsense=1"])
    conf = parse(["rm.checkpoint=/some/where", "repeats=2"])
    assert conf.rm.checkpoint == "/some/where" and conf.repeats == 2


def test_missing_checkpoint_is_a_one_line_error(torch_stack, tmp_path, capsys):
    # in-process (the console script's main): torch is imported already, a subprocess would import it again
    from racsim.tools.profile import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as ex:
        main([f"rm.checkpoint={tmp_path / 'nope'}", f"out={tmp_path / 'x.csv'}"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and err.count("\n") == 1 and not (tmp_path / "x.csv").exists()
    assert err.strip().startswith("racsim-profile: error: rm.checkpoint = ") and "local checkpoint" in err


def test_without_torch_the_command_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; from racsim.tools.profile import main; "  # import torch fails
            f"main(['out={tmp_path / 'x.csv'}'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "racsim-profile: error: torch is not installed: pip install -e '.[rm]'"


@pytest.mark.parametrize("value, expected", [("true", True), ("1", True), ("", False), ("false", False)])
def test_ci_turns_a_missing_torch_into_a_failure(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    monkeypatch.setitem(sys.modules, "no_such_module_for_racsim", None)  # importing it raises ImportError
    outcome = pytest.fail.Exception if expected else pytest.skip.Exception
    with pytest.raises(outcome) as info:
        require("no_such_module_for_racsim")
    assert ("CI=" in str(info.value)) == expected


def test_core_modules_do_not_import_torch():
    code = ("import sys, racsim.pipeline.engines, racsim.analyses.dispatch, racsim.analyses.capacity, racsim.pipeline.service, racsim.app.cli, "
            "racsim.tools.profile; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_checkpoint_folder_that_is_not_a_model_is_refused_naming_it(torch_stack, tmp_path):
    """An empty folder, a config.json without a model type, a model's config without weights:
    a ConfigError naming rm.checkpoint with transformers' reason (the command prints it as one line)."""
    import json

    from racsim.tools.profile import ProfileConf, ProfileRMConf, build_model

    torch, _ = torch_stack
    tiny = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10}
    for i, files in enumerate(({}, {"config.json": "{}"}, {"config.json": json.dumps(tiny)}, {"a.txt": "x"})):
        d = tmp_path / f"ckpt{i}"
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
        with pytest.raises(ConfigError) as info:
            build_model(ProfileConf(rm=ProfileRMConf(checkpoint=str(d))), torch.float32, torch.device("cpu"))
        assert info.value.key == "rm.checkpoint" and "\n" not in str(info.value), info.value
