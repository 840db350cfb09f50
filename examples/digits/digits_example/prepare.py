"""``python -m digits_example.prepare --config CONFIG --out DIR``: the example's clients as files on disk.

Writes what three workers on three machines would each hold: ``DIR/client-<cid>/train.npz`` (+ ``test.npz``)
with x and y, cut by the config's partition (the simulator's, so a cluster run on these files reproduces the
simulation), and ``DIR/server_test.npz``, a held-out set for server-side evaluation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedent.config import load_config
from fedent.data.local import export_partition
from fedent.inputs import load_inputs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m digits_example.prepare", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    inputs = load_inputs(cfg)
    d = inputs.data
    out = Path(args.out)
    files = export_partition(d.x_train, d.y_train, d.x_test, d.y_test, inputs.client_indices, cfg.train.seed, out)
    np.savez(out / "server_test.npz", x=d.x_test.numpy(), y=d.y_test.numpy())
    sizes = inputs.client_sizes()
    print(f"wrote {len(files)} files for {len(sizes)} clients under {out} (train sizes {sizes}) + server_test.npz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
