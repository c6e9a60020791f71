"""racsim: a discrete-event simulator of asynchronous reward pipelines for RLHF.

``racsim.run(scenario, overrides=[...])`` runs one scenario from Python and returns
its tables (racsim.app.api); the ``racsim`` command does the same from a shell.

Folders, each answering one question of the model (README, "Layout"):
``config`` (what is asked), ``pipeline`` (when is each slow result usable?),
``learner`` (what is the update, and how biased is it?), ``analyses`` (the
studies built from the two), ``report`` (what a user reads). Leaf helpers with
no racsim imports: ``errors``, ``io``, ``markers``, ``seeds``.
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
