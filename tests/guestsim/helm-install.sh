#!/bin/bash
# GUEST SIMULATOR STAND-IN for Helm's installer
# (https://raw.githubusercontent.com/helm/helm/main/scripts/get-helm-4),
# served by the curl stand-in (which fills in the paths below).
#
# What it does, with the real script's messages: "installs" helm into
# /usr/local/bin (here <root>/.guestsim/installed-bin/helm, the helm
# stand-in); HELM_INSTALL_DIR, DESIRED_VERSION and USE_SUDO are ignored.
# Counter: helm.get. What it does not do: download or verify anything.
set -eu
ROOT='@GUESTSIM_ROOT@'
HOME_='@GUESTSIM_HOME@'
G="$ROOT/.guestsim"
VER=v4.0.0
echo "Downloading https://get.helm.sh/helm-$VER-linux-amd64.tar.gz"
echo "Verifying checksum... Done."
echo "Preparing to install helm into /usr/local/bin"
mkdir -p "$G/installed-bin" "$G/state/counters"
ln -sfn "$HOME_/opt/helm" "$G/installed-bin/helm"
echo "helm installed into /usr/local/bin/helm"
( flock 9; n=$(cat "$G/state/counters/helm.get" 2>/dev/null || echo 0); echo $((n + 1)) > "$G/state/counters/helm.get" ) 9> "$G/state/counters/helm.get.lock"
