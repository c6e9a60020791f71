"""The package's map, read from its source with ast (nothing is imported): its rooms from the
bottom up, what each answers, what each may import, its modules, the lazy imports, and the files
a config knob reaches. ``python -m racsim.app.layout`` prints it (docs/layout.md's generated
block); tests/test_layout.py holds the code to these rules.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from racsim.errors import Parser, interruptible, wrapped

PKG = Path(__file__).resolve().parents[1]  # racsim/
REPO = PKG.parent

# (room, the question it answers, the rooms it may import besides its own), from the bottom up.
# A room is a folder of racsim/ or a loose module; an entry "pipeline.schedule" allows one module.
ROOMS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("errors", "the one user-facing error, any failure in one line, and the width every printed line fits", ()),
    ("io", "files written whole (atomic), their digests, numbers formatted, the cores and BLAS threads "
            "a job may use, numbers several runs compute alike computed once", ("errors",)),
    ("seeds", "one random stream per purpose", ()),
    ("progress", "how far is it? one progress model for every run, search, sweep and tool", ("errors",)),
    ("config", "what is asked? the schema, defaults, names, rules, and the boundary where a "
               "composed config becomes a spec", ("errors",)),
    ("pipeline", "when is each slow result usable?", ("errors", "io", "config")),
    ("generation", "how stale is each sample? rollout engines running ahead of the trainer, and the schedule "
                   "they make", ("errors", "io", "config", "pipeline")),
    ("learner", "what is the update, and how biased is it?", ("errors", "io", "config", "pipeline.schedule")),
    ("analyses", "the studies: bias, probe, TV bound, capacity, LM", ("errors", "io", "seeds", "progress", "config",
                                                                      "pipeline", "generation", "learner")),
    ("report", "what a user reads of one run", ("errors", "io", "config", "pipeline", "generation", "learner",
                                                "analyses")),
    ("sweep", "many runs: launch, resume, mark, gather", ("errors", "io", "progress", "config", "analyses", "report")),
    ("tools", "how fast is it, and what does a real RM cost? (racsim-bench, racsim-profile, the measured kernel "
              "tables and their curve)",
     ("errors", "io", "progress", "config", "pipeline", "generation", "learner", "analyses", "sweep.markers")),
    ("app", "what a person or a program calls: racsim, racsim.run, --help, the docs' blocks",
     ("errors", "io", "progress", "config", "analyses", "report", "sweep")),
    ("__main__", "the racsim command and python -m racsim", ("app.cli",)),
    ("__init__", "import racsim (racsim.run at first use)", ("app.api",)),
)

# Rooms that may read the Hydra config (import omegaconf or hydra): the boundary and those above
# the model. Below it, the model takes specs and plain values.
CONFIG_READERS = ("config", "sweep", "tools", "app")

# Every deliberate lazy import (module -> what it loads inside a function, each line marked
# "# lazy"): the entry points load the simulator only when a job runs, so that `import racsim`,
# `racsim --help` and Hydra's start-up stay fast; lm_study and racsim-bench load torch for the LM learner only.
LAZY: Dict[str, Tuple[str, ...]] = {
    "__init__": ("app.api",),
    "__main__": ("app.cli",),  # under its Ctrl-C handler
    "app.cli": ("app.job",),
    "app.api": ("app.cli", "app.job"),
    "sweep.callback": ("analyses.grid", "sweep.gather"),
    "analyses.lm_study": ("learner.lm",),
    "tools.bench": ("learner.lm",),  # racsim-bench --lm
}


def room(module: str) -> str:
    return module.split(".")[0]


def modules(pkg: Path = PKG) -> Dict[str, Path]:
    """Every module of the package by dotted name below racsim (a package by its folder's name)."""
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = p.relative_to(pkg).with_suffix("").parts
        if parts[0] in ("scenarios", "conf", "data"):
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        out[name] = p
    return out


def racsim_imports(tree: ast.AST, names: Sequence[str], *, inside_functions: bool) -> List[Tuple[int, str]]:
    """(line, module) of every racsim import of ``tree``, at module level or inside functions;
    ``from racsim.a import b`` counts as ``a.b`` when that is a module of ``names``."""
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(n) for f in scopes for n in ast.walk(f)}
    known = set(names)
    found = []
    for n in ast.walk(tree):
        if (id(n) in nested) != inside_functions:
            continue
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and (n.module + ".").startswith("racsim."):
            mod = n.module[len("racsim."):]
            for a in n.names:
                sub = f"{mod}.{a.name}" if mod else a.name
                found.append((n.lineno, sub if sub in known or not mod else mod))
        elif isinstance(n, ast.Import):
            found += [(n.lineno, a.name[len("racsim."):]) for a in n.names if a.name.startswith("racsim.")]
    return sorted(found)


def allowed(importer: str, imported: str) -> bool:
    """Whether ``importer``'s room may import ``imported`` (its own room, or one listed for it)."""
    rules = {r: (r, *may) for r, _, may in ROOMS}[room(importer)]
    return any(imported == r or imported.startswith(r + ".") for r in rules)


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split(".")[0].split()) if doc else ""


def rooms_text(pkg: Path = PKG) -> str:
    """The map: each room (bottom up), what it answers, its modules and what it may import."""
    mods = modules(pkg)
    lines = []
    for name, question, may in ROOMS:
        members = sorted(m.split(".", 1)[1] for m in mods if room(m) == name and "." in m)
        kind = f"{name}/" if members else f"{name}.py"
        lines += textwrap.wrap(question, 96, initial_indent=f"{kind:<12}", subsequent_indent=" " * 12)
        if members:
            lines += textwrap.wrap(", ".join(members), 96, initial_indent=" " * 12, subsequent_indent=" " * 12)
        lines.append(f"{'':12}imports: {', '.join(may) if may else 'nothing of racsim'}")
    lines += ["", "Hydra's config is read in: " + ", ".join(CONFIG_READERS) + " (below them: specs and plain values)",
              "Lazy imports (all of them): " + "; ".join(f"{m} -> {', '.join(t)}" for m, t in LAZY.items())]
    return wrapped("\n".join(lines)) + "\n"


def knob_files(field: str, roots: Sequence[Path] = (PKG, REPO / "tests")) -> List[Tuple[str, int]]:
    """(file, lines) of the Python files that name a config field (``max_load``): what adding a knob
    like it touches (this map and its test aside)."""
    pattern = re.compile(rf"\b{re.escape(field)}\b")
    skip = {Path(__file__).resolve(), REPO / "tests" / "test_layout.py"}
    out = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            if p.resolve() in skip:
                continue
            n = sum(1 for line in p.read_text().splitlines() if pattern.search(line))
            if n:
                out.append((str(p.relative_to(REPO)), n))
    return out


@interruptible("python -m racsim.app.layout")
def main(argv: Sequence[str] | None = None) -> None:
    ap = Parser(prog="python -m racsim.app.layout", description=__doc__.splitlines()[0])
    ap.add_argument("--knob", help="a config field's name (e.g. max_load): list the files that name it")
    args = ap.parse_args(argv)
    if args.knob:
        sys.stdout.write("".join(f"{f}: {n} line{'s' if n > 1 else ''}\n" for f, n in knob_files(args.knob)))
        return
    sys.stdout.write(rooms_text())


if __name__ == "__main__":
    main()
