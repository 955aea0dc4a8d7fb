# Envelope — `make run` starts the webhook locally, `make test` runs every test.
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The venv holds exactly the locks: requirements.lock (what the image ships) and
# requirements-test.lock (the [test] extra's packages that are not in it), both with
# sha256 hashes. The stamp is named after pyproject.toml and both locks, so a changed lock
# reinstalls on the next make run/test.
LOCKS := requirements.lock requirements-test.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCKS) | cksum | cut -d' ' -f1)
PORT ?= 8443
METRICS_PORT ?= 9090
# Where the e2e control plane (kube-apiserver, etcd, kubectl, helm) is built and cached.
ENVELOPE_CONTROLPLANE_DIR ?= $(HOME)/.cache/envelope/controlplane
export ENVELOPE_CONTROLPLANE_DIR

.PHONY: run test unit e2e e2e-second e2e-next lint fmt bench bench-apiserver bench-audit bench-peers bench-intree bench-cache bench-quotas bench-node install controlplane clean image lock

# --no-deps: nothing outside the locks is installed (pip check then proves they are
# closed); Envelope itself is installed editable without resolving anything, with the
# locked setuptools (--no-build-isolation). A package the locks do not pin is removed, so
# a venv made before (or by a `pip install -U`) comes back to what ships.
$(STAMP): pyproject.toml $(LOCKS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements.lock -r requirements-test.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@$(PY) -c "import re, sys; from importlib import metadata; \
		norm = lambda name: re.sub(r'[-_.]+', '-', name).lower(); \
		pins = {norm(n) for f in sys.argv[1:] for n in re.findall(r'(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==', open(f).read())}; \
		print(' '.join(sorted({norm(d.metadata['Name']) for d in metadata.distributions()} - pins - {'pip', 'envelope'})), end='')" \
		$(LOCKS) > $(VENV)/.unpinned
	@test ! -s $(VENV)/.unpinned || { echo "removing what the locks do not pin: $$(cat $(VENV)/.unpinned)"; \
		$(PY) -m pip uninstall -q -y $$(cat $(VENV)/.unpinned); }
	$(PY) -m pip check
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(VENV)/bin/envelope serve --self-signed --host 127.0.0.1 --port $(PORT) \
		--metrics-port $(METRICS_PORT) $(if $(CONFIG),--config $(CONFIG))

UNIT_TESTS = $(PY) -m pytest tests -m "not e2e" --durations=15

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
# install tests in tests/chart/test_chart.py.
e2e: $(STAMP) controlplane
	ENVELOPE_CONTROLPLANE_BIN=$$(bash e2e/controlplane/build.sh | tail -n 1) \
		$(PY) -m pytest e2e tests -m e2e --durations=40

# The version matrix's second minor (SECOND_KUBERNETES_VERSION, the oldest supported): every
# differential oracle again, on a seeded quarter of its CI cases (docs/upstream.md).
SECOND_ORACLES = e2e/test_oracle_*.py e2e/test_matchconditions.py
ORACLE_FRACTION ?= 0.25
e2e-second: $(STAMP)
	ENVELOPE_CONTROLPLANE_BIN=$$(ENVELOPE_CONTROLPLANE_KUBERNETES=$(SECOND_KUBERNETES_VERSION) \
		bash e2e/controlplane/build.sh | tail -n 1) \
		$(PY) -m pytest $(SECOND_ORACLES) -m e2e --oracle-fraction $(ORACLE_FRACTION)

# The next minor before its GA (NEXT_KUBERNETES_VERSION, v1.38.0-beta.0): the same oracles as
# e2e-second, on a control plane built under its own cache key with the Go toolchain its
# go.mod needs (GOTOOLCHAIN=NEXT_GOTOOLCHAIN, taken from the module proxy; exported for the
# build). Not part of `make test` until that minor is GA and becomes the default
# (docs/testing.md, docs/upstream.md).
NEXT_KUBERNETES_VERSION := $(shell sed -n 's/^NEXT_KUBERNETES_VERSION=//p' e2e/controlplane/versions.env)
NEXT_GOTOOLCHAIN := $(shell sed -n 's/^NEXT_GOTOOLCHAIN=//p' e2e/controlplane/versions.env)
# A failed build leaves the bin dir empty: stop there rather than fall back to the default.
e2e-next: $(STAMP)
	bin=$$(export GOTOOLCHAIN=$(NEXT_GOTOOLCHAIN); \
		ENVELOPE_CONTROLPLANE_KUBERNETES=$(NEXT_KUBERNETES_VERSION) bash e2e/controlplane/build.sh | tail -n 1) \
		&& test -n "$$bin" && ENVELOPE_CONTROLPLANE_BIN=$$bin \
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
	rm -rf $(VENV) $(UV_VENV) $(RELEASE_TOOLS) .pytest_cache .ruff_cache .hypothesis

# ---------------------------------------------------------------- chart and manifests
# helm comes from the e2e control plane ($ENVELOPE_CONTROLPLANE_BIN, else built/cached
# by e2e/controlplane/build.sh). tests/chart/test_chart.py fails when manifests/install.yaml
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
# Global buildah flags, e.g. --storage-driver=vfs where overlay cannot mount (make release's default).
BUILDAH_FLAGS ?=

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
	case $$builder in buildah) build="buildah $(BUILDAH_FLAGS) build" ;; *) build="$$builder build" ;; esac; \
	echo "+ $$build -t $(IMAGE) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) ). "; \
	$$build -t $(IMAGE) $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) . || exit 1; \
	echo "built $(IMAGE) with $$builder"; \
	echo "push it:  $$builder push $(IMAGE)"; \
	echo "install:  helm install envelope charts/envelope -n envelope-system --create-namespace \\"; \
	echo "            --set image.repository=$$(echo '$(IMAGE)' | sed 's/:[^:/]*$$//') --set image.tag=$$(echo '$(IMAGE)' | sed -n 's/.*:\([^:/]*\)$$/\1/p')"

