"""Process-level seeding for stages. Per-sample seeds are derived inside the libraries
(``zlib.crc32`` of (seed, step, example, sample)); this only fixes the global generators."""

from __future__ import annotations

import random


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (those that are importable)."""
    random.seed(seed)
    try:
        import numpy as np  # lazy: utils stays free of heavy imports; seeding loads what it seeds

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    try:
        import torch  # lazy: as numpy above (torch takes seconds to load)

        torch.manual_seed(seed)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
