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

.PHONY: demo test test-slow lint clean bench-peers bench-whole-model latency-vs-flops

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sparta-explore demo

# The NNI remote-training-service test starts its own sshd: .ci/install-sshd installs OpenSSH's
# server where root apt-get can (its service not started); elsewhere that test skips, saying why.
test: $(STAMP)
	.ci/install-sshd
	$(BIN)/python -m pytest -q -m "not slow"

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

# Whole compiled models pass by pass vs dense and Torch-Pruning 1.6.1 (a benchmark-only extra, installed here):
# `make bench-whole-model ARGS="--only channel"`.
bench-whole-model: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[bench]"
	$(BIN)/python benchmarks/whole_model.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
