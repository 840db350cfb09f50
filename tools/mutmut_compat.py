"""A pytest plugin for tools/mutation.py: mutmut 3.8's harness reads ``item._nodeid``, which newer pytest
no longer has (it has ``nodeid``); this gives every node the old name back. Loaded with ``-p mutmut_compat``."""

from __future__ import annotations

from _pytest import nodes

if not hasattr(nodes.Node, "_nodeid"):
    nodes.Node._nodeid = property(lambda self: self.nodeid)  # type: ignore[attr-defined]
