#!/usr/bin/env bash
# The full-scale study on a lent GPU machine (issue 17) in one device call, after tools/device_prepare.sh here
# (carry .devdeps and data/fashion-mnist). From the repository root on that machine:
#   1. the GPU tests of the vectorised executor's new parts (unfolded convolution, TF32 flags, per-client steps);
#   2. benchmarks/bench_vectorised_step.py: client steps/s by convolution path and precision; its BEST line (at
#      TF32, the full profile's precision, 20 clients a step) picks train.conv, and RATE_SHARE of its rate is the
#      starting estimate of the whole pipeline's rate (host work, evaluation, probes and Algorithm 1 cost extra);
#   3. fedent reproduce --profile full with that conv path and --budget-s: trimmed in the documented drop order,
#      re-planned at the measured rate as runs finish, until DEADLINE_S after this script started.
# A second call resumes the study: carry results/full (what the first brought back; complete runs are skipped) and
# pass CONV and RATE (the first call's choice and measured rate) to skip steps 1-2.
# Whatever finished comes back as $OUT/reproduce.tgz, logs and run records without model files (a device call
# returns at most 8 files of 16 MiB), also when a limit cuts a step short. Here, report it with
#   fedent reproduce --profile full --seeds $SEEDS --set train.conv=CONV --out results/full --report-only
set -u
DEADLINE_S=${DEADLINE_S:-570}  # the whole script, under the call's 600 s limit
WORKERS=${WORKERS:-4}          # runs at a time, each its own process on the one GPU
RATE_SHARE=${RATE_SHARE:-0.5}
SEEDS=${SEEDS:-0,1,2}
ROUNDS=${ROUNDS:-}             # only for a smoke test of this script: every run's rounds
source "$(dirname "$0")/device_lib.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
} >"$STEPS_LOG" 2>&1
if [ -z "${CONV:-}" ] || [ -z "${RATE:-}" ]; then  # a later call of the same study passes what the first chose
  step gpu-tests 60 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
    tests/fedent/rounds/test_vectorised.py -k "cuda and (unfold or precision or each_client or fedent)"
  step stepbench 60 "$PY" benchmarks/bench_vectorised_step.py --device cuda --clients 20,60 --repeats 3
  read -r CONV RATE < <("$PY" - "$OUT/stepbench.log" "$RATE_SHARE" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("BEST "):
        best = json.loads(line[5:])
print(best.get("conv", "direct"), max(200, int(float(best.get("steps_per_s", 4000)) * float(sys.argv[2]))))
PY
  )
fi
echo "chosen: train.conv=$CONV, starting estimate $RATE client steps/s" | tee -a "$STEPS_LOG"
# The profile's configs read the system copy (train.device and train.executor are auto: CUDA, vectorised).
mkdir -p /usr/share/datasets/fashion-mnist && cp data/fashion-mnist/*-ubyte.gz /usr/share/datasets/fashion-mnist/
LEFT=$((DEADLINE_S - SECONDS - 20))  # 20 s for the archive
step reproduce "$LEFT" "${FEDENT[@]}" reproduce --profile full --seeds "$SEEDS" --out results/full \
  --workers "$WORKERS" --threads 1 --set "train.conv=$CONV" --steps-per-s "$RATE" --budget-s $((LEFT - 40)) \
  ${ROUNDS:+--rounds "$ROUNDS"}
tar czf "$OUT/reproduce.tgz" --exclude='*.pt' --exclude='checkpoints' --exclude='client_state*' results/full 2>/dev/null
cat "$STEPS_LOG"; tail -n 8 "$OUT/gpu-tests.log"; cat "$OUT/stepbench.log"; tail -n 30 "$OUT/reproduce.log"
