#!/bin/sh
# GUEST SIMULATOR STAND-IN for https://get.rke2.io, served by the curl
# stand-in (which fills in the paths below).
#
# What it does, as the real script does with the tarball method on Ubuntu:
# installs the version in INSTALL_RKE2_VERSION (else the "stable" channel's,
# the simulator config's rke2_latest) into /usr/local: the rke2 binary,
# rke2-killall.sh, rke2-uninstall.sh, and the rke2-server / rke2-agent units
# in /usr/local/lib/systemd/system. It does not start anything (the real
# script does not either: `systemctl enable --now rke2-server` does).
# "Installing" links the stand-ins into <root>/.guestsim/installed-bin (the
# simulated /usr/local/bin) and records the version.
# Counter: rke2.install. What it does not do: download or verify anything.
set -eu
ROOT='@GUESTSIM_ROOT@'
HOME_='@GUESTSIM_HOME@'
G="$ROOT/.guestsim"
info() { echo "[INFO]  $*"; }
VER="${INSTALL_RKE2_VERSION:-}"
if [ -z "$VER" ]; then
  info "finding release for channel stable"
  VER="$(sed -n 's/^rke2_latest=//p' "$G/config")"
fi
info "using $VER as release"
info "downloading checksums at https://github.com/rancher/rke2/releases/download/$VER/sha256sum-amd64.txt"
info "downloading tarball at https://github.com/rancher/rke2/releases/download/$VER/rke2.linux-amd64.tar.gz"
info "verifying tarball"
info "unpacking tarball file to /usr/local"
mkdir -p "$G/installed-bin" "$G/state/k8s" "$ROOT/usr/local/lib/systemd/system"
for f in rke2 rke2-killall.sh rke2-uninstall.sh; do ln -sfn "$HOME_/opt/$f" "$G/installed-bin/$f"; done
echo "$VER" > "$G/state/k8s/rke2-version"
for t in server agent; do
  cat > "$ROOT/usr/local/lib/systemd/system/rke2-$t.service" <<UNIT
[Unit]
Description=Rancher Kubernetes Engine v2 ($t)
Documentation=https://github.com/rancher/rke2#readme
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
ExecStart=/usr/local/bin/rke2 $t
KillMode=process
Delegate=yes
Restart=always
RestartSec=5s

[Install]
WantedBy=multi-user.target
UNIT
done
( flock 9; n=$(cat "$G/state/counters/rke2.install" 2>/dev/null || echo 0); echo $((n + 1)) > "$G/state/counters/rke2.install" ) 9> "$G/state/counters/rke2.install.lock"
