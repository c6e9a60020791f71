"""A composed config as the YAML text a run folder keeps (config.yaml): the one place that
writes the Hydra config out; below the config boundary a run carries this text, not the config."""

from __future__ import annotations

from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_omega_conf_dumper


def config_yaml(cfg: Any) -> str:
    """``OmegaConf.to_yaml(cfg)``, byte for byte, emitted by libyaml (about 3x faster: a
    sweep job writes its config three times) when PyYAML has it."""
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
        class Dumper(yaml.CDumper):
            pass

        for kind, fn in python_dumper.yaml_representers.items():
            Dumper.add_representer(kind, fn)
        for kind, fn in python_dumper.yaml_multi_representers.items():
            Dumper.add_multi_representer(kind, fn)
        _C_DUMPERS[python_dumper] = Dumper
    return _C_DUMPERS[python_dumper]
