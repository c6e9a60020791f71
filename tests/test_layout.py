"""The package's shape: which folder may import which, no import cycles, and no
racsim import hidden inside a function (README, "Layout").

Read from the source with ast (nothing is imported), so a new module is checked
as soon as it exists."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "racsim"

# Layer of each top-level name: a module may import its own layer and the ones
# listed for it. Leaves import no racsim module (markers: only io, to write atomically).
ALLOWED = {
    "errors": set(),
    "io": set(),
    "seeds": set(),
    "markers": {"io"},
    "config": {"errors", "config", "guide"},
    "guide": {"errors", "config"},  # help and hints for a person: the schema loaded lazily
    "pipeline": {"errors", "config", "pipeline"},
    "learner": {"errors", "config", "learner", "pipeline.schedule"},
    "analyses": {"errors", "io", "seeds", "config", "pipeline", "learner", "analyses"},
    "report": {"errors", "io", "markers", "config", "pipeline", "learner", "analyses", "report"},
    "api": {"errors", "config", "analyses", "report", "markers", "sweep", "cli"},  # racsim.run: all lazy
    "sweep": {"errors", "io", "markers", "report", "sweep", "guide", "config", "analyses"},
    "sweeper": {"errors", "config", "analyses", "markers", "sweep"},  # the logic of hydra_plugins/racsim_sweeper
    "cli": {"errors", "io", "config", "analyses", "report", "sweep", "guide"},
    "bench": {"config", "pipeline", "learner", "analyses"},
    "profile": {"errors", "io", "markers"},
    "docs": {"io"},  # the docs' generated blocks: runs the commands, imports no model code
    "__main__": {"cli"},
    "__init__": {"api"},  # racsim.run, loaded at first use
}


def modules():
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        if rel.parts[1] == "scenarios":
            continue
        name = ".".join(rel.parts[1:])
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = ast.parse(p.read_text())
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


# Deliberate lazy imports (heavy modules the command line loads only when a job runs;
# torch and transformers, which racsim.learner.lm imports, only when learner.kind=lm runs),
# each marked "# lazy" on its line; nowhere else may a racsim import hide in a function.
LAZY = {"cli", "sweep", "sweeper", "guide", "analyses.lm_study", "api", "__init__"}


def lazy_lines(name):
    src = (PKG / (name.replace(".", "/") + ".py")).read_text().splitlines()
    return {i + 1 for i, line in enumerate(src) if "# lazy" in line}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_racsim_import_inside_a_function(name):
    hidden = racsim_imports(MODULES[name], inside_functions=True)
    if name in LAZY:
        hidden = [(line, m) for line, m in hidden if line not in lazy_lines(name)]
    assert hidden == []


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
    assert not allowed("pipeline.lanes", "learner.bias") and not allowed("config.schema", "pipeline.latency")
    assert allowed("learner.bias", "pipeline.schedule") and not allowed("learner.bias", "pipeline.lanes")
