# One image for every fedent service (aggregator + dashboard, estimator, workers); docker-compose.yml
# picks the command. Fashion-MNIST comes from Debian's dataset-fashion-mnist package, so the demo cluster
# runs without network access to dataset mirrors.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends dataset-fashion-mnist \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# The pinned torch/torchvision first (the largest layer, cached while the sources change);
# the pins must match pyproject.toml (tests/system/test_compose.py checks that).
RUN pip install "torch==2.14.1" "torchvision==0.29.1"

COPY pyproject.toml README.md ./
COPY fedent ./fedent
COPY fedentrpc ./fedentrpc
COPY server ./server
COPY client ./client
COPY estimator ./estimator
COPY configs ./configs
RUN pip install .

RUN useradd --create-home --uid 10001 fedent \
    && mkdir -p /runs /state /pki \
    && chown fedent /runs /state /pki
USER fedent

# aggregator gRPC, estimator gRPC, dashboard HTTP
EXPOSE 50051 50052 8080
CMD ["fedent", "--help"]
