#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine (the device tool) from the repository root, after
# tools/device_prepare.sh here; carry .devdeps and data/fashion-mnist. Everything goes to $OUT:
#   env.txt             the card, its driver, python and torch versions
#   gpu-tests.log       tests/fedent/rounds/test_vectorised.py on CUDA (every strategy: vectorised = sequential, 1e-5)
#   bench.log           benchmarks/bench_simulator.py --device cuda: bare loop, sequential and vectorised executors
#   full-fedavg.log     the Table IV Fashion-MNIST twin (configs/fmnist-mnist-pathological.yaml), FedAvg, 50 rounds,
#                       vectorised, timed end to end (issue 16's goal: <= 60 s on one H100)
#   per-algorithm.log   5 rounds of every algorithm at the same setting, vectorised, and FedAvg sequential (s/round)
#   runs/               the run directories (metrics.jsonl, status.json)
# Each step has its own time limit so that one slow step cannot eat the whole device call.
set -u
source "$(dirname "$0")/device_lib.sh"
mkdir -p "$OUT/runs"
CFG=configs/fmnist-mnist-pathological.yaml
DATA=(--set data.root=data/fashion-mnist)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; "$PY" -c \
  'import sys, torch, numpy; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0)); print("numpy", numpy.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step gpu-tests 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
  tests/fedent/rounds/test_vectorised.py -k "cuda or falls_back or without_a_plan"
step bench 150 "$PY" benchmarks/bench_simulator.py --device cuda --data-root data/fashion-mnist \
  --executors sequential,vectorised --algorithms fedavg,fedent --rounds 3 --repeats 2
step full-fedavg 150 "${FEDENT[@]}" simulate --config "$CFG" "${DATA[@]}" --set algorithm.name=fedavg \
  --executor vectorised --device cuda --no-plots --no-progress --out "$OUT/runs" --run-id full-fedavg-vectorised
: >"$OUT/per-algorithm.log"
for algo in fedavg fedprox feddyn scaffold fedadam fedcos fednorm fedent; do
  step "five-$algo" 60 "${FEDENT[@]}" simulate --config "$CFG" "${DATA[@]}" --set algorithm.name=$algo \
    --set train.rounds=5 --executor vectorised --device cuda --no-plots --no-progress --out "$OUT/runs" \
    --run-id "five-$algo-vectorised"
  tail -1 "$OUT/five-$algo.log" >>"$OUT/per-algorithm.log"
done
step five-fedavg-sequential 120 "${FEDENT[@]}" simulate --config "$CFG" "${DATA[@]}" --set algorithm.name=fedavg \
  --set train.rounds=5 --executor sequential --device cuda --no-plots --no-progress --out "$OUT/runs" \
  --run-id five-fedavg-sequential
tail -1 "$OUT/five-fedavg-sequential.log" >>"$OUT/per-algorithm.log"
cat "$STEPS_LOG" "$OUT/per-algorithm.log"
tail -n 12 "$OUT/bench.log" "$OUT/gpu-tests.log" "$OUT/full-fedavg.log"
# The device tool brings back at most 8 files: everything (model files aside) in one archive, beside the summary.
tar czf /tmp/device-check.tgz -C "$OUT" --exclude='*.pt' --exclude='checkpoints' --exclude='client_state*' .
find "$OUT" -mindepth 1 -maxdepth 1 ! -name steps.log ! -name env.txt ! -name bench.log -exec rm -rf {} +
mv /tmp/device-check.tgz "$OUT/"
