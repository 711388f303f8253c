# qosflow — the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export UV_LINK_MODE ?= copy
# uv from PATH, else the copy bootstrapped into .uv/ (a private venv: no system packages touched).
UV = $$(command -v uv || echo .uv/bin/uv)

.PHONY: demo test check lint typecheck contracts pytest pytest-unit pytest-k8s36 bench venv uv clean

uv:
	@command -v uv >/dev/null 2>&1 || [ -x .uv/bin/uv ] || { \
	  echo "bootstrapping uv from PyPI into .uv/"; \
	  python3 -m venv .uv && .uv/bin/python -m pip install --quiet --disable-pip-version-check uv; \
	} || { echo "error: could not bootstrap uv (needs python3 with venv/ensurepip and PyPI)" >&2; exit 1; }

venv: uv
	@$(UV) sync --frozen --all-extras --quiet

lint: venv
	$(VENV)/bin/ruff check src trainer operators argo_templates dags bench tests
	$(VENV)/bin/ruff format --check src trainer operators argo_templates dags bench tests

typecheck: venv
	$(VENV)/bin/mypy

contracts: venv
	$(VENV)/bin/lint-imports

pytest: venv
	$(PY) -m pytest

# The fast suite: every test that starts no real process (no trainer, cluster or Airflow run).
pytest-unit: venv
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

# The Argo client must work with kubernetes client 36 (what cncf-kubernetes pins) and 37 (our lock):
# re-run the client, contract and fault suites with 36.0.3 layered over the locked environment.
pytest-k8s36: venv
	@$(UV) run --frozen --all-extras --quiet \
	  --with 'kubernetes==36.0.3' python -c "import kubernetes, sys; print('kubernetes client', \
	  kubernetes.__version__); sys.exit(not kubernetes.__version__.startswith('36.'))" && \
	$(UV) run --frozen --all-extras --quiet \
	  --with 'kubernetes==36.0.3' python -m pytest -q -p no:cacheprovider \
	  tests/argo/test_client.py tests/argo/test_contract.py tests/argo/test_faults.py \
	  tests/argo/test_recorded_contract.py

# Build the wheel, install it (with the argo extra) in a clean venv, run the CLI outside the repo
# (also part of `make test`: tests/test_wheel.py is in the suite).
.PHONY: wheel-smoke
wheel-smoke: venv
	$(PY) -m pytest -q tests/test_wheel.py

test: lint typecheck contracts pytest pytest-k8s36

# `make check` before every commit (under two minutes: its four parts run side by side, each
# one's output shown whole when it ends); `make test` runs everything.
check: venv
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck contracts pytest-unit

# Every bench prints `key: value` lines; bench/RESULTS.md is written from them (date, machine).
bench: venv
	@mkdir -p .qosflow; set -o pipefail; for b in bench/*_bench.py bench/fault_campaign.py; do echo "== $$b"; $(PY) $$b || exit 1; done \
	  | tee .qosflow/bench.log
	$(PY) bench/results.py .qosflow/bench.log > bench/RESULTS.md

demo: venv
	$(PY) -m qosflow_airflow.demo

clean:
	rm -rf $(VENV) .uv .mypy_cache .ruff_cache .pytest_cache
