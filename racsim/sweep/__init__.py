"""Many runs: the Hydra callback of every job (``callback``: resume, progress, signals), racsim's
sweeper and launcher (``sweeper``), submitit's local controllers (``detached``), the done.json
markers and folder ownership (``markers``) and the gathered report of a sweep (``gather``,
racsim-report).
"""
