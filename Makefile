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

.PHONY: run test unit e2e e2e-second lint fmt bench bench-apiserver bench-audit bench-peers bench-intree bench-cache bench-quotas bench-node install controlplane clean image lock

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(VENV)/bin/envelope serve --self-signed --host 127.0.0.1 --port $(PORT) \
		--metrics-port $(METRICS_PORT) $(if $(CONFIG),--config $(CONFIG))

UNIT_TESTS = $(PY) -m pytest tests -m "not e2e"

# The tools only later tests need (the kubelet for the node tests e2e/test_node_*.py, the
# second Kubernetes minor of the version matrix, promtool for the PrometheusRule,
# kustomize for the KRM function, Chromium for the quota page, gitopsdiff for e2e/test_gitops_drift.py) are built in the background while the unit tests and
# the first e2e tests run, which leave a core idle; the tests that need them wait on the
# build scripts' locks. Cold, that takes ~7 of the ~35 minutes off `make test`.
SECOND_KUBERNETES_VERSION := $(shell sed -n 's/^SECOND_KUBERNETES_VERSION=//p' e2e/controlplane/versions.env)
PREBUILD = ( ENVELOPE_CONTROLPLANE_KUBELET=1 bash e2e/controlplane/build.sh \
	&& ENVELOPE_CONTROLPLANE_KUBERNETES=$(SECOND_KUBERNETES_VERSION) bash e2e/controlplane/build.sh \
	&& bash e2e/controlplane/build-promtool.sh && bash e2e/controlplane/build-kustomize.sh \
	&& bash e2e/controlplane/install-chromium.sh && bash e2e/controlplane/build-gitopsdiff.sh ) \
	>$(ENVELOPE_CONTROLPLANE_DIR)/prebuild.log 2>&1

# Everything: the unit tests run with helm, so the offline chart tests never skip.
test: lint controlplane
	@mkdir -p $(ENVELOPE_CONTROLPLANE_DIR)
	$(PREBUILD) & \
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(UNIT_TESTS) \
		&& $(MAKE) --no-print-directory e2e && $(MAKE) --no-print-directory e2e-second; \
		rc=$$?; wait; exit $$rc

# Unit and HTTP tests: no control plane needed. The offline chart tests use helm when
# `make controlplane` has cached it, and are skipped (saying so) when it has not.
unit: $(STAMP)
	ENVELOPE_CONTROLPLANE_CACHED_ONLY=1 $(UNIT_TESTS)

# Everything on a real kube-apiserver + etcd: the scenarios in e2e/ and the chart's
# install tests in tests/test_chart.py.
e2e: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) \
		$(PY) -m pytest e2e tests -m e2e

# The version matrix's second minor (SECOND_KUBERNETES_VERSION, the oldest supported): every
# differential oracle again, on a seeded quarter of its CI cases (docs/upstream.md).
SECOND_ORACLES = e2e/test_oracle_*.py e2e/test_matchconditions.py
ORACLE_FRACTION ?= 0.25
e2e-second: $(STAMP)
	ENVELOPE_CONTROLPLANE_BIN=$$(ENVELOPE_CONTROLPLANE_KUBERNETES=$(SECOND_KUBERNETES_VERSION) \
		bash e2e/controlplane/build.sh | tail -n 1) \
		$(PY) -m pytest $(SECOND_ORACLES) -m e2e --oracle-fraction $(ORACLE_FRACTION)

controlplane:
	@bash e2e/controlplane/build.sh >/dev/null

# ruff on everything, then mypy strict on app/ (pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check app tests e2e bench
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix app tests e2e bench

install: $(STAMP)

# Benchmarks are run by hand and recorded in docs/benchmarks.md; never in `make test`.
bench: $(STAMP)
	$(PY) bench/webhook.py

bench-apiserver: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/apiserver.py

bench-audit: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/audit.py

# Envelope side by side with the peers users would pick instead (Kyverno v1.19.1, built
# from the Go module proxy by bench/peers/build-kyverno.sh; a MutatingAdmissionPolicy):
# the same-answer check, then the API-server rounds, then the handlers alone. ~40 min.
PEER_ROUNDS ?= go-h2,floor-patch,floor-envpatch,map,kyverno-cpol,kyverno-mpol,envelope,envelope-mc
bench-peers: $(STAMP) controlplane
	bash bench/peers/build-kyverno.sh >/dev/null
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/apiserver.py \
		--rounds $(PEER_ROUNDS) --object mutated,compliant --concurrency 1,20 --count 300 --repeat 3
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/peers/handlers.py

# The in-tree policy (docs/in-tree.md) beside the bare MutatingAdmissionPolicy and the Go
# no-op pair: docs/benchmarks.md "In-tree policies — run I". ~20 min.
INTREE_ROUNDS ?= go-h2,map,envelope-mc,intree-map,envelope-intree
bench-intree: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/apiserver.py \
		--rounds $(INTREE_ROUNDS) --object mutated,burstable,compliant --concurrency 1,20 --count 300 --repeat 3

# The same CPU work limited and through Envelope on a real node (containerd + kubelet; root,
# cgroup v1, the node's apt packages: docs/testing.md "The node"). docs/benchmarks.md "The node".
bench-node: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) $(PY) bench/node_premise.py

