"""``racsim.run``: one run from Python (a notebook, a script), its tables as DataFrames.

    import racsim
    t = racsim.run("capacity/judge_rm_h100", overrides=["learner.trials=50"])
    t.curve, t.recommended, t.status, t.results, t.channels

The config is composed as the command line composes it (Hydra's compose API over the
package's conf/ and scenarios/: from any working directory, which it leaves as it is)
and computed by the command line's own function (racsim.analyses.dispatch.compute). A
mistake raises :class:`~racsim.errors.ConfigError` with the command line's one-line
message. Nothing is written unless ``out`` names a folder: it then gets what ``racsim``
writes into a run folder, ``done.json`` last (so ``racsim-report`` gathers it).

Only this module's names load with ``import racsim``: the simulator (numpy, pandas,
scipy, Hydra) loads when ``run`` is called, and torch only for ``learner=lm``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

from racsim.errors import ConfigError, write_failure
from racsim.progress import Progress

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Tables:
    """What :func:`run` returns: the run's tables, as the files of the same names in a run folder."""

    results: "pd.DataFrame"  # one row per corrector (and cell of a study grid); capacity: at the recommended count
    # (or the largest simulated; empty when every count is overloaded)
    channels: "pd.DataFrame"  # one row per slow channel (capacity: at the recommended count; empty likewise)
    curve: "Optional[pd.DataFrame]" = None  # capacity planning: one row per count and corrector (capacity.csv);
    # a pool split (async generation): one row per split tried (split.csv)
    recommended: Any = None  # capacity planning: the fewest units meeting the targets (None: no count); a pool
    # split: the Split (engines, trainer, judge GPUs) with the most steps per hour meeting them
    # capacity planning: "recommended", "infeasible" (a target out of reach of more capacity: the search stopped
    # early; the command exits 3) or "not_found" (racsim.analyses.capacity.STATUSES); None for other runs
    status: Optional[str] = None
    sensitivity: "Optional[pd.DataFrame]" = None  # capacity: the answer with each guessed input moved (sensitivity.csv)
    config: Any = None  # the composed config (an OmegaConf DictConfig)
    raw: Any = None  # everything computed: a RunResult (schedules, training curves...) or a CapacityResult
    files: List[Path] = field(default_factory=list)  # what ``out`` received


def run(scenario: Optional[str] = None, overrides: Sequence[str] = (), out: Union[str, Path, None] = None,
        progress: Optional[bool] = None) -> Tables:
    """Run ``scenario`` (a name as in ``racsim scenario=NAME``: ``capacity/judge_rm_h100``; None: the
    default scenario) with ``overrides`` (as on the command line: ``"seed=3"``, ``"corrector.tau_age=50"``)
    and return its tables. ``out``: a folder to write the run's files into (nothing is written without
    it; ``output.force=true`` to replace files racsim did not write there). ``progress``: whether to show
    the run's progress on stderr as the command does (racsim.progress: a line redrawn in place on a terminal;
    through a pipe, in a notebook or a log, a line at least every 10 s saying which phase runs, how far it
    is and the time left); None (the default): as ``output.progress`` says, which is true unless an
    override sets it false. Raises ConfigError (the key and what is allowed, the command line's wording)
    on a bad scenario, key or value."""
    from omegaconf.errors import OmegaConfBaseException

    from racsim.app import job as J  # lazy: the simulator loads when run is called

    given = _arguments(scenario, overrides, out, progress)
    t0 = time.perf_counter()
    cfg = _friendly(given, lambda: J.compose_config(*given), Exception)
    spec = _friendly(given, lambda: J.scenario(cfg), (ConfigError, OmegaConfBaseException))  # the config boundary
    shown = spec.output.progress if progress is None else progress
    with Progress(spec.name, mode="auto" if shown else "off", tail=[J.WRITING] if out else []) as bar:
        res = _friendly(given, lambda: J.compute(spec, progress=bar), (ConfigError, OmegaConfBaseException))
        if out:
            bar.start(J.WRITING, 1)
        files = _written(out, lambda: _write(Path(out), cfg, spec, res, given, time.perf_counter() - t0)) if out else []
        bar.finish()
    if isinstance(res, J.SplitResult):  # a pool split: its results and channels, the run at the answer (if any)
        import pandas as pd

        best = res.best
        return Tables(results=best.results if best else pd.DataFrame(),
                      channels=best.channels if best else pd.DataFrame(), curve=res.table, recommended=res.recommended, status=res.status, config=cfg, raw=res, files=files)
    if isinstance(res, J.CapacityResult):  # its results and channels: the run at the recommended (or largest) count
        import pandas as pd

        best = res.best  # None: every count overloaded, none simulated (the CLI writes capacity.csv alone)
        return Tables(results=best.results if best else pd.DataFrame(), channels=best.channels if best else pd.DataFrame(),
                      curve=res.curve, recommended=res.recommended, status=res.status, sensitivity=res.sensitivity,
                      config=cfg, raw=res, files=files)
    return Tables(results=res.results, channels=res.channels, config=cfg, raw=res, files=files)


