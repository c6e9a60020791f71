"""The package's shape (racsim.app.layout, docs/layout.md): which room may import which, no import
cycle, no racsim import hidden inside a function but the listed lazy ones, and no Hydra config
below the config boundary.

Read from the source with ast (nothing is imported), so a new module is checked as soon as it exists."""

import ast

import pytest

from racsim.app import layout as L

PATHS = L.modules()
MODULES = {name: ast.parse(p.read_text()) for name, p in PATHS.items()}
NAMES = sorted(MODULES)
LOOSE = {"__init__", "__main__", "errors", "io", "seeds", "progress"}  # the only modules outside a room's folder


def imports(name, *, inside_functions=False):
    return L.racsim_imports(MODULES[name], NAMES, inside_functions=inside_functions)


def test_every_module_has_a_room_and_only_leaves_are_loose():
    rooms = {r for r, _, _ in L.ROOMS}
    assert {L.room(m) for m in MODULES} <= rooms
    loose_files = {p.stem for p in L.PKG.glob("*.py")}
    assert loose_files == LOOSE, loose_files - LOOSE


@pytest.mark.parametrize("name", NAMES)
def test_no_relative_imports(name):
    rel = [n.lineno for n in ast.walk(MODULES[name]) if isinstance(n, ast.ImportFrom) and n.level]
    assert rel == [], f"relative import at lines {rel}: use racsim.<room>.<module>"


@pytest.mark.parametrize("name", NAMES)
def test_imports_flow_down(name):
    bad = [(line, m) for line, m in imports(name) if not L.allowed(name, m)]
    assert not bad, f"racsim.{name} imports {bad}: not allowed for the {L.room(name)} room"


def lazy_imports(name):
    src = PATHS[name].read_text().splitlines()
    return [(line, m) for line, m in imports(name, inside_functions=True) if "# lazy" in src[line - 1]]


@pytest.mark.parametrize("name", NAMES)
def test_no_racsim_import_inside_a_function_but_the_listed_ones(name):
    listed = set(L.LAZY.get(name, ()))
    assert [(line, m) for line, m in imports(name, inside_functions=True) if m not in listed] == []
    assert len(lazy_imports(name)) == len(imports(name, inside_functions=True)), "mark each lazy import '# lazy'"


def test_the_lazy_list_is_the_codes():
    """Each listed lazy import exists, and is allowed for its room: the list is the code's, not a wish."""
    for name, targets in L.LAZY.items():
        assert {m for _, m in lazy_imports(name)} == set(targets), name
        assert all(L.allowed(name, t) for t in targets), name


def config_imports(tree):
    """(line, module) importing omegaconf or hydra, at any depth."""
    found = []
    for n in ast.walk(tree):
        names = ([n.module or ""] if isinstance(n, ast.ImportFrom)
                 else [a.name for a in n.names] if isinstance(n, ast.Import) else [])
        found += [(n.lineno, m) for m in names if m.split(".")[0] in ("omegaconf", "hydra")]
    return sorted(found)


@pytest.mark.parametrize("name", [m for m in NAMES if L.room(m) not in L.CONFIG_READERS and m not in LOOSE - {"io"}]
                         + ["io", "errors", "seeds", "progress"])
def test_no_hydra_config_below_the_boundary(name):
    assert config_imports(MODULES[name]) == [], f"racsim.{name} reads the Hydra config: take a spec instead"


def test_no_import_cycle():
    graph = {m: {i for _, i in imports(m) if i in MODULES} for m in MODULES}
    state: dict = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_checks_can_fail():
    a = ast.parse("from racsim.b import x\nfrom racsim import errors\nimport racsim.pipeline.lanes")
    assert L.racsim_imports(a, ["b", "errors"], inside_functions=False) == [(1, "b"), (2, "errors"), (3, "pipeline.lanes")]
    hidden = ast.parse("def f():\n    from racsim.app import job\n")
    assert L.racsim_imports(hidden, ["app.job"], inside_functions=True) == [(2, "app.job")]
    assert config_imports(ast.parse("import hydra\ndef f():\n    from omegaconf import DictConfig\n")) == [
        (1, "hydra"), (3, "omegaconf")]
    assert not L.allowed("pipeline.lanes", "learner.bias") and not L.allowed("config.schema", "pipeline.latency")
    assert L.allowed("learner.bias", "pipeline.schedule") and not L.allowed("learner.bias", "pipeline.lanes")
    assert not L.allowed("report.writers", "sweep.markers") and L.allowed("tools.profile", "sweep.markers")
    assert not L.allowed("sweep.callback", "app.guide") and not L.allowed("config.validate", "app.guide")


def test_the_map_names_every_module_and_room():
    text = L.rooms_text()
    flat = " ".join(text.split())
    for r, question, _ in L.ROOMS:
        assert question in flat
    for m in MODULES:
        if "." in m:
            assert m.split(".", 1)[1] in text, m


def test_knob_files_finds_a_field():
    files = dict(L.knob_files("max_load"))
    assert "racsim/config/schema.py" in files and any(f.startswith("tests/") for f in files)
    assert L.knob_files("no_such_" + "field_anywhere") == []
