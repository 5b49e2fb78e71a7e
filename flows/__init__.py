"""Prefect flows: ``envace`` (the pipeline, deployment ``full-pipeline``) and the local server helpers."""
