# edgegpu: the one entry point for people and CI. `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8888
NODES  ?= 4
REAL_NODES ?= $(if $(filter 0,$(shell id -u)),1,0)
METRICS_PORT ?= 9400
DOCKER ?= docker
REGISTRY ?= edgegpu
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

.DEFAULT_GOAL := help
.PHONY: help venv run cluster images test pytest e2e lint format typecheck imports check crd chart proto generate bench bench-quick bench-e2e bench-openb-e2e bench-sharing bench-ab fuzz soak bench-openb bench-openb-quick gpu-check clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ \
		out = sprintf("  make %-18s", $$1); col = length(out); n = split($$2, w, " "); \
		for (i = 1; i <= n; i++) { \
			if (col + length(w[i]) + 1 > 88) { print out; out = sprintf("%25s", ""); col = 25 } \
			out = out " " w[i]; col += length(w[i]) + 1 } \
		print out }'

$(STAMP): pyproject.toml
	@echo "creating $(VENV) and installing edgegpu with its test tools (a minute or so, once)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "installing the project and its dependencies..."
	$(PY) -m pip install --quiet --progress-bar off -e '.[dev]'
	@echo "done: $(VENV) is ready"
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install the project with every extra

run: $(STAMP) ## start the extender on HOST:PORT (127.0.0.1:8888) with NODES (4) simulated agents, metrics from METRICS_PORT (9400)
	$(PY) -m tools.devcluster --host $(HOST) --port $(PORT) --nodes $(NODES) --metrics-base-port $(METRICS_PORT)

cluster: $(STAMP) ## a real control plane with edgegpu, NODES (4) simulated GPU nodes and REAL_NODES (1 as root) real kubelet nodes (kubeconfig: .e2e/kubeconfig)
	@[ "$(REAL_NODES)" = 0 ] || bash tests/e2e/install-node.sh
	$(PY) -m tests.e2e.cluster --nodes $(NODES) --real-nodes $(REAL_NODES)

images: ## build REGISTRY/extender and REGISTRY/node-agent with DOCKER (docker or podman) and save them as archives in dist/images/
	@command -v $(DOCKER) >/dev/null || { echo "make images: '$(DOCKER)' is not installed; set DOCKER=podman or install docker" >&2; exit 1; }
	@mkdir -p dist/images
	$(DOCKER) build -f Dockerfile.extender -t $(REGISTRY)/extender:$(VERSION) .
	$(DOCKER) build -f Dockerfile.agent -t $(REGISTRY)/node-agent:$(VERSION) .
	$(DOCKER) save -o dist/images/extender-$(VERSION).tar $(REGISTRY)/extender:$(VERSION)
	$(DOCKER) save -o dist/images/node-agent-$(VERSION).tar $(REGISTRY)/node-agent:$(VERSION)
	@echo "images: dist/images/extender-$(VERSION).tar dist/images/node-agent-$(VERSION).tar"

test: $(STAMP) lint typecheck imports pytest ## lint, types, layers, unit and integration tests (no cluster; Helm built once from the Go module proxy)

pytest: $(STAMP) ## the test suite only
	$(PY) -m pytest

lint: $(STAMP) ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP) ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP) ## mypy --strict on both packages
	$(VENV)/bin/mypy

imports: $(STAMP) ## import-linter: the layer contracts in pyproject.toml
	$(VENV)/bin/lint-imports

check: test ## alias of test

crd: $(STAMP) ## regenerate manifests/crd/ from the policy and maintenance models
	$(VENV)/bin/python -m scheduler_extender.policy.crd > manifests/crd/gpuschedulingpolicies.yaml
	$(VENV)/bin/python -m scheduler_extender.remediation.crd > manifests/crd/gpumaintenances.yaml

chart: $(STAMP) ## regenerate the Helm chart charts/edgegpu from manifests/
	$(VENV)/bin/python -m tools.chart