# requirements.lock: every dependency of pyproject.toml (and the build backend) pinned with
# its sha256, for the Dockerfile's pip --require-hashes. requirements-test.lock: the [test]
# extra, resolved with requirements.lock as constraints and without the packages it already
# pins, so the venv runs the shipped versions. Regenerate both after changing dependencies
# (`make lock`; `make lock UPGRADE=1` to move every pin); tests/test_image_lock.py fails when
# the locks no longer satisfy pyproject.toml or each other. uv is pinned (UV_VERSION) and
# runs from its own venv, outside the locked one.
UV_VERSION ?= 0.13.9
UV_VENV := $(VENV)-uv
UV_COMPILE = $(UV_VENV)/bin/uv pip compile --generate-hashes --universal --python-version 3.11 \
	--custom-compile-command "make lock"
lock:
	@test -x $(UV_VENV)/bin/uv || { $(PYTHON) -m venv $(UV_VENV) && $(UV_VENV)/bin/pip install -q uv==$(UV_VERSION); }
	$(PYTHON) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))" \
		> $(UV_VENV)/build-requires.in
	$(UV_COMPILE) $(if $(UPGRADE),--upgrade) pyproject.toml $(UV_VENV)/build-requires.in -o requirements.lock
	$(UV_COMPILE) pyproject.toml --extra test -c requirements.lock \
		$$(sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\)==.*/--no-emit-package \1/p' requirements.lock) \
		-o requirements-test.lock

