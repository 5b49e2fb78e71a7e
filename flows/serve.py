"""Serve the ``envace`` flow as deployment ``full-pipeline``, one run at a time (run from the repo root).

python -m flows.serve        # then: prefect deployment run envace/full-pipeline -p overrides='["profile=smoke"]'
"""

from flows.pipeline import serve

if __name__ == "__main__":
    serve()