proto: $(STAMP) ## regenerate the kubelet plugins' gRPC modules from node_agent/{deviceplugin,dra}/*.proto
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. node_agent/deviceplugin/api.proto node_agent/deviceplugin/podresources.proto node_agent/dra/dra.proto node_agent/dra/registration.proto node_agent/dra/health.proto

generate: $(STAMP) ## regenerate the GPU reading fields of the telemetry structs from scheduler_extender/telemetry/fields.py
	$(PY) -m tools.gen_fields

e2e: $(STAMP) ## the e2e suite: a real control plane and real kubelet nodes built from the Kubernetes Go modules, Debian's containerd 1.6 and containerd 2 (first build: minutes)
	bash tests/e2e/install-node.sh
	bash tests/e2e/build-controlplane.sh >/dev/null
	bash tests/e2e/build-containerd.sh >/dev/null
	EDGEGPU_E2E=1 $(PY) -m pytest tests/e2e -p no:randomly $(E2E_ARGS)

fuzz: $(STAMP) ## schemathesis over every route of the OpenAPI document, fixed seed (FUZZ_CASES per route: about 28,000 cases, 7 minutes)
	EDGEGPU_FUZZ_CASES=$(or $(FUZZ_CASES),4000) $(PY) -m pytest tests/fuzz -p no:randomly -q

soak: $(STAMP) ## 5,000 nodes pushing every second for a minute while pods are scheduled: fails on any lost push or verb error
	$(PY) -m benchmarks.soak

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench-e2e: $(STAMP) ## the real kube-scheduler with and without the extender, 1k and 5k nodes (benchmarks/results/e2e.json)
	bash tests/e2e/build-controlplane.sh >/dev/null
	$(PY) -m benchmarks.e2e $(BENCH_ARGS)

bench-openb-e2e: $(STAMP) ## OpenB slices through the real kube-scheduler vs the replay harness (benchmarks/results/openb-e2e.json, ~10 min)
	bash tests/e2e/build-controlplane.sh >/dev/null
	$(PY) -m benchmarks.openb_e2e --profiles shipped,gpupods $(BENCH_ARGS)

bench-sharing: $(STAMP) ## tasks per GPU and GPU memory utilisation: whole GPUs, memory blocks, blocks with idle ones lent (benchmarks/results/sharing.json, seconds)
	$(PY) -m benchmarks.sharing $(BENCH_ARGS)

bench-outcomes: $(BENCH_STAMP) ## heat, throttling, energy, outages and sharing: five arms in one time-stepped fleet (benchmarks/results/outcomes.json and .png, ~3 min)
	$(PY) -m benchmarks.outcomes $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP) ## latency/ingest/memory benchmarks at 1k and 5k nodes (< 5 min)
	$(PY) -m benchmarks.latency --quick

bench: $(BENCH_STAMP) ## every benchmark: 1k/5k/10k nodes, longer runs
	$(PY) -m benchmarks.latency

bench-ab: $(BENCH_STAMP) ## decision p99 under pushes, builds interleaved: make bench-ab A=tree B=tree [MORE="c=tree --floor"] [ROUNDS=20]
	$(PY) -m benchmarks.ab $(A) $(B) $(MORE) --rounds $(or $(ROUNDS),20)

bench-openb-quick: $(BENCH_STAMP) ## OpenB trace replay: default trace, 3 seeds, every policy (< 10 min)
	$(PY) -m benchmarks.openb --trace default --seeds 42-44 --json benchmarks/results/openb-quick.json

bench-openb: $(BENCH_STAMP) ## OpenB replay: 17 traces x 10 seeds, every policy (long; results in benchmarks/results)
	$(PY) -m benchmarks.openb --trace all --seeds 42-51 --json benchmarks/results/openb-all.json --png benchmarks/results/openb-all.png | tee benchmarks/results/openb-all.txt

gpu-check: $(STAMP) ## on a machine with a GPU (NVIDIA, AMD or Intel): real sampling, power-limit dry run, CUDA probe
	$(PY) -m tools.gpu_check
	$(PY) -m pytest -m gpu tests/agent/test_nvml_real.py

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
