"""What the ``racsim`` command tells a person: its help, and the words of its usage errors.

* :func:`help_text`: ``racsim --help`` (Hydra's ``hydra.help.template``, conf/config.yaml):
  every scenario (every folder of scenarios/), the config groups and the knobs people change most;
* :func:`unknown_option`, :func:`unknown_key`: a mistyped scenario, group option or key, with
  the closest valid names (difflib), never an internal class;
* :func:`missing_extra`: a missing optional package, as the extra that installs it.

Light: the standard library, Hydra's resources and the schema's dataclasses only (no NumPy).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from importlib.resources import files
from typing import Any, Dict, List, Optional, Tuple

SCENARIO_PACKAGE = "racsim.scenarios.scenario"  # scenarios/, shipped (pyproject.toml)
CONF_PACKAGE = "racsim.conf"  # conf/

# The knobs people change most, each with one example (tests/test_guide.py composes every one).
KNOBS: Tuple[Tuple[str, str], ...] = (
    ("seed=1", "the random seed: the same config and seed give byte-identical results"),
    ("pipeline.steps=200", "optimizer steps per trial"),
    ("pipeline.batch_size=8", "trajectories (prompts) per optimizer step"),
    ("learner.trials=200", "Monte-Carlo trials per corrector: more trials, tighter bias estimates"),
    ("corrector.names=[naive,rac]", "the correctors to compare (default: all of them)"),
    ("corrector.tau_age=50", "RAC's age scale, in optimizer steps"),
    ("pipeline.channels.judge.workers=8", "workers serving a slow channel (here the judge)"),
    ("pipeline.channels.judge.latency.mean=30", "mean latency of a channel's law, in seconds"),
    ("pipeline.channels.judge.latency.kind=empirical pipeline.channels.judge.latency.path=delays.csv "
     "pipeline.channels.judge.latency.column=seconds",
     "your own measured delays (a CSV column), used as measured; add latency.mean=S to rescale them"),
    ("capacity.counts=[1,2,4,8]", "the GPU or worker counts a capacity scenario tries"),
)

# Optional packages -> the extra of pyproject.toml that installs them (tests/test_guide.py holds
# this to pyproject.toml).
EXTRAS: Dict[str, str] = {
    "torch": "rm",
    "transformers": "rm",
    "ray": "ray",
    "hydra_plugins.hydra_ray_launcher": "ray",
    "joblib": "sweep",
    "submitit": "sweep",
    "hydra_plugins.hydra_joblib_launcher": "sweep",
    "hydra_plugins.hydra_submitit_launcher": "sweep",
}
LAUNCHER_EXTRAS = {"ray": "ray", "ray_aws": "ray", "joblib": "sweep", "submitit_local": "sweep",
                   "submitit_slurm": "sweep"}  # hydra/launcher=NAME -> its extra


def _yaml_files(root: Any, prefix: str = "") -> List[str]:
    out = []
    for entry in root.iterdir():
        if entry.is_dir() and not entry.name.startswith(("_", ".")):
            out += _yaml_files(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".yaml"):
            out.append(prefix + entry.name[: -len(".yaml")])
    return out


def scenario_names() -> List[str]:
    """Every scenario, as ``scenario=`` takes it: the top-level ones first, then each folder's."""
    return sorted(_yaml_files(files(SCENARIO_PACKAGE)), key=lambda n: (n.count("/"), n))


def _description(name: str) -> str:
    text = files(SCENARIO_PACKAGE).joinpath(f"{name}.yaml").read_text(encoding="utf-8", errors="replace")
    m = re.search(r"^description:\s*(.*)$", text, re.MULTILINE)
    return m.group(1).strip().strip("\"'") if m else ""


