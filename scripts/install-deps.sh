#!/usr/bin/env bash
# Installs the Debian 12 packages Factory needs to build, test and demo.
# Idempotent: installs only what is missing. As root it runs apt-get itself;
# otherwise it prints the one command to run and exits non-zero.
set -euo pipefail

build_pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  libboost1.81-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libsqlite3-dev
)
# Real validators and peers the test suite runs against the product.
test_pkgs=(
  cloud-init prometheus node-ws testssl.sh openssl curl
  python3 python3-jsonschema python3-kubernetes python3-yaml
  iproute2 procps openssh-client binutils systemd
)

want=("${build_pkgs[@]}")
if [[ "${1:-}" == "--test" ]]; then want+=("${test_pkgs[@]}"); fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "factory: missing packages: ${missing[*]}" >&2
  echo "run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# The prometheus package would start a server on :9090 where systemd runs;
# we only need promtool, so keep services from starting during the install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; created_policy=1; fi
trap '[[ $created_policy == 1 ]] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
