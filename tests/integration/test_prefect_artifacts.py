"""The flow run's artifacts (issue 14): ``tasks.stages.publish_report`` publishes ``report.md`` as a
markdown artifact and the main tables as table artifacts, against a real (temporary) Prefect server."""

from __future__ import annotations

import json


def test_publish_report_creates_markdown_and_table_artifacts_of_the_flow_run(tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.testing.utilities import prefect_test_harness

    from tasks.stages import REPORT_ARTIFACT, publish_report

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "report.md").write_text("# envace report\n\n| method | toolworld |\n|---|---|\n| envace | 12.5 |\n")
    (reports / "main.csv").write_text("method,toolworld,Overall\nenvace,12.5,\nbase,0.0,nan\n")
    (reports / "testtime.csv").write_text("")  # written empty: skipped

    @flow(name="publish-test")
    def publish(root: str):
        from prefect.runtime import flow_run

        return str(flow_run.id), publish_report(root)

    with prefect_test_harness(server_startup_timeout=120):
        run_id, made = publish(str(tmp_path))
        assert set(made) == {REPORT_ARTIFACT, "envace-main-table"}
        with get_client(sync_client=True) as client:
            artifacts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
    by_key = {a.key: a for a in artifacts}
    assert set(by_key) == {REPORT_ARTIFACT, "envace-main-table"}
    assert by_key[REPORT_ARTIFACT].type == "markdown" and "# envace report" in by_key[REPORT_ARTIFACT].data
    table = by_key["envace-main-table"]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert table.type == "table" and rows == [
        {"method": "envace", "toolworld": 12.5, "Overall": None},
        {"method": "base", "toolworld": 0.0, "Overall": None},
    ]
