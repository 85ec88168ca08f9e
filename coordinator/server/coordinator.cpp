#include "coordinator/server/coordinator.hpp"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <mutex>

#include "common/atomic_file.hpp"
#include "common/display.hpp"
#include "common/durations.hpp"
#include "common/net/server.hpp"
#include "common/net/tls_tickets.hpp"
#include "common/net/url.hpp"
#include "common/pki.hpp"
#include "common/worker_pool.hpp"
#include "contract/protocol.hpp"
#include "coordinator/agents/agent_service.hpp"
#include "coordinator/api/router.hpp"
#include "coordinator/catalog/source.hpp"
#include "coordinator/controller/tenant_controller.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/feed/status_feed.hpp"
#include "coordinator/kube/leader_election.hpp"
#include "coordinator/kubevirt/kubevirt_provider.hpp"
#include "coordinator/qemu/qemu_provider.hpp"
#include "coordinator/server/kube_tenant_objects.hpp"
#include "coordinator/shared/replica.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/agent_binary.hpp"
#include "coordinator/tenants/agent_control.hpp"
#include "coordinator/tenants/endpoint_keys.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::coordinator {
namespace fs = std::filesystem;

namespace {

// What tenant logic may ask of the agents, answered by the agents module.
class AgentsForTenants : public tenants::AgentControl {
 public:
  explicit AgentsForTenants(AgentService& agents) : agents_(agents) {}
  Status revoke(const std::string& tenant) override { return agents_.revoke(tenant); }
  bool send_command(const std::string& tenant, const nlohmann::json& body) override {
    return agents_.send_command(tenant, body);
  }
  bool push_endpoint(const std::string& tenant) override { return agents_.push_endpoint(tenant); }
  std::optional<std::vector<std::string>> agent_features(const std::string& tenant) override {
    return agents_.agent_features(tenant);
  }

 private:
  AgentService& agents_;
};

}  // namespace

struct Coordinator::Parts {
  // Work that may wait (Kubernetes, signatures, store syncs) runs here, never
  // on an io thread.
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<enroll::CertificateAuthority> ca;
  std::unique_ptr<enroll::Tokens> tokens;
  std::unique_ptr<store::Store> store;
  std::unique_ptr<feed::StatusFeed> feed;
  std::unique_ptr<AgentService> agents;
  std::unique_ptr<AgentsForTenants> agent_control;
  std::unique_ptr<ApiRouter> router;
  std::unique_ptr<tenants::TenantService> tenants;
  std::unique_ptr<tenants::EndpointKeys> endpoint_keys;
  // The Tenant controller (tenants.source: kubernetes; null otherwise):
  // active while this replica leads, stopped before the service it calls.
  std::unique_ptr<controller::TenantController> controller;
  // The agent binary served at /v1/agent/binary (tenants/agent_binary.hpp):
  // read at start, and again on a worker when the file changed; served
  // from memory, so a download never reads the disk on an io thread.
  std::unique_ptr<tenants::AgentBinary> agent_binary;
  // The Lease election (null without one); stopped before anything it
  // calls into goes (~Coordinator, run()).
  std::unique_ptr<kube::LeaderElector> elector;
  // The agents endpoint's session ticket keys, rotated by a worker.
  std::shared_ptr<net::TicketKeys> ticket_keys;
  // Replicas on one PostgreSQL database (`store: postgres://…`, issue 26):
  // the CAs, the admin token and both kinds of tokens are the database's,
  // not state_dir's. Last, so destroyed first: it refreshes the router's
  // read-only tokens from a thread of its own.
  std::unique_ptr<shared::Replica> replica;
};

struct Coordinator::Net {
  std::unique_ptr<net::IoPool> pool;
  std::unique_ptr<net::Server> agents;
  std::unique_ptr<net::Server> api;
  std::unique_ptr<boost::asio::signal_set> signals;
  std::unique_ptr<boost::asio::steady_timer> renewal;
  // When the serving certificate was issued and when it expires (wall clock):
  // written by the worker that renews it, read by the io thread's check.
  std::mutex cert_mu;
  Clock::time_point cert_issued{}, cert_expires{};
  bool renewing = false;  // one renewal on a worker at a time
  std::unique_ptr<boost::asio::steady_timer> memory_trim;
  std::atomic<bool> trimming{false};
};

