#!/usr/bin/env bash
# Installs what muxfs needs to build, run its demo and pass its tests on a fresh Debian
# machine: FUSE 3, OpenSSH client and server, a C compiler (the demo builds a program
# from the mount), and Go modules. Idempotent; needs root for the apt-get part.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
# procps: pgrep and pkill, which the bench (and its tests) use to wait for a file
# system's process after an unmount.
packages=(fuse3 openssh-server openssh-client gcc make procps)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages ${missing[*]}: run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's udev rule makes /dev/fuse usable by every user; containers often leave it
# 0600, and then only root can mount (the unprivileged test proves the normal case).
if [ -c /dev/fuse ] && [ "$(id -u)" -eq 0 ] && [ "$(stat -c %a /dev/fuse)" != "666" ]; then
  chmod 0666 /dev/fuse
fi
if ! command -v go >/dev/null; then
  echo "setup: Go is not installed (expected in /usr/local/go/bin)" >&2
  exit 1
fi
go mod download
