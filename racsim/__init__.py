"""racsim: a discrete-event simulator of asynchronous reward pipelines for RLHF.

Folders, each answering one question of the model (README, "Layout"):
``config`` (what is asked), ``pipeline`` (when is each slow result usable?),
``learner`` (what is the update, and how biased is it?), ``analyses`` (the
studies built from the two), ``report`` (what a user reads). Leaf helpers with
no racsim imports: ``errors``, ``io``, ``markers``, ``seeds``.
"""

from __future__ import annotations

__version__ = "0.1.0"
