"""The end-of-turn rule both episode loops follow (``envace.engines.local.rollout``, ``envace.engines.verl.episode``):
how one generation ended decides what its role's token stream keeps.

- ``END_OF_TURN``: its last token is the chat template's end-of-turn token: kept, and trained with the output.
- ``OTHER_END_TOKEN``: its last token is another token generation stops on (the tokenizer's eos where that
  differs from the template's end of turn; Qwen3's ``<|endoftext|>``): removed from the output, with its
  log-prob, and the end-of-turn token appended as scaffold (not trained), so the stream ends as the
  template would have it before the next message.
- ``SILENT_STOP``: a server stopped before the budget without returning its stop token: end-of-turn appended.
- ``LENGTH``: the token budget ran out; the episode ends (``Termination.MAX_TOKENS``), the text is not parsed.
- ``ABORTED``: the server aborted the request; the episode ends and is not trained on.

The local decoder stops only on end tokens or at the budget, so it meets the first, second and fourth.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

ABORTED_REASONS = frozenset({"aborted", "abort"})
KNOWN_REASONS = frozenset({None, "completed", "stop", "length"}) | ABORTED_REASONS


class Ending(enum.Enum):
    """How one generation ended, and so what its stream keeps."""

    END_OF_TURN = "end_of_turn"  # the template's end-of-turn token closes it: kept, trained
    OTHER_END_TOKEN = "other_end_token"  # another EOS-set token: removed, end-of-turn appended as scaffold
    SILENT_STOP = "silent_stop"  # stopped before the budget without returning a stop token: end-of-turn appended
    LENGTH = "length"  # the token budget ran out: the episode ends (MAX_TOKENS)
    ABORTED = "aborted"  # the server aborted the request: the episode ends (ERROR) and is not trained on


def generation_ending(
    ids: Sequence[int], stop_reason: str | None, budget: int, end_of_turn: int, end_ids: frozenset[int]
) -> Ending:
    """Classify a generation by its last token, the server's ``stop_reason`` and the ``budget`` it was given.
    verl's vLLM server reports both a stop and the length limit as "completed", so the budget tells them apart."""
    if stop_reason in ABORTED_REASONS:
        return Ending.ABORTED
    if ids and ids[-1] == end_of_turn:
        return Ending.END_OF_TURN
    if ids and ids[-1] in end_ids:
        return Ending.OTHER_END_TOKEN
    if stop_reason == "length" or len(ids) >= budget:
        return Ending.LENGTH
    if stop_reason not in KNOWN_REASONS:
        logger.warning("unknown stop_reason %r from the server: taken as a stop before the budget", stop_reason)
    return Ending.SILENT_STOP
