# One Dockerfile for every fedent service (aggregator + dashboard, estimator, workers); docker-compose.yml
# picks the command. Fashion-MNIST comes from Debian's dataset-fashion-mnist package, so the demo cluster
# runs without network access to dataset mirrors.
#
# Build arguments (all optional):
#   BASE             the base image: any Debian bookworm image with python3 (3.11) and python3-venv.
#                    Default: the official slim Python image. Without a registry, build one locally with
#                    tools/docker_base.sh (mmdebstrap + docker import) and pass BASE=fedent-base:bookworm.
#   PIP_INDEX_URL    package index for every pip install (e.g. a mirror); PIP_EXTRA_INDEX_URL likewise.
#   TORCH_INDEX_URL  where torch/torchvision come from. Empty: the package index (on x86_64 PyPI's wheel
#                    bundles CUDA, ~5 GB installed). https://download.pytorch.org/whl/cpu gives the CPU-only
#                    build, the right one for the aggregator and estimator images (docker-compose.yml's
#                    FEDENT_CPU_TORCH_INDEX_URL).
# A CA bundle for an intercepting proxy in front of the index: put it at docker/build/ca.crt (git-ignored;
# tools/compose_check.py copies the host's there); only the pip steps use it (docker/build/pip.sh), and it is
# deleted from the final filesystem (it stays in the small COPY layer: a CA certificate is public).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Only what the base lacks: python3-venv for the virtualenv (a Debian python refuses pip outside one, PEP 668;
# the official Python image has venv built in) and passwd for useradd (a minbase Debian lacks it).
RUN pkgs=dataset-fashion-mnist \
    && { python3 -c "import ensurepip" 2>/dev/null || pkgs="$pkgs python3-venv"; } \
    && { command -v useradd >/dev/null || pkgs="$pkgs passwd"; } \
    && apt-get update \
    && apt-get install -y --no-install-recommends $pkgs \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /app

ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG TORCH_INDEX_URL=
COPY docker/build/ /tmp/build/

# The pinned torch/torchvision first (the largest layer, cached while the sources change);
# the pins must match pyproject.toml (tests/system/test_compose.py checks that).
RUN if [ -n "$TORCH_INDEX_URL" ]; then set -- --index-url "$TORCH_INDEX_URL"; else set --; fi \
    && /tmp/build/pip.sh install "$@" "torch==2.14.1" "torchvision==0.29.1"

COPY pyproject.toml README.md ./
COPY fedent ./fedent
COPY fedentrpc ./fedentrpc
COPY server ./server
COPY client ./client
COPY estimator ./estimator
COPY configs ./configs
RUN /tmp/build/pip.sh install ".[cluster,dashboard]" \
    && rm -rf /tmp/build

RUN useradd --create-home --uid 10001 fedent \
    && mkdir -p /runs /state /pki \
    && chown fedent /runs /state /pki
USER fedent

# aggregator gRPC, estimator gRPC, dashboard HTTP
EXPOSE 50051 50052 8080
CMD ["fedent", "--help"]
