"""What the ``racsim`` command tells a person: ``racsim --help`` (:func:`help_text`, Hydra's
``hydra.help.template``, conf/config.yaml): every scenario with its description, the config
groups and the knobs people change most. The words of usage errors are racsim.config.names'.

Light: the standard library and racsim.config.names only (no NumPy).
"""

from __future__ import annotations

from typing import Tuple

from racsim.config.names import description, config_groups, scenario_names
from racsim.errors import WIDTH, wrapped

# The knobs people change most, each with one example (tests/test_guide.py composes every one).
KNOBS: Tuple[Tuple[str, str], ...] = (
    ("seed=1", "the random seed: the same config and seed give byte-identical results"),
    ("pipeline.steps=200", "optimizer steps per trial"),
    ("pipeline.batch_size=8", "trajectories (prompts) per optimizer step"),
    ("learner.trials=200", "Monte-Carlo trials per corrector: more trials, tighter bias estimates"),
    ("corrector.names=[naive,rac]", "the correctors to compare (default: all of them)"),
    ("corrector.tau_age=50", "RAC's age scale, in optimizer steps"),
    ("pipeline.channels.judge.workers=8", "workers serving a slow channel (here the judge)"),
    ("pipeline.channels.judge.latency.mean=30", "mean latency of a channel's law, in seconds"),
    ("pipeline.channels.judge.latency.kind=empirical pipeline.channels.judge.latency.path=delays.csv "
     "pipeline.channels.judge.latency.column=seconds",
     "your own measured delays (a CSV column), used as measured; add latency.mean=S to rescale them"),
    ("capacity.counts=[1,2,4,8]", "the GPU or worker counts a capacity scenario tries"),
)

def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def help_text() -> str:
    """``racsim --help``: usage, every scenario with its description (cut to one line), the config groups
    and the knobs people change most, each line at most racsim.errors.WIDTH wide. (No '$': Hydra reads it
    as a string.Template.)"""
    names = scenario_names()
    width = max(len(n) for n in names) + 2
    lines = [
        "racsim: simulate an asynchronous reward pipeline for RLHF and compare its correctors on wall-clock and bias.",
        "",
        "Usage:",
        "  racsim                                  run the default scenario",
        "  racsim scenario=NAME [KEY=VALUE ...]    run a scenario, with overrides",
        "  racsim -m KEY=V1,V2 [KEY=V3,V4 ...]     a sweep: one job per combination (racsim-report gathers them)",
        "  racsim [scenario=NAME] --cfg job        print the composed configuration (every key) and stop",
        "  racsim --hydra-help                     Hydra's own flags",
        "",
        "Scenarios (scenario=NAME):",
    ]
    lines += [f"  {n:<{width}}{_shorten(description(n), WIDTH - 2 - width)}" for n in names]
    lines += ["", "Config groups (GROUP=OPTION; at a channel: latency@pipeline.channels.NAME.latency=KIND, "
                  "and +channel@pipeline.channels.NEW=OPTION adds one):"]
    lines += [f"  {g:<10}{', '.join(o)}" for g, o in config_groups().items()]
    lines += ["", "The knobs people change most (KEY=VALUE; the scenarios name their channels: see --cfg job):"]
    for example, what in KNOBS:
        lines += [f"  {what}:", f"      racsim {example}"]
    lines += ["  GRPO on a small transformer policy instead of the tabular learner (pip install -e \".[rm]\"):",
              "      racsim learner=lm",
              "",
              "Outputs go to outputs/NAME/<time>/ (summary.md explains every column). A mistake in a key or value "
              "ends in one line naming the key and what is allowed, with exit status 2."]
    return wrapped("\n".join(lines))


