# Two entry points (see README): `make run` runs the main job, `make test` runs every check.
# Both create .venv on first use; torch is pinned to the CPU build that pip finds locally.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run run-megatron-core test test-quick lint format install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The whole tune loop for the handbook recipe on an embedded cluster of 3 simulated nodes x 4
# fake GPUs running the emulated Megatron, with the default A/B (early stopping ends it in a few
# minutes on 2 cores). Run it again and it resumes from ray_layout_store/ (study "quickstart").
run: $(STAMP)
	$(BIN)/python -m ray_layout.tune configs/handbook_7b_a1b.yaml --pp 4 --hbm-gb 131 \
		--profile-iters 8 --study quickstart

# The same loop on real model code: every rank trains megatron-core's own GPTModel on the CPU
# (a tiny MoE with MTP on PP 2, about a minute on 2 cores); its times are CPU times.
run-megatron-core: $(STAMP)
	$(BIN)/python -m ray_layout.tune configs/tiny_moe_mtp.yaml --pp 2 --backend megatron-core \
		--gpus-per-node 4 --profile-iters 8 --ab-top 1 --ab-warmup 2 --ab-batch 3 --ab-looks 2,4 \
		--study megatron-core-quickstart

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint
	$(BIN)/python -m pytest -q

# The quick loop: everything but the end-to-end tests (Ray clusters, emulated Megatron ranks).
test-quick: lint
	$(BIN)/python -m pytest -q -m "not slow"
