#!/bin/sh
# The development PKI for deploy/k8s, where the base's secretGenerator reads it (deploy/k8s/base/pki,
# git-ignored): the server certificate names the Services the pods dial, one identity and token per worker
# ordinal, the aggregator's token for the estimator, and the dashboard token.
#   deploy/k8s/make-pki.sh [OUT]            # WORKERS=N for N workers (default 2); EXTRA_HOSTS=a,b adds names
set -eu
OUT=${1:-$(dirname "$0")/base/pki}
WORKERS=${WORKERS:-2}
ids=aggregator
i=0
while [ "$i" -lt "$WORKERS" ]; do ids="$ids,worker-$i"; i=$((i + 1)); done
# the repository's venv when there is one (no activated venv needed), else fedent on PATH
FEDENT=$(dirname "$0")/../../.venv/bin/fedent
[ -x "$FEDENT" ] || FEDENT=fedent
exec "$FEDENT" certs --out "$OUT" --hosts "fedent-aggregator,fedent-estimator,localhost,127.0.0.1${EXTRA_HOSTS:+,$EXTRA_HOSTS}" \
  --workers "$ids" --dashboard-token --if-missing