bench-cache: $(STAMP)
	$(PY) bench/cache.py

bench-quotas: $(STAMP)
	$(PY) bench/quotas.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# ---------------------------------------------------------------- chart and manifests
# helm comes from the e2e control plane ($ENVELOPE_CONTROLPLANE_BIN, else built/cached
# by e2e/controlplane/build.sh). tests/test_chart.py fails when manifests/install.yaml
# is not what `make manifests` renders.
CHART := charts/envelope
MANIFEST_NAMESPACE := envelope-system
CONTROLPLANE_BIN = $${ENVELOPE_CONTROLPLANE_BIN:-$$(bash e2e/controlplane/build.sh | tail -n 1)}
HELM_CHECK = test -x "$$bin/helm" || { echo "no helm in '$$bin' (set ENVELOPE_CONTROLPLANE_BIN or see docs/testing.md)" >&2; exit 1; }

.PHONY: manifests chart-lint

manifests:
	@bin="$(CONTROLPLANE_BIN)"; $(HELM_CHECK); { \
		echo "# Generated by 'make manifests' from $(CHART) with its default values (plus the"; \
		echo "# Namespace object): helm template envelope $(CHART) --namespace $(MANIFEST_NAMESPACE)"; \
		echo "# --set namespace.create=true --set image.local=true --skip-tests (the helm test hook"; \
		echo "# is for helm only). Do not edit; change the chart and run make manifests."; \
		echo "# The image is envelope:0.1.0, which no registry serves: push yours (make image) and"; \
		echo "# point the manifests at it, e.g. kustomize edit set image envelope=REGISTRY/envelope:0.1.0,"; \
		echo "# or load it into the nodes of a local cluster (kind load docker-image envelope:0.1.0)."; \
		"$$bin/helm" template envelope $(CHART) --namespace $(MANIFEST_NAMESPACE) \
			--set namespace.create=true --set image.local=true --skip-tests; \
	} > manifests/install.yaml.tmp && mv manifests/install.yaml.tmp manifests/install.yaml \
	|| { rm -f manifests/install.yaml.tmp; exit 1; }
	@echo "wrote manifests/install.yaml"

chart-lint:
	@bin="$(CONTROLPLANE_BIN)"; $(HELM_CHECK); \
	"$$bin/helm" lint --strict $(CHART) --set image.local=true && \
	"$$bin/helm" lint --strict $(CHART) --set image.local=true --set certificates.mode=certManager && \
	"$$bin/helm" lint --strict $(CHART) --set image.local=true --set certificates.mode=provided \
		--set certificates.provided.secretName=envelope-tls --set certificates.provided.caBundle=Cg==

# ---------------------------------------------------------------------------- the image
# `make image` builds the Dockerfile with the first builder that works on this machine
# (docker, podman, buildah; IMAGE_BUILDER=... to choose) and prints the image. Set IMAGE
# to where you will push it: make image IMAGE=registry.example.com/platform/envelope:0.1.0
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= envelope:$(VERSION)
IMAGE_BUILDER ?=
PYTHON_IMAGE ?=

image:
	@builder="$(IMAGE_BUILDER)"; tried=""; \
	if [ -z "$$builder" ]; then \
		for b in docker podman buildah; do \
			if ! command -v $$b >/dev/null 2>&1; then tried="$$tried $$b(not installed)"; continue; fi; \
			case $$b in \
				docker) docker info >/dev/null 2>&1 || { tried="$$tried docker(no engine: docker info failed)"; continue; } ;; \
				podman) podman info >/dev/null 2>&1 || { tried="$$tried podman(podman info failed)"; continue; } ;; \
				buildah) buildah version >/dev/null 2>&1 || { tried="$$tried buildah(buildah version failed)"; continue; } ;; \
			esac; \
			builder=$$b; break; \
		done; \
	fi; \
	if [ -z "$$builder" ]; then echo "make image: no image builder works here:$$tried" >&2; exit 1; fi; \
	case $$builder in buildah) build="buildah build" ;; *) build="$$builder build" ;; esac; \
	echo "+ $$build -t $(IMAGE) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) ). "; \
	$$build -t $(IMAGE) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) . || exit 1; \
	echo "built $(IMAGE) with $$builder"; \
	echo "push it:  $$builder push $(IMAGE)"; \
	echo "install:  helm install envelope charts/envelope -n envelope-system --create-namespace \\"; \
	echo "            --set image.repository=$$(echo '$(IMAGE)' | sed 's/:[^:/]*$$//') --set image.tag=$$(echo '$(IMAGE)' | sed -n 's/.*:\([^:/]*\)$$/\1/p')"

# requirements.lock: every dependency of pyproject.toml (and the build backend) pinned with
# its sha256, for the Dockerfile's pip --require-hashes. Regenerate after changing
# dependencies; tests/test_lockfile.py fails when the lock no longer satisfies pyproject.toml.
lock: $(STAMP)
	$(PY) -m pip install -q uv
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))" \
		> $(VENV)/build-requires.in
	$(VENV)/bin/uv pip compile pyproject.toml $(VENV)/build-requires.in --generate-hashes --universal \
		--python-version 3.11 --custom-compile-command "make lock" -o requirements.lock
