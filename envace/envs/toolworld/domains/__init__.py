"""Stateful backends of the tool world, one module per domain (tools, handlers, seed state)."""
