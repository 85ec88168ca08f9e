#!/usr/bin/env bash
# Builds the base image tenant VMs boot from under the QEMU provider: a Debian
# 12 root made with debootstrap, with systemd, cloud-init (NoCloud) and what
# the agent's install script uses (curl, sha256sum), as a qcow2 disk plus the
# kernel and initrd QEMU boots directly (the disk has no boot loader), and an
# image.json naming them. Point the coordinator's qemu.base_image at the
# folder it prints. For tests and air-gapped single hosts; a real host may
# use Ubuntu's cloud image instead (qemu.base_image: the .img file).
#
#   deploy/qemu/build-image.sh [--cache DIR] [--mirror URL] [--size 3G] [--out DIR]
#
# The image is cached under DIR/<recipe hash>/ (default
# ${XDG_CACHE_HOME:-~/.cache}/factory/images): the hash covers this file and
# the options that change the image, so a changed recipe builds a new one and
# an unchanged one is reused. The last line printed is the image's folder.
# Needs root (debootstrap chroots and makes device nodes) and the packages
# debootstrap, e2fsprogs (mkfs.ext4 -d) and qemu-utils. Two builds of one
# recipe never run at once: the second waits for the first and reuses it.
set -euo pipefail

suite=bookworm
mirror=${FACTORY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
size=3G
cache=${FACTORY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/factory/images}
out=""
while (($#)); do
  case "$1" in
    --cache) cache="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# systemd and cloud-init run the guest; ifupdown + isc-dhcp-client are what
# cloud-init's Debian renderer configures; python3-cffi-backend is the
# virtual package python3-cryptography needs that debootstrap does not
# resolve (without it cloud-init stays unconfigured); openssh-server is what
# the tenant's forwarded SSH port reaches; sudo for the ubuntu user's rule.
packages=systemd,systemd-sysv,udev,cloud-init,python3-cffi-backend,linux-image-amd64,ifupdown,isc-dhcp-client,iproute2,curl,ca-certificates,openssh-server,sudo
recipe_hash=$( { sha256sum "$0" | cut -d' ' -f1; echo "$suite $size $packages"; } | sha256sum | cut -c1-16)
dir=${out:-$cache/$recipe_hash}

reuse_cached() {
  [[ -f $dir/image.json ]] || return 1
  echo "factory image: reusing the cached image for recipe $recipe_hash (built $(stat -c %y "$dir/image.json" | cut -d. -f1))"
  echo "$dir"
}
reuse_cached && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "factory image: debootstrap needs root (it chroots and makes device nodes): run this as root" >&2
  exit 1
fi
for tool in debootstrap mkfs.ext4 qemu-img; do
  command -v "$tool" >/dev/null || { echo "factory image: $tool is missing (apt-get install debootstrap e2fsprogs qemu-utils)" >&2; exit 1; }
done

start=$(date +%s)
mkdir -p "$(dirname "$dir")"
# One build per recipe at a time: `make test` starts one in the background
# while it compiles (scripts/prefetch-guest-image.sh), and the test fixture's
# own run then waits for it here and reuses its image instead of building a
# second. A build that failed leaves no image, so the waiter builds its own.
exec 9>"$(dirname "$dir")/.lock-$recipe_hash"
if ! flock -n 9; then
  echo "factory image: another build of recipe $recipe_hash is under way; waiting for it"
  flock 9
  echo "factory image: waited $(($(date +%s) - start)) s"
  reuse_cached && exit 0
fi
work=$(mktemp -d "$(dirname "$dir")/.build-$recipe_hash.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

echo "factory image: debootstrap $suite from $mirror (minbase + $packages)"
# dpkg without an fsync per file: the tree is thrown away if the build fails,
# and the disk image is written (and synced) once at the end.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/factory-unsafe-io"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -20 "$work/debootstrap.log" >&2
  echo "factory image: debootstrap failed (log above)" >&2
  exit 1
fi
t_boot=$(date +%s)

# Every VM gets its own identity at first boot: an empty machine-id makes
# systemd generate one, and cloud-init makes the SSH host keys.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id" "$root"/etc/ssh/ssh_host_*
echo "LABEL=root / ext4 defaults 0 1" >"$root/etc/fstab"
rm -f "$root/etc/dpkg/dpkg.cfg.d/factory-unsafe-io"
# NoCloud only: no minutes lost probing for clouds this guest is not on. The
# locale cloud-init sets by default (en_US.UTF-8) is not generated in a
# minbase system and its module would fail; C.UTF-8 is always there.
# Host keys: the two every current OpenSSH client speaks; RSA-3072 and DSA
# would take the longest to generate on an emulated CPU. /etc/hosts names
# the guest (sudo and others look its hostname up there).
cat >"$root/etc/cloud/cloud.cfg.d/90-factory.cfg" <<'CFG'
datasource_list: [NoCloud, None]
locale: C.UTF-8
ssh_genkeytypes: [ed25519, ecdsa]
manage_etc_hosts: localhost
CFG
# No mirror to reach from a test or air-gapped guest: apt's daily timers
# would only burn the emulated CPU. The VMs have no screen: no gettys on
# tty1-6 (the serial console keeps its own).
for unit in apt-daily.timer apt-daily-upgrade.timer getty-static.service getty@tty1.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
# The journal survives the plan's reboots, so both boots can be read after.
mkdir -p "$root/var/log/journal"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

kernel=$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -1)
initrd=$(cd "$root/boot" && ls initrd.img-* | sort -V | tail -1)
cp "$root/boot/$kernel" "$work/vmlinuz"
cp "$root/boot/$initrd" "$work/initrd.img"
mkfs.ext4 -q -F -L root -d "$root" "$work/disk.raw" "$size"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/disk.qcow2"
rm -f "$work/disk.raw"
rm -rf "$root"
cat >"$work/image.json" <<JSON
{"disk": "disk.qcow2", "format": "qcow2", "kernel": "vmlinuz", "initrd": "initrd.img",
 "append": "root=LABEL=root rw console=ttyS0 ds=nocloud", "suite": "$suite", "recipe": "$recipe_hash",
 "kernel_version": "${kernel#vmlinuz-}"}
JSON
chmod 0755 "$work"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
end=$(date +%s)
echo "factory image: built recipe $recipe_hash in $((end - start)) s (debootstrap $((t_boot - start)) s, disk $((end - t_boot)) s): $(du -sh "$dir" | cut -f1)"
echo "$dir"
