# qosflow — the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
export UV_LINK_MODE ?= copy

.PHONY: demo test lint typecheck contracts pytest bench venv uv clean render

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

test: lint typecheck contracts pytest

bench: venv
	@for b in bench/*_bench.py; do echo "== $$b"; $(PY) $$b || exit 1; done

demo: venv
	$(PY) -m qosflow.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
