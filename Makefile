# inferd: thin wrappers over go commands and scripts in this repo.
CONFIG ?= config.example.yaml
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
# go-nvml's cgo bindings include NVIDIA's header, which marks many calls we never
# use as deprecated; the warnings would bury real output.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)

.PHONY: build run doctor test test-busy test-cluster lint fuzz faults clean client-deps test-deps digits-deps package bench bench-cluster bench-quick mutate gremlins gpu-check-bin gpu-check-dry

# What ./inferd is built from: the main module's Go files (tools/ is a module
# of its own), go.mod and go.sum, and the files it embeds (the status page,
# the Potassium shim). A make target that needs the binary relinks it only
# when one of them is newer, so make doctor or make run start at once the
# second time. make -B build forces a build.
BIN ?= inferd
SOURCES := go.mod go.sum $(shell find . \
	\( -path ./tools -o -path ./.git -o -name node_modules -o -path ./bench/out \) -prune -o -name '*.go' -not -name '*_test.go' -type f -print) \
	$(shell find web/static scheduler/backend/local/potassiumshim -type f)

## build: compile ./inferd, only when a source changed since it was built
build: $(BIN)

$(BIN): $(SOURCES)
	go build -ldflags "$(LDFLAGS)" -o $(BIN) .

# The demo runs its model as `inferd --config config.example.yaml serve` would,
# as the packaged service does: as root, under a uid of the project's own (the
# example runs on the system python3, which any user may run). Where other
# users cannot read this checkout (a clone under /root, or a home of mode 700)
# that uid could not read the example either: there the demo runs its model as
# you (scripts/demo-user.sh), and make run says so with the command that
# restarts it the same way. apply and doctor check the models as that same user.
DEMO_USER = $(shell scripts/demo-user.sh)
RUN_ENV = $(if $(DEMO_USER),INFERD_REPLICA_USER=$(DEMO_USER) )
DEMO_NOTE = Other users cannot read this checkout, so the model runs as $(DEMO_USER), not under a uid of its own as a service's would.

## run: start the daemon with the example echo model (Ctrl-C stops it). It applies
## the example to the data file itself (apply --offline), so a second make run
## while one serves stops there and changes nothing.
run: build
	$(RUN_ENV)./inferd --config $(CONFIG) apply --offline -f examples/projects.yaml
	@echo
	@echo "inferd is starting on http://127.0.0.1:8080 with the example project 'echo'."
	@echo "In another terminal, create an API key and call the model:"
	@echo "  KEY=\$$(./inferd --config $(CONFIG) key create --team demo | tail -n1)"
	@echo "  curl -s localhost:8080/start/v4 -d '{\"apiKey\":\"'\$$KEY'\",\"modelKey\":\"mk-echo-1\",\"modelInputs\":{\"prompt\":\"hi\"}}'"
	@echo "Or from the shell, with no key: ./inferd --config $(CONFIG) call echo '{\"prompt\":\"hi\"}'"
	@echo "The other examples, each applied and called as its README says: make example-NAME (batch, stream, potassium, openai-mock, openai-js, banana-js)"
	@echo "To check the box and the applied projects: $(RUN_ENV)./inferd --config $(CONFIG) doctor (or make doctor)"
	@echo "After Ctrl-C, make run or $(RUN_ENV)./inferd --config $(CONFIG) serve starts it again."
	@$(if $(DEMO_USER),echo "$(DEMO_NOTE)",true)
	@echo
	$(RUN_ENV)./inferd --config $(CONFIG) serve

## example-NAME: apply examples/NAME to the daemon make run serves and call it as its README does
## (echo, batch, stream, potassium, openai-mock, digits, openai-js, banana-js; scripts/example.sh)
example-%: build
	INFERD=./inferd CONFIG=$(CONFIG) scripts/example.sh $*

## doctor: check the box and the applied projects as make run runs them
doctor: build
	$(RUN_ENV)./inferd --config $(CONFIG) doctor

## test: every check CI runs: formatting, vet, and all tests with the race detector,
## including the public Banana npm clients against a live inferd (README, "What
## make test needs"). The Debian packages install while lint runs (apt waits on
## the network and the disk, lint on the CPU); their output follows lint's. The
## e2e tests run up to E2E_PARALLEL at a time: most of their time is spent
## waiting on model processes, not on the CPU.
E2E_PARALLEL ?= 6
TEST_TIMEOUT ?= 20m
test: client-deps
	@log=$$(mktemp); echo "scripts/test-deps.sh >$$log (beside lint)"; \
	scripts/test-deps.sh >$$log 2>&1 & deps=$$!; \
	scripts/lint.sh; lint=$$?; \
	wait $$deps; rc=$$?; cat $$log; rm -f $$log; \
	[ $$lint -eq 0 ] && [ $$rc -eq 0 ]
	INFERD_REQUIRE_CLIENT_TESTS=1 go test -race -count=1 -timeout $(TEST_TIMEOUT) -parallel $(E2E_PARALLEL) ./...
	scripts/fuzz.sh $(CI_FUZZTIME)