Result<std::string> load_or_create_admin_token(const std::string& state_dir) {
  fs::path p = fs::path(state_dir) / kAdminTokenFile;
  if (fs::exists(p)) {
    auto t = read_file(p);
    if (!t) return t.error();
    std::string tok = *t;
    while (!tok.empty() && (tok.back() == '\n' || tok.back() == '\r')) tok.pop_back();
    if (tok.size() < 32) return Error(Errc::invalid_argument, p.string() + " holds no valid token");
    return tok;
  }
  std::string tok = pki::random_token_chars(48);
  if (auto st = write_file_atomic(p, tok + "\n", 0600); !st.ok()) return st.error();
  spdlog::info("created the admin token at {} (mode 0600)", p.string());
  return tok;
}

namespace {

std::string self_dir() {
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

std::vector<std::string> server_hosts(const CoordinatorConfig& cfg) {
  std::vector<std::string> hosts = {"localhost", "127.0.0.1", "::1"};
  char hn[256] = {0};
  if (::gethostname(hn, sizeof hn - 1) == 0 && hn[0]) hosts.push_back(hn);
  if (auto u = net::parse_url(cfg.external_url)) hosts.push_back(u->host);
  for (auto* l : {&cfg.agents_listen, &cfg.api_listen}) {
    if (auto hp = net::split_host_port(*l);
        hp && !hp->first.empty() && hp->first != "0.0.0.0" && hp->first != "::")
      hosts.push_back(hp->first);
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  return hosts;
}

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::open(CoordinatorConfig cfg) {
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->cfg_ = std::move(cfg);
  c->parts_ = std::make_unique<Parts>();
  Parts& p = *c->parts_;
  const std::string& dir = c->cfg_.state_dir;
  if (auto st = ensure_dir(dir, 0700); !st.ok())
    return st.error().with_context("state_dir (run as a user that can write it, or set state_dir)");
  if (shared::shares_state(c->cfg_.store)) {
    auto replica = shared::Replica::open(c->cfg_.store, dir, fs::path(dir) / kAdminTokenFile);
    if (!replica) return replica.error();
    p.replica = std::move(*replica);
  }
  auto ca = p.replica ? p.replica->ca() : enroll::CertificateAuthority::load_or_create(dir);
  if (!ca) return ca.error();
  p.ca = std::make_unique<enroll::CertificateAuthority>(std::move(*ca));
  auto endpoint_ca =
      p.replica ? p.replica->endpoint_ca()
                : enroll::CertificateAuthority::load_or_create(dir, enroll::kEndpointCaFiles);
  if (!endpoint_ca) return endpoint_ca.error().with_context("endpoint CA");
  auto admin = p.replica ? p.replica->admin_token() : load_or_create_admin_token(dir);
  if (!admin) return admin.error();
  if (p.replica) {
    p.tokens = p.replica->token_book();
  } else {
    auto tokens = enroll::TokenBook::load(fs::path(dir) / kTokenBookFile);
    if (!tokens) return tokens.error();
    p.tokens = std::make_unique<enroll::TokenBook>(std::move(*tokens));
  }
  {
    // A key file this build cannot read costs each agent one full handshake,
    // not the start: said, replaced with fresh keys.
    const fs::path keys = fs::path(dir) / kTicketKeysFile;
    auto ticket_keys = net::TicketKeys::open(keys);
    if (!ticket_keys) {
      spdlog::warn("{}; starting with new session ticket keys", ticket_keys.error().message);
      std::error_code ec;
      fs::remove(keys, ec);
      ticket_keys = net::TicketKeys::open(keys);
      if (!ticket_keys) return ticket_keys.error();
    }
    p.ticket_keys = std::move(*ticket_keys);
  }
  store::StoreOptions so;
  so.max_events_per_tenant = c->cfg_.quota_max_events_stored;
  so.max_event_age = c->cfg_.quota_max_event_age;
  // 10,000 agents' steady events come a few ms apart, and each was its own
  // transaction and sync (a sixth of the coordinator's CPU, docs/scale.md,
  // stop 43): a writer busy lately lets an event wait up to 10 ms for others.
  so.commit_delay = std::chrono::milliseconds(10);
  auto store = c->cfg_.store.empty()
                   ? store::open_sqlite_store((fs::path(dir) / "store").string(), so)
                   : store::open_postgres_store(c->cfg_.store, so);
  if (!store) return store.error();
  p.store = std::move(*store);
  p.workers = std::make_unique<WorkerPool>(c->cfg_.worker_threads);
  feed::EventBusOptions bus;
  bus.heartbeat = c->cfg_.events_heartbeat;
  // Replicas on one PostgreSQL store stream one feed, numbered by the
  // database (store/feed_log.hpp); SQLite has no log, the bus numbers.
  bus.log = p.store->feed_log();
  // Each replica's note of its agents goes out at every heartbeat: an
  // agent is shown lost once its replica missed four of them.
  if (bus.heartbeat.count() > 0)
    bus.replica_ttl = 4 * std::chrono::duration_cast<std::chrono::milliseconds>(bus.heartbeat);
  p.feed = std::make_unique<feed::StatusFeed>(*p.store, bus);
  AgentServiceOptions ao;
  ao.cert_ttl = c->cfg_.agent_cert_ttl;
  ao.renewal_grace = c->cfg_.agent_renewal_grace;
  ao.quotas.events_per_second = c->cfg_.quota_events_per_second;
  ao.quotas.event_burst = c->cfg_.quota_event_burst;
  ao.quotas.bytes_per_day = c->cfg_.quota_bytes_per_day;
  ao.endpoint_ca = *endpoint_ca;
  p.agents =
      std::make_unique<AgentService>(*p.store, *p.ca, *p.tokens, p.feed->state(), *p.workers, ao);
  p.agent_control = std::make_unique<AgentsForTenants>(*p.agents);
  p.router = std::make_unique<ApiRouter>(*admin, *p.workers);
  if (auto st = p.replica ? p.replica->share_api_tokens(p.router->auth())
                          : p.router->auth().load((fs::path(dir) / kApiTokensFile).string());
      !st.ok())
    return st.error();
  p.agent_binary = std::make_unique<tenants::AgentBinary>(
      c->cfg_.agent_binary.empty() ? self_dir() + "/factory-agent" : c->cfg_.agent_binary);
  if (auto bin = p.agent_binary->current(); !bin->readable())
    spdlog::warn("agent binary {}: guests cannot download the agent (set agents.binary)",
                 bin->no_version);
  else if (bin->version.empty())
    spdlog::warn("agent binary {}: agents cannot be upgraded to it", bin->no_version);
  // What /metrics and `factory status` show of it, whenever it is read.
  p.agent_binary->on_change([feed = p.feed.get()](const tenants::AgentBinarySnapshot& s) {
    feed->state().set_agent_binary(s.to_json());
  });
  // The catalog is checked whole at start-up: a typo in it stops the
  // coordinator here, not a guest halfway through its first boot.
  auto cat = catalog::load_configured("", c->cfg_.source);
  if (!cat) return cat.error().with_context("catalog");
  tenants::TenantServiceOptions to;
  to.default_namespace = c->cfg_.kube_namespace;
  to.token_ttl = c->cfg_.token_tenant_ttl;
  to.coordinator_url = c->cfg_.external_url;
  to.agent_binary_url = c->cfg_.agents_https_url() + "/v1/agent/binary";
  to.agent_binary_path = p.agent_binary->path();
  to.upgrade_grace = c->cfg_.agent_upgrade_grace;
  to.ca_pem = p.ca->certificate_pem();
  to.guest_ranges_avoid = c->cfg_.guest_ranges_avoid;
  to.guest_ranges_pool = c->cfg_.guest_ranges_pool;
  to.project_gpu_quotas = c->cfg_.project_gpu_quotas;
  to.usage_every = c->cfg_.usage_observe_every;
  to.endpoint_ca_pem = endpoint_ca->certificate_pem();
  to.endpoint_host = c->cfg_.endpoints_host;
  if (to.endpoint_host.empty())
    if (auto u = net::parse_url(c->cfg_.external_url)) to.endpoint_host = u->host;
  std::unique_ptr<tenants::VmProvider> provider;
  if (c->cfg_.provider == "qemu") {
    const QemuSettings& q = c->cfg_.qemu;
    qemu::QemuProviderOptions qo;
    qo.qemu_binary = q.binary;
    qo.qemu_img = q.img;
    qo.base_image = q.base_image;
    qo.vms_dir = q.vms_dir;
    qo.accel = q.accel;
    qo.supervisor = q.supervisor;
    qo.ssh_listen = q.ssh_listen;
    auto qp = qemu::QemuProvider::create(qo);
    if (!qp) return qp.error().with_context("provider qemu");
    provider = std::move(*qp);
  } else {
    provider = std::make_unique<kubevirt::KubeVirtProvider>(
        kube::AccessOptions{c->cfg_.kube_kubeconfig, c->cfg_.kube_context},
        std::chrono::duration_cast<std::chrono::milliseconds>(c->cfg_.kube_request_timeout));
  }
  // tenants.source: kubernetes: the admin API's creates and deletes go
  // through Tenant objects (tenants/tenant_objects.hpp). A cluster that
  // cannot be reached is a start-up error, as nothing could be created.
  std::unique_ptr<tenants::TenantObjects> tenant_objects;
  if (c->cfg_.tenants_from_kubernetes()) {
    auto access =
        kube::resolve_access(kube::AccessOptions{c->cfg_.kube_kubeconfig, c->cfg_.kube_context});
    if (!access)
      return access.error().with_context(
          "tenants.source is kubernetes, but the host cluster cannot be reached");
    tenant_objects = std::make_unique<KubeTenantObjects>(kube::KubeClient(
        std::move(*access),
        std::chrono::duration_cast<std::chrono::milliseconds>(c->cfg_.kube_request_timeout)));
  }
  p.tenants = std::make_unique<tenants::TenantService>(
      tenants::TenantServiceDeps{
          *p.store, *p.tokens, p.feed->view(), *p.agent_control,
          [feed = p.feed.get()](const std::string& tenant, const nlohmann::json& action) {
            feed->state().bus().publish("action", tenant, action);
          },
          p.agent_binary.get(),
          [feed = p.feed.get()](const std::string& result) {
            feed->state().count_agent_upgrade(result);
          }},
      std::move(*cat), std::move(provider), to, std::move(tenant_objects));
  p.agents->set_plan_provider(
      [svc = p.tenants.get()](const store::TenantRecord& t) { return svc->plan_for(t); });
  p.agents->set_pending_commands([svc = p.tenants.get()](const store::TenantRecord& t) {
    auto owed = svc->pending_commands(t);
    if (auto order = svc->tier_upgrade_owed(t)) owed.push_back(std::move(*order));
    return owed;
  });
  p.agents->set_plan_step_ids(
      [svc = p.tenants.get()](const store::TenantRecord& t) { return svc->plan_step_ids(t); });
  if (c->cfg_.tenants_source == "kubernetes") {
    // Tenants are the host cluster's objects: without it there is nothing
    // to serve them from, so this is a start-up error, not a warning.
    auto access =
        kube::resolve_access(kube::AccessOptions{c->cfg_.kube_kubeconfig, c->cfg_.kube_context});
    if (!access)
      return access.error().with_context(
          "tenants.source is kubernetes, but the host cluster cannot be reached");
    controller::TenantControllerOptions co;
    co.ns = c->cfg_.kube_namespace;
    p.controller = std::make_unique<controller::TenantController>(
        kube::KubeClient(std::move(*access), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 c->cfg_.kube_request_timeout)),
        *p.tenants, *p.store, p.feed->view(),
        [feed = p.feed.get()](const std::string& tenant, const nlohmann::json& action) {
          feed->state().bus().publish("action", tenant, action);
        },
        co);
  }
  c->net_ = std::make_unique<Net>();
  c->install_core_routes();
  p.feed->install_routes(*p.router, c->cfg_.metrics_public);
  p.tenants->install_routes(*p.router);
  p.endpoint_keys = std::make_unique<tenants::EndpointKeys>(*p.store, *p.agent_control);
  p.endpoint_keys->install_routes(*p.router);
  return c;
}

Coordinator::~Coordinator() {
  if (parts_ && parts_->elector) parts_->elector->stop();
  if (parts_ && parts_->controller) parts_->controller->stop();
  if (parts_ && parts_->tenants) parts_->tenants->stop_maintenance();
  if (net_ && net_->agents) net_->agents->stop();
  if (net_ && net_->api) net_->api->stop();
  if (parts_ && parts_->workers) parts_->workers->stop();
  if (parts_ && parts_->store) parts_->store->close();
}

void Coordinator::install_core_routes() {
  Parts& p = *parts_;
  auto& r = *p.router;
  // Readiness: "this replica can reach its store". A replica on a shared
  // database that cannot reach it is taken out of the Services (the agents
  // go to one that can store their events); the embedded store is a local
  // file, always within reach. Public, as probes carry no token; blocking,
  // as the question goes over the network.
  r.add("GET", "/readyz",
        [&p](auto&, auto&) {
          if (!p.replica) return json_response({{"status", "ready"}, {"store", "sqlite"}});
          auto db = p.replica->database();
          if (auto st = db->run("ping", {}); !st)
            return net::HttpResponseOut::error(
                503, "unready",
                "cannot reach the store (" + db->where() + "): " + st.error().message);
          return json_response({{"status", "ready"}, {"store", db->where()}});
        },
        {.public_route = true, .blocking = true});
  r.add("GET", "/healthz",
        [](auto&, auto&) {
          return json_response({{"status", "ok"}});
        },
        {.public_route = true});
  // GET /v1/tenants and /metrics: the status feed; GET/DELETE
  // /v1/tenants/{name}, POST /v1/tenants and retry: TenantService.
  r.add("POST", "/v1/tokens",
        [this, &p](const net::HttpRequestIn& req, auto&) {
          auto body = nlohmann::json::parse(req.body, nullptr, false);
          auto bad = [](const std::string& m) {
            return net::HttpResponseOut::error(400, "invalid_argument", m);
          };
          if (body.is_discarded() || !body.is_object())
            return net::HttpResponseOut::error(400, "bad_request",
                                               "want {\"tenant\": NAME, \"ttl\": \"1h\"}");
          for (auto& [k, v] : body.items())
            if (k != "tenant" && k != "ttl")
              return bad("unknown field '" + k + "' (known: tenant, ttl)");
          if (!body.contains("tenant")) return bad("'tenant' is required (a tenant name)");
          if (!body["tenant"].is_string()) return bad("'tenant' must be a string (a tenant name)");
          std::string tenant = body["tenant"].get<std::string>();
          if (auto st = enroll::validate_tenant_name(tenant); !st.ok())
            return net::HttpResponseOut::error(400, "invalid_argument", st.error().message);
          std::chrono::seconds ttl = cfg_.token_default_ttl;
          if (body.contains("ttl") && !body["ttl"].is_null()) {
            if (!body["ttl"].is_string())
              return bad("'ttl' must be a duration string like \"1h\" or \"90s\"");
            auto d = parse_duration(body["ttl"].get<std::string>());
            if (!d) return net::HttpResponseOut::error(400, "invalid_argument", d.error().message);
            ttl = *d;
          }
          if (ttl < std::chrono::seconds(1) || ttl > std::chrono::hours(24 * 7))
            return net::HttpResponseOut::error(400, "invalid_argument",
                                               "ttl must be between 1s and 7d");
          // The tenant's record first, the token second: a token is good only
          // with a record to enroll into, so one whose record could not be
          // stored (a full disk) must never be left active in the book.
          if (!p.store->get_tenant(tenant)) {
            store::TenantRecord rec;
            rec.name = tenant;
            rec.created_at = format_rfc3339(Clock::now());
            if (auto st = p.store->put_tenant(rec); !st.ok())
              return net::HttpResponseOut::error(
                  503, "store_failed",
                  "could not store tenant " + tenant + ": " + st.error().message +
                      "; no token was issued, try again once the store is writable");
          }
          auto issued = p.tokens->issue(tenant, ttl);
          if (!issued)
            return net::HttpResponseOut::error(
                503, "store_failed",
                issued.error().message +
                    "; no token was issued, try again once the token book is writable");
          spdlog::info("api: issued bootstrap token {} for tenant {} (expires {})", issued->id,
                       tenant, format_rfc3339(issued->expires_at));
          return json_response({{"tenant", tenant},
                                {"token", issued->token},
                                {"expires_at", format_rfc3339(issued->expires_at)},
                                {"coordinator_url", cfg_.external_url},
                                {"ca_sha256", p.ca->sha256()}},
                               201);
        },
        {.blocking = true});
  // Read-only API tokens: GET of the status feed and the dashboard, nothing else.
  r.add("POST", "/v1/api-tokens",
        [&p](const net::HttpRequestIn& req, auto&) {
          auto body = nlohmann::json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
          const bool wanted = !body.is_discarded() && body.is_object() &&
                              body.size() == (body.contains("access") ? 1u : 0u) &&
                              (!body.contains("access") || body["access"] == "read-only");
          if (!wanted)
            return net::HttpResponseOut::error(
                400, "invalid_argument",
                "want {\"access\": \"read-only\"} (the only kind there is)");
          auto t = p.router->auth().create_read_only_token();
          if (!t) return net::HttpResponseOut::error(500, "internal", t.error().message);
          spdlog::info("api: created read-only API token {}", t->id);
          return json_response({{"id", t->id},
                                {"token", t->token},
                                {"access", "read-only"},
                                {"created_at", t->created_at}},
                               201);
        },
        {.blocking = true});
  r.add("GET", "/v1/api-tokens", [&p](auto&, auto&) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& t : p.router->auth().read_only_tokens())
      list.push_back({{"id", t.id}, {"access", "read-only"}, {"created_at", t.created_at}});
    return json_response({{"api_tokens", list}});
  });
  // Blocking: the book may be a database (shared::Replica).
  r.add("GET", "/v1/tokens",
        [&p](auto&, auto&) {
          auto records = p.tokens->records();
          if (!records)
            return net::HttpResponseOut::error(503, "store_failed", records.error().message);
          nlohmann::json list = nlohmann::json::array();
          for (auto& t : *records)
            list.push_back({{"id", t.id},
                            {"tenant", t.tenant},
                            {"state", enroll::token_state(t)},
                            {"expires_at", format_rfc3339(t.expires_at)}});
          return json_response({{"tokens", list}});
        },
        {.blocking = true});
}