# ------------------------------------------------------------------ release artifacts
# `make release RELEASE_KEY=key.pem` writes into $(DIST): the image as an OCI archive
# (envelope-<version>.oci.tar, built by buildah or podman: RELEASE_BUILDER), the chart
# package (envelope-<version>.tgz, helm package), an SBOM of the image's Python packages
# (envelope-<version>.sbom.cdx.json: CycloneDX 1.6 JSON by cyclonedx-py from
# requirements.lock, what the image installs, and pyproject.toml), SHA256SUMS over them,
# SHA256SUMS.sig (openssl, the caller's PEM private key, RSA or EC) and the public key
# that verifies it (release-key.pub.pem; publish it apart from the artifacts).
# RELEASE_IMAGE=0 leaves the image out (tests/test_release.py: the rest in seconds).
# Verify: make verify-release PUBKEY=release-key.pub.pem (docs/deploy.md, "Release").
DIST ?= dist
RELEASE_KEY ?=
RELEASE_IMAGE ?= 1
RELEASE_BUILDER ?= buildah
CYCLONEDX_VERSION ?= 7.5.0
RELEASE_TOOLS := $(VENV)-release
PUBKEY ?= $(DIST)/release-key.pub.pem
# buildah as root without a daemon: vfs storage and chroot isolation work in a container
# (buildah 1.28 reads BUILDAH_ISOLATION, not STORAGE_DRIVER: the flag is given).
RELEASE_BUILDAH_FLAGS ?= --storage-driver=vfs
release: export BUILDAH_ISOLATION ?= chroot

.PHONY: release verify-release

release:
	@test -n "$(RELEASE_KEY)" && test -r "$(RELEASE_KEY)" || { echo "make release: give the signing key: \
	RELEASE_KEY=key.pem (a PEM private key; e.g. openssl genpkey -algorithm EC -pkeyopt \
	ec_paramgen_curve:P-256 -out key.pem)" >&2; exit 2; }
	@bin="$(CONTROLPLANE_BIN)"; $(HELM_CHECK); \
	mkdir -p $(DIST) && rm -f $(DIST)/envelope-$(VERSION).* $(DIST)/SHA256SUMS* $(DIST)/release-key.pub.pem \
	&& "$$bin/helm" package $(CHART) -d $(DIST) >/dev/null
	@test -x $(RELEASE_TOOLS)/bin/cyclonedx-py || { $(PYTHON) -m venv $(RELEASE_TOOLS) \
		&& $(RELEASE_TOOLS)/bin/pip install -q cyclonedx-bom==$(CYCLONEDX_VERSION); }
	$(RELEASE_TOOLS)/bin/cyclonedx-py requirements requirements.lock --pyproject pyproject.toml \
		--output-reproducible --of JSON --sv 1.6 -o $(DIST)/envelope-$(VERSION).sbom.cdx.json 2>/dev/null
	@if [ "$(RELEASE_IMAGE)" = 1 ]; then \
		$(MAKE) --no-print-directory image IMAGE_BUILDER=$(RELEASE_BUILDER) IMAGE=localhost/envelope:$(VERSION) \
			BUILDAH_FLAGS="$(RELEASE_BUILDAH_FLAGS)" || exit 1; \
		case "$(RELEASE_BUILDER)" in \
			buildah) buildah $(RELEASE_BUILDAH_FLAGS) push localhost/envelope:$(VERSION) \
				oci-archive:$(DIST)/envelope-$(VERSION).oci.tar:envelope:$(VERSION) ;; \
			podman) podman save --format oci-archive -o $(DIST)/envelope-$(VERSION).oci.tar \
				localhost/envelope:$(VERSION) ;; \
			*) echo "make release: RELEASE_BUILDER is buildah or podman" >&2; exit 2 ;; \
		esac || exit 1; \
	fi
	cd $(DIST) && sha256sum -- envelope-$(VERSION).* > SHA256SUMS
	openssl dgst -sha256 -sign "$(RELEASE_KEY)" -out $(DIST)/SHA256SUMS.sig $(DIST)/SHA256SUMS
	openssl pkey -in "$(RELEASE_KEY)" -pubout -out $(DIST)/release-key.pub.pem
	@$(MAKE) --no-print-directory verify-release DIST=$(DIST) PUBKEY=$(DIST)/release-key.pub.pem
	@ls -l $(DIST)

verify-release:
	openssl dgst -sha256 -verify "$(PUBKEY)" -signature $(DIST)/SHA256SUMS.sig $(DIST)/SHA256SUMS
	cd $(DIST) && sha256sum --strict -c SHA256SUMS
