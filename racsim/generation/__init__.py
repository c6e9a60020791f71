"""Asynchronous generation (``pipeline.generation.mode=async``, issue 46): rollout engines that run
ahead of the trainer, the policy version of every sample, and the schedule the learner reads.

``lane`` (one trial: :class:`~racsim.generation.lane.LaneInputs` -> :class:`~racsim.generation.lane.LaneTrace`,
the fast event loop), ``simpy_lane`` (the SimPy engine of record of the same model), ``state`` (the model both
drive), ``draws`` (the lengths and gate-all service times, from their own random streams), ``schedule`` (the
bridge: a run's :class:`~racsim.pipeline.schedule.ArrivalSchedule` in async mode) and ``figures`` (what a user
reads of it). The model in words: docs/generation.md.
"""
