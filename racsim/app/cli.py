"""The ``racsim`` command: a Hydra app over conf/ and scenarios/.

    racsim                                  # the default scenario
    racsim scenario=NAME key=value ...      # a named scenario, with overrides
    racsim -m corrector.tau_age=50,1000     # a sweep, one output folder per job

A run is computed by racsim.analyses.dispatch.compute, the function ``racsim.run``
(racsim/api.py) calls from Python too; a sweep ends with its table averaged over
seeds (racsim.sweep.gather). A user mistake (bad value, unknown key or scenario) ends with one line on
stderr naming the key and what is allowed, exit status 2, and no output folder
left behind. Set HYDRA_FULL_ERROR=1 to see Hydra's own report instead.

Exit statuses: 0 done; 1 a run that failed after writing what it computed (a
non-finite value where a number must be); 2 a usage error; 3 a capacity plan
whose targets no count can meet (status ``infeasible``: a target out of reach of
more capacity, racsim.analyses.capacity.reach; its files are written, done.json
included); 130 and 143 an interrupt (SIGINT, SIGTERM); 141 a closed stdout.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

from racsim.app.guide import help_text
from racsim.config import names
from racsim.config.defaults import compose_config, measured_as_given, replace_grid
from racsim.config.names import missing_extra
from racsim.config.schema import register_configs
from racsim.config.validate import allowed_at
from racsim.errors import ConfigError, causes, exit_interrupted, say, write_failure
from racsim.progress import Progress
from racsim.sweep.callback import (
    Job,
    catch_sigint,
    end_single_run,
    holding,
    in_multirun,
    keep_created,
    lean_job,
    publish_run,
    raise_pending_interrupt,
    register_resolvers,
    release,
    remove_created,
    stopped_by_sigterm,
    single_run,
    take_prepared,
)
from racsim.sweep.detached import end_detached

EXIT_USAGE = 2
EXIT_FAILED = 1  # a run that failed after writing what it computed (a non-finite value where a number must be)
EXIT_INFEASIBLE = 3  # a capacity plan with a target no count can meet (CapacityResult.status "infeasible")


_FRIENDLY = True  # set by main(): False when the user asked for Hydra's full error reports
_STARTED: Optional[float] = None  # set by main(): when the command started (time.perf_counter)
_EXIT: list = []  # set by _task: a single run's exit status other than 0 once it is complete (EXIT_INFEASIBLE)


def _task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import OmegaConfBaseException

    from racsim.app import job as J  # lazy: racsim.app.job loads the simulator only when a job runs

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    found: list = []  # non-finite values where a number must be: the run fails once its files are written
    try:
        with _warnings_unless_refused() as held:
            replace_grid(cfg, hc.overrides.task)  # Hydra merged the grid given; it replaces the scenario's
            measured_as_given(cfg, hc.overrides.task)  # an empirical law chosen here: its data as measured
            job = Job(cfg, out_dir)  # resume=true: a job whose results are complete is skipped
            if job.skip:
                say(f"racsim: {job.label}: results complete in {out_dir}, skipped (resume)")
                return
            prepared = take_prepared(job.num)  # a sweep job the racsim launcher computed with its batch, its cell checked
            # a sweep job's progress is the sweep's job counter (racsim.sweep.callback)
            with Progress(cfg.name, mode="auto" if cfg.output.progress and not in_multirun() else "off",
                          tail=[J.WRITING]) as progress:
                if prepared is not None:
                    spec, res = prepared  # the job's spec, as racsim.config.spec.scenario gives it, and its results
                else:
                    job.computing()
                    spec = J.scenario(cfg)  # the config boundary: checked against the schema, typed dataclasses
                    try:
                        res = J.compute(spec, progress=progress)  # the same as racsim.run's
                    except MemoryError:  # past racsim.config.validate.check_limits' estimate: one line naming the knob
                        raise J.memory_error(cfg) from None
                progress.start(J.WRITING, 1)
                digests: dict = {}
                about, changes = ([], []) if lean_job(cfg) else J.inputs_of(spec, hc)  # a lean job writes no summary.md
                yaml_text = functools.partial(J.config_yaml, cfg)  # config.yaml: the composed config's, when written
                written = publish_run(out_dir, cfg, lambda stage: J.write_run(stage, spec, res, yaml_text,
                                                                            lean=lean_job(cfg), digests=digests,
                                                                            found=found, about=about))
                progress.finish()
            keep_created()
            if found:
                held.clear()
    except (ConfigError, OmegaConfBaseException, ImportError, OSError) as ex:
        # SystemExit rather than the exception: Hydra would log the failed job first.
        if isinstance(ex, (ImportError, OSError)) and error_line(ex) is None:  # not a package's or the disk's: a bug
            raise
        if in_multirun():  # a sweep job: the others go on, the sweep lists it when it ends; its folders are the sweep's
            raise
        remove_created()
        if "HYDRA_FULL_ERROR" in os.environ and not _FRIENDLY:
            raise
        say(f"racsim: error: {error_line(ex)}", sys.stderr)
        sys.exit(EXIT_USAGE)
    if found:
        _fail_after_writing(found, cfg, out_dir, job)
    job.finish(written, digests)  # done.json, the completion marker: the last file written
    if job.num is not None:  # a sweep job: one line, the table is in its folder and the sweep's
        say(f"racsim: {job.label}: results in {out_dir}")
        return
    for change in changes:
        say(f"racsim: note: {change}")
    say(J.capacity_text(spec, res, _STARTED) if spec.capacity.enabled else J.run_text(spec, res, _STARTED))
    say(f"racsim: results in {out_dir}")
    if spec.capacity.enabled and res.status == "infeasible":  # complete, but no count to recommend: main exits 3
        _EXIT.append(EXIT_INFEASIBLE)


@contextlib.contextmanager
def _warnings_unless_refused():
    """Hold the warnings raised inside (NumPy's overflow of an extreme setting...): shown when
    the block ends normally, dropped when it raises (a refusal is one line)."""
    with warnings.catch_warnings(record=True) as held:
        yield held  # the caller may clear it (a run that fails after writing: its one line stands alone)
    for w in held:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _fail_after_writing(found: list, cfg, out_dir: Path, job) -> None:
    """End a run whose tables hold a non-finite value where a number must be (``found``,
    racsim.report.finite), once its files are published: one line naming the rows, exit 1,
    the files kept, no done.json (``resume=true`` reruns it). A sweep job raises it: the
    sweep lists it among the failed jobs."""
    from racsim.app import job as J  # lazy: see _task

    ex = J.failure(found, lambda: J.config_yaml(cfg), f"everything computed is written to {out_dir} "
                                                  f"(summary.md names the rows; no done.json)")
    job.close()
    if in_multirun():
        raise ex
    release()
    say(f"racsim: error: {ex}", sys.stderr)
    sys.exit(EXIT_FAILED)


def error_line(ex: BaseException) -> "str | None":
    """The one line racsim prints for a user's mistake ``ex`` (a bad value, key, scenario or
    config file); None for anything else, which is a bug to show in full. The command line
    and ``racsim.run`` (racsim.app.api) word their errors alike through it."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(ex, ConfigError):
        return str(ex)
    wrote = write_failure(ex, f"{folder_key()}=DIR")  # racsim's files or Hydra's own
    if wrote:
        return wrote
    if isinstance(ex, (HydraException, OmegaConfBaseException)):
        return _one_line(ex)
    return _usage_error(ex)


