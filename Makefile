# icebatch — every target builds its own environment on a fresh machine.
#
# The virtualenv lives outside the clone, keyed by the lock file's hash, so CI and new clones reuse it:
#   $(ICEBATCH_CACHE)/venv-<hash of requirements/dev.lock and the install flags>
# uv installs it (pip 23 backtracks for minutes on this dependency set). torch's CPU wheel comes from
# /opt/wheels where that folder exists, else from PyTorch's CPU index.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
ICEBATCH_CACHE ?= $(HOME)/.cache/icebatch
LOCK := requirements/dev.lock
# Bytecode is compiled at install time: with PYTHONDONTWRITEBYTECODE set (as on these machines) every
# process -- each Ray worker, vLLM's spawned engine core -- would otherwise compile torch, vLLM and Ray
# from source again. The install flags are part of the venv's key, so changing them builds a new one.
UV_SYNC_FLAGS := --compile-bytecode
LOCK_HASH := $(shell (cat $(LOCK); echo "$(UV_SYNC_FLAGS)") | sha256sum | cut -c1-12)
VENV ?= $(ICEBATCH_CACHE)/venv-$(LOCK_HASH)
UV_VERSION := 0.13.9
UV := $(ICEBATCH_CACHE)/uv-$(UV_VERSION)/bin/uv
WHEELS := $(wildcard /opt/wheels)
UV_INDEX := $(if $(WHEELS),--find-links $(WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu) --index-strategy unsafe-best-match
PY := $(VENV)/bin/python
SAM_VERSION := 1.170.0
SAM_VENV := $(ICEBATCH_CACHE)/sam-$(SAM_VERSION)
SAM := env SAM_CLI_TELEMETRY=0 PATH=$(dir $(UV)):$$PATH $(SAM_VENV)/bin/sam
PYTEST_ARGS ?=
SRC := $(wildcard functions jobimage tests bench)

export ICEBATCH_HOME ?= $(CURDIR)/.icebatch
# This clone's code first, for every process a target starts (Ray workers and vLLM's engine included):
# the venv is shared by clones of the same lock, and its editable install points at the last to run `make env`.
export PYTHONPATH := $(CURDIR)/functions:$(CURDIR)/jobimage$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: help env browser docs demo test test-fast test-fault test-reliability reliability test-engine test-aws test-hygiene test-lifecycle-soak test-upgrade lint sam-venv sam-check format bench bench-gpu lock clean

help:
	@echo "make demo   - run the whole flow on this machine (no AWS, no GPU)"
	@echo "make test   - lint, type-check and run the test suite (all tiers)"
	@echo "make test-aws - the production path against AWS APIs (moto) as template.yaml deploys it, each part as its role (IAM enforced)"
	@echo "make test-fault - the real job killed (SIGKILL, SIGTERM) at chosen points, resumed after each"
	@echo "make test-hygiene - the real job ended every way (signals, its group, its terminal); nothing may outlive it"
	@echo "make test-reliability - the concurrency tests alone, then 20 times in a shuffled order"
	@echo "make test-lifecycle-soak - random table lifecycles with runs, kills and resumes (LIFECYCLE_EXAMPLES=5000)"
	@echo "make test-upgrade - the engine tier on the newest Ray and vLLM CPU build the index has, in a scratch venv"
	@echo "make bench  - run the benchmarks (results in bench/results/); BENCH_BEFORE=<git rev> also runs the job as it was then"
	@echo "make bench-gpu - the job vs a bare vllm.LLM on one NVIDIA GPU, Llama-3.1-8B shape (in the job image)"
	@echo "make docs   - build the documentation site into site/ (mkdocs-material)"
	@echo "make lint   - ruff + mypy only"
	@echo "make lock   - re-resolve requirements/dev.lock from pyproject.toml"

$(UV):
	$(PYTHON) -m venv $(ICEBATCH_CACHE)/uv-$(UV_VERSION)
	$(ICEBATCH_CACHE)/uv-$(UV_VERSION)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)

# The venv's path holds the lock's hash, so an existing .synced means it matches (a fresh clone's newer
# file times do not matter).
$(VENV)/.synced: | $(UV)
	@echo "== creating $(VENV) (once per lock file; a few minutes on a fresh machine)"
	$(UV) venv -q --allow-existing -p $(PYTHON) $(VENV)
	$(UV) pip sync -q $(UV_SYNC_FLAGS) -p $(PY) $(UV_INDEX) $(LOCK)
	touch $@

# The project itself is installed editable, pointing at this clone (cheap; redone when the clone moves).
env: $(VENV)/.synced
	@if [ "$$(cat $(VENV)/.project 2>/dev/null)" != "$(CURDIR)" ]; then \
		$(UV) pip install -q -p $(PY) --no-deps -e . && echo "$(CURDIR)" > $(VENV)/.project; fi
	@ln -sfn $(VENV) .venv

