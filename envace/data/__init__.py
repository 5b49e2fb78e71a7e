"""Data sources: raw CM2 rows (validation, splits, episode specs)."""
