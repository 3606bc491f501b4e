# Two entry points for a fresh machine with Python >= 3.11 (see README.md):
#   make quickstart   set up .venv, then train the tiny quickstart drafter on CPU
#   make test         set up .venv, then run ruff and every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Test and lint tools (the root package's [dev] extra, listed here so the four packages are
# installed once, editable, rather than again as the root package's path dependencies).
DEV_DEPS := "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "ruff>=0.6" "pre-commit>=3.5" pyyaml
# Inductor's cache lives under build/ so compiled tests reuse it between runs.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/build/inductor-cache
export SPECDRAFT_CACHE ?= $(CURDIR)/build/cache

.PHONY: setup quickstart test lint clean

$(BIN)/.installed: pyproject.toml packages/*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, pinned, so no dependency can pull a CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e packages/config -e packages/collate \
		-e "packages/trainer[sharegpt,mooncake,tensorboard,plot]" -e packages/cli \
		$(DEV_DEPS)
	touch $@

setup: $(BIN)/.installed

quickstart: setup
	$(BIN)/specdraft lint examples/*.toml

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q tests

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis
