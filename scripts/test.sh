#!/usr/bin/env bash
# The README's test command: sets the machine up, then runs the checks and every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"

echo "== gofmt, go vet, staticcheck"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted" >&2; exit 1; fi
go vet ./...
(cd bench && go vet ./...)
command -v staticcheck >/dev/null || go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck ./...
(cd bench && staticcheck ./...)

echo "== unit tests (race detector)"
go test -race -count=1 ./internal/... ./cmd/...
(cd bench && go test -count=1 ./...)

echo "== end-to-end tests (real sshd, real mounts, separate muxfs processes)"
go test -count=1 -timeout 20m ./e2e/...
