"""racsim: a discrete-event simulator of asynchronous reward pipelines for RLHF.

``racsim.run(scenario, overrides=[...])`` runs one scenario from Python and returns
its tables (racsim.app.api); the ``racsim`` command does the same from a shell.

Rooms, each answering one question (``python -m racsim.app.layout`` draws the map;
docs/layout.md): ``config`` (what is asked; the boundary where a config becomes a
spec), ``pipeline`` (when is each slow result usable?), ``learner`` (what is the
update, and how biased is it?), ``analyses`` (the studies), ``report`` (what a user
reads of one run), ``sweep`` (many runs), ``tools`` (racsim-bench, racsim-profile),
``app`` (the command, racsim.run, help). Leaves with no racsim imports: ``errors``,
``io``, ``seeds``.
"""

from __future__ import annotations

__all__ = ["Tables", "run", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``racsim.run`` and ``racsim.Tables``, loaded at first use: ``import racsim`` stays instant."""
    if name in ("run", "Tables"):
        from racsim.app import api  # lazy

        return getattr(api, name)
    raise AttributeError(f"module 'racsim' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