demo: env
	$(PY) -m icebatch.tools.cli demo

lint: env
	$(PY) -m ruff check $(SRC)
	$(PY) -m ruff format --check $(SRC)
	$(PY) -m mypy
	$(VENV)/bin/hadolint jobimage/Dockerfile

format: env
	$(PY) -m ruff format $(SRC)
	$(PY) -m ruff check --fix $(SRC)

# SAM CLI lives in its own virtualenv: it pins boto3 and pydantic.
$(SAM_VENV)/.installed: | $(UV)
	$(UV) venv -q --allow-existing -p $(PYTHON) $(SAM_VENV)
	$(UV) pip install -q -p $(SAM_VENV)/bin/python "aws-sam-cli==$(SAM_VERSION)" "cfn-lint==1.58.0"
	touch $@

sam-venv: $(SAM_VENV)/.installed

sam-check: $(SAM_VENV)/.installed
	$(SAM) validate --lint --region us-east-1
	$(SAM_VENV)/bin/cfn-lint template.yaml
	$(SAM) build LauncherFunction --build-dir $(ICEBATCH_CACHE)/sam-build --region us-east-1 >/dev/null
	@du -sh $(ICEBATCH_CACHE)/sam-build/LauncherFunction | sed 's/^/launcher bundle (unzipped): /'

# Tiers: fast (unit, contract, functional), fault (the real job killed at chosen points, behind one small
# vLLM server), engine + e2e (real vLLM on CPU), aws (the production path on moto, with the engine too),
# hygiene (the real job ended every way), reliability (the tests that race threads, alone and repeated shuffled).
# Each runs in its own process: a native crash in one cannot take the others down. Two chains run side by side:
# the tiers that start Ray and vLLM one after another in the foreground (hygiene, fault, aws, engine + e2e), and
# fast then reliability in the background (its log is printed when the foreground's ends). Two of the first kind
# at once, beside a third load on two cores, outlast Ray's fixed 30 s for a raylet to register ("The current node
# timed out during startup": seen with aws beside hygiene, and with fault beside aws). The tests transform
# template.yaml with SAM's own translator, from SAM CLI's virtualenv.
export SAM_PYTHON := $(SAM_VENV)/bin/python
FAST := not engine and not e2e and not aws and not fault and not hygiene
LOGS := $(ICEBATCH_HOME)/test-logs
# $(call beside,<background command>,<name>,<foreground command>): both run; fails if either failed
beside = mkdir -p $(LOGS); echo "== $(2) started in the background (log: $(LOGS)/$(2).log)"; \
	( $(1) ) >$(LOGS)/$(2).log 2>&1 & bg=$$!; \
	fg=0; $(3) || fg=$$?; rc=0; wait $$bg || rc=$$?; \
	echo "== $(2) (exit $$rc)"; cat $(LOGS)/$(2).log; [ $$fg -eq 0 ] && [ $$rc -eq 0 ]

LIGHT = ( rc=0; $(PY) -m pytest -m "$(FAST)" --durations=15 $(PYTEST_ARGS) || rc=1; \
	$(MAKE) --no-print-directory reliability RELIABILITY_REPEAT=5 || rc=1; exit $$rc )
HEAVY = ( rc=0; for tier in hygiene fault aws "engine or e2e"; do echo "== $$tier"; \
	$(PY) -m pytest -m "$$tier" --durations=5 $(PYTEST_ARGS) || rc=1; done; exit $$rc )

# The documentation site: mkdocs-material in its own virtualenv, keyed by its lock; built strictly (a broken link
# or anchor, a page missing from the nav fail the build).
DOCS_LOCK := requirements/docs.lock
DOCS_VENV := $(ICEBATCH_CACHE)/docs-$(shell sha256sum $(DOCS_LOCK) | cut -c1-12)
$(DOCS_VENV)/.installed: | $(UV)
	$(UV) venv -q --allow-existing -p $(PYTHON) $(DOCS_VENV)
	$(UV) pip sync -q -p $(DOCS_VENV)/bin/python $(DOCS_LOCK)
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --quiet
	@echo "== the documentation site: site/index.html"

# Debian's Chromium, for the test that looks at `icebatch costs --html`'s page in a real browser.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@command -v chromium >/dev/null || { echo "== installing Debian's chromium (once per machine)"; \
		$(SUDO) apt-get install -y -q chromium >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium >/dev/null; }; }

test: lint sam-check browser docs
	@$(call beside,$(LIGHT),fast+reliability,$(HEAVY))

test-fast: env $(SAM_VENV)/.installed browser
	$(PY) -m pytest -m "$(FAST)" $(PYTEST_ARGS)

