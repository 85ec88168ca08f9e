# Shared by the guest simulator's stand-ins (sourced, not run).
#
# A stand-in is reached through a symlink in <root>/.guestsim/bin (or
# <root>/.guestsim/installed-bin for the programs a package installs), so the
# simulated guest's root is two directories above the link ($0), and the
# stand-ins' own files are found through the link's target.
#
# State layout (all under <root>/.guestsim/, see tests/guestsim/README.md):
#   config              KEY=value written by guestsim.sh create (profile, kernel, port, paths)
#   knobs/NAME          failure knobs: a file's presence (and content) turns a failure on
#   state/counters/NAME invocation counters (one integer per file)
#   state/dpkg/PKG      dpkg's status for a package ("Status:" and "Version:" lines)
#   state/...           see README.md
#   log/calls.log       every stand-in call with its arguments

set -u

GS_LINK_DIR="$(cd "$(dirname "$0")" && pwd)"
GS_ROOT="${FACTORY_GUESTSIM_ROOT:-$(cd "$GS_LINK_DIR/../.." && pwd)}"
GS_DIR="$GS_ROOT/.guestsim"
GS_SELF="$(readlink -f "$0")"
GS_HOME="$(cd "$(dirname "$GS_SELF")/.." && pwd)"   # tests/guestsim
GS_STATE="$GS_DIR/state"
GS_NAME="$(basename "$0")"

if [ ! -f "$GS_DIR/config" ]; then
  echo "guestsim $GS_NAME: $GS_ROOT is not a simulated guest (no .guestsim/config); run tests/guestsim/guestsim.sh create" >&2
  exit 127
fi

# config: KEY=value lines, values without quotes.
gs_config() {
  sed -n "s/^$1=//p" "$GS_DIR/config" | head -n1
}

gs_log() {
  mkdir -p "$GS_DIR/log"
  printf '%s %s\n' "$GS_NAME" "$*" >> "$GS_DIR/log/calls.log"
}

# gs_count NAME: adds one to state/counters/NAME, atomically (flock), so tests
# can assert "installed once" even when stand-ins run concurrently.
gs_count() {
  local f="$GS_STATE/counters/$1"
  mkdir -p "$GS_STATE/counters"
  (
    flock 9
    local n=0
    [ -f "$f" ] && n="$(cat "$f")"
    echo $((n + 1)) > "$f.tmp" && mv "$f.tmp" "$f"
  ) 9> "$f.lock"
}

# gs_knob NAME: true when the knob is set; its content (if any) on stdout.
gs_knob() {
  [ -f "$GS_DIR/knobs/$1" ] || return 1
  cat "$GS_DIR/knobs/$1"
  return 0
}

# Packages: state/dpkg/<name> holds dpkg's Status and Version.
gs_pkg_status() {   # prints "install ok installed" ("hold ok installed" when held) or nothing
  [ -f "$GS_STATE/dpkg/$1" ] && sed -n 's/^Status: //p' "$GS_STATE/dpkg/$1"
}
gs_pkg_version() {
  [ -f "$GS_STATE/dpkg/$1" ] && sed -n 's/^Version: //p' "$GS_STATE/dpkg/$1"
}
gs_pkg_installed() {   # held or not
  case "$(gs_pkg_status "$1")" in "install ok installed"|"hold ok installed") return 0 ;; esac
  return 1
}
gs_pkg_held() {
  case "$(gs_pkg_status "$1")" in "hold "*) return 0 ;; esac
  return 1
}
gs_pkg_set() {     # name version status
  mkdir -p "$GS_STATE/dpkg"
  printf 'Status: %s\nVersion: %s\n' "$3" "$2" > "$GS_STATE/dpkg/$1.tmp"
  mv "$GS_STATE/dpkg/$1.tmp" "$GS_STATE/dpkg/$1"
}

# Kernel messages go to both the persistent kern.log and this boot's ring
# buffer (what dmesg prints; a reboot empties it).
gs_klog() {
  local uptime
  uptime="$(printf '%5d.%06d' "$(( $(date +%s) % 100000 ))" "$(( RANDOM * 30 ))")"
  mkdir -p "$GS_ROOT/var/log" "$GS_STATE"
  local line
  for line in "$@"; do
    printf '%s %s kernel: [%s] %s\n' "$(date '+%b %e %H:%M:%S')" "$(gs_config hostname)" "$uptime" "$line" >> "$GS_ROOT/var/log/kern.log"
    printf '[%s] %s\n' "$uptime" "$line" >> "$GS_STATE/dmesg"
  done
}

