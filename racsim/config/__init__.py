"""What is asked: the typed schema (``schema``), its validation (``validate``) and the
expansion of a study grid into validated cells (``grid``).
"""
