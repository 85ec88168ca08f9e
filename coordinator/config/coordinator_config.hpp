#pragma once
// The coordinator's YAML config. Every key has a documented default, so a
// file naming only what differs (or no file at all) is a working config:
//
//   state_dir: /var/lib/factory        # CA, admin token, tenants, events (0700)
//   store: ""                          # tenants and events: "" = SQLite in
//                                      # <state_dir>/store; postgres://user@host/db
//                                      # = that PostgreSQL database (libpq's URI; leave
//                                      # the password to PGPASSWORD or ~/.pgpass, it is
//                                      # never logged)
//   external_url: wss://<host>:8443    # what agents dial; default from agents.listen
//                                      # (provider qemu: wss://10.0.2.2:<port>, the
//                                      # host's loopback as QEMU user networking shows it)
//   provider: kubevirt                 # where tenants' VMs run: kubevirt (the host
//                                      # cluster) or qemu (processes on this host)
//   agents:
//     listen: 0.0.0.0:8443             # the wss endpoint guests reach
//     idle_timeout: 60s                # websocket ping/pong deadline
//     cert_ttl: 24h                    # agent client certificates; renewed at 2/3
//     renewal_grace: 90d               # how long after expiry an agent that was off
//                                      # may still renew with its old certificate
//     binary: ""                       # agent binary served at /v1/agent/binary
//                                      # (default: factory-agent beside factory)
//     upgrade_grace: 5m                # how long past an upgrade's confirm_within the
//                                      # coordinator waits for its outcome before
//                                      # calling it failed (docs/agent-rollouts.md)
//     quota:                           # each tenant's share (coordinator/agents/quota.hpp)
//       events_per_second: 250         # messages an agent may send per second (events,
//                                      # heartbeats, ...; above the agent's 200/s replay)
//       event_burst: 500               # ... at once, on top of the rate
//       bytes_per_day: 32Mi            # event bytes stored per tenant per day (a day's
//                                      # allowance at once, then refilled over the day)
//       max_events_stored: 10000       # a tenant's stored history; the oldest go first
//       max_event_age: 90d             # ... and none older than this
//   api:
//     listen: 127.0.0.1:8444           # admin API and status feed (HTTPS, bearer token)
//     metrics_public: false            # true: GET /metrics without the bearer token (it
//                                      # names every tenant: open it only to a trusted
//                                      # network's Prometheus)
//     events_heartbeat: 15s            # a comment line on every GET /v1/events stream
//   endpoints:                         # tiers that serve a model endpoint
//     host: ""                         # the address callers reach the node(s) at, in each
//                                      # endpoint's URL and certificate ("" = external_url's host)
//   tokens:
//     default_ttl: 1h                  # `factory token create` without --ttl
//     tenant_ttl: 24h                  # the token in a tenant VM's user-data: the VM
//                                      # must import its image, boot and enroll by then
//   kube:                              # the host cluster tenants' VMs run in
//     kubeconfig: ""                   # "" = kubectl's lookup ($KUBECONFIG,
//                                      # ~/.kube/config), else the pod's service
//                                      # account; relative to this file's folder
//     context: ""                      # "" = the kubeconfig's current-context
//     namespace: tenants               # where tenant objects go (--namespace overrides)
//     request_timeout: 10s             # per API request (on a worker, never an io thread)
//   tenants:
//     source: coordinator              # where tenants are defined: coordinator (its own
//                                      # store; `tenant create` acts at once) or kubernetes
//                                      # (Tenant objects, factory.dev/v1alpha1, in
//                                      # kube.namespace: the leader reconciles them, and
//                                      # `tenant create|delete` write them; provider kubevirt)
//   leader_election:                   # replicas on one PostgreSQL store: one leader runs
//                                      # the reconcilers and resumes interrupted actions
//     enabled: false                   # true: a coordination.k8s.io/v1 Lease decides
//                                      # (false: this coordinator is the only one)
//     lease: factory-coordinator       # the Lease's name
//     namespace: ""                    # "" = $POD_NAMESPACE, else kube.namespace
//     identity: ""                     # "" = $POD_NAME, else <hostname>-<pid>
//     lease_duration: 10s              # a leader that stops renewing is replaced after this
//     renew_deadline: 7s               # a leader that cannot renew for this long steps down
//     retry_period: 2s                 # how often the Lease is tried and renewed
//   qemu:                              # provider qemu only
//     binary: qemu-system-x86_64       # looked up on PATH unless a path
//     img: qemu-img
//     base_image: ""                   # what every tenant's copy-on-write disk sits on:
//                                      # a folder with image.json (deploy/qemu/
//                                      # build-image.sh) or a disk file booted by its
//                                      # own boot loader (Ubuntu's cloud image);
//                                      # relative to this file's folder
//     vms_dir: ""                      # "" = <state_dir>/vms
//     accel: auto                      # auto (KVM when a guest runs under it, else
//                                      # TCG) | kvm | tcg
//     supervisor: auto                 # auto (systemd when it is PID 1, else a child
//                                      # the coordinator restarts) | systemd | child
//     ssh_listen: 127.0.0.1            # where each tenant's forwarded SSH port listens
//   threads:
//     io: 0                            # io threads serving connections (0: one per
//                                      # core, at most 4)
//     workers: 4                       # threads for what may wait: Kubernetes
//                                      # calls, signatures, disk syncs
//   usage:                             # GPU time per tenant (docs/usage.md)
//     observe_every: 15s               # how often the leader looks at each VM (1s to 5m)
//   quotas:                            # docs/usage.md
//     projects: {}                     # project -> {gpus: {card model: GPUs}}: the most
//                                      # GPUs of that model the project's tenants may
//                                      # hold (e.g. ml: {gpus: {nvidia.com/GH100_H200: 4}});
//                                      # a project or model not named has no limit
//   guest_ranges:                      # a gpu-k8s guest cluster's own ranges
//     avoid: []                        # ranges the host's API does not show that the
//                                      # guest must not use (an overlay's pool such as
//                                      # Calico's 192.168.0.0/16, a routed office LAN);
//                                      # the host cluster's node pod ranges, Services
//                                      # and ServiceCIDRs are read from its API
//     pool: [10.52.0.0/14, 10.56.0.0/13, 10.64.0.0/10, 172.16.0.0/12]
//                                      # where pod and service ranges are picked, first
//                                      # free first (IPv4: the guest is single-stack)
//     pod_prefix: 16                   # the size of each
//     service_prefix: 16
//     dns_offset: 10                   # the DNS Service's address in the service range
//   catalog: ""                        # catalog file ("" = the built-in one);
//                                      # relative to this file's folder
//   log_level: info
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/cluster_ranges.hpp"

