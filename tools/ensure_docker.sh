#!/usr/bin/env bash
# Docker for `make compose-check` on a bare Debian machine (CI runs as root): installs docker.io,
# docker-compose (v1.29) and mmdebstrap (the local base image) when missing, and starts dockerd when no
# daemon answers. Prints the dockerd pid it started on fd 3 when given one (so the caller can stop it).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
missing=()
command -v docker >/dev/null || missing+=(docker.io)
{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; } || missing+=(docker-compose)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure_docker: missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -q
  apt-get install -y -q "${missing[@]}"
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "ensure_docker: no Docker daemon answers, and only root can start one" >&2; exit 1; }
  log=${DOCKERD_LOG:-/tmp/fedent-dockerd.log}
  nohup dockerd >"$log" 2>&1 3>&- &  # fd 3 closed: a caller reading it must not wait for dockerd
  pid=$!
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "ensure_docker: dockerd exited; see $log" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "ensure_docker: dockerd did not answer within 60 s; see $log" >&2; exit 1; }
  echo "ensure_docker: started dockerd (pid $pid, log $log)"
  if { true >&3; } 2>/dev/null; then echo "$pid" >&3; fi
fi
docker --version
