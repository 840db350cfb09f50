#!/bin/sh
# pip inside the image build: drops empty index build arguments (pip would take "" as the index) and uses
# docker/build/ca.crt when present (a CA bundle for a proxy in front of the package index).
set -eu
[ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL
[ -n "${PIP_EXTRA_INDEX_URL:-}" ] || unset PIP_EXTRA_INDEX_URL
if [ -f /tmp/build/ca.crt ]; then
  export PIP_CERT=/tmp/build/ca.crt
fi
exec pip "$@"