SCENARIO_FILE = " (a scenario file is a YAML mapping that begins with '# @package _global_')"


def _one_line(ex: BaseException) -> str:
    """Shorten a Hydra/OmegaConf exception chain to 'key: reason'."""
    from omegaconf.errors import OmegaConfBaseException, ValidationError

    from hydra.errors import OverrideParseException

    chain = causes(ex)
    friendly = _mistyped(chain)
    if friendly:
        return friendly
    unread = next((e for e in chain if isinstance(e, OverrideParseException)), None)
    if unread is not None and "=" in unread.override:
        return _quote_hint(unread)
    for e in chain:
        if isinstance(e, OmegaConfBaseException) and getattr(e, "full_key", None):
            msg = str(e).splitlines()[0].strip()
            if "is not Optional" in msg:
                return names.not_null(e.full_key)
            if isinstance(e, ValidationError) and getattr(e, "value", None) is not None:  # a value of the wrong type
                allowed = _allowed(e.full_key)
                if allowed:  # in the words of the key's range rule, as an out-of-range value is refused
                    return str(ConfigError(e.full_key, e.value, allowed))
            if e.full_key == "scenario":  # a scenario file that is empty, not a mapping, or lacks its header
                msg += SCENARIO_FILE
            return f"{e.full_key}: {msg}"
    text = str(ex).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(ex).__name__
    if text.startswith("Interpolation") or "interpolation" in type(ex).__name__.lower():
        refs = [a for a in sys.argv[1:] if "${" in a]  # which override: the resolver does not say
        return f"{' '.join(refs) + ': ' if refs else ''}{lines[0]}"
    if "Available options" in text:
        i = next(i for i, ln in enumerate(lines) if ln.startswith("Available options"))
        options = []
        for ln in lines[i + 1:]:
            if ln.startswith("Config search path"):
                break
            options.append(ln)
        return f"{lines[0]} ({lines[i].rstrip(':').lower()}: {', '.join(options)})"
    return " ".join(lines[:2])


