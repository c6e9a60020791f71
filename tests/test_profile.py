"""racsim-profile: real forward passes of a tiny transformers reward model with
torch on this machine, written as the CSV that the profiled service model reads.

torch and transformers are optional (the ``rm`` extra): the tests that run
them are skipped where they are missing, except in CI (``CI=true``), which
installs the ``test`` extra (torch and transformers included) and fails there
instead of skipping silently. The other tests run everywhere."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from helpers import messages

from racsim.config.defaults import catalog
from racsim.config.schema import GpuConf, RMConf, RMModelConf
from racsim.errors import ConfigError
from racsim.pipeline.service import (
    Profiled,
    build_service,
    read_profile,
)
from racsim.tools.profile import check_rows, parse

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
          "repeats=5", "warmup=1", "threads=1"])  # five: a fastest time a busy machine rarely spoils
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
    assert ex.value.code == 2 and len(messages(err)) == 1 and not (tmp_path / "x.csv").exists()
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


def _rows(times, spread):
    """Profile rows of a batch x length grid: the fastest time of each cell and its slowest repeat."""
    return [{"batch_size": b, "seq_len": s, "seconds": t, "seconds_max": t * (1 + spread.get((b, s), 0.02)),
             "seconds_median": t, "repeats": 3} for (b, s), t in times.items()]


@pytest.mark.parametrize("seed", range(5))
def test_a_profile_that_grows_with_the_work_passes_its_check(seed):
    rng = np.random.default_rng(seed)
    bs, ss = [1, 2, 4, 8, 16], [32, 64, 128, 256]
    a, c = rng.uniform(1e-3, 1e-2), rng.uniform(1e-7, 1e-6)
    times = {(b, s): (a + c * b * s) * rng.uniform(0.99, 1.0) for b in bs for s in ss}  # jitter inside the spread
    sound, line = check_rows(_rows(times, {}))
    assert sound and line.startswith("times grow with batch and length; repeats within 2%") and "noisiest" not in line


@pytest.mark.parametrize("seed", range(5))
def test_more_work_that_is_faster_beyond_the_spread_is_refused_naming_both_cells(seed):
    rng = np.random.default_rng(seed)
    bs, ss = [1, 4, 16], [64, 256]
    times = {(b, s): 1e-3 + 1e-6 * b * s for b in bs for s in ss}
    small = (int(rng.choice(bs[:-1])), 64)
    big = (16, 256)  # dominates every cell
    times[small] = times[big] * 3  # a smaller workload far slower than the largest's slowest repeat (2% spread)
    rows = _rows(times, {})
    sound, line = check_rows(rows)
    assert not sound and f"batch {small[0]} x seq {small[1]} took at least" in line
    named = tuple(map(int, re.search(r"batch (\d+) x seq (\d+) at most", line).groups()))
    # the worst pair: of the cells at least as large, the one whose slowest repeat is the fastest
    larger = [r for r in rows if r["batch_size"] >= small[0] and r["seq_len"] >= small[1] and
              r["batch_size"] * r["seq_len"] >= 4 * small[0] * small[1]]  # at least 4x the work
    assert named == min(((r["batch_size"], r["seq_len"]) for r in larger), key=lambda c: times[c] * 1.02)
    times[small] = min(times[c] for c in ((r["batch_size"], r["seq_len"]) for r in larger)) * 1.01
    # now within the spread of every larger cell (2%): noise, not a refusal
    assert check_rows(_rows(times, {}))[0]


def test_a_noisy_cell_is_named():
    times = {(b, s): 1e-3 * b * s for b in (1, 2) for s in (32, 64)}
    sound, line = check_rows(_rows(times, {(2, 32): 11.75}))  # 12x between repeats, as the issue measured
    assert sound and "the noisiest, batch 2 x seq 32, varied 1175%" in line


def test_help_lists_every_key_and_a_typo_gets_the_closest(capsys):
    from racsim.tools.profile import keys, main

    main(["--help"])
    out = capsys.readouterr().out
    assert [k for k, _ in keys() if f"  {k} " not in out] == []
    for typo, near in (("batch_size=4", "batch_sizes"), ("rm.model.layer=3", "rm.model.layers"), ("seq_len=[8]", "seq_lens")):
        with pytest.raises(SystemExit) as ex:
            main([typo])
        err = capsys.readouterr().err
        assert ex.value.code == 2 and len(messages(err)) == 1 and f"did you mean {near}" in err, err


@pytest.mark.parametrize("arg, said", [("--nope", "--nope: no such option"), ("-x", "-x: no such option"),
                                       ("batch_sizes", "batch_sizes: a key with no value")])
def test_an_argument_without_a_value_is_named_for_what_it_is(capsys, arg, said):
    # issue 49: `racsim-profile --nope` said `--nope = None`, a value nobody gave
    from racsim.tools.profile import main

    with pytest.raises(SystemExit) as ex:
        main([arg])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and len(messages(err)) == 1 and said in err and "None" not in err, err


def test_cells_that_do_not_fit_in_memory_are_one_line_naming_the_cell(torch_stack, tmp_path, capsys, monkeypatch):
    """torch's allocation failure (simulated: the model's forward raises what torch raises) is one line
    naming the cell and the keys to change, and no file is written."""
    from racsim.tools import profile as P

    real = P.build_model

    def huge(conf, dtype, device):
        model, desc, vocab = real(conf, dtype, device)

        def forward(*args, **kw):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 274877906944 bytes")

        return forward, desc, vocab

    monkeypatch.setattr(P, "build_model", huge)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ex:
        P.main([f"out={tmp_path / 'x.csv'}", "batch_sizes=[1,4096]", "seq_lens=[16,8192]", "repeats=1", "warmup=0"])
    err = messages(capsys.readouterr().err)
    assert ex.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert "batch 4096 x seq 8192" in err[0] and "batch_sizes=" in err[0] and "seq_lens=" in err[0]
    assert not (tmp_path / "x.csv").exists()


def test_a_profile_that_is_not_monotone_is_named_where_racsim_changes_it(tmp_path):
    from racsim.config.defaults import default_config
    from racsim.report.inputs import data_changes

    path = tmp_path / "p.csv"
    rows = [(b, s, 1e-4 * b * s) for b in (1, 4) for s in (16, 64)]
    rows[2] = (4, 16, 1e-5)  # batch 4 faster than batch 1 at 16 tokens
    pd.DataFrame(rows, columns=["batch_size", "seq_len", "seconds"]).to_csv(path, index=False)
    model = Profiled(str(path))
    assert len(model.changes) == 1 and "1 of 4 cells" in model.changes[0] and "batch 4 x seq 16" in model.changes[0]
    rows[2] = (4, 16, 1e-4 * 64)
    pd.DataFrame(rows, columns=["batch_size", "seq_len", "seconds"]).to_csv(path, index=False)
    assert Profiled(str(path)).changes == ()
    rows[2] = (4, 16, 1e-5)
    pd.DataFrame(rows, columns=["batch_size", "seq_len", "seconds"]).to_csv(path, index=False)
    cfg = default_config("scenario=capacity/judge_rm_h100", "pipeline.channels.judge.rm.service=profiled",
                         f"pipeline.channels.judge.rm.profile={path}")
    assert [c for c in data_changes(cfg) if "not monotone" in c] == \
        [f"pipeline.channels.judge.rm.profile: {path}: {model.changes[0]}"]
