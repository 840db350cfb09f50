"""Differential privacy for every strategy: central (client-level) DP at the aggregator, local DP-SGD on the
clients, and the ε(δ) accountant (docs/security.md, "Privacy"). ``RunPrivacy`` is what the round engine holds."""
