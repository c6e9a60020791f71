"""Every exception class racsim defines crosses a process boundary: a sweep job's error is
pickled to the sweep's process by joblib, submitit and Ray (cloudpickle), and must come back
as the same error, message and fields. The classes are found by walking the package, so a
new one is covered without a change here."""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pickle
import pkgutil
import typing
from pathlib import Path

import pytest

import hydra_plugins.racsim_sweeper
import racsim
from racsim.errors import ConfigError, JobError

SKIP = {"racsim.__main__"}  # runs the command on import


def racsim_modules() -> list:
    names = [m.name for m in pkgutil.walk_packages(racsim.__path__, "racsim.")]
    names += [m.name for m in pkgutil.walk_packages(hydra_plugins.racsim_sweeper.__path__,
                                                    "hydra_plugins.racsim_sweeper.")]
    return [importlib.import_module(n) for n in sorted(names) if n not in SKIP]


def exception_classes() -> list:
    found = {cls for mod in racsim_modules() for _, cls in inspect.getmembers(mod, inspect.isclass)
             if issubclass(cls, BaseException) and cls.__module__.startswith(("racsim", "hydra_plugins.racsim"))}
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def exception_names() -> list:
    """``module:Class`` of every exception class in racsim's source, read without importing it
    (collecting imports no module, so the LM learner's torch stays unloaded): a class whose base is a
    builtin exception, is named like one (``...Error``, ``...Exception``), or is such a class of racsim's.
    :func:`test_the_source_walk_finds_what_importing_finds` holds it to the import walk."""
    classes = {}
    for root, prefix in ((racsim.__path__, "racsim."), (hydra_plugins.racsim_sweeper.__path__,
                                                         "hydra_plugins.racsim_sweeper.")):
        for m in pkgutil.walk_packages(root, prefix):
            if m.name in SKIP:
                continue
            path = importlib.util.find_spec(m.name).origin
            for node in ast.walk(ast.parse(Path(path).read_text())):
                if isinstance(node, ast.ClassDef):
                    classes[f"{m.name}:{node.name}"] = [_base_name(b) for b in node.bases]
    known = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    while True:
        found = {name for name, bases in classes.items()
                 if any(b in known or b.endswith(("Error", "Exception")) for b in bases)}
        more = {name.split(":")[1] for name in found} - known
        if not more:
            return sorted(found)
        known |= more


def load(name: str) -> type:
    module, qualname = name.split(":")
    return getattr(importlib.import_module(module), qualname)


CLASSES = exception_names()


def test_the_walk_finds_racsims_exceptions():
    assert "racsim.errors:ConfigError" in CLASSES


@pytest.mark.long  # imports every module, torch too: 6 CPU s
def test_the_source_walk_finds_what_importing_finds():
    assert [load(n) for n in CLASSES] == exception_classes()


def sample(name: str, hint: typing.Any, i: int) -> typing.Any:
    """A value of the parameter's type, distinct per parameter (so that swapped fields show)."""
    if hint is str:
        return f"{name} text {i}"
    if hint is int:
        return 7 + i
    if hint is float:
        return 0.25 + i
    return {"values": [i, 2.5, None, f"{name}"]}  # Any and the rest: a nested value that pickles


def instance(cls: type) -> BaseException:
    hints = typing.get_type_hints(cls.__init__)
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return cls(*[sample(p.name, hints.get(p.name, typing.Any), i) for i, p in enumerate(params)])


def dumpers() -> list:
    out = [(f"pickle-{p}", lambda e, p=p: pickle.dumps(e, protocol=p)) for p in range(2, pickle.HIGHEST_PROTOCOL + 1)]
    cloudpickle = pytest.importorskip("cloudpickle")  # joblib's and Ray's serialiser
    return out + [("cloudpickle", cloudpickle.dumps)]


@pytest.mark.parametrize("name", CLASSES)
def test_every_exception_pickles_back_to_the_same_error(name):
    cls = load(name)
    error = instance(cls)
    error.add_note("a note added on the way")
    for name, dumps in dumpers():
        back = pickle.loads(dumps(error))
        assert type(back) is cls, name
        assert str(back) == str(error) and back.args == error.args, name
        assert vars(back) == vars(error), name  # its fields (key, value, allowed) and notes


def test_a_config_error_keeps_its_fields_and_one_line():
    error = ConfigError("pipeline.channels.judge.latency.path", "gone.csv", "a file\n  that exists")
    back = pickle.loads(pickle.dumps(error))
    assert (back.key, back.value, back.allowed) == ("pipeline.channels.judge.latency.path", "gone.csv",
                                                    "a file\n  that exists")
    assert str(back) == "pipeline.channels.judge.latency.path = 'gone.csv': a file that exists"


class Unpicklable(Exception):
    def __init__(self, a, b):  # BaseException pickles args = (message,): unpickling calls Unpicklable(message)
        super().__init__(f"{a} and {b}")


def raised(error: BaseException, cause: BaseException = None) -> BaseException:
    try:
        raise error from cause
    except BaseException as e:
        return e


def test_a_failed_jobs_error_crosses_whatever_it_was():
    """What a sweep job hands back (racsim.sweep.job_failure) pickles, and says what the job's own
    process would have said (racsim.errors.reason): the key of a cause too, which pickling drops."""
    from racsim.sweep.callback import job_failure
    from racsim.errors import reason

    keyed = Exception("Value 'abc' could not be converted to Integer")
    keyed.full_key = "learner.trials"
    errors = [raised(Unpicklable(1, 2)), raised(KeyError("k")), raised(RuntimeError("outer"), keyed),
              raised(ConfigError("seed", -1, "an integer >= 0"))]
    with pytest.raises(TypeError):
        pickle.loads(pickle.dumps(errors[0]))
    for error in errors:
        back = pickle.loads(pickle.dumps(job_failure(error)))
        assert type(back) is (ConfigError if isinstance(error, ConfigError) else JobError)
        assert str(back) == reason(error)
    assert str(pickle.loads(pickle.dumps(job_failure(errors[2])))).startswith("learner.trials: Value 'abc'")
