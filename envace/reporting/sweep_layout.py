"""How the rehearsal sweep's cells are laid out in ``metrics/rehearsal_sweep.json``: keyed by a stable name,
``<benchmark>/<mode>/n<N>/<rehearser>`` (``cell_name``), so that DVC sees every cell's numbers; the report
reads them back as the list of rows in grid order (``with_cell_rows``). The sweep stage writes the layout,
the report and ``envace.reporting.testtime_plots`` read it.
"""

from __future__ import annotations

import re
from typing import Any

from envace.config.load import to_plain

# ``cell_name`` parsed back (``envace.reporting.testtime_plots.sweep_cells``)
# how a rehearser key reads in plots and tables (``base`` is the REHEARSE role of the weights RL started from)
REHEARSER_LABELS = {"trained": "trained", "base": "SFT-start", "oracle": "oracle (sandboxed env)"}
CELL_NAME = re.compile(r"^(?P<benchmark>[^/]+)/(?P<mode>[^/]+)/n(?P<n_attempts>\d+)/(?P<rehearser>[^/]+)$")


def cell_name(row: dict[str, Any]) -> str:
    """A grid row's stable name: ``toolworld/parallel/n2/trained`` (``toolworld/none/n0/none`` for N=0)."""
    return f"{row['benchmark']}/{row['mode']}/n{row['n_attempts']}/{row['rehearser']}"


def keyed_cells(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Grid rows keyed by ``cell_name`` (each name once: the grid has one cell per setting)."""
    keyed: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = cell_name(row)
        if name in keyed:
            raise ValueError(f"rehearsal_sweep: two cells named {name!r}")
        keyed[name] = row
    return keyed


def cells_list(
    cells: dict[str, dict[str, Any]] | list[dict[str, Any]],
    modes: list[str] | None = None,
    rehearsers: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``keyed_cells`` again, in grid order: per benchmark, N ascending, then ``modes`` and
    ``rehearsers`` in the order given (the config's, as the sweep ran them; default parallel, sequential
    and trained, base), unknown names last. A list is returned as it is."""
    if isinstance(cells, list):
        return cells
    mode_rank = {m: i for i, m in enumerate(["none", *(modes or ["parallel", "sequential"])])}
    rehearser_rank = {r: i for i, r in enumerate(["none", *(rehearsers or ["trained", "base", "oracle"])])}

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        mode, rehearser = str(row.get("mode")), str(row.get("rehearser"))
        return (
            str(row.get("benchmark", "")),
            int(row.get("n_attempts") or 0),
            mode_rank.get(mode, len(mode_rank)),
            mode,
            rehearser_rank.get(rehearser, len(rehearser_rank)),
            rehearser,
        )

    return sorted(cells.values(), key=order)


def with_cell_rows(sweep: Any, cfg: Any) -> Any:
    """This stage's metrics as read back (``load_metrics``), its keyed ``cells`` as the list of rows; ``cfg``: the
    typed config (or a composed one), whose ``rehearsal`` section orders the grid."""
    if isinstance(sweep, dict) and isinstance(sweep.get("cells"), dict):
        r = cfg.rehearsal
        sweep = {**sweep, "cells": cells_list(sweep["cells"], to_plain(r.modes), to_plain(r.rehearsers))}
    return sweep
