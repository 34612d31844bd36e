# The two commands of the README: `make train` and `make test`. Each sets everything up first.
# Set-up keeps an installed torch; otherwise it installs TORCH_VERSION (the CPU build where one is offered:
# torch==X+cpu, from a pip index or find-links that has it; else the plain torch==X, as PyPI has it).
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
CONFIG ?= configs/tiny.yaml

.PHONY: setup train test test-all gpu-wheels

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
		|| $(PYTHON) -m pip install "torch==$(TORCH_VERSION)"
	@# (the editable install builds with the installed setuptools: a fresh venv's older one lacks bdist_wheel)
	@$(PYTHON) -m pip install -q "setuptools>=70.1"
	@$(PYTHON) -m pip install -q --no-build-isolation -e ".[dev]"

train: setup
	$(PYTHON) train.py --config $(CONFIG)

test: setup
	$(PYTHON) -m pytest

test-all: setup
	$(PYTHON) -m pytest -m "not gpu"

# Wheels a lent GPU machine lacks (its image has torch, lightning, transformers, ...; not omegaconf), for
# scripts/gpu_session.sh: pass .whl in the device tool's carry. omegaconf's own version, pure Python.
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d .whl \
		"omegaconf==$$($(PYTHON) -c 'import importlib.metadata as m; print(m.version("omegaconf"))')"
