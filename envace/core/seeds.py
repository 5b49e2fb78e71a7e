"""Stable seeds derived from their parts (house rule 9: seeds derive from (seed, step, example, sample)).

``derive_seed`` hashes the parts' string forms with ``zlib.crc32`` and keeps 31 bits, so a seed is the
same in every process and on every machine (Python's ``hash()`` is salted per process).
"""

from __future__ import annotations

import zlib

__all__ = ["derive_seed"]


def derive_seed(*parts: object) -> int:
    """Stable 31-bit seed from (seed, step, example, sample, ...) via ``zlib.crc32`` (never ``hash()``)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode("utf-8")) & 0x7FFFFFFF