namespace factory::coordinator {

// provider: qemu (coordinator/qemu reads these; this module only parses them).
struct QemuSettings {
  std::string binary = "qemu-system-x86_64";
  std::string img = "qemu-img";
  std::string base_image;  // resolved against the config file's folder
  std::string vms_dir;     // resolved: never empty after load
  std::string accel = "auto";
  std::string supervisor = "auto";
  std::string ssh_listen = "127.0.0.1";
};

// leader_election: the Lease replicas elect their leader with.
struct LeaderElectionSettings {
  bool enabled = false;
  std::string lease = "factory-coordinator";
  std::string ns;        // resolved: never empty after load
  std::string identity;  // resolved: never empty after load
  std::chrono::seconds lease_duration{10};
  std::chrono::seconds renew_deadline{7};
  std::chrono::seconds retry_period{2};
};

struct CoordinatorConfig {
  std::string state_dir = "/var/lib/factory";
  // "" = the embedded SQLite store; else a postgres:// (or postgresql://)
  // URI. It may hold a password: never put in a message or a log line.
  std::string store;
  std::string external_url;    // derived when empty
  std::string endpoints_host;  // "" = external_url's host
  std::string agents_listen = "0.0.0.0:8443";
  std::chrono::seconds agents_idle_timeout{60};
  std::chrono::seconds agent_cert_ttl{std::chrono::hours(24)};
  std::chrono::seconds agent_renewal_grace{std::chrono::hours(24 * 90)};
  std::chrono::seconds agent_upgrade_grace{std::chrono::minutes(5)};
  std::string agent_binary;
  // agents.quota: per tenant (coordinator/agents/quota.hpp), and the history
  // the store keeps of each (its retention).
  double quota_events_per_second = 250;
  double quota_event_burst = 500;
  std::uint64_t quota_bytes_per_day = 32ull << 20;
  std::size_t quota_max_events_stored = 10000;
  std::chrono::seconds quota_max_event_age{std::chrono::hours(24 * 90)};
  std::string api_listen = "127.0.0.1:8444";
  bool metrics_public = false;
  std::chrono::seconds events_heartbeat{15};
  std::chrono::seconds token_default_ttl{std::chrono::hours(1)};
  std::chrono::seconds token_tenant_ttl{std::chrono::hours(24)};
  std::string kube_kubeconfig;  // resolved against the config file's folder
  std::string kube_context;
  std::string kube_namespace = "tenants";
  std::chrono::seconds kube_request_timeout{10};
  std::size_t io_threads = 0;  // resolved: never 0 after load
  std::size_t worker_threads = 4;
  std::string provider = "kubevirt";  // or "qemu"
  // tenants.source: "coordinator" (the store is the truth) or "kubernetes"
  // (Tenant objects are; the controller reconciles them into the store).
  std::string tenants_source = "coordinator";
  bool tenants_from_kubernetes() const { return tenants_source == "kubernetes"; }
  LeaderElectionSettings leader_election;
  QemuSettings qemu;
  // guest_ranges: what gpu-k8s guests pick their ranges around, besides
  // what the host cluster's API shows, and where they pick them.
  std::vector<ranges::Fact> guest_ranges_avoid;
  ranges::Pool guest_ranges_pool;
  std::chrono::seconds usage_observe_every{15};
  // quotas.projects: project -> card model -> GPUs its tenants may hold.
  std::map<std::string, std::map<std::string, int>> project_gpu_quotas;
  std::string catalog;  // as written; catalog::load_configured resolves it
  std::string log_level = "info";
  std::string source;  // the file it came from, for messages

  // https://host:port of the API as a local client should dial it.
  std::string api_url() const;
  // https://host:port of the agents endpoint (for /v1/agent/binary).
  std::string agents_https_url() const;
};

// A missing file is an error only when required (an explicit --config);
// the default path may be absent and then defaults apply.
Result<CoordinatorConfig> load_coordinator_config(const std::string& path, bool required);

}  // namespace factory::coordinator