test-fault: env
	$(PY) -m pytest -m fault $(PYTEST_ARGS)

# The tests that race threads or processes: each alone in a fresh process, then all of them 20 times in
# a shuffled order (the seed is printed; ICEBATCH_TEST_SHUFFLE=<seed> replays it). make test repeats them 5 times.
RELIABILITY_SEED ?= $(shell date +%s)
RELIABILITY_REPEAT ?= 20
test-reliability: env $(SAM_VENV)/.installed reliability

reliability:
	@for t in $$($(PY) -m pytest -m concurrency --collect-only -q -p no:cacheprovider | grep '::'); do \
		echo "== alone: $$t"; $(PY) -m pytest -q -p no:cacheprovider "$$t" || exit 1; done
	ICEBATCH_TEST_REPEAT=$(RELIABILITY_REPEAT) ICEBATCH_TEST_SHUFFLE=$(RELIABILITY_SEED) $(PY) -m pytest -q -m concurrency $(PYTEST_ARGS)

# `make test` runs 200 lifecycles in a fixed order and 200 at random; this runs more at random (LIFECYCLE_EXAMPLES, default
# 5,000; LIFECYCLE_SEED replays a run: its seed is printed, and with a failure its steps).
test-lifecycle-soak: env
	LIFECYCLE_SOAK=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/functional/test_lifecycle_machine.py $(PYTEST_ARGS)

test-engine: env
	$(PY) -m pytest -m "engine or e2e" $(PYTEST_ARGS)

# HYGIENE_REPEAT=N runs each way of ending the job N times.
test-hygiene: env
	$(PY) -m pytest -m hygiene $(PYTEST_ARGS)

# Not in `make test`: the newest Ray and vLLM CPU build the package index has (torch as they need it, within this
# machine's constraints), every other package as pyproject.toml allows, in a scratch venv; then the engine tier on
# them. What breaks is printed (an install that cannot resolve says why); docs/limitations.md records the last check.
UPGRADE_VENV := $(ICEBATCH_CACHE)/venv-upgrade
test-upgrade: | $(UV)
	rm -rf $(UPGRADE_VENV) && $(UV) venv -q -p $(PYTHON) $(UPGRADE_VENV)
	printf 'ray[data,default]>=2.60\nvllm-cpu>=0.29\ntorch>=2.13\n' > $(UPGRADE_VENV)/overrides.txt
	$(UV) pip install -q $(UV_SYNC_FLAGS) -p $(UPGRADE_VENV)/bin/python $(UV_INDEX) \
		--override $(UPGRADE_VENV)/overrides.txt -e ".[dev]"
	$(UPGRADE_VENV)/bin/python -c 'import ray, vllm, torch; print("== the engine tier on Ray", ray.__version__, \
		"vLLM", vllm.__version__, "torch", torch.__version__)'
	$(UPGRADE_VENV)/bin/python -m pytest -m engine -p no:cacheprovider -rfE $(PYTEST_ARGS) \
		|| { echo "== what breaks on the newest Ray and vLLM is above"; exit 1; }

test-aws: env $(SAM_VENV)/.installed
	$(PY) -m pytest -m aws $(PYTEST_ARGS)

bench: env
	$(PY) -m bench.launcher_weight
	$(PY) -m bench.backlog_scaling
	$(PY) -m bench.streaming_history
	$(PY) -m bench.content_identity
	$(PY) -m bench.pipeline_vs_bare --rows 2000 --runs 3 $(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))
	$(PY) -m bench.pipeline_vs_bare --rows 6000 --runs 2 --model small --output-tokens 48 $(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))
	$(PY) -m bench.scale_out --rows 1000
	$(PY) -m bench.chunk_cost --rows 2000
	$(PY) -m bench.tokens_per_row
	$(PY) -m bench.day
	$(PY) -m bench.report

# Needs an NVIDIA GPU and vLLM's CUDA build (the job image); exits non-zero with one line elsewhere.
bench-gpu:
	$(if $(wildcard $(VENV)/bin/python),$(PY),$(PYTHON)) -m bench.gpu

lock: | $(UV)
	$(UV) pip compile pyproject.toml --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		$(UV_INDEX) --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
		--no-emit-package triton --no-emit-package icebatch -o $(LOCK)
	# the Lambda bundle's: python3.11 on Amazon Linux 2 (manylinux2014), binary wheels only (functions/Makefile)
	$(UV) pip compile functions/requirements.txt --python-version 3.11 --python-platform x86_64-manylinux_2_17 \
		--only-binary :all: -o functions/requirements.lock

clean:
	rm -rf .icebatch .venv .pytest_cache .mypy_cache .ruff_cache site