## test-busy: make test with a CPU hog of twice the cores beside it (scripts/busy.sh): every test
## must hold on a busy machine. Deadlines stretch by INFERD_TEST_SLACK (3 here) or the load
## average per core, whichever is larger (internal/testenv/slack.go); go test's own limit is
## TEST_TIMEOUT (60m here).
test-busy:
	scripts/busy.sh $(MAKE) test TEST_TIMEOUT=60m

## test-cluster: the three-node failure scenarios of cluster mode (#22, #42; e2e/threenode_*_test.go
## built with the cluster tag): a node and the leader killed, a node cut off (network namespaces, as
## root), quorum lost and regained with nothing restarted, a partition of all three, every node
## answering every call alike after a heal, etcd on cluster init's certificates, a team's quota and a
## key's rate across nodes, GPU placement, the Batch API through every node (503 for a killed
## holder), and the porcupine linearizability check of clients'
## starts, checks and cancels under kill -9, a cut and SIGSTOP. Not part of make test (leases of 5 s
## lapse, nodes restart: 5 to 6 minutes of tests, 5.2 to 6.7 with the build, on 2 cores shared with other builds,
## 2026-12-07); the quick three-node scenario is.
## CI (.ci/run) runs it after make test.
test-cluster: test-deps
	INFERD_REQUIRE_CLIENT_TESTS=1 go test -race -count=1 -tags cluster -timeout 20m -run 'TestThreeNode' ./e2e/

## test-deps: the Debian packages the tests need (apt, only what is missing)
test-deps:
	scripts/test-deps.sh

## client-deps: the pinned Banana JavaScript clients, the openai npm client and the npm OpenAI
## clients (openai 4.x and current, the AI SDK, LangChain: examples/openai-clients) the
## end-to-end tests drive, and playwright-core for the status page browser test (it drives
## Debian's chromium and never downloads a browser); each npm ci has NPM_TIMEOUT seconds
NPM_TIMEOUT ?= 300
NPM_CI = timeout --kill-after=10 $(NPM_TIMEOUT) npm ci --no-audit --no-fund --loglevel=error \
	|| { echo "npm ci in $$PWD failed or took over $(NPM_TIMEOUT)s (NPM_TIMEOUT): check the registry in ~/.npmrc or the network" >&2; exit 1; }
client-deps:
	cd examples/banana-js && $(NPM_CI)
	cd examples/openai-js && $(NPM_CI)
	cd examples/openai-clients && $(NPM_CI)
	cd web/browsertest && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(NPM_CI)

## digits-deps: the Debian packages examples/digits needs (PyTorch, scikit-learn),
## without their recommends (as root, or with sudo)
digits-deps:
	scripts/apt-install.sh python3-torch python3-sklearn

## lint: gofmt, go vet, staticcheck and govulncheck (skipped only when its
## database cannot be reached)
lint:
	scripts/lint.sh

## package: build dist/inferd_VERSION_ARCH.deb and .rpm with nfpm (pinned in
## tools/go.mod); make test installs the .deb when it runs as root
package:
	scripts/package.sh dist

## bench: inferd side by side with the model called directly and behind nginx, the large-payload figures,
## the queue ETA's accuracy (bench/eta), batching against a call per pass, plus the Go micro-benchmarks
## (docs/benchmarks.md); about 6 minutes
bench:
	scripts/bench.sh

## bench-cluster: calls/s and added latency through a 3-node cluster (embedded etcd members, on this
## box) side by side with the single box (docs/benchmarks.md); the suite's cluster step alone, about
## a minute; make bench runs it too
bench-cluster:
	BENCH_GO=0 BENCH_REPORT=cluster.md scripts/bench.sh -only cluster

## bench-quick: the hot path's figures and targets (added latency, calls/s at c=1/16/64 with the no-op and
## the 10 ms model, inferd CPU per call, cluster through one node) in one interleaved run of short slices,
## under a minute: run it before and after a change on the write or call path (docs/benchmarks.md)
bench-quick:
	BENCH_GO=0 BENCH_REPORT=quick.md scripts/bench.sh -quick

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

## gremlins: mutation testing by a tool: go-gremlins (pinned in tools/go.mod) over the lines that differ
## from BASE (default main) in each package they touch, against that package's own tests; scores and
## the reasons for mutants that live in docs/benchmarks.md. Not part of make test (minutes per package)
BASE ?= main
gremlins:
	scripts/gremlins.sh $(BASE)

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
