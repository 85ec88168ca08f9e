#!/usr/bin/env bash
# Installs the Debian 12 packages Factory needs: to build (no argument), to
# build and run the demo (--demo), or to build, demo and test (--test).
# Idempotent: installs only what is missing. As root it runs apt-get itself;
# otherwise with sudo when there is one, else it prints the one command to run
# and exits non-zero.
set -euo pipefail

# python3: the configure step finds it for the module graph test (tests/).
# libpq-dev: the PostgreSQL store's client library (coordinator/store).
# libgoogle-perftools-dev: tcmalloc, the coordinator's allocator, linked into factory.
build_pkgs=(
  build-essential cmake ninja-build ccache pkg-config python3
  libboost1.81-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libsqlite3-dev
  libpq-dev libgoogle-perftools-dev
)
# What scripts/demo.sh runs besides the two binaries: the Kubernetes API test
# double (python3 with yaml, jsonschema and kubernetes; its PKI is made with
# the openssl command), the VM simulator (python3-yaml; the real curl fetches
# the agent; the guests' stand-ins use pgrep), ssh-keygen for the admin's
# throwaway key, and headless chromium driven by node (node-ws), which takes
# the dashboard's picture (build/demo/dashboard.png; dashboard_test.cpp too).
demo_pkgs=(
  python3-yaml python3-jsonschema python3-kubernetes openssl curl openssh-client procps
  chromium node-ws
)
# Real validators and peers the test suite runs against the product; faketime
# moves the real binaries' clocks; clang builds the fuzz targets (libFuzzer);
# clang-format and clang-tidy are the lint tests' (tests/lint, version 14);
# QEMU, debootstrap and genisoimage boot the real guests of `make e2e-vm`
# (the provider's seed ISO, the base image, the VMs). python3-cryptography
# issues the fleet benchmark's agent certificates (make bench-fleet).
# postgresql: the real server the PostgreSQL store's tests start
# (tests/support/postgres_server.hpp); its service is kept from starting.
test_pkgs=(
  cloud-init prometheus testssl.sh python3-cryptography postgresql
  iproute2 binutils systemd faketime
  clang libclang-rt-14-dev clang-format clang-tidy
  qemu-system-x86 qemu-utils debootstrap genisoimage e2fsprogs
)

want=("${build_pkgs[@]}")
case "${1:-}" in
  "") ;;
  --demo) want+=("${demo_pkgs[@]}") ;;
  --test) want+=("${demo_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: $0 [--demo|--test]" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
((${#missing[@]} == 0)) && exit 0

as_root=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "factory: missing packages: ${missing[*]}" >&2
    echo "run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo)
fi
echo "installing: ${missing[*]}"
# The prometheus package would start a server on :9090 where systemd runs
# (postgresql one on :5432); we only need promtool and the server binaries the
# tests start themselves, so keep services from starting during the install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
  "${as_root[@]}" chmod 755 "$policy"
  created_policy=1
fi
trap '[[ $created_policy == 1 ]] && "${as_root[@]}" rm -f "$policy"' EXIT
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