def _allowed(key: str) -> "str | None":
    """What the rules allow at ``key`` in the scenario asked for (racsim.config.validate.allowed_at), or None."""
    try:
        return allowed_at(compose_config(f"scenario={_scenario_arg()}"), key)
    except Exception:  # a scenario that does not compose: OmegaConf's words stand
        return None


def _mistyped(chain: list) -> "str | None":
    """A mistyped key (``pipline.steps=3``) or config group option (``scenario=capacity/judge_h100``,
    ``hydra/launcher=ray`` without its plugin) in an exception chain, in racsim.config.names' words."""
    import re

    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    for e in chain:
        m = re.match(r"Could not (?:override|append to config)\W+'?([^'\s]+)'", str(e))
        if m and any(isinstance(c, (ConfigKeyError, ConfigAttributeError)) and " not in " in str(c) for c in chain):
            return names.unknown_key(m.group(1).lstrip("+~"))
        if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
            group, option = e.missing_cfg_file.rsplit("/", 1)
            if group.startswith("scenario/"):  # a scenario in a folder: capacity/judge_rm_h100
                group, option = "scenario", e.missing_cfg_file.split("/", 1)[1]
            given = next((a.split("=", 1)[0] for a in sys.argv[1:]
                          if re.match(rf"[+~]*{re.escape(group)}(@[^=]*)?={re.escape(option)}$", a)), group)
            return names.unknown_option(group, option, e.options, given.lstrip("+~"))
    return None


def _quote_hint(ex) -> str:
    """A value Hydra's override grammar cannot read bare (a path with ``=``, ``~`` or a non-ASCII
    letter): how to quote it, in one line."""
    key, _, value = ex.override.partition("=")
    why = " ".join(str(ex.message).split("See https://")[0].split())
    if not (set(value) & set("=~ \t") or not value.isascii()):  # a typo, not a character to quote
        return f"{ex.override}: Hydra cannot read this override ({why})"
    home = " (a leading ~ stays a ~ inside quotes: write the full path)" if value.startswith("~") else ""
    return (f"{ex.override}: Hydra cannot read this value unquoted ({why}); quote it for Hydra inside quotes for "
            f"the shell: '{key}=\"{value}\"'{home}")


