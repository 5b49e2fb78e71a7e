"""Test-time private rehearsal (docs/method.md §12): attempts, critiques, memory, one committed execution, sweeps.

Pure logic lives in ``envace.core``: config and records in ``rehearsal``, prompts in ``rehearsal_prompts``,
the critique parser in ``critique``, the memory bound in ``rehearsal_memory``.
"""

from envace.rehearsal.committed import REHEARSAL_PURPOSES, evaluate_with_rehearsal, rehearsed_episode
from envace.rehearsal.controller import RehearsalOutcome, RehearsalSettings, context_for_turn, rehearse
from envace.rehearsal.imagined import RehearserResponder
from envace.rehearsal.sweep import CellCosts, CellResult, run_rehearsal_sweep

__all__ = [
    "REHEARSAL_PURPOSES",
    "CellCosts",
    "CellResult",
    "RehearsalOutcome",
    "RehearsalSettings",
    "RehearserResponder",
    "context_for_turn",
    "evaluate_with_rehearsal",
    "rehearse",
    "rehearsed_episode",
    "run_rehearsal_sweep",
]
