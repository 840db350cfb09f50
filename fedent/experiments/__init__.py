"""Experiments built on the simulator: multi-algorithm comparisons and the paper's reproduction plan."""
