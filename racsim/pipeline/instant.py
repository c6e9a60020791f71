"""The SimPy engine's decision at the end of an instant, shared by its gpu_rm batcher,
its autoscaled pools and its failing queue workers."""

from __future__ import annotations


class EndOfInstant:
    """A decider process: once poked in an instant, it runs ``self._decide(now)`` after every
    other event of that instant (arrivals, completions, releases) is in, through a late event
    (simpy_engine's ``_Late``, passed as ``late_cls``). Subclasses define ``_decide``."""

    def _start_decider(self, env, late_cls) -> None:
        self.env, self.Late = env, late_cls
        self.wake = env.event()
        env.process(self._decider())

    def _poke(self, _=None) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def _decider(self):
        while True:
            yield self.wake
            self.wake = self.env.event()
            yield self.Late(self.env)
            self._decide(self.env.now)

    def _decide(self, tau: float) -> None:
        raise NotImplementedError