def _usage_error(ex: BaseException) -> "str | None":
    """'file or key: reason' for the mistakes that reading the configuration
    raises outside Hydra's own exception types (a scenario file that is not
    valid YAML or not UTF-8, a config group given a number as in ``scenario=1``);
    None for anything else, which is a bug to show in full."""
    import yaml

    if isinstance(ex, ImportError) and missing_extra(ex.name):  # an optional package this run needs
        return f"{ex.name} is not installed: {missing_extra(ex.name)}"
    frames, tb = [], ex.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if isinstance(ex, RecursionError):
        return ("a config file includes itself, or its defaults lists nest deeper than Python allows "
                f"(scenario={_scenario_arg()}): break the cycle")
    override = next((f.f_locals["override"] for f in reversed(frames)
                     if getattr(f.f_locals.get("override"), "input_line", None)), None)
    if override is not None and isinstance(ex, (AssertionError, AttributeError, TypeError)):
        return _null_parent(override, frames) or f"{override.input_line}: cannot be applied ({type(ex).__name__}: {ex})"
    innermost = frames[-1].f_code.co_filename if frames else ""
    from_hydra = f"{os.sep}hydra{os.sep}" in innermost
    source = next((f.f_locals["config_path"] for f in reversed(frames)
                   if isinstance(f.f_locals.get("config_path"), str)), None)
    reading = f"{os.sep}omegaconf{os.sep}" in innermost or from_hydra  # where config files are read
    if isinstance(ex, OSError) and source is not None and reading:  # OmegaConf.load of a config file: a scalar, a list
        loaded = str(ex).rpartition("Invalid loaded object type: ")[2] if "Invalid loaded object" in str(ex) else None
        return (f"{source}: holds a YAML {loaded}, not a mapping{SCENARIO_FILE}" if loaded
                else f"{source}: cannot be read ({ex.strerror or ex})")
    if isinstance(ex, (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        # a file or folder of the machine's (a temporary folder that cannot be written), not a config file
        hint = ": set TMPDIR to a folder you can write to" if "temporary" in str(ex) else ""
        return f"{ex.filename + ': ' if ex.filename else ''}{ex.strerror or ex}{hint}"
    if not (isinstance(ex, (yaml.YAMLError, UnicodeDecodeError)) or (from_hydra and isinstance(ex, ValueError))):
        return None
    if isinstance(ex, yaml.MarkedYAMLError) and ex.problem_mark is not None:
        where = f"{source or ex.problem_mark.name}, line {ex.problem_mark.line + 1}"
        return f"{where}: not valid YAML: {ex.problem}"
    if isinstance(ex, UnicodeDecodeError):
        return f"{source or 'a config file'}: not UTF-8 text ({ex.reason} at byte {ex.start})"
    reason = " ".join(str(ex).split())
    if "Config group override" in reason:  # which override: a group given a number, a list or nothing
        bad = [a for a in sys.argv[1:] if _bad_group_choice(a)]
        return f"{' '.join(bad) or 'a config group override'}: a config group takes a name ({reason})"
    return f"{source + ': ' if source else ''}{reason}"


def _scenario_arg() -> str:
    return next((a.split("=", 1)[1] for a in sys.argv[1:] if a.lstrip("+").startswith("scenario=")), "default")


def _null_parent(override, frames) -> "str | None":
    """'KEY=VALUE: PARENT is null ...' when an override sets a key under a block that is null
    (``pipeline.delay_distribution.mean=3`` while there is none), with how to set the block first
    (an RM block is created instead: racsim.config.schema.null_rm_block)."""
    from omegaconf import OmegaConf

    cfg = next((f.f_locals["cfg"] for f in reversed(frames) if OmegaConf.is_config(f.f_locals.get("cfg"))), None)
    parts = str(override.key_or_group).split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if cfg is not None and OmegaConf.select(cfg, parent, default=0) is None:
            return (f"{override.input_line}: {parent} is null (not set), so its keys cannot be set one by one: "
                    f"set the block first ({parent}={{...}})")
    return None


def _bad_group_choice(arg: str) -> bool:
    """``scenario=nan``, ``=5``: a config group (a folder of conf/, or scenario) given a non-name."""
    from importlib.resources import files

    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        o = OverridesParser.create().parse_override(arg)
    except Exception:
        return False
    groups = {p.name for p in files("racsim.conf").iterdir() if p.is_dir()} | {"scenario", ""}
    return o.key_or_group.lstrip("/") in groups and not isinstance(o.value(), (str, list))


MAX_YAML_NODES = 1_000_000  # values of one config file once its aliases are expanded


def _expanded_nodes(node, memo: dict) -> int:
    """How many YAML nodes ``node`` stands for once every alias (``*a``) is copied out."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a node that refers to itself counts once
    n = 1
    for item in node.value if isinstance(node.value, list) else ():
        for sub in item if isinstance(item, tuple) else (item,):
            n += _expanded_nodes(sub, memo)
    memo[id(node)] = n
    return n


def guard_yaml() -> None:
    """Refuse a YAML alias bomb (a few lines of ``&a``/``*a`` that expand to billions of
    values) before OmegaConf copies it out: the loader Hydra reads config files with
    counts the expanded nodes of each file first (a YAMLError naming the file)."""
    import omegaconf._utils as ou
    import yaml

    if getattr(ou.get_yaml_loader, "racsim_guard", False):
        return
    base = ou.get_yaml_loader

    def get_yaml_loader():
        class Loader(base()):
            def compose_document(self):
                node = super().compose_document()
                if node is not None and _expanded_nodes(node, {}) > MAX_YAML_NODES:
                    raise yaml.YAMLError(f"more than {MAX_YAML_NODES:,} values once its aliases (*name) are "
                                         f"expanded: refused (an alias bomb?)")
                return node
        return Loader

    get_yaml_loader.racsim_guard = True
    ou.get_yaml_loader = get_yaml_loader


_SAID = False  # this command's interrupt line is written (a second Ctrl-C then ends it quietly)


def _again(signum, frame) -> None:
    """A second Ctrl-C while the first is answered (its line, the run's files taken away): end now,
    with a line of its own if the first one's was not written yet."""
    if not _SAID:
        os.write(2, b"racsim: interrupted again: stopped at once (what the run wrote may remain)\n")
    os._exit(130)


def _answering():
    """Ctrl-C answered by :func:`_again` from now on (in the main thread); the handler it replaced, to restore."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, _again)


def main(started: Optional[float] = None) -> None:
    """The command (``racsim`` and ``python -m racsim``, through racsim.__main__, which passes when it
    ``started``: a perf_counter reading; else now). The times the command prints count from it."""
    import hydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    global _FRIENDLY, _STARTED, _SAID
    catch_sigint()  # a Ctrl-C is remembered from here on, where a library turns it into another error
    _SAID = False
    _STARTED = time.perf_counter() if started is None else started
    friendly = _FRIENDLY = "HYDRA_FULL_ERROR" not in os.environ
    answering = None
    _EXIT.clear()
    try:
        if friendly:
            os.environ["HYDRA_FULL_ERROR"] = "1"  # let errors reach us instead of Hydra's printer
        guard_yaml()
        register_configs()
        register_resolvers()
        if not OmegaConf.has_resolver("racsim.help"):  # racsim --help (hydra.help.template)
            OmegaConf.register_new_resolver("racsim.help", help_text)
        app = hydra.main(version_base="1.3", config_path="pkg://racsim.conf", config_name="config")(_task)
        try:
            app()
        except Exception:  # a Ctrl-C inside Hydra or OmegaConf can leave a node half made, and the next
            raise_pending_interrupt()  # step fail on it (AttributeError): the interrupt is what happened
            raise
        if _EXIT:  # a complete single run whose answer says no (a capacity plan's infeasible targets)
            sys.exit(_EXIT.pop())
    except BrokenPipeError:  # stdout closed by its reader (racsim ... | head): what was written stays
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes it
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command its pipe stopped
    except KeyboardInterrupt as ex:  # Ctrl-C (or SIGTERM during a single run: racsim.sweep.Stopped)
        answering = _answering()  # a second Ctrl-C while this one is answered: no traceback
        say(f"racsim: {_interrupted()}", sys.stderr)  # first: a second Ctrl-C during the clean-up ends it quietly
        _SAID = True
        end_detached()  # submitit_local's controllers, in groups of their own: the Ctrl-C reached racsim alone
        exit_interrupted(143 if stopped_by_sigterm(ex) else 130)
    except (HydraException, OmegaConfBaseException, ConfigError) as ex:
        remove_created()  # what this process made before the run could start
        if not friendly:
            raise
        say(f"racsim: error: {error_line(ex)}", sys.stderr)
        sys.exit(EXIT_USAGE)
    except Exception as ex:  # a YAML or encoding error in a config file, a bad group choice
        remove_created()
        msg = error_line(ex) if friendly else None
        if msg is None:
            raise
        say(f"racsim: error: {msg}", sys.stderr)
        sys.exit(EXIT_USAGE)
    finally:
        end_single_run()  # gives SIGINT back the handler the run found
        if answering is not None:  # exiting on the interrupt: ignored while Python ends (it would restore
            # the default action for a handler written in Python, and a Ctrl-C then would kill it, exit -2)
            signal.signal(signal.SIGINT, signal.SIG_IGN if sys.exc_info()[0] is SystemExit else answering)
        if friendly:  # leave the environment as found (main() may be called again in-process)
            os.environ.pop("HYDRA_FULL_ERROR", None)


MULTIRUN = {"-m", "--multirun", "hydra.mode=MULTIRUN"}  # the arguments that make the command a sweep


def folder_key() -> str:
    """The key that sets the command's output folder: ``hydra.sweep.dir`` for a sweep, else ``hydra.run.dir``."""
    return "hydra.sweep.dir" if MULTIRUN & set(sys.argv[1:]) else "hydra.run.dir"


def _interrupted() -> str:
    """What an interrupt did, on one line. A single run that had not finished takes away what it
    wrote (its folder, or its own files in a folder that existed) and gives its folder back; a
    sweep keeps every complete job (done.json) and reruns the rest on resume."""
    run, sweep = single_run(), folder_key() == "hydra.sweep.dir"
    if run is None and not (sweep and holding()):
        remove_created()
        return f"interrupted before the {'sweep' if sweep else 'run'} began; nothing was written"
    if run is None:
        release()  # the sweep's folder: its lock goes with it, its finished jobs stay
        return "interrupted; rerun the same command with resume=true to finish a sweep"
    if run["done"]:
        release()
        return f"interrupted after the run finished; results in {run['dir']}"
    remove_created()
    where = f"its files in {run['dir']} are" if run["dir"].exists() else f"its folder {run['dir']} is"
    return f"interrupted: the run did not finish, and {where} removed (run it again)"


if __name__ == "__main__":
    main()
