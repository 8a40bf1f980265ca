# Two commands on a fresh machine: `make demo` (export the bundled example through its recipe) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install -c constraints.txt

.PHONY: setup demo test test-all system-deps clean examples

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP) torch==2.13.0            # CPU build first, so nothing below pulls a CUDA one
	$(PIP) -e ".[all,test]"
	touch $@

# Debian's chromium for the Space's browser tests (Playwright cannot download browsers here).
system-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the browser tests"; fi; fi
	@# shellcheck: actionlint/jactionlint check the action's and workflows' `run:` scripts with it (tests/test_action.py)
	@if ! command -v shellcheck >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; \
	  else echo "install shellcheck (sudo apt-get install shellcheck) for the action lint tests"; fi; fi
	@# Node.js + npm: transformers.js, one of the real loaders tests/test_ecosystem_clients.py runs (npm packages from the registry)
	@if ! command -v npm >/dev/null || ! command -v node >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  else echo "install Node.js and npm (sudo apt-get install nodejs npm) for the transformers.js test"; fi; fi

demo: setup
	$(BIN)/hfexport export examples/tiny-llama --all-targets -o demo-out

test: setup system-deps
	$(BIN)/python -m pytest

test-all: setup system-deps
	$(BIN)/python -m pytest -m "slow or not slow"

examples: setup
	$(BIN)/python examples/make_examples.py

clean:
	rm -rf demo-out build dist *.egg-info
