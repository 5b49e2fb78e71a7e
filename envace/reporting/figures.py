"""How the pipeline draws a figure: matplotlib on an Agg canvas (no pyplot state), and the conventions
every figure of ``envace.reporting`` follows.

Each ``*_figure`` builder takes plain frames and returns a titled ``Figure`` with labelled axes, or a
string saying why there is nothing to draw (no such data in these metrics); ``draw`` saves what a builder
returns, or passes its reason on. Legends sit outside the axes (right of them, or below a grid), saved
with ``bbox_inches="tight"``; step and N axes have integer ticks; count axes use integer locators.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def new_figure(title: str, nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 3.6)):
    """A figure with an Agg canvas (no pyplot) and its axes (a flat array when there are several)."""
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    fig.suptitle(title)
    return fig, axes


def legend_outside(ax) -> None:
    """The axes' legend to the right of it, outside the data (nothing when there are no labels)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=8, frameon=False)


def integer_ticks(axis) -> None:
    axis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")


def draw(build: Callable[[], Figure | str], path: Path) -> str | None:
    """Build one figure and save it to ``path``: None, or the builder's reason for not drawing it."""
    figure = build()
    if isinstance(figure, str):
        return figure
    save_figure(figure, path)
    return None
