#!/bin/bash
# The guest simulator: builds a directory tree that the agent treats as an
# Ubuntu guest's root (GuestEnv::root), with stand-in programs on PATH that
# keep their state under it. It is a SIMULATION, for tests on a machine with
# no GPU and no VM: see tests/guestsim/README.md for what it models and what
# it does not.
#
#   guestsim.sh create ROOT [--profile l4|l4-k8s|h200|l4-gpu-operator|none]
#                           [--ollama-port PORT] [--fixtures DIR] [--python PYTHON]
#   guestsim.sh path ROOT       the PATH the agent runs with in this guest
#   guestsim.sh stop ROOT       stops the guest's services (the stand-in Ollama server)
#   guestsim.sh counters ROOT   every invocation counter, NAME=N per line
#   guestsim.sh host-tools DIR  makes DIR/host-bin and DIR/guard (below) for a
#                               PATH that is not a whole guest's; prints that PATH
#
# The guest's PATH holds the stand-ins, what the guest installed, the host
# tools listed in HOST_TOOLS (and no other program of this machine), then the
# guards: a command a step runs that no stand-in answers either does not exist
# there or, if it is one that would act on this machine (GUARDED), hits
# tests/guestsim/guard, which records it for the harness to fail the test.
set -euo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# This machine's programs a simulated guest may run: tools that only read and
# write the files and pipes they are given, which the stand-ins, the install
# script stand-ins and the steps' own shell snippets use. Anything that acts
# on the machine itself (services, packages, modules, devices, the network,
# users, processes it did not start) is not here. Looked up in the system
# directories only, never through the caller's PATH.
HOST_TOOLS=(
  sh bash env cat sed grep awk head tail tr cut sort uniq wc tee printf echo test true false
  cp mv rm ln mkdir rmdir touch chmod mktemp readlink realpath dirname basename ls stat find xargs
  date seq sleep id sha256sum flock setsid pgrep tar gzip
)
# Names that would act on the machine the tests run on if this machine's own
# program ran: each gets a guard at the end of the guest's PATH. Stand-ins
# for some of them come earlier on the PATH and answer for the guest. Names
# a step probes to see whether the guest has them yet (nvidia-smi, ollama,
# kubectl, helm, rke2) are left out: a guard would look installed to
# `command -v`; they are simply absent until a stand-in install puts them in
# installed-bin, and bin/ guards kubectl, helm and rke2 itself.
GUARDED=(
  reboot shutdown poweroff halt telinit init systemctl service systemd-run loginctl
  hostnamectl timedatectl localectl journalctl resolvectl networkctl
  apt-get apt apt-key apt-mark dpkg dpkg-reconfigure add-apt-repository snap unattended-upgrade
  modprobe insmod rmmod depmod dkms update-initramfs update-grub grub-install mokutil
  driverctl lspci setpci nvidia-persistenced
  mount umount swapon swapoff sysctl ip iptables nft ifup ifdown dhclient
  curl wget ssh scp rsync nc
  useradd usermod userdel groupadd passwd chpasswd sudo su
  chroot kill pkill killall
  wall  # writes to every terminal of this machine
)

sysdirs=/usr/bin:/bin:/usr/sbin:/sbin

# host_tools DIR: DIR/host-bin (links to HOST_TOOLS), DIR/guard (links to the
# guard for every GUARDED name) and DIR/log. A missing host tool fails here,
# naming it, rather than later as a puzzling "command not found" in a step.
host_tools() {
  local dir="$1" t real
  mkdir -p "$dir/host-bin" "$dir/guard" "$dir/log"
  for t in "${HOST_TOOLS[@]}"; do
    real="$(PATH="$sysdirs" type -P "$t" || true)"
    if [ -z "$real" ]; then
      echo "guestsim: this machine has no '$t', which the simulated guest needs (scripts/install-deps.sh --demo or --test installs it)" >&2
      return 1
    fi
    ln -sfn "$real" "$dir/host-bin/$t"
  done
  for t in "${GUARDED[@]}"; do ln -sfn "$HERE/guard" "$dir/guard/$t"; done
  : >> "$dir/log/guarded.log"
}

