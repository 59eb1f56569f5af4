#!/usr/bin/env bash
# Runs the benchmarks: installs what they need (fio, sshfs, rclone, mergerfs, fuse3, sshd, a C
# compiler), then `go run` the harness with the given flags. Needs root (apt-get, and
# dropping the page cache for cold runs). See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
missing=()
for p in fio sshfs rclone bonnie++ mergerfs git rsync; do command -v "$p" >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export PATH="/usr/local/go/bin:$PATH"
cd bench && exec go run . "$@"
