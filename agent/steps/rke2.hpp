#pragma once
// Step kind `rke2`: the guest's own Kubernetes, a single-node RKE2 server
// whose pod and service ranges cannot clash with the host cluster's
// (runbook step 6, guest/01-rke2.sh).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   version:     "v1.36.4+rke2r1"            INSTALL_RKE2_VERSION; `rke2 --version` must report it
//   install_url: https://get.rke2.io         (default) RKE2's install script
//   service:     rke2-server                 (default) the systemd unit
//   kubeconfig:  /etc/rancher/rke2/rke2.yaml (default) what the server writes
//   bin_dir:     /var/lib/rancher/rke2/bin   (default) where RKE2 puts its kubectl
//   config:      {cluster-cidr, service-cidr, cluster-dns, ...} (default {})
//                written to /etc/rancher/rke2/config.yaml, the three ranges
//                first in the runbook's order, other keys after them. The
//                three are all fixed or all left out: then they are chosen.
//   ranges:      {avoid: [{range, source}], pool} (the coordinator's): the
//                host cluster's ranges and where to pick from
//
// Ranges: the guest's own networks (routes, DHCP's DNS servers, KubeVirt's
// masquerade network: guest/network.hpp) are added to `avoid`; fixed ranges
// are checked against all of it, else the first free ones of the pool are
// chosen (contract/cluster_ranges.hpp), kept in the step state (once RKE2 runs
// its own pod network shows among the routes) and reported in a progress
// event's `ranges` with what they were chosen around.
//
// check:  config.yaml holds the planned values, `rke2 --version` reports
//         `version`, the service is active and every node is Ready.
// apply:  refuses (guest_cidr_clash) planned ranges that overlap the host
//         cluster's service range as the guest sees it (the DNS server it got
//         from DHCP, 10.43.0.10 under the runbook's host), before touching
//         anything; writes config.yaml atomically; runs the install script
//         with INSTALL_RKE2_VERSION unless it finished installing that version
//         before (recorded in the agent's step state) and rke2 reports it;
//         `systemctl enable --now` (or `restart` when a running server's
//         config changed); waits for the node to be Ready within the step's
//         deadline, with progress events.
// verify: the node is Ready (waiting up to 2 minutes) and config.yaml holds
//         the planned values.
// Diagnoses: guest_cidr_clash, guest_dns_clash (the node stays NotReady
//   because the cluster's service range holds the guest's DNS server: the
//   runbook's failure), rke2_api_unreachable, rke2_node_not_ready,
//   download_failed.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_rke2(const StepSpec& spec);

// config.yaml's text for a `config` param: cluster-cidr, service-cidr and
// cluster-dns first, as the runbook writes them, then any other key sorted;
// plain scalars where YAML reads them back unchanged, else quoted.
std::string render_rke2_config(const nlohmann::json& config);

// "rke2 version v1.36.4+rke2r1 (a4ba9c3e)" -> "v1.36.4+rke2r1"; "" when absent.
std::string parse_rke2_version(const std::string& output);

}  // namespace factory::agent::steps
