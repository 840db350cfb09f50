# shellcheck shell=bash disable=SC2034  # sourced: FEDENT, PY and step are used by the scripts that source it
# Sourced by tools/device_check.sh and tools/device_study.sh (on a lent GPU machine, from the repository root):
# the paths, the fedent command without an installed package, and a time-limited, logged step.
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}:$PWD/.devdeps"  # the device's own packages first
PY=${PY:-python3}
FEDENT=("$PY" -c 'import sys; from fedent.cli import main; sys.exit(main(sys.argv[1:]))')
STEPS_LOG="$OUT/steps.log"
step() {  # step NAME LIMIT_S CMD...: run, log to $OUT/NAME.log, note the exit status and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$STEPS_LOG"
}
