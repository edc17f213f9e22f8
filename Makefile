# inferd: thin wrappers over go commands and scripts in this repo.
CONFIG ?= config.example.yaml
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
# go-nvml's cgo bindings include NVIDIA's header, which marks many calls we never
# use as deprecated; the warnings would bury real output.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)

.PHONY: build run doctor test test-cluster lint fuzz faults clean client-deps test-deps package bench bench-cluster mutate gpu-check-bin gpu-check-dry

## build: compile ./inferd
build:
	go build -ldflags "$(LDFLAGS)" -o inferd .

# The demo runs its model as you, even as root, where a service install gives
# each project a uid of its own (replica.user: per-project): python3 may live
# where no other user can read it. apply and doctor check the models as that
# same user. The rest of the sandbox applies as far as your privileges allow;
# the start-up log line says which protections are on.
RUN_ENV = INFERD_REPLICA_USER=$${INFERD_REPLICA_USER:-$$(id -un)}

## run: start the daemon with the example echo model (Ctrl-C stops it)
run: build
	$(RUN_ENV) ./inferd --config $(CONFIG) apply -f examples/projects.yaml
	@echo
	@echo "inferd is starting on http://127.0.0.1:8080 with the example project 'echo'."
	@echo "In another terminal, create an API key and call the model:"
	@echo "  KEY=\$$(./inferd --config $(CONFIG) key create --team demo | tail -n1)"
	@echo "  curl -s localhost:8080/start/v4 -d '{\"apiKey\":\"'\$$KEY'\",\"modelKey\":\"mk-echo-1\",\"modelInputs\":{\"prompt\":\"hi\"}}'"
	@echo "To check the box and the applied projects as this demo runs them: make doctor"
	@echo
	$(RUN_ENV) ./inferd --config $(CONFIG) serve

## doctor: check the box and the applied projects as make run runs them
doctor: build
	$(RUN_ENV) ./inferd --config $(CONFIG) doctor

## test: every check CI runs: formatting, vet, and all tests with the race detector,
## including the public Banana npm clients against a live inferd. The e2e
## package alone runs about 7 minutes on 2 cores: go test's default 10-minute
## limit per test binary would leave too little headroom.
test: lint test-deps client-deps
	INFERD_REQUIRE_CLIENT_TESTS=1 go test -race -count=1 -timeout 20m ./...
	scripts/fuzz.sh $(CI_FUZZTIME)

## test-cluster: the three-node failure scenarios of cluster mode (#22; e2e/threenode_faults_test.go,
## built with the cluster tag): a node and the leader killed, a node cut off (network namespaces, as
## root), quorum lost, GPU placement. Not part of make test (leases of 5 s lapse, nodes restart: about
## 2.5 minutes on 2 cores); the quick three-node scenario (keys, projects, calls, long polls) is.
test-cluster: test-deps
	INFERD_REQUIRE_CLIENT_TESTS=1 go test -race -count=1 -tags cluster -timeout 20m -run 'TestThreeNode' ./e2e/

## test-deps: the Debian packages the tests need (apt, only what is missing)
test-deps:
	scripts/test-deps.sh

## client-deps: the pinned Banana JavaScript clients the end-to-end test drives, and
## playwright-core for the status page browser test (it drives Debian's chromium and
## never downloads a browser)
client-deps:
	cd examples/banana-js && npm ci --no-audit --no-fund --loglevel=error
	cd web/browsertest && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error

## lint: gofmt, go vet, staticcheck and govulncheck (skipped only when its
## database cannot be reached)
lint:
	scripts/lint.sh

## package: build dist/inferd_VERSION_ARCH.deb and .rpm with nfpm (pinned in
## tools/go.mod); make test installs the .deb when it runs as root
package:
	scripts/package.sh dist

## bench: inferd side by side with the model called directly and behind nginx, the large-payload figures,
## batching against a call per pass, plus the Go micro-benchmarks (docs/benchmarks.md); about 5 minutes
bench:
	scripts/bench.sh

## bench-cluster: calls/s and added latency through a 3-node cluster (embedded etcd members, on this
## box) side by side with the single box (docs/benchmarks.md); the suite's cluster step alone, about
## a minute; make bench runs it too
bench-cluster:
	BENCH_GO=0 BENCH_REPORT=cluster.md scripts/bench.sh -only cluster

## fuzz: each fuzz target for FUZZTIME executions (make test: CI_FUZZTIME)
FUZZTIME ?= 200000x
CI_FUZZTIME ?= 3000x
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

## faults: the fault tests (docs/reliability.md) with a long kill -9 soak; run as
## root for the disk-full test. Figures go to faults-report.txt.
# The end-to-end fault tests live in ./e2e/, the unit-level ones (store,
# scheduler, replica) beside their code: ./... runs both.
FAULT_TESTS := Fault|Kill|Payload|Crash|Corrupt|DamagedTree|FlippedBytes|EmptyFile|DiskFull|StorageFull|NotSave|Orphan|Leaked|WallClock|RealClock|Backoff|Recovery|InferReports|SurviveDaemon|Graceful|Drain|Flood|ConnLimit
faults:
	rm -f faults-report.txt
	INFERD_SOAK_ROUNDS=$${INFERD_SOAK_ROUNDS:-8} INFERD_SOAK_CALLS=$${INFERD_SOAK_CALLS:-250} \
	  INFERD_FAULTS_REPORT=$(CURDIR)/faults-report.txt \
	  go test -race -count=1 -run '$(FAULT_TESTS)' ./...
	@cat faults-report.txt

## mutate: break each core rule in turn (scripts/mutations.txt: durability,
## recovery, isolation, validation, idle and min replicas) in a temporary
## worktree of HEAD and check that a test fails; not part of make test
mutate:
	scripts/mutate.sh

## gpu-check-bin: bin/inferd, built with cgo (NVML, the CUDA checkpoint helper) and without the race
## detector, to carry to a GPU box with scripts/ and examples/ for scripts/gpu-check.sh (docs/gpu.md);
## it needs glibc 2.34 or later there
gpu-check-bin:
	CGO_ENABLED=1 go build -ldflags "$(LDFLAGS)" -o bin/inferd .

## gpu-check-dry: scripts/gpu-check.sh --dry-run on simulated GPUs, with a -tags failpoints build whose
## fake checkpointer stands in for the driver (make test runs it too: TestGPUCheckScriptDryRun)
gpu-check-dry:
	go build -tags failpoints -o bin/inferd-failpoints .
	scripts/gpu-check.sh --dry-run --inferd bin/inferd-failpoints

clean:
	rm -rf inferd bin dist faults-report.txt
