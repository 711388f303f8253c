# qosflow — the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export UV_LINK_MODE ?= copy
# uv from PATH, else the copy bootstrapped into .uv/ (a private venv: no system packages touched).
UV = $$(command -v uv || echo .uv/bin/uv)
# The extras the venv holds: all but `torch` (`--all-extras` would sync PyTorch, from PyPI a CUDA
# build of several GB). The trainer's DDP tests and bench layer torch in at run time instead, the
# way pytest-k8s36 layers kubernetes 36: from pip's find-links folder when this machine has one
# (the CPU wheel), else from PyPI.
EXTRAS := --extra argo --extra airflow --extra postgres
TORCH_VERSION := 2.13.0
WITH_TORCH = $(UV) run --frozen $(EXTRAS) --quiet --with 'torch==$(TORCH_VERSION)' \
  --find-links "$$(pip config get global.find-links 2>/dev/null || true)"

.PHONY: demo test check lint typecheck contracts pytest pytest-unit pytest-beside pytest-slow pytest-torch \
  pytest-k8s36 bench venv uv clean \
  chromium

uv:
	@command -v uv >/dev/null 2>&1 || [ -x .uv/bin/uv ] || { \
	  echo "bootstrapping uv from PyPI into .uv/"; \
	  python3 -m venv .uv && .uv/bin/python -m pip install --quiet --disable-pip-version-check uv; \
	} || { echo "error: could not bootstrap uv (needs python3 with venv/ensurepip and PyPI)" >&2; exit 1; }

venv: uv
	@$(UV) sync --frozen $(EXTRAS) --quiet

lint: venv
	$(VENV)/bin/ruff check src trainer operators argo_templates dags bench tests
	$(VENV)/bin/ruff format --check src trainer operators argo_templates dags bench tests

typecheck: venv
	$(VENV)/bin/mypy

contracts: venv
	$(VENV)/bin/lint-imports

# Tests marked `torch` run in pytest-torch only (with PyTorch layered in), never twice.
pytest: venv
	$(PY) -m pytest -m "not torch"

# The rest of `pytest` (with pytest-unit and pytest-beside): the tests that start real processes
# (trainers, local clusters, Airflow deployments) and size their jobs from the speeds they measure
# or measure step rates, so `make test` runs them with nothing else beside them. (Each part's
# contract report is a file of its own: pytest-unit's stays.)
pytest-slow: venv
	QOSFLOW_CONTRACT_REPORT=.qosflow/contract-report-slow.json \
	  $(PY) -m pytest -m "slow and not beside and not torch"

# The slow tests marked `beside`: real processes, but nothing they check depends on this machine's
# speed or load (the wheels, the fault campaign, the Airflow guide, the DAG-parse imports), so
# `make test` runs them beside the fast tests.
pytest-beside: venv
	QOSFLOW_CONTRACT_REPORT=.qosflow/contract-report-beside.json \
	  $(PY) -m pytest -q -p no:cacheprovider -m "slow and beside and not torch"

# The fast suite: every test that starts no real process (no trainer, cluster or Airflow run).
pytest-unit: venv
	$(PY) -m pytest -q -m "not slow and not torch" -p no:cacheprovider

# The Argo client must work with kubernetes client 36 (what cncf-kubernetes pins) and 37 (our lock):
# re-run the client, contract and fault suites with 36.0.3 layered over the locked environment.
pytest-k8s36: venv
	@$(UV) run --frozen $(EXTRAS) --quiet \
	  --with 'kubernetes==36.0.3' python -c "import kubernetes, sys; print('kubernetes client', \
	  kubernetes.__version__); sys.exit(not kubernetes.__version__.startswith('36.'))" && \
	$(UV) run --frozen $(EXTRAS) --quiet \
	  --with 'kubernetes==36.0.3' python -m pytest -q -p no:cacheprovider \
	  tests/argo/test_client.py tests/argo/test_contract.py tests/argo/test_faults.py \
	  tests/argo/test_recorded_contract.py

