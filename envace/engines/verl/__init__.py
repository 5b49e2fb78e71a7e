"""The verl engine: envace's role-wise GRPO on verl 0.9.x (Ray, vLLM rollouts, FSDP actor), GPU only.

Importing this package is light (no verl, no Ray). What lives where:

- ``advantages``: the role-wise estimator (envace.core.advantages) in verl's estimator signature, and
  its registration (``envace_rolewise``, ``envace_grpo``).
- ``plugin``: verl's plugin entry point; registers the estimators, the ``envace`` trainer mode and the
  ``envace_act_rehearse`` agent loop in every process that imports verl.
- ``agent_loop`` / ``episode``: the act/rehearse agent loop over verl's server manager.
- ``trainer``: verl's synchronous v1 trainer passing role ids etc. to the role-wise estimator.
- ``config_builder``: our config → ``verl.trainer.main_ppo`` overrides (and a Hydra compose check).
- ``launcher``: dataset preparation, the single-node command, Ray multi-node commands, MLflow wiring.
- ``engine``: ``VerlEngine``, the ``Engine`` the ``train`` stage gets from ``get_engine("verl")``.
"""