Status Coordinator::issue_serving_certificate(net::TlsServerOptions& tls) {
  Parts& p = *parts_;
  auto cert = p.ca->issue_server_certificate(server_hosts(cfg_), kServingCertTtl);
  if (!cert) return cert.error().with_context("server certificate");
  tls.cert_chain_pem = cert->certificate_pem;
  tls.key_pem = cert->private_key_pem;
  std::lock_guard lk(net_->cert_mu);
  net_->cert_issued = Clock::now();
  net_->cert_expires = cert->not_after;
  return {};
}

// The agents endpoint asks for client certificates from our CA, and lets an
// expired one through for the agents module to judge: an agent that was off
// longer than its certificate's life may still renew it (and do nothing else)
// within agents.renewal_grace.
net::TlsServerOptions Coordinator::agents_tls(const net::TlsServerOptions& serving) const {
  net::TlsServerOptions t = serving;
  t.client_ca_pem = parts_->ca->certificate_pem();
  t.accept_expired_client_certs = true;
  t.ticket_keys = parts_->ticket_keys;
  return t;
}

Status Coordinator::start() {
  Parts& p = *parts_;
  net_->pool = std::make_unique<net::IoPool>(cfg_.io_threads);
  net::TlsServerOptions tls;
  if (auto st = issue_serving_certificate(tls); !st.ok()) return st;

  net::ServerOptions ao;
  ao.listen = cfg_.agents_listen;
  ao.tls = agents_tls(tls);
  ao.ws_idle_timeout = cfg_.agents_idle_timeout;
  // The hard ceiling (above it the connection closes with 1009); the
  // protocol's 64 KiB cap per type is enforced by proto::parse, which
  // rejects the frame with an error and keeps the session. Strangers get
  // the small limit of ServerOptions::strangers from the first byte.
  ao.ws_max_message = proto::kMaxPlanFrameBytes;
  // A stranger may only enroll: its messages need be no larger than an
  // enroll frame. 4096 strangers each holding an unfinished frame of that
  // size is the most memory they can pin (Strangers.* tests measure it).
  ao.strangers.max_message = proto::kMaxEnrollFrameBytes;
  ao.name = "agents";
  net_->agents = std::make_unique<net::Server>(*net_->pool, ao);
  net_->agents->on_websocket([&p](const net::HttpRequestIn& req, const net::PeerInfo& peer) {
    return p.agents->accept(req, peer);
  });
  net_->agents->on_http(net::immediate([&p](const net::HttpRequestIn& req, const net::PeerInfo&) {
    if (req.method == "GET" && req.path == "/healthz") return json_response({{"status", "ok"}});
    if (req.method == "GET" && req.path == "/v1/agent/binary") {
      // The file is looked at again on a worker (at most every 10 s); this
      // answer is what is held now.
      if (p.agent_binary->refresh_due() &&
          !p.workers->post([bin = p.agent_binary.get()] { bin->refresh(); }))
        spdlog::warn("could not queue a look at the agent binary");
      // An upgrade order asks for its binary by hash: the one it was
      // ordered with, or nothing (never another binary under its name).
      auto want = req.query.find("sha256");
      auto bin = want == req.query.end() ? p.agent_binary->current()
                                         : p.agent_binary->by_sha256(want->second);
      if (!bin)
        return net::HttpResponseOut::error(
            404, "not_found",
            "this coordinator no longer serves the agent binary with sha256 " +
                display::sanitize(want->second.substr(0, 64)) +
                " (agents.binary changed since the upgrade was ordered)");
      if (!bin->readable())
        return net::HttpResponseOut::error(
            404, "not_found",
            "the coordinator has no agent binary (agents.binary): " + bin->no_version);
      net::HttpResponseOut out;
      out.content_type = "application/octet-stream";
      out.shared_body = bin->bytes;
      out.headers["X-Factory-Agent-Sha256"] = bin->sha256;
      if (!bin->version.empty()) out.headers["X-Factory-Agent-Version"] = bin->version;
      return out;
    }
    return net::HttpResponseOut::error(404, "not_found", "no such path: " + req.path);
  }));

  net::ServerOptions po;
  po.listen = cfg_.api_listen;
  po.tls = tls;
  po.name = "api";
  // What a GET /v1/events reader that does not read may hold before it is
  // dropped: 1 MiB of references to the feed's events (shared, not copied),
  // so 100 such readers cost about 100 MiB at worst, and far less when they
  // fell behind on the same events. Its whole replay (the bus keeps at most
  // 512 KiB of history) fits.
  po.max_stream_queue = 1 << 20;
  // A feed reader of a fleet gets an event for every agent's every health
  // sample (1,000 a second at 10,000 agents): written as they come, each
  // was its own TLS record and system call, half the coordinator's writes.
  // Gathered for 5 ms they go a record at a time, 5 ms later at most.
  po.stream_flush_delay = std::chrono::milliseconds(5);
  net_->api = std::make_unique<net::Server>(*net_->pool, po);
  net_->api->on_http(
      [&p](std::shared_ptr<net::HttpExchange> x) { p.router->handle(std::move(x)); });

  // Nothing is left listening when either cannot bind.
  if (auto st = net_->agents->start(); !st.ok()) return st.error().with_context("agents endpoint");
  if (auto st = net_->api->start(); !st.ok()) {
    net_->agents->stop();
    return st.error().with_context("api endpoint");
  }
  spdlog::info("agents endpoint on {} (agents dial {}), API on {}; CA sha256 {}; {} io threads",
               cfg_.agents_listen, cfg_.external_url, cfg_.api_listen, p.ca->sha256(),
               net_->pool->size());
  if (auto left = p.ca->not_after() - Clock::now(); left < kCaExpiryWarning)
    spdlog::warn(
        "the coordinator's CA ({}/ca.crt) expires at {}: after that no agent or admin "
        "client can verify this coordinator",
        cfg_.state_dir, format_rfc3339(p.ca->not_after()));
  schedule_renewal();
  schedule_memory_trim();
  if (p.controller) p.controller->start();
  // Host drains: the journals' notices, stops and starts (the leader only).
  p.tenants->start_maintenance(std::chrono::seconds(1));
  if (cfg_.leader_election.enabled)
    start_leader_election();
  else
    on_leadership(true);
  return {};
}