def config_groups() -> Dict[str, List[str]]:
    """conf/'s config groups (``latency``, ``rm/gpu``...) and their options."""
    groups: Dict[str, List[str]] = {}
    for name in _yaml_files(files(CONF_PACKAGE)):
        if "/" in name:
            group, option = name.rsplit("/", 1)
            groups.setdefault(group, []).append(option)
    return {g: sorted(o) for g, o in sorted(groups.items())}


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def help_text() -> str:
    """``racsim --help``: usage, every scenario with its description, the config groups and
    the knobs people change most. (No '$': Hydra reads it as a string.Template.)"""
    names = scenario_names()
    width = max(len(n) for n in names) + 2
    lines = [
        "racsim: simulate an asynchronous reward pipeline for RLHF and compare its correctors on wall-clock and bias.",
        "",
        "Usage:",
        "  racsim                                  run the default scenario",
        "  racsim scenario=NAME [KEY=VALUE ...]    run a scenario, with overrides",
        "  racsim -m KEY=V1,V2 [KEY=V3,V4 ...]     a sweep: one job per combination (racsim-report gathers them)",
        "  racsim [scenario=NAME] --cfg job        print the composed configuration (every key) and stop",
        "  racsim --hydra-help                     Hydra's own flags",
        "",
        "Scenarios (scenario=NAME):",
    ]
    lines += [f"  {n:<{width}}{_shorten(_description(n), 100)}" for n in names]
    lines += ["", "Config groups (GROUP=OPTION; at a channel: latency@pipeline.channels.NAME.latency=KIND, "
                  "and +channel@pipeline.channels.NEW=OPTION adds one):"]
    lines += [f"  {g:<10}{', '.join(o)}" for g, o in config_groups().items()]
    lines += ["", "The knobs people change most (KEY=VALUE; the scenarios name their channels: see --cfg job):"]
    for example, what in KNOBS:
        lines += [f"  {what}:", f"      racsim {example}"]
    lines += ["  GRPO on a small transformer policy instead of the tabular learner (pip install -e \".[rm]\"):",
              "      racsim learner=lm",
              "",
              "Outputs go to outputs/NAME/<time>/ (summary.md explains every column). A mistake in a key or value "
              "ends in one line naming the key and what is allowed, with exit status 2."]
    return "\n".join(lines)


def closest(word: str, options: List[str], n: int = 3) -> List[str]:
    """Up to ``n`` options nearest ``word`` (difflib), best first; also an option that ends
    with ``word``'s last part where difflib finds none close."""
    found = difflib.get_close_matches(word, options, n=n, cutoff=0.6)
    if not found:
        last = word.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
        found = [o for o in options if o.rsplit("/", 1)[-1].rsplit(".", 1)[-1] == last][:n]
    return found


def _fields(cls: Any) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _node(tp: Any) -> Any:
    """The dataclass below a field's type (through Optional), a ``dict`` for a Dict of them
    (named entries: the channels), or None for a leaf."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return _node(next(a for a in args if a is not type(None)))
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) is dict and args and dataclasses.is_dataclass(args[1]):
        return {"": args[1]}
    return None


def schema_keys(cls: Any = None, prefix: str = "") -> List[str]:
    """Every key of the schema (racsim.config.schema.RacsimConf), dotted; a named entry (a
    channel) as ``NAME``."""
    from racsim.config.schema import RacsimConf  # lazy: racsim --help answers without the schema

    out = []
    for name, tp in _fields(cls or RacsimConf).items():
        key = f"{prefix}{name}"
        sub = _node(tp)
        out.append(key)
        if isinstance(sub, dict):
            out += [f"{key}.NAME", *schema_keys(sub[""], f"{key}.NAME.")]
        elif sub is not None:
            out += schema_keys(sub, f"{key}.")
    return out


def key_hint(key: str) -> str:
    """'did you mean K1 or K2?' with the schema's keys closest to ``key`` (a channel's name
    kept as given), or where to find every key."""
    parts = key.split(".")
    channel = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "channels"), None)
    general = ".".join("NAME" if i and parts[i - 1] == "channels" else p for i, p in enumerate(parts))
    near = [k.replace("NAME", channel) if channel else k for k in closest(general, schema_keys())]
    return f"did you mean {' or '.join(near)}?" if near else "racsim --cfg job prints every key"


def unknown_key(key: str) -> str:
    """'KEY: no such key; did you mean ...'."""
    return f"{key}: no such key; {key_hint(key)}"


def unknown_option(group: str, option: str, options: Optional[List[str]] = None, given: str = "") -> str:
    """'GROUP=OPTION: ...' for a config group given an option it lacks (``given``: the key as
    typed, ``latency@pipeline.channels.judge.latency``): every scenario for ``scenario``,
    the extra to install for a launcher plugin, else the closest and every option."""
    given = given or group
    if group == "hydra/launcher" and option in LAUNCHER_EXTRAS:
        return f'{given}={option}: that launcher is not installed: pip install -e ".[{LAUNCHER_EXTRAS[option]}]"'
    scenario = group == "scenario"
    options = scenario_names() if scenario else list(options if options is not None
                                                     else config_groups().get(group, []))
    near = closest(option, options)
    hint = f" Did you mean {' or '.join(near)}?" if near else ""
    listed = "The scenarios" if scenario else f"The {group} options"
    return (f"{given}={option}: no such {'scenario' if scenario else 'option of ' + group}.{hint} "
            f"{listed}: {', '.join(options)}")


def missing_extra(module: Optional[str]) -> Optional[str]:
    """``pip install -e ".[EXTRA]"`` for a missing optional module (or a module inside one), or None."""
    parts = (module or "").split(".")
    extra = next((EXTRAS[n] for n in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if n in EXTRAS), None)
    return f'pip install -e ".[{extra}]"' if extra else None
