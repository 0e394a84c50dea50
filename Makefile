# Two entry points (see README): `make run` runs the main job, `make test` runs every check.
# Both create .venv on first use; torch is pinned to the CPU build that pip finds locally.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint format install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m ray_layout size configs/handbook_7b_a1b.yaml --pp 4
	$(BIN)/python -m ray_layout layouts configs/handbook_7b_a1b.yaml --pp 4 --count
	$(BIN)/python -m ray_layout plan configs/handbook_7b_a1b.yaml --pp 4 \
		--costs configs/costs/handbook_h200_example.json --hbm-gb 131 --top 5

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint
	$(BIN)/python -m pytest -q