void Coordinator::start_leader_election() {
  Parts& p = *parts_;
  const LeaderElectionSettings& le = cfg_.leader_election;
  // The access is resolved once (the kubeconfig, or the pod's service
  // account, whose token file current_token() rereads as it rotates).
  auto access = kube::resolve_access(kube::AccessOptions{cfg_.kube_kubeconfig, cfg_.kube_context});
  if (!access) {
    // Not fatal: this replica still serves agents, the API and the feed;
    // it just never leads. Said loudly, and in /metrics (factory_leader 0).
    spdlog::error("leader election: cannot reach the host cluster ({}); this replica will not lead",
                  access.error().message);
    p.feed->state().set_leadership(le.identity, false);
    return;
  }
  kube::LeaderElectionOptions opts;
  opts.lease_name = le.lease;
  opts.ns = le.ns;
  opts.identity = le.identity;
  opts.lease_duration = le.lease_duration;
  opts.renew_deadline = le.renew_deadline;
  opts.retry_period = le.retry_period;
  p.feed->state().set_leadership(le.identity, false);
  p.elector = std::make_unique<kube::LeaderElector>(
      kube::KubeClient(std::move(*access), std::chrono::duration_cast<std::chrono::milliseconds>(
                                               cfg_.kube_request_timeout)),
      opts,
      kube::LeaderCallbacks{.on_start = [this] { on_leadership(true); },
                            .on_stop = [this] { on_leadership(false); },
                            .on_new_leader =
                                [](const std::string& holder) {
                                  spdlog::info(
                                      "leader election: the leader is {}",
                                      holder.empty() ? "nobody (the Lease is free)" : holder);
                                }});
  p.elector->start();
}

