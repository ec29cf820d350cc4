# sandlot: `make run` starts a server; `make test` runs the whole test suite.
VENV     ?= .venv
PY       := $(VENV)/bin/python
SANDLOT  := $(VENV)/bin/sandlot
DATA_DIR ?= /var/lib/sandlot
CONFIG   ?= $(DATA_DIR)/config.toml
PYTEST_ARGS ?=

.PHONY: deps run image test test-heavy bench lint clean console server-image

deps:
	@scripts/install-deps.sh

image: deps
	@$(SANDLOT) image build base --data-dir $(DATA_DIR) --if-missing

# The images of deploy/kubernetes/ (server, execd bundle, PostgreSQL) as docker-archives, built
# from Debian packages and this checkout without Docker (docs/runtime-kubernetes.md).
server-image: deps
	$(PY) scripts/build-server-image.py

run: image
	@test -f $(CONFIG) || $(SANDLOT) init-config $(CONFIG)
	@echo "API key: see api_key in $(CONFIG)"
	$(SANDLOT) serve --config $(CONFIG) --data-dir $(DATA_DIR)

test: deps
	$(PY) -m pytest $(PYTEST_ARGS)

# The slow-marked tests make test leaves out, among them the full compat suite on the runsc
# and docker backends (heavy_backends marks, tests/compat/conftest.py) and the 1000
# create/delete cycle leak run (5-41 min on the 2-core VM by load; its own timeout bounds it).
test-heavy: deps
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

bench: deps
	SANDLOT_WITH_DOCKER=1 scripts/install-deps.sh
	$(PY) -m bench $(BENCH_ARGS)

# The web console's bundle is committed (src/sandlot/console/static/), so `make run` and
# `make test` need no Node.js; this rebuilds it from console/ with the locked npm packages.
console:
	cd console && npm ci --no-fund --no-audit && npm run typecheck && npm run build

lint: deps
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy src

clean:
	rm -rf $(VENV) build *.egg-info
