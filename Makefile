# fedent: two commands for a newcomer: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/demo.yaml
PROTO_SRC := $(wildcard proto/fedentrpc/v1/*.proto)
# buf (proto lint) from the npm registry, pinned, into the git-ignored .tools/; the stamp names the version,
# so changing BUF_VERSION reinstalls. BUF_INPUT: what proto-lint checks (a directory with its own buf.yaml).
BUF_VERSION := 1.75.0
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
BUF_STAMP := $(TOOLS)/.buf-$(BUF_VERSION)
BUF_INPUT ?= .

.PHONY: setup data browser run test mutation lint proto proto-check proto-lint buf simulate cluster bench reproduce clean \
	docker-base compose-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# System packages (Debian/Ubuntu): installed here when this user may (root or passwordless sudo); otherwise
# one line with the exact command, and the target stops. The browser test skips without Chromium.
DATA_DIR ?= /usr/share/datasets/fashion-mnist
CHROMIUM ?= /usr/bin/chromium
# Off Debian: the four Fashion-MNIST idx .gz files in any directory, then make run DATA_DIR=that/directory
# (run and simulate then pass it as data.root).
DATA_ELSEWHERE := put Fashion-MNIST's four idx .gz files (train/t10k images and labels) in a directory and run: \
	make run DATA_DIR=/that/directory
data:
	@tools/ensure_system_deps.sh $(DATA_DIR) dataset-fashion-mnist "the offline Fashion-MNIST copy" \
		"$(DATA_ELSEWHERE)"

browser:
	@tools/ensure_system_deps.sh --optional $(CHROMIUM) chromium "Chromium (dashboard browser test)" \
		"install Chromium with your system's package manager (the browser test runs $(CHROMIUM))"

# The main job: always the most complete thing that exists (the local cluster on the demo config).
# a DATA_DIR other than the OS copy is the dataset's data.root
DATA_ROOT_ARG = $(if $(filter-out /usr/share/datasets/fashion-mnist,$(DATA_DIR)),--set data.root=$(DATA_DIR))
run: data $(STAMP)
	$(BIN)/fedent cluster up --config $(CONFIG) --workers 2 --exit-when-done $(DATA_ROOT_ARG)

simulate: data $(STAMP)
	$(BIN)/fedent simulate --config $(CONFIG) $(DATA_ROOT_ARG)

lint: $(STAMP) proto-lint
	$(BIN)/ruff check fedent fedentrpc server client estimator tests benchmarks tools
	$(BIN)/mypy

$(BUF_STAMP):
	mkdir -p $(TOOLS)
	rm -f $(TOOLS)/.buf-*
	npm install --no-save --no-audit --no-fund --prefix $(TOOLS) @bufbuild/buf@$(BUF_VERSION)
	$(BUF) --version
	touch $@

buf: $(BUF_STAMP)

# buf's STANDARD rules (buf.yaml): a Request/Response pair per RPC, *_UNSPECIFIED enum zero values, ...
proto-lint: $(BUF_STAMP)
	$(BUF) lint --error-format=msvs $(BUF_INPUT)  # msvs: each violation names its rule

test: data browser $(STAMP) lint proto-check
	$(BIN)/pytest -q

# Mutation testing of the core (not part of `make test`; long): mutmut over each module with its own tests,
# a seeded sample per module, resumable (.mutation/), scores into tests/MUTATION.md. MUTATION_ARGS, e.g.
# "--module codec --sample 150 --budget 1800".
MUTATION_ARGS ?= --sample 150
mutation: $(STAMP)
	nice -n 19 $(BIN)/python tools/mutation.py $(MUTATION_ARGS)

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. $(PROTO_SRC)

proto-check: $(STAMP)
	$(BIN)/python tools/check_proto.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

reproduce: data $(STAMP)
	$(BIN)/fedent reproduce --out results/reproduce

# docker-compose.yml for real (tools/compose_check.py): local base image when missing, build, up, healthchecks,
# FEDENT_CHECK_ROUNDS (2) rounds, dashboard + run files, aggregator restart, logs, down. Needs Docker only.
docker-base:
	tools/docker_base.sh

compose-check:
	$(PY) tools/compose_check.py

clean:
	rm -rf runs results .pytest_cache .mypy_cache .ruff_cache