# The NVIDIA display functions in the simulated sysfs.
gs_nvidia_functions() {
  local d
  for d in "$GS_ROOT"/sys/bus/pci/devices/*; do
    [ -e "$d/vendor" ] || continue
    [ "$(cat "$d/vendor")" = "0x10de" ] || continue
    case "$(cat "$d/class")" in 0x03*) basename "$d" ;; esac
  done
}

# Loads the nvidia module as the kernel would: the DKMS-built module for the
# running kernel must exist; a large-BAR card the firmware could not map
# (knob bar0) makes the probe fail and the module refuses to load, with the
# messages the real driver prints (kubevirt/kubevirt#11093).
gs_load_nvidia() {
  local kernel built version fn
  kernel="$(gs_config kernel)"
  built="$GS_STATE/dkms/nvidia.$kernel"
  [ -f "$built" ] || return 2
  version="$(cat "$built")"
  if [ -d "$GS_ROOT/sys/module/nvidia" ]; then return 0; fi
  if gs_knob bar0 > /dev/null; then
    for fn in $(gs_nvidia_functions); do
      gs_klog "nvidia-nvlink: Nvlink Core is being initialized, major device number 236" \
              "NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:" \
              "NVRM: BAR0 is 0M @ 0x0 (PCI:$fn)" \
              "nvidia: probe of $fn failed with error -1"
    done
    gs_klog "NVRM: The NVIDIA probe routine failed for 1 device(s)." \
            "NVRM: None of the NVIDIA devices were initialized."
    return 1
  fi
  gs_klog "nvidia: loading out-of-tree module taints kernel." \
          "nvidia: module license 'Dual MIT/GPL' taints kernel." \
          "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  $version  Release Build  (dvs-builder@U22-I3-AE18-09-1)"
  mkdir -p "$GS_ROOT/sys/module/nvidia" "$GS_ROOT/sys/bus/pci/drivers/nvidia" "$GS_ROOT/proc"
  echo "$version" > "$GS_ROOT/sys/module/nvidia/version"
  echo "nvidia 14376960 0 - Live 0x0000000000000000 (POE)" >> "$GS_ROOT/proc/modules"
  for fn in $(gs_nvidia_functions); do
    ln -sfn ../../../bus/pci/drivers/nvidia "$GS_ROOT/sys/bus/pci/devices/$fn/driver"
  done
  return 0
}

gs_unload_nvidia() {
  local fn
  rm -rf "$GS_ROOT/sys/module/nvidia"
  if [ -f "$GS_ROOT/proc/modules" ]; then
    grep -v '^nvidia ' "$GS_ROOT/proc/modules" > "$GS_ROOT/proc/modules.tmp" || true
    mv "$GS_ROOT/proc/modules.tmp" "$GS_ROOT/proc/modules"
  fi
  for fn in $(gs_nvidia_functions); do
    if [ "$(basename "$(readlink "$GS_ROOT/sys/bus/pci/devices/$fn/driver" 2>/dev/null)")" = nvidia ]; then
      rm -f "$GS_ROOT/sys/bus/pci/devices/$fn/driver"
    fi
  done
}

# A process that exists and is not a zombie (an exited service waits for
# init to reap it, and kill -0 still succeeds on it).
gs_alive() {
  [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# Services: state/services/<unit>.enabled, state/services/<unit>.pid.
gs_service_running() {
  local pidf="$GS_STATE/services/$1.pid"
  [ -f "$pidf" ] && gs_alive "$(cat "$pidf")"
}

gs_unit_file() {
  local u
  for u in "$GS_ROOT/etc/systemd/system/$1.service" "$GS_ROOT/lib/systemd/system/$1.service" \
           "$GS_ROOT/usr/local/lib/systemd/system/$1.service"; do
    [ -f "$u" ] && { echo "$u"; return 0; }
  done
  return 1
}

# Starts a unit's process. Only ollama has one here: the stand-in Ollama HTTP
# server (tests/fakes/ollama_server.py) on the port in config; rke2-server
# brings the simulated guest cluster up (tests/guestsim/k8s_sim.py). The knob
# ollama_not_answering makes the service "start" (systemctl returns 0, as for
# a Type=simple unit) and die at once, so nothing listens.
gs_service_start() {
  local unit="$1"
  mkdir -p "$GS_STATE/services" "$GS_DIR/log"
  gs_service_running "$unit" && return 0
  case "$unit" in
    ollama)
      if gs_knob ollama_not_answering > /dev/null; then
        echo "failed" > "$GS_STATE/services/$unit.result"
        return 0
      fi
      rm -f "$GS_STATE/services/$unit.result"
      setsid "$(gs_config python)" "$GS_HOME/../fakes/ollama_server.py" \
        --root "$GS_ROOT" --port "$(gs_config ollama_port)" \
        --pidfile "$GS_STATE/services/$unit.pid" \
        >> "$GS_DIR/log/ollama.log" 2>&1 < /dev/null &
      # systemd records the main PID when it forks it; so do we, before
      # returning, so a stop right after a start finds it.
      echo $! > "$GS_STATE/services/$unit.pid"
      ;;
    rke2-server)
      # No process either: the simulated cluster (tests/guestsim/k8s_sim.py)
      # is up while this unit is active; its first start fixes the ranges.
      echo "active" > "$GS_STATE/services/$unit.result"
      FACTORY_GUESTSIM_ROOT="$GS_ROOT" GS_HOME="$GS_HOME" "$(gs_config python)" "$GS_HOME/k8s_sim.py" server-start
      ;;
    *)
      : # no process behind other units in this simulation
      echo "active" > "$GS_STATE/services/$unit.result"
      ;;
  esac
}

gs_service_stop() {
  local unit="$1" pidf="$GS_STATE/services/$1.pid" pid i
  if [ -f "$pidf" ]; then
    pid="$(cat "$pidf")"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do gs_alive "$pid" || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidf"
  fi
  rm -f "$GS_STATE/services/$unit.result"
}

# For commands a fresh guest does not have until something installs them
# into /usr/local/bin (<root>/.guestsim/installed-bin): bin/<name> shadows
# the build machine's own (its /usr/bin is on the guest's PATH too, and may
# hold a real kubectl or helm that must never run here). Runs the installed
# stand-in, or fails as bash does for a command that does not exist.
gs_exec_installed_or_absent() {
  local name="$1"; shift
  if [ -x "$GS_DIR/installed-bin/$name" ]; then exec "$GS_DIR/installed-bin/$name" "$@"; fi
  # What a step itself put in the guest's /usr/local/bin (Helm from its tarball).
  if [ -x "$GS_ROOT/usr/local/bin/$name" ]; then exec "$GS_ROOT/usr/local/bin/$name" "$@"; fi
  echo "bash: $name: command not found" >&2
  exit 127
}
