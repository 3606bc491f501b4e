#!/usr/bin/env bash
# The system packages the tests need, checked and, where this user may, installed:
#   libibverbs1  libibverbs.so.1, which Mooncake's transfer engine links even for TCP
#   iproute2     `ip`, to bring up loopback in the Mooncake tests' private network namespace
#   util-linux   `unshare`, to create that namespace
# Installs with apt-get as root or with passwordless sudo; otherwise stops with the exact
# command to run. `make setup` (so `make test`) runs it; the Mooncake tests fail, naming this
# script, when a package is still missing.
set -euo pipefail

need=()
# ldconfig lives in /sbin, which a normal user's PATH may lack; dpkg knows the package by name.
libs="$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)"
if [[ "$libs" != *"libibverbs.so.1 "* ]] && ! dpkg -s libibverbs1 >/dev/null 2>&1; then
  need+=(libibverbs1)
fi
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

why="libibverbs.so.1 for Mooncake, ip and unshare for the Mooncake tests' network namespace"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing system packages: ${need[*]} ($why); this machine has no apt-get:" \
    "install the equivalent packages with its package manager, then rerun make" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
  sudo=(sudo -n)
else
  echo "error: missing system packages: ${need[*]} ($why), and installing them needs root." \
    "Run: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing system packages: ${need[*]} ($why)"
"${sudo[@]}" apt-get update -qq
# Through env: sudo drops the caller's environment.
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
