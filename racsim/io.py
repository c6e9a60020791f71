"""Writing files safely, configs as YAML, formatting numbers: leaf helpers with no racsim imports.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the result onto ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: Path(p).write_text(text))


def config_yaml(cfg: Any) -> str:
    """``OmegaConf.to_yaml(cfg)``, byte for byte, emitted by libyaml (about 3x faster: a
    sweep job writes its config three times) when PyYAML has it."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_omega_conf_dumper

    tree = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    if not yaml.__with_libyaml__ or not _plain(tree):
        return OmegaConf.to_yaml(cfg)
    return yaml.dump(tree, default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=_c_dumper(get_omega_conf_dumper()))


def _plain(node: Any) -> bool:
    """Keys and text the two emitters write alike: printable ASCII, keys of 1 to 100
    characters. Else libyaml quotes an empty key, escapes some characters, and folds
    long escaped strings, otherwise than PyYAML."""
    if isinstance(node, dict):
        return all(_plain(k) and _plain(v) and (not isinstance(k, str) or 0 < len(k) <= 100)
                   for k, v in node.items())
    if isinstance(node, list):
        return all(_plain(v) for v in node)
    if isinstance(node, str):
        return node.isascii() and node.isprintable()
    return True


_C_DUMPERS: dict = {}


def _c_dumper(python_dumper: type) -> type:
    """libyaml's emitter with the representers of OmegaConf's dumper (its quoting of strings)."""
    if python_dumper not in _C_DUMPERS:
        import yaml

        class Dumper(yaml.CDumper):
            pass

        for kind, fn in python_dumper.yaml_representers.items():
            Dumper.add_representer(kind, fn)
        for kind, fn in python_dumper.yaml_multi_representers.items():
            Dumper.add_multi_representer(kind, fn)
        _C_DUMPERS[python_dumper] = Dumper
    return _C_DUMPERS[python_dumper]


def fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bool,)):
        return str(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
            return f"{v:.2e}"
        return f"{v:.4g}"
    return str(v)