cmd="${1:-}"; root="${2:-}"
[ -n "$cmd" ] && [ -n "$root" ] || usage
shift 2

case "$cmd" in
  path)
    G="$root/.guestsim"
    echo "$G/bin:$G/installed-bin:$G/host-bin:$G/guard"
    exit 0 ;;
  host-tools)
    mkdir -p "$root"
    dir="$(cd "$root" && pwd)"
    host_tools "$dir"
    echo "$dir/host-bin:$dir/guard"
    exit 0 ;;
  counters)
    for f in "$root"/.guestsim/state/counters/*; do
      [ -f "$f" ] || continue
      case "$f" in *.lock|*.tmp) continue ;; esac
      echo "$(basename "$f")=$(cat "$f")"
    done
    exit 0 ;;
  stop)
    alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
    for f in "$root"/.guestsim/state/services/*.pid; do
      [ -f "$f" ] || continue
      pid="$(cat "$f")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.05; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$f"
    done
    exit 0 ;;
  create) ;;
  *) usage ;;
esac

profile=l4
port=11434
fixtures="$(cd "$HERE/.." && pwd)/fixtures/real"
[ -n "${FACTORY_FIXTURES_DIR:-}" ] && fixtures="$FACTORY_FIXTURES_DIR"
python=/usr/bin/python3
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --ollama-port) port="$2"; shift 2 ;;
    --fixtures) fixtures="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) usage ;;
  esac
done
pf="$HERE/profiles/$profile.env"
[ -f "$pf" ] || { echo "guestsim: unknown profile '$profile' (profiles: $(ls "$HERE/profiles" | sed 's/\.env$//' | tr '\n' ' '))" >&2; exit 2; }
[ -d "$fixtures" ] || { echo "guestsim: no fixtures at $fixtures (the real captures, tests/fixtures/real; or give --fixtures DIR)" >&2; exit 2; }
if [ -e "$root/.guestsim" ]; then
  echo "guestsim: $root already holds a simulated guest" >&2; exit 1
fi
# shellcheck source=/dev/null
source "$pf"

G="$root/.guestsim"
mkdir -p "$G"/{bin,installed-bin,knobs,data,log} "$G"/state/{counters,dpkg,dkms,services,apt,ollama}
root="$(cd "$root" && pwd)"
G="$root/.guestsim"
host_tools "$G"

cat > "$G/config" <<EOF
profile=$profile
kernel=$KERNEL
hostname=$HOSTNAME
ollama_port=$port
python=$python
fixtures=$fixtures
ollama_latest=0.40.2
network_nvidia_package_version=615.71.09-1ubuntu1
rke2_latest=v1.36.4+rke2r1
EOF
cp "$pf" "$G/profile.env"

# The captures the stand-ins answer with, copied from the real ones.
cp "$fixtures/l4-runbook/tenant1-nvidia-smi-idle.txt" "$G/data/l4-nvidia-smi-idle.txt"
cp "$fixtures/l4-runbook/tenant1-nvidia-smi-ollama-loaded.txt" "$G/data/l4-nvidia-smi-ollama-loaded.txt"
cp "$fixtures/h200-passthrough-vm/nvidia-smi.txt" "$G/data/h200-nvidia-smi.txt"
cp "$fixtures/h200-passthrough-vm/nvidia-smi-q-x.xml" "$G/data/h200-nvidia-smi-q-x.xml"
cp "$fixtures/h200-passthrough-vm/2026-12-01/nvidia-smi-q.txt" "$G/data/h200-nvidia-smi-q.txt"
cp "$fixtures/h200-passthrough-vm/2026-12-01/nvidia-smi-mig-lgip-and-lgi.txt" "$G/data/h200-nvidia-smi-mig-lgip.txt"
cp "$fixtures/third-party/pci.ids-nvidia-2025.07.11" "$G/data/pci.ids"
cp "$fixtures/l4-runbook/tenant2-pod-nvidia-smi-hami-1024MiB.txt" "$G/data/"
cp "$fixtures/l4-runbook/tenant2-node-allocatable.txt" "$G/data/"
chmod u+w "$G"/data/*

# The commands every Ubuntu guest has; nvidia-smi and ollama appear in
# installed-bin only when a package or the install script puts them there.
for f in "$HERE"/bin/*; do
  case "$(basename "$f")" in _*) continue ;; esac
  ln -s "$f" "$G/bin/$(basename "$f")"
done

# sysfs: one directory per PCI function, with the attribute files and the
# driver symlink the kernel provides.
mkdir -p "$root/sys/bus/pci/devices" "$root/sys/bus/pci/drivers" "$root/sys/module"
add_function() {  # address vendor device class driver subvendor subdevice revision
  local d="$root/sys/bus/pci/devices/$1"
  mkdir -p "$d"
  echo "$2" > "$d/vendor"; echo "$3" > "$d/device"; echo "$4" > "$d/class"
  echo "${6:-0x0000}" > "$d/subsystem_vendor"; echo "${7:-0x0000}" > "$d/subsystem_device"
  echo "${8:-0x00}" > "$d/revision"
  if [ -n "$5" ]; then
    mkdir -p "$root/sys/bus/pci/drivers/$5"
    ln -s "../../../bus/pci/drivers/$5" "$d/driver"
  fi
}
for spec in $OTHER_FUNCTIONS; do
  IFS=',' read -r a v d c drv <<< "$spec"
  sv="$v"; sd="$d"; [ "$v" = 0x8086 ] && { sv=0x0000; sd=0x0000; }
  add_function "$a" "$v" "$d" "$c" "$drv" "$sv" "$sd"
done
for a in $GPU_FUNCTIONS; do
  add_function "$a" "$GPU_VENDOR" "$GPU_DEVICE" "$GPU_CLASS" "" "$GPU_SUBSYSTEM_VENDOR" "$GPU_SUBSYSTEM_DEVICE" "$GPU_REVISION"
done

# /proc and the boot id.
mkdir -p "$root/proc/sys/kernel/random"
cat /proc/sys/kernel/random/uuid > "$root/proc/sys/kernel/random/boot_id"
printf '%s\n' "virtio_net 77824 0 - Live 0x0000000000000000" "virtio_blk 28672 2 - Live 0x0000000000000000" > "$root/proc/modules"

# /etc: Ubuntu 24.04, as the real VM's os-release says (host-facts.txt).
mkdir -p "$root/etc/apt/sources.list.d" "$root/etc/systemd/system" "$root/usr/share/keyrings" \
         "$root/var/log" "$root/var/cache" "$root/var/lib/dpkg"
cat > "$root/etc/os-release" <<'EOF'
PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
EOF
echo "$HOSTNAME" > "$root/etc/hostname"

# DNS as KubeVirt's DHCP gives it (profiles that say): systemd-resolved's
# upstream list in /run/systemd/resolve/resolv.conf, and the stub it points
# /etc/resolv.conf at, as on Ubuntu 24.04.
if [ -n "${DNS_SERVERS:-}" ]; then
  mkdir -p "$root/run/systemd/resolve"
  {
    echo "# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8)."
    echo "# Do not edit."
    for s in $DNS_SERVERS; do echo "nameserver $s"; done
    if [ -n "${DNS_SEARCH:-}" ]; then echo "search $DNS_SEARCH"; fi
  } > "$root/run/systemd/resolve/resolv.conf"
  {
    echo "# This is /run/systemd/resolve/stub-resolv.conf managed by man:systemd-resolved(8)."
    echo "# Do not edit."
    echo "nameserver 127.0.0.53"
    echo "options edns0 trust-ad"
    if [ -n "${DNS_SEARCH:-}" ]; then echo "search $DNS_SEARCH"; fi
  } > "$root/run/systemd/resolve/stub-resolv.conf"
  ln -s ../run/systemd/resolve/stub-resolv.conf "$root/etc/resolv.conf"
  # What systemd-resolved holds in memory (resolvectl asks it over D-Bus).
  mkdir -p "$G/state/resolved"
  echo "$DNS_SERVERS" > "$G/state/resolved/servers"
  echo "${DNS_SEARCH:-}" > "$G/state/resolved/domains"
fi

# The routes the kernel holds, as /proc/net/route lists them (profiles that
# say: ROUTES="IFACE DEST/PREFIX GATEWAY FLAGS METRIC;...", FLAGS in hex as the
# kernel prints them: 0003 up+gateway, 0001 up, 0005 up+host): addresses in
# memory order, which on x86 reads back to front (10.0.2.0 is 0002000A).
kernel_hex() { # a.b.c.d -> DDCCBBAA
  local IFS=.; set -- $1; printf '%02X%02X%02X%02X' "$4" "$3" "$2" "$1"
}
mask_hex() { # prefix -> the mask, in the same order
  local n=$1 m=0 i
  for i in $(seq 1 32); do m=$(( (m << 1) | (i <= n ? 1 : 0) )); done
  kernel_hex "$(( (m >> 24) & 255 )).$(( (m >> 16) & 255 )).$(( (m >> 8) & 255 )).$(( m & 255 ))"
}
if [ -n "${ROUTES:-}" ]; then
  mkdir -p "$root/proc/net"
  {
    # Every line padded to 127 columns, as the kernel's seq_printf("%-127s\n").
    printf '%-127s\n' "$(printf 'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT')"
    echo "$ROUTES" | tr ';' '\n' | while read -r iface dest gw flags metric; do
      [ -n "$iface" ] || continue
      printf '%-127s\n' "$(printf '%s\t%s\t%s\t%s\t0\t0\t%s\t%s\t0\t0\t0' "$iface" \
        "$(kernel_hex "${dest%/*}")" "$(kernel_hex "$gw")" "$flags" "$metric" "$(mask_hex "${dest#*/}")")"
    done
  } > "$root/proc/net/route"
