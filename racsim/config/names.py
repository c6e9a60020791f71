"""The names a user may write, and the words for a mistyped one.

* :func:`scenario_names`, :func:`config_groups`: every scenario (every folder of scenarios/)
  and conf/'s config groups with their options;
* :func:`schema_keys`, :func:`key_hint`, :func:`unknown_key`, :func:`unknown_option`: a
  mistyped scenario, group option or key, with the closest valid names (difflib), never an
  internal class;
* :func:`missing_extra`: a missing optional package, as the extra that installs it.

Light: the standard library, the package's resources and the schema's dataclasses only (no NumPy).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
import typing
from importlib.resources import files
from typing import Any, Dict, List, Optional

from racsim.config.schema import RacsimConf

SCENARIO_PACKAGE = "racsim.scenarios.scenario"  # scenarios/, shipped (pyproject.toml)
CONF_PACKAGE = "racsim.conf"  # conf/

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


def description(name: str) -> str:
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


def _leaf(key: str) -> Any:
    """The schema's type of leaf ``key`` (a channel as NAME), or None if there is none."""
    cls, tp = RacsimConf, None
    for part in key.split("."):
        if isinstance(cls, dict):
            cls = cls[""]
            continue
        if not dataclasses.is_dataclass(cls) or part not in _fields(cls):
            return None
        tp = _fields(cls)[part]
        cls = _node(tp)
    return tp


def not_null(key: str) -> str:
    """'KEY: ... never null ...' for a key set to null that may not be: a block's keys to set
    instead, or a leaf's kind of value."""
    parts = key.split(".")
    general = ".".join("NAME" if i and parts[i - 1] == "channels" else p for i, p in enumerate(parts))
    below = [k[len(general) + 1:] for k in schema_keys() if k.startswith(general + ".") and k.count(".") == general.count(".") + 1]
    if not below:
        kind = {int: "an integer", float: "a number", str: "a word", bool: "true or false"}.get(_leaf(general))
        return f"{key}: never null; give it a value" + (f" ({kind})" if kind else "")
    turn_off = f" ({key}.enabled=false turns it off)" if "enabled" in below else ""
    return f"{key}: a block, never null; set its keys instead: {', '.join(below)}{turn_off}"


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


# A run folder's name holds its what-if: brackets, braces, quotes and spaces go, other characters a path may
# not hold (or a shell reads) become "_"; past WHAT_IF_MAX characters its end gives way to a digest of the
# whole, so that two what-ifs never share a folder.
FOLDER_DROPPED = re.compile(r"[\[\]{}'\" ]")
FOLDER_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
WHAT_IF_MAX = 80
# Overrides that are no what-if: the scenario (the folder above names it), how a run shows itself, resuming.
NOT_WHAT_IF = ("scenario", "output", "resume")


def what_if_name(overrides: Any) -> str:
    """The part of a single run's folder name that says what it changed (``hydra.run.dir``: outputs/NAME/<time>
    and this): ``_`` and its task overrides joined by ``,``, each key by its last two dotted parts (more where
    two would be alike; a config group's by its package, ``rm/gpu@pipeline.channels.judge.rm.gpu=A100`` ->
    ``rm.gpu=A100``), those of :data:`NOT_WHAT_IF` left out; ``''`` without any. Every what-if of the judge
    landed in outputs/judge_rm_h100/ whatever GPU or model was set (issue 49)."""
    pairs = []
    for o in map(str, overrides or []):
        key, _, value = o.lstrip("+~").partition("=")
        path = key.rpartition("@")[2] if "@" in key else key.replace("/", ".")
        if path.split(".")[0] in NOT_WHAT_IF:
            continue
        pairs.append((path.split("."), value))
    if not pairs:
        return ""
    parts = [2] * len(pairs)
    while True:  # the keys that read alike each take one more part, until none do (or all are whole)
        keys = [".".join(p[-n:]) for (p, _), n in zip(pairs, parts)]
        alike = [i for i, k in enumerate(keys) if keys.count(k) > 1 and parts[i] < len(pairs[i][0])]
        if not alike:
            break
        for i in alike:
            parts[i] += 1
    text = FOLDER_UNSAFE.sub("_", FOLDER_DROPPED.sub("", ",".join(f"{k}={v}" for k, (_, v) in zip(keys, pairs))))
    if len(text) > WHAT_IF_MAX:
        digest = hashlib.sha256(",".join(map(str, overrides)).encode()).hexdigest()[:10]
        text = f"{text[:WHAT_IF_MAX - 11]}~{digest}"
    return "_" + text
