#!/usr/bin/env bash
# Soak: the random-operation tests (TestRandom*: names against a local directory, on
# one server and on a union; one file through several descriptors against a model; a
# file statted, listed and read through new descriptors while it is being written)
# with more seeds and operations than CI runs, and with every CPU kept busy beside
# them: requests the mount sends ahead (listings, read-ahead, write-behind, the
# persistent cache's commits) then take longer, and races between them and the test's
# own operations show (docs/design.md, "Soaks are also run with the CPUs busy").
#
#   scripts/soak.sh [-seeds N] [-ops N] [-idle] [-run REGEXP]
#
# -idle leaves the CPUs alone. Defaults: 40 seeds of 3,000 operations, every TestRandom
# test. The busy loops end with the script, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

seeds=40 ops=3000 busy=1 run='TestRandom'
while [ $# -gt 0 ]; do
	case "$1" in
	-seeds) seeds=$2; shift 2 ;;
	-ops) ops=$2; shift 2 ;;
	-idle) busy=0; shift ;;
	-run) run=$2; shift 2 ;;
	*) echo "soak.sh: unknown argument $1; use -seeds N, -ops N, -idle, -run REGEXP" >&2; exit 2 ;;
	esac
done

loops=()
stop() { [ ${#loops[@]} -eq 0 ] || kill "${loops[@]}" 2>/dev/null || true; }
trap stop EXIT
if [ "$busy" = 1 ]; then
	for _ in $(seq "$(nproc)"); do
		sh -c 'while :; do :; done' &
		loops+=($!)
	done
fi
# go test's own -timeout kills the test binary without its cleanups (mounts would be
# left behind): give it room, 1.5 s per 100 operations of a seed and 10 minutes more
# (all of them with 40 seeds of 3,000 under load: about 13 minutes of the 40 given).
timeout=$(( seeds * ops / 100 * 3 / 2 + 600 ))
MUXFS_FSX_SEEDS=$seeds MUXFS_FSX_OPS=$ops go test -count=1 -timeout "${timeout}s" -run "$run" ./e2e/
