"""YAML as users write it: ``1e-5`` is a number.

PyYAML implements YAML 1.1, whose float pattern needs a dot, so ``lr: 1e-2`` in a config file or
``--set algorithm.mu=1e-05`` on the command line (the form Python's own ``json.dumps(1e-05)`` and ``repr`` give,
which is how ``fedent tune`` writes its grid points) loaded as the *string* "1e-05", and the typed options refused
it. This loader adds YAML 1.2's float form (an exponent without a dot) and is otherwise PyYAML's safe loader.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader plus YAML 1.2's floats (``1e-5``, ``-2E+3``)."""


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                       |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                       |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                       |[-+]?\.(?:inf|Inf|INF)
                       |\.(?:nan|NaN|NAN))$""", re.X)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load(text: str) -> Any:
    """``yaml.safe_load`` with ``1e-5`` read as a float."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass
