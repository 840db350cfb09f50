#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine (the device tool) from the repository root, after
# tools/device_prepare.sh here; carry .devdeps and data/fashion-mnist. Everything goes to $OUT.
#
# The checks come in sections (SECTIONS, space-separated, run in the order given); the default is issue 28's
# first device call, and the second call is SECTIONS="pipeline distributed transfer". A section's steps each
# have their own time limit, and a step that would end after DEADLINE_S (from this script's start) is skipped
# with a line saying so, so one device call (600 s) always returns what it measured.
#   env          env.txt: the card, its driver, python and torch versions
#   profile      profile.md/.json: benchmarks/profile_step.py, 20 clients, float32 (kernels, share, memory, gaps)
#   levers       levers.log: profile_step.py with each train.perf lever on, against it off, and bf16 with each of
#                the others, and the looped convolution (conv_looped: train.conv looped) alone and with bf16
#                (client steps/s; LEVERS="none autocast_bf16,channels_last conv_looped ..." chooses)
#   table4       a Table IV run (CFG: default configs/fmnist-mnist-pathological.yaml, the Fashion-MNIST twin),
#                50 rounds, vectorised, FedAvg and FedEnt (TABLE4 chooses), timed end to end (issue 28's goal: FedAvg
#                <= 8 s), FedAvg under bf16 autocast (its final accuracy against float32's: the lever's accuracy
#                check on a full run) and FedAvg with train.conv looped (default TABLE4="fedavg looped fedent bf16")
#   step         step.log: benchmarks/bench_vectorised_step.py (goal: >= 25,000 client steps/s on an H100)
#   pipeline     pipeline.log: fedent reproduce --profile full (PIPE_PROFILE, data PIPE_DATA) for PIPELINE_S seconds
#                (--budget-s), 6 workers on the card; its measured client steps/s (goal: >= 15,000)
#   stacked      stacked.log: benchmarks/bench_stacked.py, 6 rates of FedAvg on 100 clients (20 a round), stacked in
#                one vectorised step against one by one (fedent reproduce --stack); pipeline-stacked.log: the pipeline
#                section's command with --workers 2 --stack 3 (its measured client steps/s against the pipeline's)
#   state        state.log: benchmarks/bench_client_state.py, FedDyn's client states written in the round against in
#                the background (ClientStateStore(background=True)), vectorised on the GPU, 600 samples a client
#   distributed  distributed-cpu.log: benchmarks/bench_distributed.py on the host's CPU cores, P = 1, 2, 4, 8
#                (goal: >= 0.8 P); distributed-cuda.log: P = 1, 2 sharing the one GPU
#   transfer     transfer.log: benchmarks/bench_transfer.py (generated gRPC path vs bare gRPC on the 16 cores;
#                skipped with a message where the device's python has no grpc)
#   study        issue 29's runs on the real MNIST: fedent reproduce --profile mnist (Table IV's MNIST pathological
#                row, the paper's data and model) with STUDY_ROWS and STUDY_SEEDS, --budget-s = the time left before
#                DEADLINE_S (data.root=data/mnist); results/mnist stays on a warm machine, so the same section in the
#                next call resumes it (complete runs are skipped); carry data/mnist (the four IDX .gz of
#                `fedent data fetch mnist`)
#   tune         issue 29's fair tuning on the real MNIST: fedent tune (validation split, test set never read) of
#                TUNE_ALGOS (default FedEnt, FedAdam and FedDyn: every knob on the CPU has tuning seeds 0, 1
#                and 2, docs/mnist-cpu/results.md, and those three seeds split on FedEnt's γ, FedAdam's rate and
#                FedDyn's α) on Table IV's MNIST row, 50 rounds, tuning seeds TUNE_SEEDS
#                (default 3: which side of each split does a fourth seed take?), --workers
#                TUNE_WORKERS, into results/mnist-tune
#                (a warm machine's next call resumes it: finished points are read back, a point cut short goes on
#                from its checkpoint); then, in the time left,
#                the tuned rows with 3 seeds: reproduce --profile mnist --tuned mnist-pathological=.../tuned.json
#                into results/mnist-tuned (the test set used once)
#                (STACK=K: the study and tune sections' commands with --stack K; default 1)
#   legacy       issue 16's checks: the CUDA tests of the vectorised executor, bench_simulator.py, 5 rounds of
#                every algorithm (per-algorithm.log)
# Dry run on a machine without a GPU: DEVICE=cpu QUICK=1 (tiny sizes, CPU device) exercises every step's command.
set -u
# shellcheck source=tools/device_lib.sh
source "$(dirname "$0")/device_lib.sh"
SECTIONS=${SECTIONS:-env profile levers table4 step}
DEADLINE_S=${DEADLINE_S:-570}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
PIPELINE_S=${PIPELINE_S:-150}
# the pipeline sections' profile and data (PIPE_PROFILE=mnist PIPE_DATA=data/mnist-gz: the real MNIST row, whose four
# .gz files weigh 11 MB; the tree, .devdeps and Fashion-MNIST's 30 MB together exceed the tool's 64 MiB)
PIPE_PROFILE=${PIPE_PROFILE:-full}
PIPE_DATA=${PIPE_DATA:-data/fashion-mnist}
TABLE4=${TABLE4:-fedavg looped fedent bf16}
STUDY_ROWS=${STUDY_ROWS:-fedavg,fedent,fedadam,fedprox,feddyn,fedent-shuffled}
STUDY_SEEDS=${STUDY_SEEDS:-0,1,2}
STUDY_WORKERS=${STUDY_WORKERS:-6}
STACK=${STACK:-1}  # --stack of the study and tune sections' commands (runs side by side per worker)
TUNE_ALGOS=${TUNE_ALGOS:-fedent,fedadam,feddyn}  # three CPU tuning seeds split on one knob of each
TUNE_SEEDS=${TUNE_SEEDS:-3}  # the CPU's searches used seeds 0, 1 and 2 (docs/mnist-cpu/results.md)
TUNE_WORKERS=${TUNE_WORKERS:-6}
STUDY_RATE=${STUDY_RATE:-3000}  # client steps/s of the full pipeline, 6 runs sharing an H100 (2026-11-26)
mkdir -p "$OUT/runs"
CFG=${CFG:-configs/fmnist-mnist-pathological.yaml}  # the Table IV runs; CFG=configs/mnist-pathological.yaml
DATA=(--set "data.root=${DATA_ROOT:-data/fashion-mnist}")  # DATA_ROOT=data/mnist: the real MNIST row itself
if [ -n "$QUICK" ]; then  # a smoke test of this script: tiny sizes, every command still runs
  CLIENTS=4 SAMPLES=64 CALLS=1 ROUNDS=1 STEP_ARGS=(--clients 4 --samples 64 --repeats 1)
  DIST_ARGS=(--clients 8 --samples 16 --rounds 3) SIZES_MB=4 PIPE_SEEDS=0
  PIPE_ROUNDS=(--rounds 1 --set data.max_train_samples=2000 --set data.max_test_samples=500)
  # the real-MNIST sections: their own --out (never the study's) and a small CPU problem
  STACK_ARGS=(--clients 4 --samples 32 --rounds 2 --lrs 0.05,0.1)
  STATE_ARGS=(--clients 10 --samples 16 --rounds 3 --repeats 1)
  RESULTS_SUFFIX=-quick SMALL=(--set train.device=cpu --set data.max_train_samples=2000 --set data.max_test_samples=500)
  STUDY_SMALL=(--rounds 1 "${SMALL[@]}") TUNE_SMALL=(--set train.rounds=2 "${SMALL[@]}")
else
  CLIENTS=20 SAMPLES=600 CALLS=3 ROUNDS=50 STEP_ARGS=(--clients "20,60" --repeats 3)
  DIST_ARGS=(--clients 100 --samples 60 --rounds 4) SIZES_MB=16,256,1024 PIPE_SEEDS=0 PIPE_ROUNDS=()
  STACK_ARGS=(--clients 100 --fraction 0.2 --samples 600 --rounds 5 --lrs 0.01,0.02,0.05,0.1,0.2,0.5)
  STATE_ARGS=(--clients 100 --samples 600 --rounds 6 --repeats 2)
  RESULTS_SUFFIX="" STUDY_SMALL=() TUNE_SMALL=()
fi

small_files() {  # small_files DIR: the files worth bringing back (logs, tables, metrics, configs), one a line
  find "$1" -type f -size -3000k ! -name '*.pt' ! -name '*.ckpt' ! -name '*.state' ! -path '*/checkpoint*/*' \
    ! -path '*/client_state/*'
}

guarded() {  # guarded NAME LIMIT_S CMD...: step(), unless it could end after DEADLINE_S
  local name=$1 limit=$2
  if [ $((SECONDS + limit)) -gt "$DEADLINE_S" ]; then
    echo "$name skipped: needs up to ${limit}s, $((DEADLINE_S - SECONDS))s left before DEADLINE_S" | tee -a "$STEPS_LOG"
    return 0
  fi
  step "$@"
}

sim() {  # sim RUN_ID: SIM=the command of one Table IV twin run on $DEVICE, vectorised (timeout needs a program)
  SIM=("${FEDENT[@]}" simulate --config "$CFG" "${DATA[@]}" --set train.rounds="$ROUNDS" --executor vectorised
       --device "$DEVICE" --no-plots --no-progress --out "$OUT/runs" --run-id "$1")
}

section_env() {
  { if command -v nvidia-smi >/dev/null 2>&1; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    else
      echo "no nvidia-smi on this machine"
    fi
    nproc
    "$PY" -c 'import sys, torch, numpy; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"); print("numpy", numpy.__version__)'
  } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

section_profile() {
  guarded profile 120 "$PY" benchmarks/profile_step.py --device "$DEVICE" --clients "$CLIENTS" --samples "$SAMPLES" \
    --calls "$CALLS" --out "$OUT/profile.md"
}

section_levers() {
  : >"$OUT/levers.log"
  local lever
  # each lever alone, then bf16 (the one that helped on the H100, 1.52x) with each of the others (LEVERS overrides)
  # conv_looped: train.conv looped (one ordinary convolution per client, fedent/looped_conv.py), not a perf lever
  for lever in ${LEVERS:-none conv_looped cudnn_benchmark channels_last autocast_bf16 conv_looped,autocast_bf16
                compile autocast_bf16,channels_last autocast_bf16,cudnn_benchmark}; do
    local perf=$lever limit=60 conv=direct
    if [[ ",$perf," == *,conv_looped,* ]]; then
      conv=looped perf=$(echo ",$perf," | sed 's/,conv_looped,/,/; s/^,//; s/,$//')
    fi
    [ "$lever" = none ] && perf=""
    [[ "$lever" == *compile* ]] && limit=150
    guarded "lever-$lever" "$limit" "$PY" benchmarks/profile_step.py --device "$DEVICE" --clients "$CLIENTS" \
      --samples "$SAMPLES" --calls "$CALLS" --top 5 --conv "$conv" --perf "$perf" --out "$OUT/lever-$lever.md"
    if [ -f "$OUT/lever-$lever.md" ]; then
      echo "$lever: $(head -1 "$OUT/lever-$lever.md")" >>"$OUT/levers.log"
    fi
  done
  cat "$OUT/levers.log"
}

section_table4() {  # TABLE4: which of the runs (fedavg fedent bf16 looped)
  local run
  for run in $TABLE4; do
    case $run in
      fedavg) sim table4-fedavg; guarded table4-fedavg 90 "${SIM[@]}" --set algorithm.name=fedavg ;;
      fedent) sim table4-fedent; guarded table4-fedent 120 "${SIM[@]}" --set algorithm.name=fedent ;;
      bf16) sim table4-fedavg-bf16
            guarded table4-fedavg-bf16 90 "${SIM[@]}" --set algorithm.name=fedavg --set train.perf.autocast=bf16 ;;
      looped) sim table4-fedavg-looped
              guarded table4-fedavg-looped 90 "${SIM[@]}" --set algorithm.name=fedavg --set train.conv=looped ;;
    esac
  done
  tail -n 1 "$OUT"/table4-*.log
}

section_step() {
  guarded step 240 "$PY" benchmarks/bench_vectorised_step.py --device "$DEVICE" "${STEP_ARGS[@]}"
}

section_pipeline() {  # pipeline NAME WORKERS STACK: PIPE_PROFILE's pipeline for PIPELINE_S seconds
  local name=${1:-pipeline} workers=${2:-6} stack=${3:-1}
  guarded "$name" $((PIPELINE_S + 60)) "${FEDENT[@]}" reproduce --profile "$PIPE_PROFILE" --seeds "$PIPE_SEEDS" \
    "${PIPE_ROUNDS[@]}" --set data.root="$PIPE_DATA" --set train.device="$DEVICE" \
    --set train.executor=vectorised --set train.precision=tf32 --workers "$workers" --stack "$stack" --gpus auto \
    --budget-s "$PIPELINE_S" --steps-per-s 3000 --out "$OUT/$name"
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(sys.argv[2], "measured_steps_per_s",
    c.get("measured_steps_per_s"))' "$OUT/$name/command.json" "$name" 2>&1 | tee -a "$OUT/$name.log"
}

section_stacked() {
  guarded stacked 200 "$PY" benchmarks/bench_stacked.py --device "$DEVICE" --precision tf32 "${STACK_ARGS[@]}" \
    --json "$OUT/stacked.json"
  section_pipeline pipeline-stacked 2 3
}

section_state() {
  guarded state 150 "$PY" benchmarks/bench_client_state.py --device "$DEVICE" --executor vectorised "${STATE_ARGS[@]}" \
    --json "$OUT/state.json"
}

section_distributed() {
  local cpus
  cpus=$(nproc)
  local procs=1,2,4,8
  [ "$cpus" -lt 8 ] && procs=1,2
  guarded distributed-cpu 240 "$PY" benchmarks/bench_distributed.py --device cpu --procs "$procs" \
    "${DIST_ARGS[@]}" --json "$OUT/distributed-cpu.json"
  if [ "$DEVICE" = cuda ]; then
    guarded distributed-cuda 150 "$PY" benchmarks/bench_distributed.py --device cuda --procs 1,2 --reduce gather,sum \
      "${DIST_ARGS[@]}" \
      --json "$OUT/distributed-cuda.json"
  fi
}

section_transfer() {
  if "$PY" -c 'import grpc' >/dev/null 2>&1; then
    guarded transfer 180 "$PY" benchmarks/bench_transfer.py --sizes-mb "$SIZES_MB" --repeat 3 \
      --json "$OUT/transfer.json"
  else
    echo "transfer skipped: the device's python has no grpc (carry a grpcio wheel matching its python to run" \
      "benchmarks/bench_transfer.py)" | tee -a "$STEPS_LOG" "$OUT/transfer.log"
  fi
}

section_study() {
  [ -f data/mnist/train-images-idx3-ubyte.gz ] || echo "study: no data/mnist carried" | tee -a "$STEPS_LOG"
  local left=$((DEADLINE_S - SECONDS - 30))  # 30 s for the archives
  if [ "$left" -lt 90 ]; then
    echo "study skipped: ${left}s left before DEADLINE_S" | tee -a "$STEPS_LOG"
  else
    step study "$left" "${FEDENT[@]}" reproduce --profile mnist --seeds "$STUDY_SEEDS" --rows "$STUDY_ROWS" \
      --out "results/mnist$RESULTS_SUFFIX" --workers "$STUDY_WORKERS" --stack "$STACK" --threads 1 \
      --steps-per-s "$STUDY_RATE" \
      --budget-s $((left - 25)) --set data.root=data/mnist "${STUDY_SMALL[@]}"
  fi
  tail -n 25 "$OUT/study.log" 2>/dev/null
  small_files "results/mnist$RESULTS_SUFFIX" | tar czf "$OUT/study.tgz" -T - 2>/dev/null
}

section_tune() {
  local tune_out="results/mnist-tune$RESULTS_SUFFIX" tuned_out="results/mnist-tuned$RESULTS_SUFFIX"
  local left=$((DEADLINE_S - SECONDS - 30))
  if [ "$left" -lt 90 ]; then
    echo "tune skipped: ${left}s left before DEADLINE_S" | tee -a "$STEPS_LOG"
    return 0
  fi
  step tune "$left" "${FEDENT[@]}" tune --config configs/mnist-pathological.yaml --set data.root=data/mnist \
    --set train.precision=tf32 --set train.executor=vectorised --device "$DEVICE" "${TUNE_SMALL[@]}" \
    --algorithms "$TUNE_ALGOS" --seeds "$TUNE_SEEDS" --workers "$TUNE_WORKERS" --stack "$STACK" --threads 1 --out "$tune_out"
  tail -n 20 "$OUT/tune.log"
  left=$((DEADLINE_S - SECONDS - 30))
  if [ -f "$tune_out/tuned.json" ] && [ "$left" -ge 90 ]; then
    step tuned-study "$left" "${FEDENT[@]}" reproduce --profile mnist --seeds "$STUDY_SEEDS" --rows "$TUNE_ALGOS" \
      --tuned "mnist-pathological=$tune_out/tuned.json" --out "$tuned_out" --workers "$STUDY_WORKERS" \
      --stack "$STACK" --threads 1 \
      --steps-per-s "$STUDY_RATE" --budget-s $((left - 25)) --set data.root=data/mnist "${STUDY_SMALL[@]}"
    tail -n 5 "$OUT/tuned-study.log"
  fi
  small_files "$tune_out" | tar czf "$OUT/tune.tgz" -T - 2>/dev/null
  [ -d "$tuned_out" ] && small_files "$tuned_out" | tar czf "$OUT/tuned-study.tgz" -T - 2>/dev/null
  return 0
}

section_legacy() {
  guarded gpu-tests 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
    tests/fedent/rounds/test_vectorised.py -k "cuda or falls_back or without_a_plan"
  guarded bench 150 "$PY" benchmarks/bench_simulator.py --device "$DEVICE" --data-root data/fashion-mnist \
    --executors sequential,vectorised --algorithms fedavg,fedent --rounds 3 --repeats 2
  : >"$OUT/per-algorithm.log"
  local algo
  for algo in fedavg fedprox feddyn scaffold fedadam fedcos fednorm fedent; do
    sim "five-$algo-vectorised"
    guarded "five-$algo" 60 "${SIM[@]}" --set algorithm.name=$algo --set train.rounds=5
    [ -f "$OUT/five-$algo.log" ] && tail -1 "$OUT/five-$algo.log" >>"$OUT/per-algorithm.log"
  done
}

for section in $SECTIONS; do
  case $section in
    env | profile | levers | table4 | step | pipeline | stacked | state | distributed | transfer | study | tune \
      | legacy)
      "section_$section" ;;
    *) echo "unknown section $section (known: env profile levers table4 step pipeline stacked state distributed transfer study" \
         "tune legacy)" \
         | tee -a "$STEPS_LOG" ;;
  esac
done
cat "$STEPS_LOG"
# The device tool brings back at most 8 files of 16 MiB: everything but model files, checkpoints and client state
# (a 24-run study holds 6 GB of them) in one archive, beside the summary.
(cd "$OUT" && small_files . | tar czf /tmp/device-check.tgz -T -)
find "$OUT" -mindepth 1 -maxdepth 1 ! -name steps.log ! -name env.txt ! -name profile.md ! -name levers.log \
  -exec rm -rf {} +
mv /tmp/device-check.tgz "$OUT/"
