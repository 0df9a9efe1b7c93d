# The two commands of the README: `make demo` and `make test`. Everything else here serves them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench lint pytest venv testbins postgres-server clean

venv: $(BIN)/.installed
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: venv
	$(BIN)/ksquad dev --demo

# The test control plane (kube-apiserver, kube-controller-manager, etcd) and helm, built from the Go module
# proxy once into ~/.cache/ksquad-testbins/<versions>/; a no-op when the cache has them.
testbins:
	tests/cluster/build-control-plane.sh >/dev/null

# Debian's PostgreSQL server; the test bed starts its own instance in a temporary directory.
postgres-server:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
	  echo "installing Debian's postgresql (the tests start their own server)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; }

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

pytest: venv testbins postgres-server
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint pytest

# Every benchmark, into bench/results/<date>.json and a table against the targets (BENCH_ARGS=--quick: minutes).
bench: venv testbins postgres-server
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .ksquad .mypy_cache .ruff_cache .pytest_cache
