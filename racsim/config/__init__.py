"""What is asked: the typed schema (``schema``), the defaults composed from the YAML
config groups (``defaults``) and the validation of a config (``validate``).
"""
