"""Validation of a composed config: each spec's rules next to each other, one module per spec.

:func:`validate` checks every value's range and the cross-field rules and raises
:class:`~racsim.errors.ConfigError` naming the key, the value and what is allowed;
:func:`check_schema` catches what the schema's types let through on the command line;
:func:`check_limits` refuses a run past its budgets. Nothing here builds a model.

``top`` (the whole config, and the order its specs are checked in), ``schema_check`` (leaf by
leaf: unknown keys, NaN, MISSING, int64), ``latency`` (a duration law), ``rm`` (an RM server),
``channel`` (a slow channel: queue or gpu_rm, routing, bursts, autoscale, faults), ``pipeline``
(the clock, phases, channels, fast_rm, arrivals), ``corrector``, ``learner`` (tabular and lm),
``study`` (study, probe, grid), ``capacity``, ``estimate`` (a run's memory and time) and
``limits`` (the budgets), all written with ``common``'s ``need``.
"""

from racsim.config.validate.capacity import (RUN_LENGTHS, sensitivity_inputs, split_judge, split_unit, validate_capacity,
                                              validate_split)
from racsim.config.validate.channel import (
    FAILURE_POLICIES,
    FAULT_SECONDS,
    MIN_UP_VS_REPAIR,
    faults_on,
    validate_autoscale,
    validate_channel_kind,
    validate_faults,
)
from racsim.config.validate.common import INT64, MAX_GAIN
from racsim.config.validate.estimate import (
    BASELINE_BYTES,
    CHANNEL_SIZE_KEYS,
    F8,
    FAULT_EVENT_BYTES,
    FAULT_EVENTS_PER_S,
    PROBE_DRAWS,
    ROLLOUT_CHUNK,
    SIZE_KEYS,
    TRAJECTORY_STEPS_PER_S,
    biggest_knob,
    fault_events,
    longest_steps,
    memory_terms,
    run_estimate,
    run_sizes,
    search_top,
)
from racsim.config.validate.latency import MAX_ALPHA, MAX_SECONDS, MAX_SIGMA, cauchy_window_mass, validate_latency
from racsim.config.validate.learner import validate_lm
from racsim.config.validate.limits import (
    check_data_files,
    check_limits,
    machine_memory_gb,
    memory_error,
    memory_room,
    process_memory,
    runs_that_fit,
)
from racsim.config.validate.pipeline import validate_arrivals
from racsim.config.validate.rm import validate_rm
from racsim.config.validate.schema_check import (
    MISSING_ALLOWED,
    RM_PICKS,
    check_leaves,
    check_schema,
    first_missing,
    leaves,
    missing_error,
)
from racsim.config.validate.study import grid_cells
from racsim.config.validate.top import allowed_at, check_name, validate, validate_changed, validate_rules

__all__ = [
    "BASELINE_BYTES", "allowed_at", "CHANNEL_SIZE_KEYS", "F8", "FAILURE_POLICIES", "FAULT_EVENTS_PER_S", "FAULT_EVENT_BYTES",
    "FAULT_SECONDS", "INT64", "MAX_ALPHA", "MAX_GAIN", "MAX_SECONDS", "MAX_SIGMA", "MIN_UP_VS_REPAIR",
    "MISSING_ALLOWED", "PROBE_DRAWS", "RM_PICKS", "ROLLOUT_CHUNK", "RUN_LENGTHS", "SIZE_KEYS",
    "TRAJECTORY_STEPS_PER_S", "biggest_knob", "cauchy_window_mass", "check_data_files", "check_leaves",
    "check_limits", "check_name", "check_schema", "fault_events", "faults_on", "first_missing", "grid_cells",
    "leaves", "longest_steps", "machine_memory_gb", "memory_error", "memory_room", "memory_terms", "missing_error",
    "process_memory", "run_estimate", "run_sizes", "runs_that_fit", "search_top", "sensitivity_inputs", "validate",
    "split_judge", "split_unit", "validate_arrivals", "validate_autoscale",
    "validate_capacity", "validate_changed", "validate_channel_kind", "validate_faults", "validate_latency",
    "validate_lm", "validate_rm", "validate_rules", "validate_split",
]
