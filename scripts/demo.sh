#!/usr/bin/env bash
# The README's demo command: sets the machine up, builds muxfs and runs `muxfs demo`
# (two throwaway SSH servers on loopback muxed into one mount).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="/usr/local/go/bin:$PATH"
go build -o ./muxfs ./cmd/muxfs
exec ./muxfs demo "$@"