fi

# What a fresh Ubuntu cloud image has installed (of what the plan touches).
pkg() { printf 'Status: install ok installed\nVersion: %s\n' "$2" > "$G/state/dpkg/$1"; }
pkg ca-certificates 20240203
pkg curl 8.5.0-2ubuntu10.6

ts() { date '+%b %e %H:%M:%S'; }
{
  echo "$(ts) $HOSTNAME kernel: [    0.000000] Linux version $KERNEL (buildd@lcy02-amd64-001) #1 SMP PREEMPT_DYNAMIC"
  for a in $GPU_FUNCTIONS; do
    echo "$(ts) $HOSTNAME kernel: [    0.412345] pci $a: [${GPU_VENDOR#0x}:${GPU_DEVICE#0x}] type 00 class $GPU_CLASS PCIe Legacy Endpoint"
  done
} > "$root/var/log/kern.log"
sed 's/^.*kernel: //' "$root/var/log/kern.log" > "$G/state/dmesg"

# A driver that came with the image (the H200 VM), or with the GPU Operator.
live_driver() {
  mkdir -p "$root/sys/module/nvidia" "$root/sys/bus/pci/drivers/nvidia"
  echo "$DRIVER_VERSION" > "$root/sys/module/nvidia/version"
  echo "nvidia 14376960 0 - Live 0x0000000000000000 (POE)" >> "$root/proc/modules"
  for a in $GPU_FUNCTIONS; do ln -sfn ../../../bus/pci/drivers/nvidia "$root/sys/bus/pci/devices/$a/driver"; done
}
case "$DRIVER_PREINSTALLED" in
  yes)
    echo "$DRIVER_VERSION" > "$G/state/dkms/nvidia.$KERNEL"
    live_driver
    ln -s "$HERE/opt/nvidia-smi" "$G/installed-bin/nvidia-smi" ;;
  operator)
    live_driver
    mkdir -p "$root/run/nvidia/driver/usr/bin"
    ln -s "$HERE/opt/nvidia-smi" "$root/run/nvidia/driver/usr/bin/nvidia-smi" ;;
esac
echo "guestsim: created a simulated '$profile' guest at $root"
