"""The flow run's artifacts (issue 14, issue 45 point 9): ``tasks.stages.publish_report`` publishes
``report.md`` as a markdown artifact, its plots named by where they are (Prefect's UI cannot open a file
beside the report), and the main tables as markdown tables rounded as the report rounds them, against a
real (temporary) Prefect server."""

from __future__ import annotations

import pandas as pd

from envace.reporting.tables import render_markdown

MAIN = pd.DataFrame(
    {
        "contender": ["policy", "base"],
        "method": ["envace (tiny)", "tiny (sft)"],
        "toolworld": [48.98908364545973, 0.0],
        "toolworld/n": [8, 8],
        "toolworld/ci_low": [21.52340917, 0.0],
        "toolworld/ci_high": [76.98713, 32.44349],
        "toolworld/status": [None, None],
        "Overall": [48.98908364545973, None],
    }
)
TESTTIME = pd.DataFrame(
    {
        "n_attempts": [0, 2],
        "mode": ["none", "parallel"],
        "success_rate": [0.4898908, 0.25],
        "success_rate/n": [4, 4],
        "success_rate/ci_low": [0.15004, 0.0456],
        "success_rate/ci_high": [0.8499, 0.6994],
    }
)


def test_publish_report_creates_markdown_artifacts_of_the_flow_run(tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.testing.utilities import prefect_test_harness

    from tasks.stages import REPORT_ARTIFACT, publish_report

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "report.md").write_text(
        "# envace report\n\n| method | toolworld |\n|---|---|\n| envace | 12.5 |\n\n## Plots\n\n"
        "![training_curve.png](training_curve.png)\n![testtime.png](testtime.png)\n"
    )
    MAIN.to_csv(reports / "main.csv", index=False)
    TESTTIME.to_csv(reports / "testtime.csv", index=False)
    (reports / "fidelity.csv").write_text("")  # written empty: skipped

    @flow(name="publish-test")
    def publish(root: str):
        from prefect.runtime import flow_run

        return str(flow_run.id), publish_report(root)

    with prefect_test_harness(server_startup_timeout=120):
        run_id, made = publish(str(tmp_path))
        assert set(made) == {REPORT_ARTIFACT, "envace-main-table", "envace-testtime-table"}
        with get_client(sync_client=True) as client:
            artifacts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
    by_key = {a.key: a for a in artifacts}
    assert set(by_key) == set(made) and {a.type for a in artifacts} == {"markdown"}
    report = by_key[REPORT_ARTIFACT].data
    assert "# envace report" in report and "| envace | 12.5 |" in report
    assert "](" not in report, "a local image Prefect's UI shows broken"
    for plot in ("training_curve.png", "testtime.png"):
        assert f"`{reports / plot}`" in report
    # the tables as report.md shows them: percentages to 1 place, fractions to 3, n and interval folded in
    main = by_key["envace-main-table"].data
    assert main == render_markdown(MAIN.drop(columns=["contender"]), 1)
    assert "49.0 [21.5, 77.0] (n=8)" in main and "48.989" not in main
    assert by_key["envace-testtime-table"].data == render_markdown(TESTTIME, 3)
    assert "0.490 [0.150, 0.850] (n=4)" in by_key["envace-testtime-table"].data
