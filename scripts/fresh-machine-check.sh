#!/usr/bin/env bash
# The README's promise, checked on a fresh Debian 12: a minimal root built
# with debootstrap (build-essential, git and make, nothing else), this
# checkout's current commit cloned into it, and the two set-up commands run
# there in a chroot: `make demo`, then `make test`. Prints how long each
# phase took. Run as root on a Debian (or Ubuntu) machine that reaches a
# Debian mirror; needs a few GiB of disk and, on 2 cores, well over an hour.
#
#   scripts/fresh-machine-check.sh [--root DIR] [--keep] [--mirror URL]
#
#   --root DIR    where to build the root (default: a new folder under /var/tmp);
#                 it must not exist yet, or be empty
#   --keep        keep the root afterwards (it is kept anyway when a phase fails)
#   --mirror URL  the Debian mirror (default: http://deb.debian.org/debian)
#
# Only committed work is checked: the clone is of HEAD, not of the work tree.
# The chroot shares this machine's network (apt needs the mirror), its /dev,
# /proc and /sys; it runs no systemd. Exit 0 only when both commands passed.
set -euo pipefail

top="$(cd "$(dirname "$0")/.." && pwd)"
root=""
keep=0
mirror="http://deb.debian.org/debian"
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --mirror) mirror="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-machine-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-machine-check: run as root (debootstrap, mount and chroot need it)" >&2
  exit 1
fi

commit="$(git -C "$top" rev-parse HEAD)"
if [ -n "$(git -C "$top" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine-check: note: uncommitted changes in $top are not checked (the clone is of $commit)"
fi
if [ -z "$root" ]; then
  root="$(mktemp -d /var/tmp/factory-fresh.XXXXXX)"
  # It becomes the chroot's "/": 0755 as on a real machine, not mktemp's
  # 0700, or no user but root can reach a file in it (the PostgreSQL tests
  # run the server as nobody and failed on exactly that).
  chmod 0755 "$root"
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
  echo "fresh-machine-check: $root exists and is not empty" >&2
  exit 2
fi
mkdir -p "$root"
root="$(cd "$root" && pwd)"

phases=()
stamp() { date +%s; }
started="$(stamp)"
report() {
  echo
  echo "fresh-machine-check: phases"
  local p
  for p in "${phases[@]}"; do echo "  $p"; done
  printf '  %-28s %6d s\n' "total" $(($(stamp) - started))
}
run_phase() {  # run_phase NAME CMD...: runs CMD, records and prints how long it took
  local name="$1" t0 t1 rc=0
  shift
  printf '\n\033[1m==> %s\033[0m\n' "$name"
  t0="$(stamp)"
  "$@" || rc=$?
  t1="$(stamp)"
  phases+=("$(printf '%-28s %6d s%s' "$name" $((t1 - t0)) "$([ $rc -eq 0 ] || echo "  FAILED (exit $rc)")")")
  echo "--- $name: $((t1 - t0)) s, exit $rc"
  return $rc
}

mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[$i]}" 2>/dev/null || umount -lR "${mounted[$i]}" 2>/dev/null || true
  done
  mounted=()
}
failed=1
finish() {
  local rc=$?
  unmount_all
  if [ ${#phases[@]} -gt 0 ]; then report; fi
  # Never remove a root that still has something mounted in it.
  if [ $failed -eq 0 ] && [ $keep -eq 0 ] && ! grep -q " $root/" /proc/self/mounts; then
    rm -rf "$root"
  else
    echo "fresh-machine-check: the root is kept at $root"
  fi
  exit $rc
}
trap finish EXIT
trap 'exit 130' INT TERM

if ! command -v debootstrap >/dev/null; then
  run_phase "install debootstrap" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap'
fi

# A fresh Debian 12 as a newcomer has it: the minimal base, plus the three
# packages the README assumes.
run_phase "debootstrap bookworm" \
  debootstrap --variant=minbase --include=build-essential,git,make bookworm "$root" "$mirror"
cp /etc/resolv.conf "$root/etc/resolv.conf"
[ -s "$root/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"

mount_in() {  # mount_in TARGET MOUNT-ARGS...
  mkdir -p "$root$1"
  mount "${@:2}" "$root$1"
  mounted+=("$root$1")
}
mount_in /proc -t proc proc
mount_in /sys -t sysfs sysfs
mount_in /dev --rbind /dev
mount --make-rslave "$root/dev"
mount_in /dev/shm -t tmpfs -o mode=1777 shm

run_phase "clone ${commit:0:7}" sh -c '
  git clone -q --no-hardlinks "$1" "$2" && git -C "$2" checkout -q --detach "$3"' \
  sh "$top" "$root/root/factory" "$commit"

in_root() {  # in_root CMD: runs CMD in the clone, in the chroot, with a clean environment
  env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$root" /bin/bash -c "cd /root/factory && $1"
}
run_phase "make demo" in_root "make demo"
run_phase "make test" in_root "make test"
failed=0
echo
echo "fresh-machine-check: make demo and make test passed on a fresh Debian 12 ($commit)"