// Runs on the elector's thread (or start()'s): quick, it only queues work.
void Coordinator::on_leadership(bool leading) {
  Parts& p = *parts_;
  if (cfg_.leader_election.enabled)
    p.feed->state().set_leadership(cfg_.leader_election.identity, leading);
  // The controller only takes note: its own thread does the work.
  if (p.controller) p.controller->set_active(leading);
  p.tenants->set_maintenance_active(leading);
  if (!leading) return;
  // A restart a kill cut short is finished now (it waits on the cluster);
  // by the leader only, so two replicas never finish the same one.
  if (!p.workers->post([svc = p.tenants.get()] { svc->resume_actions(); }))
    spdlog::error("could not queue the resumption of interrupted tenant actions");
}

void Coordinator::schedule_memory_trim() {
  net_->memory_trim = std::make_unique<boost::asio::steady_timer>(net_->pool->main());
  net_->memory_trim->expires_after(kMemoryTrimEvery);
  net_->memory_trim->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    // On a worker: a trim walks every arena's free lists. One at a time.
    if (!net_->trimming.exchange(true)) {
      if (!parts_->workers->post([this] {
            ::malloc_trim(0);
            net_->trimming = false;
          }))
        net_->trimming = false;
    }
    schedule_memory_trim();
  });
}

