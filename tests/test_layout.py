"""The package's shape: which folder may import which, no import cycles, and no
racsim import hidden inside a function (README, "Layout").

Read from the source with ast (nothing is imported), so a new module is checked
as soon as it exists."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "racsim"

# Rooms, from the bottom up (racsim.ROOMS, docs/layout.md): a module may import its own room and
# the ones listed for it. The leaves import no racsim module.
ALLOWED = {
    "errors": set(),
    "io": set(),
    "seeds": set(),
    "config": {"errors", "config"},
    "pipeline": {"errors", "config", "pipeline"},
    "learner": {"errors", "config", "learner", "pipeline.schedule"},
    "analyses": {"errors", "io", "seeds", "config", "pipeline", "learner", "analyses"},
    "report": {"errors", "io", "config", "pipeline", "learner", "analyses", "report"},
    "sweep": {"errors", "io", "config", "analyses", "report", "sweep"},
    "tools": {"errors", "io", "config", "pipeline", "learner", "analyses", "sweep.markers", "tools"},
    "app": {"errors", "io", "config", "analyses", "report", "sweep", "app"},
    "__main__": {"app.cli"},
    "__init__": {"app.api"},
}

# Where the Hydra config (omegaconf, hydra) may be read: the config boundary and the rooms above the
# model. Below it, the model takes specs and plain values.
CONFIG_READERS = {"config", "sweep", "tools", "app"}


PATHS = {}  # module name -> its file


def modules():
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        if rel.parts[1] == "scenarios":
            continue
        name = ".".join(rel.parts[1:])
        name = name[: -len(".__init__")] if name.endswith(".__init__") else name
        out[name], PATHS[name] = ast.parse(p.read_text()), p
    return out


MODULES = modules()


def racsim_imports(tree, *, inside_functions: bool):
    """(line, module) of every racsim import, at module level or inside functions."""
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(n) for f in scopes for n in ast.walk(f)}
    found = []
    for n in ast.walk(tree):
        if (id(n) in nested) != inside_functions:
            continue
        if isinstance(n, ast.ImportFrom):
            assert n.level == 0, f"relative import at line {n.lineno}: use racsim.<folder>.<module>"
            if n.module == "racsim":
                found += [(n.lineno, a.name) for a in n.names]
            elif n.module and n.module.startswith("racsim."):
                mod = n.module[len("racsim."):]
                found += [(n.lineno, f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod) for a in n.names]
        elif isinstance(n, ast.Import):
            found += [(n.lineno, a.name[len("racsim."):]) for a in n.names if a.name.startswith("racsim.")]
    return found


def allowed(importer: str, imported: str) -> bool:
    rules = ALLOWED[importer.split(".")[0]]
    return any(imported == r or imported.startswith(r + ".") for r in rules)


def test_every_module_has_a_layer():
    assert {m.split(".")[0] for m in MODULES} <= set(ALLOWED)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_follow_the_layers(name):
    bad = [(line, m) for line, m in racsim_imports(MODULES[name], inside_functions=False) if not allowed(name, m)]
    assert not bad, f"racsim.{name} imports {bad}: not allowed for {name.split('.')[0]} ({sorted(ALLOWED[name.split('.')[0]])})"


# The deliberate lazy imports, all of them: the entry points that keep `import racsim`, `racsim
# --help` and Hydra's start-up fast load the rest when a job runs (racsim.analyses.lm_study loads
# torch only for learner.kind=lm, which is not a racsim import). Each is marked "# lazy" on its line.
LAZY = {
    "__init__": {"app.api"},  # racsim.run and racsim.Tables, at first use
    "app.cli": {"app.job"},  # the simulator and its reports, when a job runs
    "app.api": {"app.cli", "app.job"},  # the same, when racsim.run runs
    "sweep.callback": {"analyses.grid", "sweep.gather"},  # a refused run's own config; the sweep's report
    "analyses.lm_study": {"learner.lm"},  # torch and transformers, for learner.kind=lm only
}


def lazy_imports(name):
    src = PATHS[name].read_text().splitlines()
    marked = {i + 1 for i, line in enumerate(src) if "# lazy" in line}
    return [(line, m) for line, m in racsim_imports(MODULES[name], inside_functions=True) if line in marked]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_racsim_import_inside_a_function(name):
    hidden = racsim_imports(MODULES[name], inside_functions=True)
    allowed_lazy = LAZY.get(name, set())
    assert [(line, m) for line, m in hidden if m not in allowed_lazy] == []
    assert {m for _, m in lazy_imports(name)} <= allowed_lazy


def test_the_lazy_list_is_exact():
    """Every listed lazy import exists: the list is the code's, not a wish."""
    for name, targets in LAZY.items():
        assert {m for _, m in lazy_imports(name)} == targets, name


def config_imports(tree):
    """Lines importing omegaconf or hydra, at any depth."""
    found = []
    for n in ast.walk(tree):
        names = [n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names] if isinstance(n, ast.Import) else []
        found += [(n.lineno, m) for m in names if m.split(".")[0] in ("omegaconf", "hydra")]
    return sorted(found)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.split(".")[0] not in CONFIG_READERS
                                        and m not in ("__init__", "__main__")))
def test_no_hydra_config_below_the_boundary(name):
    assert config_imports(MODULES[name]) == [], f"racsim.{name} reads the Hydra config: take a spec instead"


def test_no_import_cycle():
    graph = {m: {i for _, i in racsim_imports(t, inside_functions=False) if i in MODULES} for m, t in MODULES.items()}
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
    cyclic = {"a": ast.parse("from racsim.b import x"), "b": ast.parse("from racsim.a import y")}
    assert racsim_imports(cyclic["a"], inside_functions=False) == [(1, "b")]
    hidden = ast.parse("def f():\n    from racsim.run import run\n")
    assert racsim_imports(hidden, inside_functions=True) == [(2, "run")]
    assert config_imports(ast.parse("def f():\n    from omegaconf import DictConfig\nimport hydra")) == [
        (2, "omegaconf"), (3, "hydra")]
    assert not allowed("pipeline.lanes", "learner.bias") and not allowed("config.schema", "pipeline.latency")
    assert allowed("learner.bias", "pipeline.schedule") and not allowed("learner.bias", "pipeline.lanes")
