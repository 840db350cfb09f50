#!/usr/bin/env bash
# The full-scale study on a lent GPU machine (issue 17), after tools/device_prepare.sh here; carry .devdeps and
# data/fashion-mnist. One device call: the GPU checks of the vectorised executor, one benchmark pass, then
# `fedent reproduce --profile full` with the vectorised executor, trimmed to BUDGET_S by its documented drop
# order (--budget-s at STEPS_PER_S client SGD steps per second, measured on an H200 in this repository's
# benchmarks/README.md). Whatever finished comes back as $OUT/reproduce.tgz, also when the time limit cuts the
# run short (without model files: finished runs are reported here by `fedent reproduce --report-only` and
# tools/runs_table.py).
set -u
BUDGET_S=${BUDGET_S:-300}       # what the plan is trimmed to
LIMIT_S=${LIMIT_S:-360}         # the hard stop for the reproduce step
STEPS_PER_S=${STEPS_PER_S:-12000}
WORKERS=${WORKERS:-8}
source "$(dirname "$0")/device_lib.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
} >"$OUT/steps.log" 2>&1
step gpu-tests 90 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
  tests/fedent/rounds/test_vectorised.py -k "cuda or falls_back or without_a_plan"
step bench 90 "$PY" benchmarks/bench_simulator.py --device cuda --data-root data/fashion-mnist \
  --executors sequential,vectorised --algorithms fedavg,fedent --rounds 3 --repeats 1
# The profile's configs read the system copy (train.device and train.executor are auto: CUDA, vectorised).
mkdir -p /usr/share/datasets/fashion-mnist && cp -n data/fashion-mnist/*-ubyte.gz /usr/share/datasets/fashion-mnist/
step reproduce "$LIMIT_S" "${FEDENT[@]}" reproduce --profile full --out results/full --workers "$WORKERS" --threads 1 \
  --steps-per-s "$STEPS_PER_S" --budget-s "$BUDGET_S"
# At most 8 files of 16 MiB come back from a device call: the run logs without the model files and checkpoints.
tar czf "$OUT/reproduce.tgz" --exclude='*.pt' --exclude='checkpoints' --exclude='client_state*' results/full 2>/dev/null
cat "$OUT/steps.log"; tail -n 8 "$OUT/gpu-tests.log" "$OUT/bench.log"; tail -n 25 "$OUT/reproduce.log"
