"""The config package: the typed schema (``schema``), its enums (``enums``) and loading a config (``load``).

``python -m envace.config profile=smoke`` composes conf/ and writes params.yaml (``__main__``).
"""
