# capsexp: every command a user needs. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.DEFAULT_GOAL := help
.PHONY: help install train lint format test test-slow test-all test-package examples mutate bench bench-gpu studies studies-full run-studies verify tensorboard clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

install:  ## create .venv and install capsexp (editable) with its dev extras
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'

train:  ## train with the default config (pass overrides with ARGS="model=lenet5 trainer.max_epochs=1")
	$(BIN)/python -m capsexp $(ARGS)

lint:  ## ruff: lint and check formatting; import-linter: the package's layers (both configured in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format:  ## ruff: fix what can be fixed, reformat
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test:  ## the fast test suite (no slow tests), one worker per core
	$(BIN)/python -m pytest -n auto --dist worksteal -m "not slow" $(ARGS)

test-slow:  ## the tests marked slow alone (end-to-end runs: kills, workers, studies, real MNIST); CI runs it after make test and make examples
	$(BIN)/python -m pytest -n auto --dist worksteal -m slow --ignore=tests/test_package.py $(ARGS)

test-all:  ## every test, slow ones included (end-to-end runs on real MNIST)
	$(BIN)/python -m pytest -n auto --dist worksteal $(ARGS)

test-package:  ## capsexp as a user installs it: a wheel and `pip install .` in a fresh venv, trained and used from empty folders
	$(BIN)/python -m pytest -q tests/test_package.py $(ARGS)

examples:  ## install the example routing package (examples/max_min_routing, docs/own_routing.md) and run its tests
	$(BIN)/pip install --no-deps -e examples/max_min_routing
	$(BIN)/python -m pytest -q examples/max_min_routing/tests

mutate:  ## mutation testing (mutmut), 50 mutants of each area (ARGS="--area models": one area whole), then the planted flips -> experiments/results/mutation.md
	$(BIN)/python experiments/mutation.py $(or $(ARGS),--sample)
	$(BIN)/python experiments/flips.py

bench:  ## speed + accuracy benchmarks -> experiments/results/bench*.md, benchmark-cpu-*.csv and benchmark.md
	$(BIN)/python experiments/bench_capsnet.py --accuracy $(ARGS)
	$(BIN)/python experiments/bench_em_caps.py --accuracy $(ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python experiments/bench_routing.py
	$(BIN)/python experiments/bench_predict.py
	$(BIN)/python experiments/bench_step.py
	OMP_NUM_THREADS=1 $(BIN)/python experiments/bench_table.py
	$(BIN)/python experiments/benchmark_page.py

bench-gpu:  ## GPU benchmark: images/s, epoch time, peak memory per model, fp32/bf16, eager/compiled -> experiments/results/bench_gpu.md, benchmark-gpu-*.csv
	$(BIN)/python experiments/bench_gpu.py $(ARGS)
	$(BIN)/python experiments/bench_table.py --device cuda

# The studies: the experiment configs with budgets (conf/experiment/*.yaml; docs/studies.md).
STUDIES ?= $(sort $(basename $(notdir $(shell grep -l '^budgets:' conf/experiment/*.yaml))))
STUDY_LOGS := logs/studies
BUDGET ?= quick

studies:  ## every study's quick budget, one after another (hours on 2 cores) -> experiments/results/<study>_quick/
	@$(MAKE) --no-print-directory run-studies BUDGET=quick

studies-full:  ## every study's full budget (GPU hours; ARGS="trainer.devices=2" etc.) -> experiments/results/<study>_full/
	@$(MAKE) --no-print-directory run-studies BUDGET=full

# The cheapest quick study (its page, experiments/results/rotation_robustness_quick/, gives its time).
VERIFY_STUDY ?= rotation_robustness

verify:  ## re-run the cheapest quick study and check its figures against those its experiment config expects
	@runs=$(STUDY_LOGS)/verify/$$(date +%Y-%m-%d_%H-%M-%S); \
	$(BIN)/python -m capsexp -m experiment=$(VERIFY_STUDY) study=quick hydra.sweep.dir=$$runs $(ARGS) && \
	$(BIN)/python -m capsexp.compare $$runs --check

# Each study of STUDIES in budget BUDGET: its sweep into a fresh folder under logs/studies/, then its
# page with the runs kept beside it.
run-studies:  ## the experiment configs' studies (STUDIES="dr_mnist", BUDGET=quick|full) -> experiments/results/<study>_<budget>/
	@set -e; for study in $(STUDIES); do \
	  runs=$(STUDY_LOGS)/$${study}_$(BUDGET)/$$(date +%Y-%m-%d_%H-%M-%S); \
	  $(BIN)/python -m capsexp -m experiment=$$study study=$(BUDGET) hydra.sweep.dir=$$runs $(ARGS); \
	  $(BIN)/python -m capsexp.compare $$runs --output experiments/results/$${study}_$(BUDGET) --keep-runs > /dev/null; \
	  echo "experiments/results/$${study}_$(BUDGET)/README.md"; \
	done

tensorboard:  ## serve logs/ on http://localhost:6006, runs named by what they ran, accuracy pinned first
	$(BIN)/python -m capsexp.tensorboard logs --port 6006

clean:  ## remove caches (keeps .venv, data/ and logs/)
	rm -rf .pytest_cache .hypothesis mutants build src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
