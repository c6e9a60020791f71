"""Help and errors a person can use (issue 20, point 3): ``racsim --help`` lists every scenario,
the config groups and the most-changed knobs; a mistyped scenario, group option or key gets
the closest valid names and never an internal class; a missing optional package names the
extra to install. CLI stderr and exit status in subprocesses."""

from __future__ import annotations

import random
import re
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import messages
from racsim.app import cli, guide
from racsim.config import names
from test_cli import racsim

REPO = Path(__file__).resolve().parents[1]


def _scenarios_on_disk() -> list:
    root = REPO / "scenarios"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def one_line_refusal(p) -> str:
    lines = messages(p.stderr)
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("racsim: error: "), p.stderr
    assert "Traceback" not in p.stderr and "Conf'" not in p.stderr and "RacsimConf" not in p.stderr
    return lines[0]


def test_help_lists_every_scenario_the_groups_and_the_knobs(tmp_path):
    p = racsim(tmp_path, "--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    listed = re.findall(r"^  (\S+)\s{2,}", out.split("Scenarios (scenario=NAME):")[1].split("\n\n")[0], re.M)
    assert sorted(listed) == _scenarios_on_disk() and len(listed) >= 19  # every folder: capacity, lm, paper
    for folder in ("capacity/", "paper/", "lm/"):
        assert any(n.startswith(folder) for n in listed)
    for group in ("channel", "corrector", "latency", "learner", "rm/gpu", "rm/model"):
        assert re.search(rf"^  {re.escape(group)}\s+\S", out, re.M), group
    flat = " ".join(out.split())  # a long example is wrapped to 120 columns (tests/test_terminal_width.py)
    for example, what in guide.KNOBS:
        assert f"racsim {example}" in flat and what in flat
    assert len(guide.KNOBS) == 10 and "== Config ==" not in out and len(out.splitlines()) < 100
    assert "pip install -e \".[rm]\"" in out
    assert not list(tmp_path.iterdir())  # help writes nothing


@pytest.mark.parametrize("example", [e for e, _ in guide.KNOBS])
def test_every_help_example_sets_what_it_says(example):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from racsim.config.defaults import compose_config

    args = example.split()
    cfg = compose_config(*args)
    for o in OverridesParser.create().parse_overrides(args):
        got = OmegaConf.select(cfg, o.key_or_group)
        want = o.value()
        assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == want, (o.input_line, got)


def test_a_mistyped_scenario_lists_every_scenario_and_the_closest(tmp_path):
    line = one_line_refusal(racsim(tmp_path, "scenario=capacity/judge_h100"))
    assert line.startswith("racsim: error: scenario=capacity/judge_h100: no such scenario. "
                           "Did you mean capacity/judge_rm_h100")
    assert line.split("The scenarios: ")[1].split(", ") == names.scenario_names()
    assert sorted(names.scenario_names()) == _scenarios_on_disk()
    assert not list(tmp_path.iterdir())


@pytest.mark.long
def test_a_mistyped_key_or_option_suggests_the_closest(tmp_path):
    p = racsim(tmp_path, "pipline.steps=3", "learner=lmm")  # a group option is read first
    assert "learner=lmm: no such option of learner. Did you mean lm? The learner options: lm, tabular" in \
        one_line_refusal(p)
    p = racsim(tmp_path, "pipline.steps=3")
    assert "pipline.steps: no such key; did you mean pipeline.steps" in one_line_refusal(p)
    p = racsim(tmp_path, "pipeline.channels.judge.workrs=3")
    assert "did you mean pipeline.channels.judge.workers" in one_line_refusal(p)
    p = racsim(tmp_path, "+corector.alpha=2")  # a key added with +: refused by the schema check
    assert "corector" in (line := one_line_refusal(p)) and "did you mean corrector" in line
    p = racsim(tmp_path, "latency@pipeline.channels.judge.latency=paretoo")
    assert one_line_refusal(p).endswith("latency@pipeline.channels.judge.latency=paretoo: no such option of latency. "
                                        "Did you mean pareto? The latency options: " +
                                        ", ".join(names.config_groups()["latency"]))
    assert not list(tmp_path.iterdir())


@pytest.mark.long
def test_a_key_one_typo_away_is_suggested():
    """Every schema key with one character dropped, doubled or swapped gets itself suggested
    (a random sample of keys and typos)."""
    rng = random.Random(3)
    keys = [k for k in names.schema_keys() if len(k.rsplit(".", 1)[-1]) >= 5]
    misses = []
    for key in rng.sample(keys, 120):
        i = rng.randrange(key.rfind(".") + 1, len(key) - 1)
        typo = rng.choice([key[:i] + key[i + 1:], key[:i] + key[i] + key[i:],
                           key[:i] + key[i + 1] + key[i] + key[i + 2:]])
        if typo in keys:
            continue
        hint = names.key_hint(typo.replace("NAME", "judge"))
        if key.replace("NAME", "judge") not in hint.removeprefix("did you mean ").rstrip("?").split(" or "):
            misses.append((typo, hint))
    assert not misses, misses


def test_schema_keys_cover_the_composed_config():
    from omegaconf import OmegaConf

    from racsim.config.defaults import compose_config

    cfg = OmegaConf.to_container(compose_config("scenario=capacity/judge_rm_h100"))
    found = set()

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            found.add(re.sub(r"channels\.[^.]+", "channels.NAME", key))
            if isinstance(v, dict) and not key.endswith("grid"):
                walk(v, key + ".")

    walk(cfg, "")
    assert found <= set(names.schema_keys()), found - set(names.schema_keys())


def test_learner_lm_without_torch_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed: importlib finds no spec
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["racsim", "learner=lm"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    err = capsys.readouterr().err
    assert ex.value.code == 2 and len(messages(err)) == 1, err
    assert " ".join(err.split()) == ("racsim: error: learner.lm.policy = 'transformer': needs torch, not installed: "
                   "pip install -e \".[rm]\" (or learner.lm.policy=bandit for the NumPy stand-in)")
    assert not list(tmp_path.iterdir())


def test_a_launcher_plugin_not_installed_names_its_extra(tmp_path):
    import importlib.util

    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None:
        pytest.skip("the Ray launcher is installed here")
    line = one_line_refusal(racsim(tmp_path, "-m", "hydra/launcher=ray", "seed=0,1"))
    assert line == 'racsim: error: hydra/launcher=ray: that launcher is not installed: pip install -e ".[ray]"'


def test_the_extras_named_are_those_of_pyproject():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def dists(extra):
        return {re.split(r"[\[=<>]", d)[0].replace("-", "_") for d in extras[extra]}

    for module, extra in names.EXTRAS.items():
        name = module.removeprefix("hydra_plugins.")
        assert name in dists(extra), (module, extra)
        assert names.missing_extra(module) == f'pip install -e ".[{extra}]"'
        assert names.missing_extra(module + ".sub") == names.missing_extra(module)
    for launcher, extra in names.LAUNCHER_EXTRAS.items():
        assert f"hydra_{launcher.split('_')[0]}_launcher" in dists(extra)
    assert names.missing_extra("numpy") is None and names.missing_extra(None) is None


@pytest.mark.long
def test_the_other_commands_help_stays_sane(tmp_path):
    import subprocess

    for cmd in ("racsim-report", "racsim-bench", "racsim-profile"):
        exe = Path(sys.executable).parent / cmd
        p = subprocess.run([str(exe), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stderr and len(p.stdout.splitlines()) >= 3, (cmd, p)


def test_an_optional_package_missing_at_run_time_names_the_extra(tmp_path, monkeypatch, capsys):
    import racsim.analyses.dispatch as dispatch

    def needs_transformers(cfg, progress=None):
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(dispatch, "run", needs_transformers)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["racsim", "pipeline.steps=3", "hydra.run.dir=out"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    err = capsys.readouterr().err
    assert ex.value.code == 2
    assert err == 'racsim: error: transformers is not installed: pip install -e ".[rm]"\n'
    assert not list(tmp_path.iterdir())  # the run never finished: its folder goes
