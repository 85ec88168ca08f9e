#!/bin/bash
# GUEST SIMULATOR STAND-IN for /usr/local/bin/rke2-uninstall.sh: stops the
# server and removes what RKE2 installed and made, as the real one does:
# the binaries and units, /etc/rancher/rke2 (config.yaml included),
# /var/lib/rancher/rke2, and with them the cluster (its fixed ranges, the
# helm releases and labels stored in it).
source "$(dirname "$(readlink -f "$0")")/../bin/_lib.sh"
gs_log "$@"
gs_count rke2.uninstall
gs_service_stop rke2-server
FACTORY_GUESTSIM_ROOT="$GS_ROOT" GS_HOME="$GS_HOME" "$(gs_config python)" "$GS_HOME/k8s_sim.py" uninstall
