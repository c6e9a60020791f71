"""What a user reads of one run: the terminal table (``tables``), the files of a run (``writers``),
plots, the Perfetto trace and Gantt chart (``trace``), capacity reports, the aggregate over seeds
(``aggregate``, which racsim.sweep.gather writes for a sweep) and the comparison with the paper (``paper``).
"""
