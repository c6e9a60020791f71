"""Configuration: Hydra composition of conf/ and scenarios/, and racsim.config.validate.

Fast tests, no subprocess: configs are composed with Hydra's compose API (the
same primary config, schema and search path the ``racsim`` command uses), or
start from those defaults as dataclasses (racsim.config.defaults.default_config). Every bad value must raise ConfigError
whose ``.key`` names the offending key and whose message says what is allowed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf, open_dict

import racsim.learner.correctors as correctors_module
from racsim.config.defaults import compose_config, default_config
from racsim.config.schema import (
    CORRECTORS,
    ENGINES,
    LATENCY_KINDS,
    ChannelConf,
    GpuConf,
    LatencyConf,
    RacsimConf,
    RMModelConf,
    register_configs,
)
from racsim.config.validate import first_missing, validate
from racsim.errors import ConfigError
from racsim.learner.correctors import CorrectorParams, correction_weight
from racsim.pipeline.schedule import INJECTED
from racsim.report.plots import MARKERS

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SCENARIOS = REPO / "scenarios"


@pytest.fixture(scope="module")
def hydra_ctx():
    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        yield


def make(*overrides: str):
    """The composed config of ``racsim OVERRIDES...`` (must be inside hydra_ctx)."""
    return compose(config_name="config", overrides=list(overrides))


def raises_config_error(cfg) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    return info.value


def check_error(ex: ConfigError, key: str, allowed_has: str) -> None:
    assert ex.key == key, f"ConfigError names {ex.key!r}, expected {key!r}: {ex}"
    assert allowed_has in ex.allowed, f"message should say what is allowed ({allowed_has!r}): {ex}"
    assert str(ex).startswith(f"{key} = "), str(ex)
    assert str(ex).endswith(ex.allowed), str(ex)


# ----------------------------------------------------------------------------
# Bad values, composed from command-line style overrides.

BAD = [
    # id, overrides, expected key, a piece of the "allowed" text
    ("negative_latency_mean", ["pipeline.channels.judge.latency.mean=-1"],
     "pipeline.channels.judge.latency.mean", ">= 0"),
    ("negative_phase_mean", ["pipeline.update.mean=-0.5"], "pipeline.update.mean", ">= 0"),
    ("rho_bar_zero", ["corrector.rho_bar=0"], "corrector.rho_bar", "positive"),
    ("rho_bar_negative", ["corrector.rho_bar=-1"], "corrector.rho_bar", "positive"),
    ("rho_bar_nan", ["corrector.rho_bar=nan"], "corrector.rho_bar", "positive"),
    ("tau_age_nan", ["corrector.tau_age=nan"], "corrector.tau_age", "positive"),
    ("unknown_corrector", ["corrector.names=[naive,bogus]"], "corrector.names", "rac_no_age"),
    ("duplicate_corrector", ["corrector.names=[naive,rac,rac]"], "corrector.names", "at most once"),
    ("no_correctors", ["corrector.names=[]"], "corrector.names", "non-empty"),
    ("kernel_row_above_one", ["pipeline.channels.judge.kernel=[0.6,0.5]"],
     "pipeline.channels.judge.kernel", "sum to at most 1"),
    ("kernel_negative_entry", ["pipeline.channels.verifier.kernel=[0.5,-0.1,0.2]"],
     "pipeline.channels.verifier.kernel", ">= 0"),
    ("kernel_nan_entry", ["pipeline.channels.verifier.kernel=[0.5,nan]"],
     "pipeline.channels.verifier.kernel", ">= 0"),
    ("workers_zero", ["pipeline.channels.judge.workers=0"], "pipeline.channels.judge.workers", ">= 1"),
    ("max_delay_negative", ["pipeline.channels.verifier.max_delay=-1"],
     "pipeline.channels.verifier.max_delay", ">= 0"),
    ("share_negative", ["pipeline.channels.judge.share=-0.5"], "pipeline.channels.judge.share", ">= 0"),
    ("all_shares_zero", ["pipeline.channels.judge.share=0", "pipeline.channels.verifier.share=0"],
     "pipeline.channels.*.share", "share > 0"),
    ("pareto_alpha_one", ["pipeline.channels.judge.latency.alpha=1"],
     "pipeline.channels.judge.latency.alpha", "> 1"),
    ("pareto_alpha_below_one", ["pipeline.channels.judge.latency.alpha=0.5"],
     "pipeline.channels.judge.latency.alpha", "> 1"),
    ("low_equals_high", ["pipeline.channels.verifier.latency.low=5", "pipeline.channels.verifier.latency.high=5"],
     "pipeline.channels.verifier.latency.high", "> low"),
    ("low_above_high", ["pipeline.channels.verifier.latency.low=9", "pipeline.channels.verifier.latency.high=3"],
     "pipeline.channels.verifier.latency.high", "> low"),
    ("lognormal_sigma_zero", ["pipeline.channels.verifier.latency.sigma=0"],
     "pipeline.channels.verifier.latency.sigma", "positive"),
    ("gamma_one", ["learner.gamma=1"], "learner.gamma", "[0, 1)"),
    ("gamma_above_one", ["learner.gamma=1.5"], "learner.gamma", "[0, 1)"),
    ("trials_one", ["learner.trials=1"], "learner.trials", ">= 2"),
    ("steps_zero", ["pipeline.steps=0"], "pipeline.steps", ">= 1"),
    ("batch_zero", ["pipeline.batch_size=0"], "pipeline.batch_size", ">= 1"),
    ("unknown_engine", ["pipeline.engine=warp"], "pipeline.engine", ", ".join(ENGINES)),
    ("unknown_latency_kind", ["pipeline.channels.judge.latency.kind=weibull"],
     "pipeline.channels.judge.latency.kind", ", ".join(LATENCY_KINDS)),
    ("unknown_phase_kind", ["pipeline.generate.kind=weibull"], "pipeline.generate.kind", "lognormal"),
    ("retrace_gamma_above_one", ["corrector.retrace_gamma=1.5"], "corrector.retrace_gamma", "[0, 1]"),
    ("wait_timeout_zero", ["corrector.wait_timeout_s=0"], "corrector.wait_timeout_s", "positive"),
    ("n_actions_one", ["learner.n_actions=1"], "learner.n_actions", ">= 2"),
    ("train_lanes_zero", ["learner.train.lanes=0"], "learner.train.lanes", ">= 1"),
    ("negative_seed", ["seed=-1"], "seed", ">= 0"),
    ("cauchy_without_bounds", ["pipeline.channels.judge.latency.kind=cauchy"],
     "pipeline.channels.judge.latency.low", "low < high"),
    ("empirical_without_path", ["pipeline.channels.judge.latency.kind=empirical"],
     "pipeline.channels.judge.latency.path", "CSV"),
]


@pytest.mark.parametrize("overrides,key,allowed", [pytest.param(o, k, a, id=i) for i, o, k, a in BAD])
def test_bad_value_names_key_and_what_is_allowed(hydra_ctx, overrides, key, allowed):
    cfg = make(*overrides)
    check_error(raises_config_error(cfg), key, allowed)
    # The same rule holds for the config as dataclasses (what validate also accepts).
    check_error(raises_config_error(OmegaConf.to_object(cfg)), key, allowed)


def test_nan_rho_bar_message_shows_nan(hydra_ctx):
    ex = raises_config_error(make("corrector.rho_bar=nan"))
    assert math.isnan(ex.value)
    assert "nan" in str(ex)


def test_infinite_knobs_are_allowed_where_documented(hydra_ctx):
    validate(make("corrector.rho_bar=inf", "corrector.tau_age=inf"))
    check_error(raises_config_error(make("corrector.alpha=inf")), "corrector.alpha", "positive")
    check_error(raises_config_error(make("corrector.retrace_gamma=inf")), "corrector.retrace_gamma", "[0, 1]")


def test_inf_as_documented_works_as_an_override(hydra_ctx):
    """The README and the error text say `inf` on the command line (`.inf` is YAML's spelling)."""
    validate(make("corrector.rho_bar=inf", "corrector.tau_age=inf"))
    ex = raises_config_error(make("corrector.rho_bar=0"))
    assert "(or inf)" in str(ex)
    page = (Path(__file__).resolve().parents[1] / "docs" / "correctors.md").read_text()
    assert "`inf`\non the command line" in page or "`inf` on the command line" in page


def test_unknown_corrector_names_the_bad_name(hydra_ctx):
    ex = raises_config_error(make("corrector.names=[naive,bogus]"))
    assert ex.value == "bogus"
    for n in CORRECTORS:
        assert n in ex.allowed


# ----------------------------------------------------------------------------
# K = 0: no slow channel.

K0_ALLOWED = "at least one slow channel"


def test_no_channels_from_the_defaults():
    check_error(raises_config_error(default_config("~scenario")), "pipeline.channels", K0_ALLOWED)


def test_no_channels_after_compose(hydra_ctx):
    cfg = make()
    validate(cfg)
    cfg.pipeline.channels = {}
    check_error(raises_config_error(cfg), "pipeline.channels", K0_ALLOWED)


def test_no_channels_without_scenario(hydra_ctx):
    cfg = make("~scenario")
    assert len(cfg.pipeline.channels) == 0
    check_error(raises_config_error(cfg), "pipeline.channels", K0_ALLOWED)


def test_adding_a_channel_group_option_fixes_k0(hydra_ctx):
    cfg = make("~scenario", "+channel@pipeline.channels.judge=judge_rm")
    assert list(cfg.pipeline.channels) == ["judge"]
    validate(cfg)


def test_k0_hint_in_message_is_a_working_override(hydra_ctx):
    ex = raises_config_error(make("~scenario"))
    hint = ex.allowed.split("e.g. ", 1)[1].strip()
    assert hint.startswith("+")
    validate(make("~scenario", hint))  # the suggested override really adds a channel


# ----------------------------------------------------------------------------
# The defaults: conf/ is their one source; the schema leaves those fields MISSING.

# The config groups whose options hold defaults: the option conf/config.yaml picks.
DEFAULT_OPTIONS = {"pipeline": "default", "corrector": "all", "learner": "tabular"}


def yaml_keys(node, schema, key):
    """(key, schema parent, field) of every value a group's YAML sets, down to the first
    field the schema leaves MISSING (a whole LatencyConf, say) or to a leaf."""
    for k, v in node.items():
        if k == "defaults":
            continue
        if isinstance(v, DictConfig) and not OmegaConf.is_missing(schema, k):
            yield from yaml_keys(v, schema[k], f"{key}.{k}")
        else:
            yield f"{key}.{k}", schema, k


def test_default_options_are_the_primary_configs_choices():
    chosen = {k: v for d in OmegaConf.load(CONF / "config.yaml").defaults if not isinstance(d, str) for k, v in d.items()}
    assert {g: chosen[g] for g in DEFAULT_OPTIONS} == DEFAULT_OPTIONS


def test_one_place_per_default_value():
    """Every value that a default option of conf/ sets is MISSING in the schema (no competing
    default), the default config takes it from the YAML, and nothing is left MISSING there:
    a config built from the schema alone lacks exactly what conf/ supplies."""
    schema = OmegaConf.structured(RacsimConf)
    composed = compose_config("~scenario")
    set_by_yaml = set()
    for group, option in DEFAULT_OPTIONS.items():
        yaml = OmegaConf.load(CONF / group / f"{option}.yaml")
        for key, parent, field in yaml_keys(yaml, schema[group], group):
            assert OmegaConf.is_missing(parent, field), f"{key} has a default in the schema as well as in conf/{group}/"
            got, want = OmegaConf.select(composed, key), OmegaConf.select(OmegaConf.create({group: yaml}), key)
            if isinstance(want, DictConfig):  # a node (a phase's LatencyConf): the YAML's values are in it
                got, want = OmegaConf.to_container(got), OmegaConf.to_container(OmegaConf.merge(got, want))
            assert got == want, key
            set_by_yaml.add(key)
    assert {"pipeline.generate", "pipeline.fast_score", "pipeline.update", "corrector.alpha", "learner.mdp_seed",
            "learner.train.lr"} <= set_by_yaml
    assert set_by_yaml == schema_missing(schema)  # the schema leaves nothing else MISSING
    assert first_missing(composed) is None and first_missing(compose_config()) is None
    # the GPU and RM catalogs: every field of every entry is MISSING in its dataclass
    for group, conf in (("gpu", GpuConf), ("model", RMModelConf)):
        node = OmegaConf.structured(conf)
        for f in (CONF / "rm" / group).glob("*.yaml"):
            for key, parent, field in yaml_keys(OmegaConf.load(f), node, f"rm/{group}/{f.stem}"):
                assert OmegaConf.is_missing(parent, field), f"{key} has a default in {conf.__name__} too"


def schema_missing(node, key=""):
    """The keys of the MISSING values of a typed DictConfig (not inside a MISSING node)."""
    out = set()
    for k in node.keys():
        sub = f"{key}.{k}" if key else str(k)
        if OmegaConf.is_missing(node, k):
            out.add(sub)
        elif isinstance(node[k], DictConfig) and sub not in ("pipeline.fast_rm",):
            out |= schema_missing(node[k], sub)
    return out


def test_the_schema_alone_is_missing_the_defaults():
    """A config built from the dataclasses alone is not a runnable model: validate names
    the first value it lacks and says where the defaults are."""
    ex = raises_config_error(RacsimConf())
    check_error(ex, "pipeline.steps", "default_config()")
    assert ex.value == "???"
    check_error(raises_config_error(OmegaConf.structured(RacsimConf)), "pipeline.steps", "conf/")


def test_defaults_are_valid_once_a_channel_is_added():
    for cfg in (default_config("~scenario"), compose_config("~scenario")):  # dataclasses, and as Hydra has them
        # no slow channel is the one thing wrong with the defaults...
        check_error(raises_config_error(cfg), "pipeline.channels", K0_ALLOWED)
        # ...and one channel with ChannelConf's defaults makes them a valid model
        if isinstance(cfg, DictConfig):
            with open_dict(cfg):  # the composed config is in struct mode
                cfg.pipeline.channels["slow"] = ChannelConf()
        else:
            cfg.pipeline.channels["slow"] = ChannelConf()
        validate(cfg)
        assert list(cfg.pipeline.channels) == ["slow"] and cfg.pipeline.channels["slow"].latency.kind == "lognormal"


def test_default_correctors_are_all_known():
    """The default corrector.names (every corrector, in CORRECTORS' order) are the ones the
    learner implements (an unknown name is a ConfigError there) and the plots draw."""
    names = list(default_config().corrector.names)
    assert names == list(CORRECTORS)
    shape = (1, 3, 1, 1)  # a schedule's (trials, steps, batch, K): rac_adaptive reads its history there
    d, st = np.zeros(shape, dtype=int), np.full(shape, INJECTED)
    for n in names:
        w = correction_weight(n, d, st, None, CorrectorParams())
        assert w.shape == shape and np.isfinite(w).all(), n
        assert n in MARKERS, n
    with pytest.raises(ConfigError):
        correction_weight("bogus", d, st, None, CorrectorParams())


def test_corrector_names_have_one_source():
    """CORRECTORS is the one list: the learner's set and the plots' markers derive from it,
    and no corrector option of conf/ lists a name outside it."""
    assert correctors_module._KNOWN == frozenset(CORRECTORS)
    assert list(MARKERS) == list(CORRECTORS) and len(set(MARKERS.values())) == len(CORRECTORS)
    assert "names" not in OmegaConf.load(CONF / "corrector" / "all.yaml")  # the default is CORRECTORS itself


# Each kind's minimal form: the knobs it needs beside ``kind``; every other field keeps
# LatencyConf's default. None: set to null on purpose (cauchy's median and empirical's
# column stand in for the mean).
MINIMAL = {
    "deterministic": dict(mean=10.0),
    "gaussian": dict(mean=10.0),
    "lognormal": dict(mean=10.0),
    "pareto": dict(mean=10.0),
    "exponential": dict(mean=10.0),
    "uniform": dict(mean=10.0),
    "cauchy": dict(mean=None, median=18.0, low=1.0, high=200.0),
    "empirical": dict(mean=None, path="lat.csv", column="seconds"),
    "geometric": dict(mean=10.0),
}


@pytest.mark.parametrize("kind", LATENCY_KINDS)
def test_each_latency_kind_has_a_valid_minimal_form(kind, tmp_path, monkeypatch):
    """Each kind validates with the documented knobs it needs and nothing else, and
    without any one of them it does not: the error names the missing knob (and a file
    that is not there, its path)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lat.csv").write_text("seconds\n1.5\n")
    cfg = default_config("~scenario")
    form = MINIMAL[kind]
    cfg.pipeline.channels["slow"] = ChannelConf(latency=LatencyConf(kind=kind, **form))
    validate(cfg)
    for knob in [k for k, v in form.items() if v is not None]:
        cfg.pipeline.channels["slow"] = ChannelConf(latency=LatencyConf(kind=kind, **{**form, knob: None}))
        ex = raises_config_error(cfg)
        assert ex.key.startswith("pipeline.channels.slow.latency."), ex
        assert ex.key.endswith(f".{knob}") or knob in ex.allowed, f"{kind} without {knob}: {ex}"
    if "path" in form:
        cfg.pipeline.channels["slow"] = ChannelConf(latency=LatencyConf(kind=kind, **form))
        (tmp_path / "lat.csv").unlink()
        ex = raises_config_error(cfg)
        assert ex.key == "pipeline.channels.slow.latency.path" and "there is no such file" in ex.allowed, ex


def test_explicit_kernel_rules():
    """A kernel row is a sub-probability vector over Delta = 0, 1, ...: missing mass never returns."""
    cfg = default_config("~scenario")
    cfg.pipeline.channels["k"] = ChannelConf(kernel=[0.25, 0.25, 0.5])
    validate(cfg)
    cfg.pipeline.channels["k"].kernel = [0.1, 0.0, 0.2]
    validate(cfg)
    cfg.pipeline.channels["k"].kernel = [0.5, 0.5 + 1e-9]
    check_error(raises_config_error(cfg), "pipeline.channels.k.kernel", "sum to at most 1")
    cfg.pipeline.channels["k"].kernel = []
    check_error(raises_config_error(cfg), "pipeline.channels.k.kernel", "non-empty")


# ----------------------------------------------------------------------------
# Every config group option and every scenario on disk composes and validates.

GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))
# Groups the primary config selects in its defaults list (overridable as group=option).
PRIMARY_GROUPS = {k for d in OmegaConf.load(CONF / "config.yaml").defaults if not isinstance(d, str) for k in d}


def test_config_groups_found():
    assert {g for g, _ in GROUP_OPTIONS} >= {"pipeline", "channel", "latency", "corrector", "learner"}
    assert PRIMARY_GROUPS >= {"pipeline", "corrector", "learner", "scenario"}


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}/{o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_and_validates(hydra_ctx, tmp_path, group, option):
    if group == "channel":  # added as a third slow channel beside the default scenario's two
        cfg = make(f"+channel@pipeline.channels.extra={option}")
        assert set(cfg.pipeline.channels) == {"verifier", "judge", "extra"}
    elif group == "latency":  # swapped in for the judge's latency and appended to a phase
        extra = []
        if option == "empirical":
            csv = tmp_path / "lat.csv"
            csv.write_text("seconds\n1.0\n2.0\n3.5\n")
            extra = [f"pipeline.channels.judge.latency.path={csv}", "pipeline.channels.judge.latency.column=seconds",
                     f"pipeline.generate.path={csv}", "pipeline.generate.column=seconds"]
        cfg = make(f"latency@pipeline.channels.judge.latency={option}", f"+latency@pipeline.generate={option}",
                   *extra)
        assert cfg.pipeline.channels.judge.latency.kind == option
        assert cfg.pipeline.generate.kind == option
    elif group in PRIMARY_GROUPS:  # pipeline, corrector, learner, ...: chosen in conf/config.yaml
        cfg = make(f"{group}={option}")
    else:  # a group the primary config does not select: appended
        cfg = make(f"+{group}={option}")
    validate(cfg)
    validate(OmegaConf.to_object(cfg))


def test_corrector_options_name_known_correctors(hydra_ctx):
    for p in (CONF / "corrector").glob("*.yaml"):
        names = list(make(f"corrector={p.stem}").corrector.names)
        assert names and set(names) <= set(CORRECTORS), p.name


SCENARIO_FILES = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))


def test_default_scenario_exists():
    assert "default" in SCENARIO_FILES


@pytest.mark.parametrize("scenario", SCENARIO_FILES)
def test_every_scenario_composes_and_validates(hydra_ctx, scenario):
    cfg = make(f"scenario={scenario}")
    validate(cfg)
    assert cfg.name == scenario, "a scenario's name should match its file (it names the output folder)"


def test_default_scenario_is_the_default(hydra_ctx):
    assert OmegaConf.to_container(make()) == OmegaConf.to_container(make("scenario=default"))
    cfg = make()
    assert list(cfg.pipeline.channels) == ["verifier", "judge"]
    assert list(cfg.corrector.names) == list(CORRECTORS)


def test_schema_rejects_wrong_types_and_unknown_keys(hydra_ctx):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        make("pipeline.steps=abc")
    with pytest.raises(ConfigCompositionException):
        make("pipeline.nosuchkey=1")
