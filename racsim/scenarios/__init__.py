"""Hydra search-path anchor: the config group ``scenario`` is the top-level ``scenarios/`` folder."""