// The serving certificate is renewed once two thirds of its life have gone,
// decided against the wall clock at every check: a process that was
// suspended, or whose clock jumped, renews at its next check instead of
// serving an expired certificate until a timer counted from start fires.
void Coordinator::schedule_renewal() {
  net_->renewal = std::make_unique<boost::asio::steady_timer>(net_->pool->main());
  net_->renewal->expires_after(kRenewalCheckEvery);
  net_->renewal->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    auto now = Clock::now();
    bool renew = false;
    {
      std::lock_guard lk(net_->cert_mu);
      auto due = net_->cert_issued + (net_->cert_expires - net_->cert_issued) * 2 / 3;
      renew = !net_->renewing && (now >= due || now < net_->cert_issued);
      if (renew) net_->renewing = true;
    }
    if (renew) {
      // Signing is quick but not free: on a worker, then swap the contexts.
      bool queued = parts_->workers->post([this] {
        net::TlsServerOptions tls;
        bool used = false;
        if (auto st = issue_serving_certificate(tls); !st.ok()) {
          spdlog::error("could not renew the serving certificate: {}", st.error().message);
        } else {
          auto a = net_->agents->update_tls(agents_tls(tls));
          auto b = net_->api->update_tls(tls);
          used = a.ok() && b.ok();
          if (!used)
            spdlog::error("could not use the renewed serving certificate: {}",
                          (a.ok() ? b : a).error().message);
        }
        std::lock_guard lk(net_->cert_mu);
        net_->renewing = false;
        if (used)
          spdlog::info("renewed the serving certificate (valid until {})",
                       format_rfc3339(net_->cert_expires));
      });
      if (!queued) {
        std::lock_guard lk(net_->cert_mu);
        net_->renewing = false;
      }
    }
    // The session ticket keys rotate on the same check; a rotation writes
    // their file, so on a worker.
    (void)parts_->workers->post([this] {
      auto rotated = parts_->ticket_keys->rotate_if_due();
      if (!rotated)
        spdlog::error("could not rotate the session ticket keys: {}", rotated.error().message);
      else if (*rotated)
        spdlog::info("rotated the agents endpoint's session ticket key");
    });
    schedule_renewal();
  });
}

