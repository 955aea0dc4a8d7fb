# Envelope — `make run` starts the webhook locally, `make test` runs every test.
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PORT ?= 8443
METRICS_PORT ?= 9090
# Where the e2e control plane (kube-apiserver, etcd, kubectl, helm) is built and cached.
ENVELOPE_CONTROLPLANE_DIR ?= $(HOME)/.cache/envelope/controlplane
export ENVELOPE_CONTROLPLANE_DIR

.PHONY: run test unit e2e lint fmt bench controlplane clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(VENV)/bin/envelope serve --self-signed --host 127.0.0.1 --port $(PORT) \
		--metrics-port $(METRICS_PORT) $(if $(CONFIG),--config $(CONFIG))

test: lint unit e2e

unit: $(STAMP)
	$(PY) -m pytest tests

e2e: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) \
		$(PY) -m pytest e2e

controlplane:
	@bash e2e/controlplane/build.sh >/dev/null

lint: $(STAMP)
	$(VENV)/bin/ruff check app tests e2e bench

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix app tests e2e bench

bench: $(STAMP)
	$(PY) bench/webhook.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
