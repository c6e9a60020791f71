"""The studies a run computes from the pipeline and the learner: a study grid expanded into
validated cells (``grid``), the bias benchmark over a
grid of cells (``bias_study``), the advantage probe (``probe``), the TV bound
(``tvbound``) and the capacity search (``capacity``).
"""
