"""One Prefect task per DVC stage. Each is a thin call of ``dvc repro <stage>``: dvc.yaml stays the
one DAG definition and DVC decides what is up to date (``cache_policy=NO_CACHE`` here).

Stages that may call network endpoints (an LLM judge or user simulator behind an OpenAI-compatible
server: ``evaluate``, ``rehearsal_sweep``) retry; the others fail fast. Every stage task has a timeout
(``TIMEOUT_SECONDS``: generous for the cpu profile, seconds for the smoke one); the flow's ``timeouts``
parameter sets others per stage (``task.with_options(timeout_seconds=...)``, seconds > 0).

``publish_report`` turns the report stage's outputs into artifacts of the flow run (the Prefect UI's
Artifacts tab), all markdown: ``reports/report.md``, its plots named by their paths (the UI cannot open
a file beside the report, so an image there shows broken), and the main tables (``TABLE_ARTIFACTS``)
rendered from their CSV files as the report renders them (``envace.reporting.tables.render_markdown``:
1 decimal for percentages, 3 for fractions, n and interval folded into each score).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from envace.config.load import write_params
from envace.reporting.layout import FRACTION_TABLES
from envace.reporting.tables import render_markdown


def tool(name: str) -> str:
    """An executable of this interpreter's environment (venv/bin/<name>), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def stage_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a stage process: this venv first on PATH (dvc.yaml says ``python``)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def dvc_repro(stage: str, root: str, env: dict[str, str] | None = None) -> None:
    """``dvc repro <stage>`` in ``root``, its output streamed to the Prefect log; raises on failure."""
    logger = get_run_logger()
    cmd = [tool("dvc"), "repro", stage]
    logger.info("%s (in %s)", " ".join(cmd), root)
    proc = subprocess.Popen(
        cmd, cwd=root, env=stage_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        logger.info(line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"`dvc repro {stage}` failed with exit code {proc.returncode}; see the log above")


@task(name="compose_params", cache_policy=NO_CACHE)
def compose_params(overrides: list[str], root: str) -> str:
    """Write params.yaml from conf/ + overrides — the same composition as ``dvc exp run -S``."""
    return str(write_params(overrides, root=root))


@task(name="stage_order", cache_policy=NO_CACHE)
def stage_order(root: str) -> list[str]:
    """Stage names in dvc.yaml order (foreach stages expanded, e.g. ``evaluate@toolworld``)."""
    out = subprocess.run(
        [tool("dvc"), "stage", "list", "--name-only"],
        cwd=root,
        env=stage_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"`dvc stage list` failed in {root}: {out.stderr.strip()}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


# Default timeout per stage task, seconds (one attempt; a retry gets its own). The cpu profile's
# measured times (docs/performance.md) are minutes to ~50 min for train; these leave room for a slower machine.
TIMEOUT_SECONDS = {
    "prepare_data": 10 * 60,
    "template_prompts": 20 * 60,
    "train": 6 * 3600,
    "evaluate": 3 * 3600,
    "rehearsal_sweep": 3 * 3600,
    "report": 10 * 60,
}


def _stage_task(name: str, retries: int = 0) -> Callable[..., None]:
    @task(
        name=name,
        task_run_name="{stage}",
        cache_policy=NO_CACHE,
        retries=retries,
        retry_delay_seconds=30,
        timeout_seconds=TIMEOUT_SECONDS[name],
    )
    def run_stage(stage: str, root: str, env: dict[str, str] | None = None) -> None:
        dvc_repro(stage, root, env)

    return run_stage


prepare_data = _stage_task("prepare_data")
template_prompts = _stage_task("template_prompts")
train = _stage_task("train")
evaluate = _stage_task("evaluate", retries=2)
rehearsal_sweep = _stage_task("rehearsal_sweep", retries=2)
report = _stage_task("report")


def with_timeout(stage_task: Any, seconds: float) -> Any:
    """The task with another timeout, in seconds (> 0)."""
    if not seconds or seconds <= 0:
        raise ValueError(f"task timeout must be a positive number of seconds, got {seconds!r}")
    return stage_task.with_options(timeout_seconds=seconds)


# (report file, artifact key, description): the tables published as table artifacts
TABLE_ARTIFACTS = (
    ("main.csv", "envace-main-table", "Main table: success % per method × benchmark (reports/main.csv)"),
    ("testtime.csv", "envace-testtime-table", "Test-time rehearsal: N × mode × rehearser (reports/testtime.csv)"),
    ("fidelity.csv", "envace-fidelity-table", "World-model fidelity of REHEARSE (reports/fidelity.csv)"),
    ("ablation.csv", "envace-ablation-table", "Ablation: training variant × benchmark (reports/ablation.csv)"),
)
REPORT_ARTIFACT = "envace-report"


# a markdown image whose target is a file (not a web address or a data: URI)
LOCAL_IMAGE = re.compile(r"!\[[^\]]*\]\((?!https?:|data:)([^)\s]+)\)")


def report_for_prefect(report_md: Path) -> str:
    """``report.md`` with each local image replaced by a list item naming the file's path, under one line
    saying where the plots are (Prefect's UI shows such an image broken)."""
    text = report_md.read_text(encoding="utf-8")
    note = (
        f"The plots are PNG files in `{report_md.parent}` (Prefect shows no local image): open them "
        "there, or run `make plots` for one page of every plot."
    )
    files = LOCAL_IMAGE.findall(text)
    if not files:
        return text
    named = LOCAL_IMAGE.sub(lambda match: f"- `{report_md.parent / match.group(1)}`", text)
    first = f"- `{report_md.parent / files[0]}`"
    return named.replace(first, f"{note}\n\n{first}", 1)


def table_markdown(path: Path) -> str:
    """A table the report stage wrote as CSV, rendered as report.md renders it: the precision of its
    table (``FRACTION_TABLES``: 3 decimals, else 1), empty cells as ``—``; "" when it has no rows."""
    frame = pd.read_csv(path) if path.stat().st_size else pd.DataFrame()
    if frame.empty:
        return ""
    frame = frame.astype(object).where(frame.notna(), None)  # an empty cell is None, as in the report's frames
    decimals = 3 if path.stem in FRACTION_TABLES else 1
    return render_markdown(frame.drop(columns=["contender"], errors="ignore"), decimals)


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(root: str, reports_dir: str = "reports") -> dict[str, str]:
    """The report as markdown artifacts of this flow run: ``report.md`` (``report_for_prefect``) and
    ``TABLE_ARTIFACTS`` (``table_markdown``, those the report wrote). Returns {artifact key: its id};
    missing files are logged and skipped."""
    from prefect.artifacts import create_markdown_artifact

    logger = get_run_logger()
    reports = Path(root) / reports_dir
    made: dict[str, str] = {}
    report_md = reports / "report.md"
    if report_md.is_file():
        made[REPORT_ARTIFACT] = str(
            create_markdown_artifact(
                markdown=report_for_prefect(report_md),
                key=REPORT_ARTIFACT,
                description=f"envace report ({report_md})",
            )
        )
    else:
        logger.warning("no %s: the report stage wrote nothing to publish", report_md)
    for name, key, description in TABLE_ARTIFACTS:
        path = reports / name
        table = table_markdown(path) if path.is_file() else ""
        if table:
            made[key] = str(create_markdown_artifact(markdown=table, key=key, description=description))
        else:
            logger.info("table artifact %s skipped: %s is missing or empty", key, path)
    logger.info("published artifacts: %s", ", ".join(made) or "none")
    return made


# dvc.yaml stage name (before any "@item") -> its task
STAGE_TASKS = {
    "prepare_data": prepare_data,
    "template_prompts": template_prompts,
    "train": train,
    "evaluate": evaluate,
    "rehearsal_sweep": rehearsal_sweep,
    "report": report,
}
