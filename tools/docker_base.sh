#!/usr/bin/env bash
# The local base image for the Dockerfile's BASE argument, for hosts that reach Debian's mirror but no
# container registry: a minimal Debian bookworm with python3 (3.11), python3-venv and CA certificates,
# made with mmdebstrap and `docker import`. Does nothing when the image exists; loads it from
# $FEDENT_BASE_CACHE (a `docker save` tarball) when that file exists, and saves it there after building.
#
#   tools/docker_base.sh [IMAGE]        # default fedent-base:bookworm
set -euo pipefail
IMAGE=${1:-${FEDENT_BASE_IMAGE:-fedent-base:bookworm}}
CACHE=${FEDENT_BASE_CACHE:-}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "docker_base: $IMAGE present"
  exit 0
fi
if [ -n "$CACHE" ] && [ -f "$CACHE" ]; then
  echo "docker_base: loading $IMAGE from $CACHE"
  docker load -i "$CACHE"
  docker image inspect "$IMAGE" >/dev/null
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "docker_base: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "docker_base: building $IMAGE with mmdebstrap (bookworm, minbase)"
mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$tmp/rootfs.tar"
docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' "$tmp/rootfs.tar" "$IMAGE"
if [ -n "$CACHE" ]; then
  mkdir -p "$(dirname "$CACHE")"
  docker save -o "$CACHE.tmp" "$IMAGE" && mv "$CACHE.tmp" "$CACHE"
  echo "docker_base: cached in $CACHE"
fi
