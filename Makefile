# The README's two commands. Each creates .venv if it is missing and installs what this
# platform needs: plain mlx on macOS, MLX's CPU build elsewhere (set MLX_EXTRA=cuda for CUDA).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UNAME := $(shell uname -s)
ifeq ($(UNAME),Darwin)
MLX_EXTRA ?=
else
MLX_EXTRA ?= cpu
endif
comma := ,
EXTRAS := test$(if $(MLX_EXTRA),$(comma)$(MLX_EXTRA),)

.PHONY: demo test install lint clean

$(BIN)/coldbench: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $(BIN)/coldbench

install: $(BIN)/coldbench

demo: install
	$(BIN)/coldbench demo

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .coldbench
