#!/bin/sh
# make lint: gofmt, go vet, staticcheck and govulncheck. The two tools are
# pinned and fetched through the module proxy (go run mod@version), so the
# project carries no tool dependencies in go.mod.
set -eu
STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOVULNCHECK=golang.org/x/vuln/cmd/govulncheck@v1.9.0

out=$(gofmt -l .)
if [ -n "$out" ]; then echo "gofmt would change:"; echo "$out"; exit 1; fi
go vet ./...
go run "$STATICCHECK" ./...
# The cluster scenarios build only with their tag (make test-cluster).
go vet -tags cluster ./e2e/
go run "$STATICCHECK" -tags cluster ./e2e/

# govulncheck needs its database from vuln.go.dev, which the module proxy does
# not mirror. Findings fail the build; only an unreachable database is
# skipped, loudly, because an offline box cannot check.
if out=$(go run "$GOVULNCHECK" ./... 2>&1); then
	echo "govulncheck: no known vulnerability reaches inferd's code"
elif echo "$out" | grep -q 'fetching vulnerabilities'; then
	echo "govulncheck: SKIPPED: the vulnerability database (vuln.go.dev) cannot be reached:"
	echo "$out" | grep 'fetching vulnerabilities' | sed 's/^/  /'
else
	echo "$out"
	exit 1
fi