void Coordinator::run() {
  net_->signals = std::make_unique<boost::asio::signal_set>(net_->pool->main(), SIGINT, SIGTERM);
  net_->signals->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    stop();
  });
  net_->pool->run();
  // The Lease is released (the next replica leads at once) before the rest
  // stops; on this thread, as releasing it waits on the API server.
  if (parts_->elector) parts_->elector->stop();
  // The controller finishes the Tenant it is on (it may wait on the cluster).
  if (parts_->controller) parts_->controller->stop();
  // A drain's pass under way finishes (it may wait on a VM's shutdown).
  if (parts_->tenants) parts_->tenants->stop_maintenance();
  // The io threads are done. What the store's writer still holds (events
  // queued behind the last batch, the coalesced latest health of every
  // tenant) is written now: the caller may end the process without running
  // the destructors (cli/serve_command.cpp).
  if (parts_->workers) parts_->workers->stop();
  // With replicas this closes the feed's log too, after what it still holds
  // (the agents' disconnections as the listener stopped) is written: here,
  // not in stop(), as it may wait on the database. The bus, closed by
  // stop(), ignores what the log still hands back meanwhile.
  if (parts_->store) parts_->store->close();
}

void Coordinator::stop() {
  // Every event stream ends with a word, and the heartbeats stop.
  if (parts_ && parts_->feed) parts_->feed->state().bus().close();
  if (net_->agents) net_->agents->stop();
  if (net_->api) net_->api->stop();
  // A moment for the close frames to go out, then the io threads end.
  auto t = std::make_shared<boost::asio::steady_timer>(net_->pool->main(),
                                                       std::chrono::milliseconds(200));
  t->async_wait([this, t](const boost::system::error_code&) { net_->pool->stop(); });
}

int Coordinator::agents_port() const {
  return net_->agents ? net_->agents->port() : 0;
}
int Coordinator::api_port() const {
  return net_->api ? net_->api->port() : 0;
}

}  // namespace factory::coordinator
