"""When is each slow result usable? The pipeline's timing, apart from learning.

``draws`` (every random number of a run, drawn once), ``latency`` (duration
laws), ``service`` (GPU batch times), ``batcher`` (the GPU batcher's dispatch
rule), two engines on the same draws -- ``lanes`` (numpy over trials) and
``simpy_engine`` (the engine of record) -- chosen in ``engines``; ``landing``
(from completion times to delays in steps), ``schedule`` (the ArrivalSchedule
where timing meets the learner), ``kernels`` (explicit delay kernels, drain)
and ``stats`` (queue statistics).
"""
