"""Report building blocks: cross-run comparison tables and the report's plots (pandas/matplotlib only)."""
