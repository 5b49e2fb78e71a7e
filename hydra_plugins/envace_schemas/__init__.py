"""Registers envace's config schema with Hydra when DVC composes conf/ (``dvc exp run -S``).

DVC calls Hydra in its own process with this repo on the plugin search path; Hydra's plugin scan
imports every module under ``hydra_plugins``, so importing ``envace.config.load`` here puts
``envace_schema`` into the ConfigStore before ``conf/config.yaml`` asks for it. No plugin class.
"""

import sys
from pathlib import Path

try:
    import envace.config.load  # noqa: F401  (registers the schema on import)
except ImportError:  # envace not installed in DVC's interpreter: use this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import envace.config.load  # noqa: F401
