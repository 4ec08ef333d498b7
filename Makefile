# Narwhal. `make run` starts Narwhal on the embedded default config with the four simulated
# engines it names; `make test` installs what the checks need and runs them all.
GO          ?= go
BIN         := $(CURDIR)/bin
# apt-get needs root: sudo when not root.
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_FLAGS  ?= -race -count=1 -timeout=30m

KUBE_VERSION   := v1.37.2
# The kube-apiserver the Kubernetes tests run (internal/kubeapiserver), built once into the user cache.
KUBE_APISERVER ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/narwhal/kube-apiserver-$(KUBE_VERSION)
# Its controller manager (the Deployment and ReplicaSet controllers roll the examples' Deployment).
KUBE_CONTROLLER_MANAGER ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/narwhal/kube-controller-manager-$(KUBE_VERSION)

# llm-d's vLLM emulator and P/D routing sidecar (internal/llmd, from the Go module proxy), built
# once into the user cache for the interop tests (docs/interop.md).
LLMD_SIM_VERSION     := v0.10.2
LLMD_SIDECAR_VERSION := v0.4.0
LLMD_DIR             ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/narwhal
LLMD_SIM             ?= $(LLMD_DIR)/llm-d-inference-sim-$(LLMD_SIM_VERSION)
LLMD_SIDECAR         ?= $(LLMD_DIR)/pd-sidecar-$(LLMD_SIDECAR_VERSION)

.PHONY: all build run prereqs-run prereqs-test test test-kubernetes kube-apiserver kube-controller-manager llmd test-interop lint fmt vet staticcheck browser screenshot bench bench-sim bench-control bench-control-random bench-burst bench-ha bench-profile fuzz check-long clean

all: build

build: $(BIN)/narwhal

# The binary is rebuilt only when a file it is built from is newer (its Go sources, the two
# files it embeds, go.mod and go.sum): make run starts at once from one already built, even
# with Go's build cache gone.
SOURCES := $(shell find . \( -path ./bin -o -path ./internal/kubeapiserver -o -path ./internal/llmd -o -path ./.git \) -prune -o \
	\( -name '*.go' ! -name '*_test.go' -o -name index.html -o -name default.yaml \) -print) go.mod go.sum
