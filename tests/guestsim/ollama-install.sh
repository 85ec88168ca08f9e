#!/bin/sh
# GUEST SIMULATOR STAND-IN for https://ollama.com/install.sh, served by the
# curl stand-in (which fills in the paths below).
#
# What it does, as the real script does it on a systemd machine: installs
# the version in OLLAMA_VERSION (else the "latest" in the simulator's
# config), writes /etc/systemd/system/ollama.service, then
# `systemctl daemon-reload`, `systemctl enable ollama`, `systemctl restart
# ollama`. "Installing" puts the ollama stand-in on PATH
# (<root>/.guestsim/installed-bin/ollama) and records the version, which the
# stand-in server (tests/fakes/ollama_server.py) reports.
# Counter: ollama.install. Knob: ollama_install_fail (the bundle download fails).
# What it does not do: download anything, create users or groups.
set -eu
ROOT='@GUESTSIM_ROOT@'
G="$ROOT/.guestsim"
latest="$(sed -n 's/^ollama_latest=//p' "$G/config")"
VER="${OLLAMA_VERSION:-$latest}"
status() { echo ">>> $*" >&2; }

status "Installing ollama to /usr/local"
status "Downloading Linux amd64 bundle"
if [ -f "$G/knobs/ollama_install_fail" ]; then
  echo "curl: (22) The requested URL returned error: 404" >&2
  exit 1
fi
echo "######################################################################## 100.0%" >&2
mkdir -p "$G/installed-bin" "$G/state/ollama" "$G/state/counters"
ln -sfn '@GUESTSIM_HOME@/opt/ollama' "$G/installed-bin/ollama"
echo "$VER" > "$G/state/ollama/version"
( flock 9; n=$(cat "$G/state/counters/ollama.install" 2>/dev/null || echo 0); echo $((n + 1)) > "$G/state/counters/ollama.install" ) 9> "$G/state/counters/ollama.install.lock"

status "Creating ollama user..."
status "Adding ollama user to render group..."
status "Adding ollama user to video group..."
status "Adding current user to ollama group..."
status "Creating ollama systemd service..."
mkdir -p "$ROOT/etc/systemd/system"
port="$(sed -n 's/^ollama_port=//p' "$G/config")"
cat > "$ROOT/etc/systemd/system/ollama.service" <<UNIT
[Unit]
Description=Ollama Service
After=network-online.target

[Service]
ExecStart=/usr/local/bin/ollama serve
User=ollama
Group=ollama
Restart=always
RestartSec=3
Environment="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Environment="OLLAMA_HOST=127.0.0.1:$port"

[Install]
WantedBy=default.target
UNIT
status "Enabling and starting ollama service..."
systemctl daemon-reload
systemctl enable ollama
systemctl restart ollama
if nvidia-smi -L > /dev/null 2>&1; then
  status "NVIDIA GPU installed."
else
  status "WARNING: No NVIDIA/AMD GPU detected. Ollama will run in CPU-only mode."
fi
status "The Ollama API is now available at 127.0.0.1:$port."
status "Install complete. Run \"ollama\" from the command line."