def _arguments(scenario: Any, overrides: Any, out: Any, progress: Any = None) -> List[str]:
    """The command line ``run``'s arguments stand for, each checked first (a ConfigError naming it):
    a scenario name or None, a list of override strings, an ``out`` folder that can be written, and
    ``progress`` None, True or False."""
    from racsim.app import job as J  # lazy: see run

    if progress is not None and not isinstance(progress, bool):
        raise ConfigError("progress", progress, "True (shown on stderr), False (not shown) or None (as "
                                                "output.progress says: shown unless an override sets it false)")
    if scenario is not None and not isinstance(scenario, str):
        raise ConfigError("scenario", scenario, "a scenario name as `racsim scenario=NAME` takes it "
                                                "(e.g. 'capacity/judge_rm_h100'), or None for the default")
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, (list, tuple)) or \
            not all(isinstance(o, str) for o in overrides):
        raise ConfigError("overrides", overrides, "a list of strings as on the command line, e.g. ['seed=3']")
    if out is not None:
        if not isinstance(out, (str, Path)) or str(out).strip() == "":
            raise ConfigError("out", out, "a folder's path (str or Path; '.' for the current folder), or None "
                                          "to write nothing")
        J.check_writable("out", Path(out))
    return ([f"scenario={scenario}"] if scenario is not None else []) + list(overrides)


def _friendly(given: List[str], step, caught) -> Any:
    """``step()``, a user's mistake among ``caught`` raised as a ConfigError worded as the command
    line words it (racsim.app.cli.error_line), keyed by the override it names (or a key above it; else ``overrides``)."""
    from racsim.app import cli, job as J  # lazy: see run

    cli.guard_yaml()
    try:
        return step()
    except ConfigError:
        raise
    except caught as ex:
        line = cli.error_line(ex)
        if line is None:
            raise
        key = next((k for k in map(J.override_key, given) if k and any(p in line for p in _prefixes(k))), "overrides")
        raise ConfigError(key, None, line, line=line) from ex


def _prefixes(key: str) -> List[str]:
    """``a.b.c``, ``a.b``, ``a``: where Hydra's report of a bad key may stop."""
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _written(out: Any, write) -> List[Path]:
    """``write()``; a file it cannot write (a full disk) raised as a ConfigError naming ``out``, in the command
    line's words (racsim.errors.write_failure)."""
    try:
        return write()
    except OSError as ex:
        line = write_failure(ex, "out=DIR")
        if line is None:
            raise
        raise ConfigError("out", str(out), line, line=line) from ex


def _write(folder: Path, cfg: Any, spec: Any, res: Any, given: List[str], runtime_s: float) -> List[Path]:
    """The run's files into ``folder`` as ``racsim`` writes them (racsim.report.writers.write_run), then done.json.
    ``cfg``: the composed config (config.yaml, the marker); ``spec``: it as racsim.config.spec.scenario gives it."""
    from racsim.app import job as J  # lazy: see run

    digests: dict = {}
    found: list = []  # non-finite values where a number must be: raised once the files are written
    yaml_text = functools.partial(J.config_yaml, cfg)  # config.yaml: the composed config's, when written
    written = J.publish_run(folder, cfg, lambda stage: J.write_run(stage, spec, res, yaml_text, digests=digests,
                                                                   found=found))
    if found:  # as the command line: the files kept, no done.json
        raise J.failure(found, lambda: J.config_yaml(cfg), f"everything computed is written to {folder} "
                                                      f"(summary.md names the rows; no done.json)")
    cell = J.cell_overrides(given)  # less the resume switch, as a run's marker has it
    J.write_marker(folder, written, overrides=cell, cell=J.cell_values(cfg, cell), job=None, runtime_s=runtime_s,
                 digests=digests)
    return written + [folder / J.DONE]
