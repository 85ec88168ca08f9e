#!/bin/bash
# GUEST SIMULATOR STAND-IN for /usr/local/bin/rke2-killall.sh (installed by
# the get.rke2.io stand-in): stops the rke2-server unit. The real script
# also kills every container and unmounts their filesystems.
source "$(dirname "$(readlink -f "$0")")/../bin/_lib.sh"
gs_log "$@"
gs_count rke2.killall
gs_service_stop rke2-server
