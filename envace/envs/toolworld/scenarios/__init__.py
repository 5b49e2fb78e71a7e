"""Scenario builders of the tool world, one module per domain: templated user requests with their
gold tool calls and gold answers (see ``envace.envs.toolworld.planning``)."""
