"""What a user reads: the terminal table (``tables``), the files of a run (``writers``),
plots, the Perfetto trace and Gantt chart (``trace``), capacity reports, the
sweep aggregate (``gather``) and the comparison with the paper (``paper``).
"""
