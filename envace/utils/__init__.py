"""Small I/O and reproducibility helpers shared by stages (atomic writes, JSONL, seeds)."""
