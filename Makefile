# The two commands of the README: `make demo` and `make test`. Everything else here serves them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Two pytest-xdist workers: the control plane's tests on one, in order (one cluster), the others beside them
# (tests/conftest.py); about 25 minutes of pytest here instead of 44 in one process. PYTEST_WORKERS= runs one.
PYTEST_WORKERS ?= -n 2 --dist loadgroup

.PHONY: demo test fuzz bench lint pytest venv prepare testbins host-packages images wheelhouse lock clean

venv: $(BIN)/.installed
# The test bed's dependencies from tests/requirements.lock (hash-checked, like the images'), then the project itself.
$(BIN)/.installed: pyproject.toml tests/requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r tests/requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# MODEL=local: the seed's Run against a real model instead (llama.cpp's server with SmolLM2-135M-Instruct, built
# once from PyPI's llama-cpp-python source and cached like the test binaries). TRACES=jaeger: every process exports
# its spans to a Jaeger (built once from the Go module proxy), and the demo ends with the seed Run's trace as a tree.
DEMO_TRACES := $(if $(filter jaeger,$(TRACES)),$(BIN)/python -m testbed.jaeger,)
demo: venv
ifeq ($(MODEL),local)
	$(DEMO_TRACES) $(BIN)/python -m testbed.local_model $(BIN)/ksquad dev --demo --real-model
else
	$(DEMO_TRACES) $(BIN)/ksquad dev --demo
endif

# Everything the suite needs before it starts (testbed/prepare.py): the test control plane, helm, Temporal's
# production server, Jaeger, agent-sandbox's controller, kwok and kube-network-policies from the Go module proxy;
# llama.cpp's server from PyPI's llama-cpp-python source; Debian's packages, the images, the field's Python programs
# (MCP servers, mcp-proxy, other frameworks' agents) and the wheelhouse. One step after another on two cores (every
# step is bound by the CPU there), in three lanes at once on more. Each is cached outside the clone
# (~/.cache/ksquad-testbins/<versions>/ and beside it), keyed by its pins, and a no-op when cached; a step that
# fails is named with the end of its log.
prepare: venv
	$(BIN)/python -m testbed.prepare --make "$(MAKE)"

# The builds alone (the compiles, the Go modules they need and the field's virtualenvs).
testbins: venv
	$(BIN)/python -m testbed.prepare --make "$(MAKE)" --only compile fetch field-virtualenvs

# What the test bed needs from Debian, installed when missing: PostgreSQL's server (the tests start their own),
# podman and mmdebstrap (the images), containerd, runc, gVisor's runsc, the CNI plugins and nftables (the test
# cluster's node), Chromium and curl (a web page and a command line attacking the dev API).
HOST_PROGRAMS := /usr/lib/postgresql/*/bin/postgres /usr/bin/podman /usr/bin/mmdebstrap /usr/bin/containerd \
                 /usr/sbin/runc /usr/bin/runsc /usr/lib/cni/bridge /usr/sbin/nft /usr/sbin/iptables /usr/bin/chromium \
                 /usr/bin/curl
HOST_PACKAGES := postgresql podman mmdebstrap containerd runc runsc containernetworking-plugins nftables iptables \
                 chromium curl
host-packages:
	@ls $(HOST_PROGRAMS) >/dev/null 2>&1 || { \
	  echo "installing Debian packages the test bed needs: $(HOST_PACKAGES)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(HOST_PACKAGES) >/dev/null; }

# The ksquad and ksquad-agent images (images/build.sh): a minute the first time, seconds when only code changed.
images: venv host-packages
	PYTHON=$(BIN)/python images/build.sh

# The locked dependencies (images/*.lock, tests/requirements.lock), after pyproject.toml's dependencies change.
UV_COMPILE = $(BIN)/uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
             --no-header --no-annotate --quiet
lock: venv
	$(BIN)/pip install --quiet uv
	{ echo "# The locked dependency set of the ksquad and ksquad-agent images (CPython 3.11, x86_64, glibc 2.36:"; \
	  echo "# Debian bookworm). Regenerate with \`make lock\` after changing pyproject.toml's dependencies."; \
	  $(UV_COMPILE) pyproject.toml; } > images/requirements.lock
	{ echo "# The locked dependency set of the test bed's venv (\`make venv\`): the images' set, the dev and test extras"; \
	  echo "# beside it. Regenerate with \`make lock\`."; \
	  $(UV_COMPILE) --extra test -c images/requirements.lock pyproject.toml; } > tests/requirements.lock
	{ echo "# The pip that installs the images' wheels (run from its wheel inside the build; not in the images)."; \
	  echo "# Regenerate with \`make lock\`."; echo pip | $(UV_COMPILE) -; } > images/build-tools.lock

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# In network, PID and mount namespaces of their own (testbed/isolate.py): the test cluster's pods, its
# servers and everything they start live and die there.
pytest: venv prepare
	KSQUAD_WHEELHOUSE=$(WHEELHOUSE) $(BIN)/python -m testbed.isolate $(BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The locked wheels, downloaded before the suite (whose namespaces reach no package index): a wheel of the repo is
# built and installed from them in a clean venv, offline (tests/dev/test_packaging.py). Outside the clone, shared.
WHEELHOUSE := $(HOME)/.cache/ksquad-wheelhouse
wheelhouse: venv
	$(BIN)/pip download --quiet --no-deps --require-hashes --dest $(WHEELHOUSE) -r tests/requirements.lock

test: lint pytest

# The fuzzers of tests/workflows/test_fuzz.py searched long, with a random seed (the suite runs them briefly with a
# fixed one); Hypothesis prints what it tried and, on a failure, the smallest example and how to reproduce it.
fuzz: venv
	KSQUAD_FUZZ=1 $(BIN)/python -m testbed.isolate $(BIN)/pytest -p no:xdist tests/workflows/test_fuzz.py \
		--hypothesis-show-statistics --timeout 3600 $(PYTEST_ARGS)

# Every benchmark, into bench/results/<date>.json and a table against the targets (BENCH_ARGS=--quick: minutes).
bench: venv prepare
	$(BIN)/python -m testbed.isolate $(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .ksquad .mypy_cache .ruff_cache .pytest_cache
