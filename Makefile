# enimasq: `make demo` runs the agent on the samples, `make test` runs the tests.

GO        ?= go
BIN       := bin
GOFLAGS_T ?= -race -count=1
SAMPLES   ?= $(abspath test/testdata/samples)

.PHONY: all build test bench demo generate docs check-fmt vet staticcheck clean k8s-bins aws-np-controller coredns crds cilium-agent test-cilium test-unprivileged test-manifests

all: build

# cnitool (a go.mod tool) drives the CNI plugin in the demo and the tests.
# The version (enimasq-agent --version, enimasq-dbg version) is the commit's.
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./cmd/... github.com/containernetworking/cni/cnitool

# Cilium v1.20.2's cilium-agent with enimasq's cells linked in (its own Go
# module, cmd/cilium-agent, so that the main module's tests do not pull Cilium).
# A cold build takes 10-20 minutes on 2 cores; the binary is cached in
# ~/.cache/enimasq/cilium-agent (by a hash of the sources) and Cilium's packages
# in the Go build cache.
CILIUM_AGENT_DIR := cmd/cilium-agent
cilium-agent:
	GO=$(GO) $(CILIUM_AGENT_DIR)/build.sh $(abspath $(BIN))/cilium-agent

check-fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# staticcheck at a pinned version, run from the module proxy (not a go.mod
# tool: its dependencies would enter the module graph the Cilium build
# shares).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck:
	$(GO) run $(STATICCHECK) ./...

# kube-apiserver (k8s.io/kubernetes v1.37.2) and etcd (v3.6.16) for the tests
# against a real API server (test/k8stest), built from the Go module proxy once and
# cached in ~/.cache/enimasq/ (about 10 minutes the first time, then instant);
# with them, the AWS network policy controller and CoreDNS.
k8s-bins: aws-np-controller coredns
	GO=$(GO) test/k8stest/apiserver-build/build.sh

# The AWS network policy controller v1.1.10, the writer of the PolicyEndpoints
# and ClusterPolicyEndpoints enimasq reads, for the tests that let it write
# them (k8stest.StartController): built from the Go module proxy once (its own
# module, test/k8stest/controller-build) and cached next to kube-apiserver
# with its module's CRDs (a few minutes the first time, then instant).
aws-np-controller:
	GO=$(GO) test/k8stest/controller-build/build.sh

# CoreDNS v1.15.0 with the plugins the tests use (bind, errors, file), the
# real resolver of the tests that need one (test/coredns_helpers_test.go):
# built from the Go module proxy once (its own module,
# test/k8stest/coredns-build) and cached in ~/.cache/enimasq/coredns-v1.15.0
# (about a minute the first time, then instant; the whole of CoreDNS took
# nine).
coredns:
	GO=$(GO) test/k8stest/coredns-build/build.sh

# Copies the controller's PolicyEndpoint and ClusterPolicyEndpoint CRDs from
# its module at the pinned version into Documentation/deploy/network-policy/crds
# and test/k8stest/crds (a test checks they are still the module's).
crds:
	GO=$(GO) test/k8stest/controller-build/build.sh -crds

# Privileged tests (TestPrivileged...) run when this runs as root. The tests
# against a real API server fail instead of skipping when its binaries are
# missing (ENIMASQ_REQUIRE_K8S).
test: check-fmt vet staticcheck build k8s-bins
	ENIMASQ_BIN=$(abspath $(BIN)) ENIMASQ_REQUIRE_K8S=1 $(GO) test $(GOFLAGS_T) -timeout 20m ./...
	$(MAKE) test-unprivileged
	$(MAKE) test-manifests
	$(MAKE) test-cilium

# The same tests as an unprivileged user (nobody, no capabilities): every
# txtar runs against the fakes (fake maps, fake netlink) and the privileged
# tests skip. Run as root, which builds the test binaries; `go test ./...`
# as any other user does the same.
UNPRIVILEGED ?= setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all
test-unprivileged: build
	ENIMASQ_BIN=$(abspath $(BIN)) $(GO) test -count=1 -timeout 10m -exec '$(UNPRIVILEGED)' ./...

# The deployment manifests (test/manifests, its own module: kustomize's API
# needs newer shared modules than the Cilium build allows): every
# kustomization of Documentation/deploy rendered as `kubectl kustomize` does,
# every object through a server-side dry run on the real kube-apiserver, the
# DaemonSet's probes, capabilities and CNI install.
MANIFESTS_DIR := test/manifests
test-manifests: k8s-bins
	cd $(MANIFESTS_DIR) && $(GO) vet ./... && ENIMASQ_REQUIRE_K8S=1 $(GO) test -count=1 -timeout 10m ./...

# The Cilium module's tests: Cilium's agent command with enimasq's cells (every
# flag once, 'cilium-agent hive' constructs) and the whole agent started
# (agenttest: bin/cilium-agent with Cilium's cilium-cni and cilium-dbg against
# the real API server; needs clang, llc and iptables, which .ci/run installs). Without -race: the race build of
# Cilium's packages would double a cold CI run; enimasq's code is race-tested
# by the main module's tests above.
test-cilium: cilium-agent k8s-bins
	cd $(CILIUM_AGENT_DIR) && $(GO) vet ./... && GO=$(GO) ENIMASQ_BIN=$(abspath $(BIN)) ENIMASQ_REQUIRE_K8S=1 $(GO) test -count=1 -timeout 30m ./...

# The process benchmarks (test/) run the binaries of bin/, built without
# -race (the tests' own build has it); the Cilium module's benchmark starts the
# whole cilium-agent, with and without enimasq's cells.
bench: build cilium-agent k8s-bins
	ENIMASQ_BIN=$(abspath $(BIN)) $(GO) test -run '^$$' -bench . -benchtime 5x -timeout 30m ./...
	cd $(CILIUM_AGENT_DIR) && ENIMASQ_BIN=$(abspath $(BIN)) $(GO) test -run '^$$' -bench . -benchtime 5x -timeout 30m ./...

demo: build
	SAMPLES=$(SAMPLES) ./test/demo.sh

# Regenerates the bpf2go output (needs clang, libbpf-dev).
generate:
	$(GO) generate ./bpf/...

docs: build
	$(BIN)/enimasq-agent flags-doc > Documentation/flags.md

clean:
	rm -rf $(BIN)
