"""DVC stages: one module per stage, each ``python -m envace.stages.<name>`` with a testable
``run(cfg, tracker) -> metrics``. ``runner`` holds the shared plumbing (config, MLflow, timing)."""

STAGES = ("prepare_data", "template_prompts", "train", "evaluate", "rehearsal_sweep", "report")
