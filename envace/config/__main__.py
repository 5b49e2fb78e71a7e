"""``python -m envace.config [overrides]``: compose conf/ and write params.yaml (``envace.config.load.main``)."""

from envace.config.load import main

raise SystemExit(main())
