"""The policy update's settings that conf/ does not expose, stated once for both engines: the local engine's
``OptimConfig`` (and ``envace.engines.losses``) and verl's actor config (``envace.engines.verl.config_builder``)
take them from here. AdamW without weight decay at a constant learning rate, a token-mean loss, low_var_kl
to the reference (docs/method.md)."""

WEIGHT_DECAY = 0.0
LOSS_AGG_MODE = "token-mean"
KL_TYPE = "low_var_kl"