# The trainer's data-parallel mode (real torchrun processes): PyTorch layered over the locked venv.
# The tests marked `torch` live in tests/trainer (collecting only there saves ~10 s). Their contract
# report is a file of their own: `make test` runs them beside pytest-unit.
pytest-torch: venv
	@$(WITH_TORCH) python -c "import torch; print('torch', torch.__version__)"
	QOSFLOW_CONTRACT_REPORT=.qosflow/contract-report-torch.json \
	  $(WITH_TORCH) python -m pytest -q -p no:cacheprovider -m torch tests/trainer tests/airflow/test_ddp_dag.py

# Build the wheel, install it (with the argo extra) in a clean venv, run the CLI outside the repo
# (also part of `make test`: tests/test_wheel.py is in the suite).
.PHONY: wheel-smoke
wheel-smoke: venv
	$(PY) -m pytest -q tests/test_wheel.py

# Headless Chromium for the UI plugin's test (tests/airflow/test_plugin.py opens the qosflow view
# in it): Debian's package, installed when missing (CI runs as root on Debian; elsewhere, sudo).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (apt-get install --no-install-recommends chromium)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; \
	} || { echo "error: could not install chromium (needs apt-get, as root or with sudo)" >&2; exit 1; }

# `make pytest`, split in two: the fast tests (no real process; they tolerate a busy machine, as
# in `make check`), the `beside` slow tests and the DDP tests (their checks hold on a busy machine:
# the DDP DAG's rescale follows from its recorded history, and its deadline only warns) run side by
# side with lint, typecheck, contracts and pytest-k8s36 (its suites are fast tests too); then the
# other slow tests, alone on the machine.
test: chromium
	@$(MAKE) --no-print-directory -j7 --output-sync=target lint typecheck contracts pytest-unit \
	  pytest-beside pytest-k8s36 pytest-torch
	@$(MAKE) --no-print-directory pytest-slow

# `make check` before every commit (under two minutes: its four parts run side by side, each
# one's output shown whole when it ends); `make test` runs everything.
check: venv
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck contracts pytest-unit

# Every bench prints `key: value` lines; bench/RESULTS.md is written from them (date, machine).
# `make bench BENCHES=bench/baselines_bench.py` re-runs only the benches named and replaces only
# their sections (each then says when and where it was re-run).
# The DDP bench runs with PyTorch layered in (WITH_TORCH); the others in the venv.
# On x86-64, OpenBLAS's kernel is pinned to Haswell (AVX2) unless OPENBLAS_CORETYPE is set: the
# kernel it picks by CPU changes the last bits of the learned-speed fits, and those move the
# learned runs by a few jobs (docs/simulator.md, "Deterministic"). Pinned, every x86-64 machine
# with AVX2 prints the same figures. (Decided in the recipe, so only `make bench` asks uname.)
BENCHES ?=
bench: venv
	@mkdir -p .qosflow; set -o pipefail; \
	if [ -z "$$OPENBLAS_CORETYPE" ] && [ "$$(uname -m)" = x86_64 ]; then \
	  export OPENBLAS_CORETYPE=Haswell; fi; \
	for b in $(or $(BENCHES),bench/*_bench.py bench/fault_campaign.py); do echo "== $$b"; \
	  if [ "$$b" = bench/ddp_bench.py ]; then $(WITH_TORCH) python $$b; else $(PY) $$b; fi || exit 1; done \
	  | tee .qosflow/bench.log || exit 1; \
	$(PY) bench/results.py .qosflow/bench.log $(if $(BENCHES),--update bench/RESULTS.md) \
	  > .qosflow/RESULTS.md && mv .qosflow/RESULTS.md bench/RESULTS.md

demo: venv
	$(PY) -m qosflow_airflow.demo

clean:
	rm -rf $(VENV) .uv .mypy_cache .ruff_cache .pytest_cache
