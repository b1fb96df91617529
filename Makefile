# plait's two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow bench lint system lock

# the Debian packages the tests run (ZooKeeper, bubblewrap): installed when missing
system:
	scripts/system-deps

# every package from requirements.txt: exact versions with their hashes, so a new
# machine installs what CI last passed with, whatever the registry serves today; plait
# itself is built with the locked setuptools (no build isolation: nothing unpinned)
$(STAMP): pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q src >/dev/null  # bytecode once: agents start faster
	touch $(STAMP)

# refresh the lock deliberately: the newest versions pyproject.toml's ranges allow
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements/tools.in --extra dev \
		--generate-hashes --universal --python-version 3.11 --upgrade -o requirements.txt

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
