# detstream: `make demo` runs the pipeline on the built-in demo; `make test` runs the whole suite.
# Both do all of the set-up on a fresh machine (venv, pip and Debian packages, model, clips).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-containers install assets lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

assets: install
	$(BIN)/detstream models fetch --clips

demo: install
	bash scripts/system_deps.sh demo
	$(BIN)/detstream models fetch --clips
	$(BIN)/detstream run

test: install
	bash scripts/system_deps.sh test
	$(BIN)/detstream models fetch --clips
	$(BIN)/python -m pytest -q

# Builds the CPU image with podman on a Debian base made by debootstrap and starts it and docker-compose.yml
# (tests/containers; left out of `make test`). Installs podman, runc, debootstrap and podman-compose when missing.
test-containers: install
	bash scripts/container_setup.sh $(VENV)
	PATH="$$PATH:/usr/sbin" $(BIN)/python -m pytest -q -m containers tests/containers

lint: install
	$(BIN)/ruff check app tests scripts

bench: install assets
	$(BIN)/detstream bench

clean:
	rm -rf out bench-results .pytest_cache
