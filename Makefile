# qosflow — the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
export UV_LINK_MODE ?= copy

.PHONY: demo test lint typecheck contracts pytest pytest-k8s36 bench venv uv clean render

uv:
	@command -v uv >/dev/null 2>&1 || [ -x "$(HOME)/.local/bin/uv" ] || \
	  (echo "bootstrapping uv from PyPI" && python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv)

venv: uv
	@UV=$$(command -v uv || echo $(HOME)/.local/bin/uv); $$UV sync --frozen --all-extras --quiet

lint: venv
	$(VENV)/bin/ruff check src operators argo_templates dags bench tests
	$(VENV)/bin/ruff format --check src operators argo_templates dags bench tests

typecheck: venv
	$(VENV)/bin/mypy

contracts: venv
	$(VENV)/bin/lint-imports

pytest: venv
	$(PY) -m pytest

# The Argo client must work with kubernetes client 36 (what cncf-kubernetes pins) and 37 (our lock):
# re-run the client, contract and fault suites with 36.0.3 layered over the locked environment.
pytest-k8s36: venv
	@UV=$$(command -v uv || echo $(HOME)/.local/bin/uv); $$UV run --frozen --all-extras --quiet \
	  --with 'kubernetes==36.0.3' python -c "import kubernetes, sys; print('kubernetes client', \
	  kubernetes.__version__); sys.exit(not kubernetes.__version__.startswith('36.'))" && \
	$$UV run --frozen --all-extras --quiet \
	  --with 'kubernetes==36.0.3' python -m pytest -q -p no:cacheprovider \
	  tests/argo/test_client.py tests/argo/test_contract.py tests/argo/test_faults.py

test: lint typecheck contracts pytest pytest-k8s36

bench: venv
	@for b in bench/*_bench.py; do echo "== $$b"; $(PY) $$b || exit 1; done

demo: venv
	$(PY) -m qosflow_airflow.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
