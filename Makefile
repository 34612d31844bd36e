# The two commands of the README: `make train` and `make test`. Each sets everything up first.
# Set-up keeps an installed torch; otherwise it installs TORCH_VERSION (the CPU build where one is offered).
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
CONFIG ?= configs/tiny.yaml

.PHONY: setup train test test-all

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch==$(TORCH_VERSION)"
	@$(PYTHON) -m pip install -q --no-build-isolation -e ".[dev]"

train: setup
	$(PYTHON) train.py --config $(CONFIG)

test: setup
	$(PYTHON) -m pytest

test-all: setup
	$(PYTHON) -m pytest -m "not gpu"
