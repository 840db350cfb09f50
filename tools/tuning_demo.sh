#!/usr/bin/env bash
# The small CPU demonstration of issue 29's tuning and controls (docs/results.md "Tuning and controls: a small CPU
# setting"): fedent tune on a validation split, then the comparison with the tuned values and FedEnt's controls,
# then the φ2 scores of the FedEnt runs. Fashion-MNIST (the Debian copy) + LeNet-5, Dirichlet α_d = 1.0 over 10
# clients, 50% a round, a seeded 1,500 of the training images (20% of each client's held out for validation), 500
# test images, 8 rounds of 2 local epochs. Usage: tools/tuning_demo.sh OUT_DIR   (about 10 CPU minutes)
set -euo pipefail
OUT=${1:?usage: tools/tuning_demo.sh OUT_DIR}
PY=${PY:-.venv/bin/python}
SETS=(--set model.name=lenet5 --set data.num_clients=10 --set train.fraction=0.5 --set data.partition=dirichlet
      --set data.alpha=1.0 --set data.max_train_samples=1500
      --set data.max_test_samples=500 --set train.rounds=8 --set train.local_epochs=2 --set train.eval_every=1
      --set train.device=cpu)
CONFIG=configs/fmnist-mnist-pathological.yaml
"$PY" -m fedent tune --config "$CONFIG" "${SETS[@]}" --algorithms fedavg,fedent --seeds 0 \
  --grid train.lr=0.03,0.1,0.3 --validation-fraction 0.2 --max-extend 1 --tail-k 3 --threads 1 --out "$OUT/tune"
"$PY" -m fedent compare --config "$CONFIG" "${SETS[@]}" --tuned "$OUT/tune/tuned.json" --seeds 0,1,2 --tail-k 3 \
  --algorithms fedavg,fedent,fedent-shuffled=fedent,fedent-fixed=fedent,fedent-cap-none=fedent \
  --algo-set fedent-shuffled.rates=shuffled --algo-set fedent-fixed.rates=fixed \
  --algo-set fedent-cap-none.eta_max=null --threads 1 --no-progress --out "$OUT/compare"
# the same runs again (read back, not retrained), paired against FedEnt instead of FedAvg: the controls' view
cp "$OUT/compare/compare.md" "$OUT/compare/compare-vs-fedavg.md"
"$PY" -m fedent compare --config "$CONFIG" "${SETS[@]}" --tuned "$OUT/tune/tuned.json" --seeds 0,1,2 --tail-k 3 \
  --algorithms fedent,fedent-shuffled=fedent,fedent-fixed=fedent,fedent-cap-none=fedent,fedavg \
  --algo-set fedent-shuffled.rates=shuffled --algo-set fedent-fixed.rates=fixed \
  --algo-set fedent-cap-none.eta_max=null --threads 1 --no-progress --out "$OUT/compare"
cp "$OUT/compare/compare.md" "$OUT/compare/compare-vs-fedent.md"
RUNS=()
for arm in fedent fedent-cap-none; do for s in 0 1 2; do RUNS+=("$OUT/compare/runs/$arm-s$s"); done; done
"$PY" -m fedent.experiments.mechanism "${RUNS[@]}" --phi2 --pool > "$OUT/mechanism.md"
echo "wrote $OUT/tune/tune.md $OUT/compare/compare.md $OUT/mechanism.md"