$(BIN)/narwhal: $(SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/narwhal ./cmd/narwhal

run: prereqs-run $(BIN)/narwhal
	./scripts/run-local.sh $(BIN)/narwhal

# One line for each prerequisite missing (README, "Two commands"), before anything is built.
prereqs-run prereqs-test:
	@./scripts/prereqs.sh $(@:prereqs-%=%) $(GO)

# The profiler's test times real engines against their known curves: it runs alone, after the
# rest, so that the other packages' tests (sharing the two cores) do not make the engines late.
test: prereqs-test lint browser
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/profiler$$')
	$(GO) test $(TEST_FLAGS) ./profiler

# Kubernetes discovery, role labels and leader election against a real kube-apiserver
# (docs/kubernetes.md): built from the Kubernetes module once (about 5 minutes on 2 cores, 3 GB
# peak, plus its modules' download on a fresh machine), then reused from the user cache.
test-kubernetes: kube-apiserver kube-controller-manager
	NARWHAL_KUBE_APISERVER=$(KUBE_APISERVER) NARWHAL_KUBE_CONTROLLER_MANAGER=$(KUBE_CONTROLLER_MANAGER) $(GO) test $(TEST_FLAGS) -tags kubernetes -run 'Kubernetes' ./discovery ./ha ./examples ./cmd/narwhal

kube-apiserver: $(KUBE_APISERVER)

kube-controller-manager: $(KUBE_CONTROLLER_MANAGER)

# Narwhal with llm-d's own components (docs/interop.md): the emulator as every engine, the
# sidecar in front of each decode engine.
test-interop: llmd
	NARWHAL_LLMD_SIM=$(LLMD_SIM) NARWHAL_PD_SIDECAR=$(LLMD_SIDECAR) $(GO) test $(TEST_FLAGS) -tags interop -run 'Interop' ./cmd/narwhal

llmd: $(LLMD_SIM) $(LLMD_SIDECAR)

$(LLMD_SIM):
	@mkdir -p $(dir $@)
	cd internal/llmd/sim && $(GO) build -trimpath -o $@.tmp github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim && mv $@.tmp $@

$(LLMD_SIDECAR):
	@mkdir -p $(dir $@)
	cd internal/llmd/sidecar && $(GO) build -trimpath -o $@.tmp github.com/llm-d/llm-d-inference-scheduler/cmd/pd-sidecar && mv $@.tmp $@

$(KUBE_APISERVER):
	@mkdir -p $(dir $@)
	cd internal/kubeapiserver && $(GO) build -trimpath -o $@.tmp . && mv $@.tmp $@

$(KUBE_CONTROLLER_MANAGER):
	@mkdir -p $(dir $@)
	cd internal/kubeapiserver && $(GO) build -trimpath -o $@.tmp ./controllermanager && mv $@.tmp $@

# The live page's test drives Debian's chromium (headless): installed here when missing.
browser:
	@command -v chromium >/dev/null || { echo "installing chromium (the page test's browser)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The README's picture of the live page: the page through make run's demo, as TestPageDemo takes
# it once a move and the TTFT over and back under the SLO show (about a minute and a half), into
# bin/page.png; copy it over docs/page.png to refresh the README's.
screenshot: browser
	@mkdir -p $(BIN)
	NARWHAL_SCREENSHOT=$(BIN)/page.png $(GO) test -count=1 -run='^TestPageDemo$$' ./cmd/narwhal

lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install $(STATICCHECK)

staticcheck: $(BIN)/staticcheck
	$(BIN)/staticcheck ./...

# Hot-path benchmarks (figures in docs/benchmarks.md).
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# Fuzz the request parser (differentially against encoding/json) and the SSE observer,
# FUZZTIME each (docs/benchmarks.md); new interesting inputs stay in Go's fuzz cache.
FUZZTIME ?= 10m
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParseRequest$$' -fuzztime=$(FUZZTIME) ./extproc
	$(GO) test -run='^$$' -fuzz='^FuzzResponseObserver$$' -fuzztime=$(FUZZTIME) ./extproc
	$(GO) test -run='^$$' -fuzz='^FuzzParseMetrics$$' -fuzztime=$(FUZZTIME) ./engineclient

# The property tests at length: 10,000 router sequences, 30,000 sequences of random ext_proc
# streams through the real server, and 10,000 random controller runs audited; and the
# simulator's engine against a real enginesim's client-observed timing (needs a quiet machine).
check-long:
	$(GO) test -race -count=1 -run='^TestConservationProperty$$' ./router -rapid.checks=10000
	$(GO) test -race -count=1 -run='^TestStreamsProperty$$' ./extproc -rapid.checks=10000
	$(GO) test -race -count=1 -run='^TestAuditedProperty$$' ./controller -rapid.checks=10000
	NARWHAL_REALTIME=1 $(GO) test -count=1 -run='^TestModelMatchesTheServer$$' ./enginesim
	NARWHAL_REALTIME=1 $(GO) test -count=1 -run='^TestProfileRecoversKnownProfiles$$' ./profiler

# The simulator's results section of docs/benchmarks.md and its plots (docs/sim/*.svg): every
# shared trace and synthetic kind on 8 engines, every policy side by side (about 15 minutes).
bench-sim:
	$(GO) run ./cmd/benchsim -root .

# The controller scorecard of docs/benchmarks.md: every row under narwhal, static, static:best,
# threshold and oracle:greedy on 8 engines at the defaults, each target checked (≤ 10 minutes).
bench-control:
	$(GO) run ./cmd/benchcontrol -root .

# The generated scorecard of docs/benchmarks.md: SCENARIOS seeded scenarios (shapes, rates,
# fleets of 4 to 64 engines, engine profiles, faults) under narwhal, static, static:best,
# threshold and oracle:split at the defaults, with the projection's fidelity (≤ 20 minutes).
SCENARIOS ?= 200
SEED      ?= 2
bench-control-random:
	$(GO) run ./cmd/benchcontrol -root . -random $(SCENARIOS) -seed $(SEED)

# A move toward prefill through real engines: the burst's TTFT with the controller advisory and
# moving (docs/benchmarks.md; times real processes: a quiet machine).
bench-burst:
	NARWHAL_REALTIME=1 $(GO) test -count=1 -run='^TestBurstMoveFigures$$' -v ./cmd/narwhal

# Takeover figures of docs/benchmarks.md: 20 kills and 20 SIGTERMs of the leader on a real etcd.
bench-ha:
	NARWHAL_HA_ROUNDS=20 $(GO) test -count=1 -timeout 30m -run='^(TestHATakeoverFigures|TestHAKillUnderLoad)$$' -v ./cmd/narwhal

bench-profile:
	NARWHAL_REALTIME=1 NARWHAL_PROFILE_BUDGET_S=120 $(GO) test -count=1 -timeout 30m -run='^TestProfileRecoversKnownProfiles$$' -v ./profiler

clean:
	rm -rf $(BIN)
