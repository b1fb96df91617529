# plait's two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow bench lint system

# the Debian packages the tests run (ZooKeeper, bubblewrap): installed when missing
system:
	scripts/system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q src >/dev/null  # bytecode once: agents start faster
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/plait demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

test: system lint
	$(BIN)/pytest -q

# scale tests left out of `make test` (a 1,000,000-machine region)
test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

bench: $(STAMP)
	$(BIN)/plait bench allocator --machines 100000 --jobs 2000 --tasks-per-job 36 --dcs 5 --msbs-per-dc 12
