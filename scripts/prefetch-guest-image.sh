#!/usr/bin/env bash
# Starts the real-guest test's base image build (deploy/qemu/build-image.sh)
# in the background, so that `make test` builds it while it compiles instead
# of holding one of CTest's two slots for it (about 12 minutes on a clean CI
# machine, mostly waiting on the Debian mirror and the disk). The e2e_vm_image
# test still runs the same script: it waits for this build, then reuses the
# image, or builds its own if this one failed, and reports what went wrong.
#
#   scripts/prefetch-guest-image.sh BUILD_DIR
#
# Does nothing when the image is cached or cannot be built here (not root, a
# tool missing): the test reports that itself. The log is BUILD_DIR/guest-image.log.
set -euo pipefail
build_dir=${1:?usage: $0 BUILD_DIR}
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || exit 0
for tool in debootstrap mkfs.ext4 qemu-img flock; do
  command -v "$tool" >/dev/null || exit 0
done
mkdir -p "$build_dir"
log=$build_dir/guest-image.log
# setsid: its own session, so it is not tied to this recipe's shell, which
# ends at once; the test that needs the image waits for it (its lock).
# Niced: it yields the two cores to the compiler and still ends long before
# the tests start (about 4 min of work against a build of about 40).
setsid nice -n 10 deploy/qemu/build-image.sh >"$log" 2>&1 </dev/null &
echo "factory: building the real-guest test's image in the background (pid $!, log $log)"
