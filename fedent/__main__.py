"""``python -m fedent ...`` is the ``fedent`` command (what ``torchrun --nproc-per-node P -m fedent simulate ...``
starts in each of its P processes)."""

from __future__ import annotations

import sys

from fedent.cli import main

if __name__ == "__main__":
    sys.exit(main())
