"""Serve the ``envace`` flow as deployment ``full-pipeline`` (run from the repo root).

    python -m flows.serve        # then: prefect deployment run envace/full-pipeline -p overrides='["profile=smoke"]'
"""

from flows.pipeline import envace_flow

if __name__ == "__main__":
    envace_flow.serve(name="full-pipeline")
