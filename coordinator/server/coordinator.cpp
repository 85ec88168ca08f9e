#include "coordinator/server/coordinator.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/net/https_server.hpp"
#include "common/net/ws_client.hpp"
#include "common/pki.hpp"
#include "common/protocol.hpp"
#include "coordinator/catalog/source.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/kubevirt_provider.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::coordinator {
namespace fs = std::filesystem;

struct Coordinator::Net {
  boost::asio::io_context ioc{1};
  std::unique_ptr<net::HttpsServer> agents;
  std::unique_ptr<net::HttpsServer> api;
  std::unique_ptr<boost::asio::signal_set> signals;
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
    if (auto hp = net::split_host_port(*l); hp && !hp->first.empty() && hp->first != "0.0.0.0" &&
                                            hp->first != "::")
      hosts.push_back(hp->first);
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  return hosts;
}

net::HttpResponseOut json_ok(const nlohmann::json& j, int status = 200) {
  return net::HttpResponseOut::json(status, j.dump(2) + "\n");
}

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::open(CoordinatorConfig cfg) {
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->cfg_ = std::move(cfg);
  const std::string& dir = c->cfg_.state_dir;
  if (auto st = ensure_dir(dir, 0700); !st.ok())
    return st.error().with_context("state_dir (run as a user that can write it, or set state_dir)");
  auto ca = enroll::CertificateAuthority::load_or_create(dir);
  if (!ca) return ca.error();
  c->ca_ = std::make_unique<enroll::CertificateAuthority>(std::move(*ca));
  auto admin = load_or_create_admin_token(dir);
  if (!admin) return admin.error();
  auto tokens = enroll::TokenBook::load(fs::path(dir) / kTokenBookFile);
  if (!tokens) return tokens.error();
  c->tokens_ = std::make_unique<enroll::TokenBook>(std::move(*tokens));
  auto store = store::open_file_store((fs::path(dir) / "store").string());
  if (!store) return store.error();
  c->store_ = std::move(*store);
  AgentServiceOptions ao;
  ao.cert_ttl = c->cfg_.agent_cert_ttl;
  c->agents_ = std::make_unique<AgentService>(*c->store_, *c->ca_, *c->tokens_, ao);
  c->router_ = std::make_unique<ApiRouter>(*admin);
  c->agent_binary_ =
      c->cfg_.agent_binary.empty() ? self_dir() + "/factory-agent" : c->cfg_.agent_binary;
  if (auto bin = read_file(c->agent_binary_)) {
    c->agent_sha256_ = pki::sha256_hex(*bin);
  } else {
    spdlog::warn("agent binary {} not readable: guests cannot download the agent (set agents.binary)",
                 c->agent_binary_);
  }
  // The catalog is checked whole at start-up: a typo in it stops the
  // coordinator here, not a guest halfway through its first boot.
  auto cat = catalog::load_configured("", c->cfg_.source);
  if (!cat) return cat.error().with_context("catalog");
  tenants::TenantServiceOptions to;
  to.default_namespace = c->cfg_.kube_namespace;
  to.token_ttl = c->cfg_.token_tenant_ttl;
  c->tenants_ = std::make_unique<tenants::TenantService>(
      *c, std::move(*cat),
      std::make_unique<tenants::KubeVirtProvider>(
          kube::AccessOptions{c->cfg_.kube_kubeconfig, c->cfg_.kube_context},
          std::chrono::duration_cast<std::chrono::milliseconds>(c->cfg_.kube_request_timeout)),
      to);
  c->agents_->set_plan_provider(
      [svc = c->tenants_.get()](const store::TenantRecord& t) { return svc->plan_for(t); });
  c->net_ = std::make_unique<Net>();
  c->install_core_routes();
  c->tenants_->install_routes(*c->router_);
  return c;
}

Coordinator::~Coordinator() = default;

boost::asio::io_context& Coordinator::io() { return net_->ioc; }

void Coordinator::install_core_routes() {
  auto& r = *router_;
  r.add("GET", "/healthz", [](auto&, auto&) { return json_ok({{"status", "ok"}}); }, true);
  r.add("GET", "/metrics", [this](auto&, auto&) {
    net::HttpResponseOut out;
    out.content_type = "text/plain; version=0.0.4; charset=utf-8";
    out.body = prometheus_metrics();
    return out;
  }, true);
  r.add("GET", "/v1/tenants", [this](auto&, auto&) { return json_ok(agents_->status_json()); });
  // GET/DELETE /v1/tenants/{name}, POST /v1/tenants and retry: TenantService.
  r.add("POST", "/v1/tokens", [this](const net::HttpRequestIn& req, auto&) {
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("tenant") ||
        !body["tenant"].is_string())
      return net::HttpResponseOut::error(400, "bad_request", "want {\"tenant\": NAME, \"ttl\": \"1h\"}");
    std::string tenant = body["tenant"].get<std::string>();
    if (auto st = enroll::validate_tenant_name(tenant); !st.ok())
      return net::HttpResponseOut::error(400, "invalid_argument", st.error().message);
    std::chrono::seconds ttl = cfg_.token_default_ttl;
    if (body.contains("ttl")) {
      auto d = parse_duration(body.value("ttl", ""));
      if (!d) return net::HttpResponseOut::error(400, "invalid_argument", d.error().message);
      ttl = *d;
    }
    if (ttl < std::chrono::seconds(1) || ttl > std::chrono::hours(24 * 7))
      return net::HttpResponseOut::error(400, "invalid_argument", "ttl must be between 1s and 7d");
    auto issued = tokens_->issue(tenant, ttl);
    if (!issued) return net::HttpResponseOut::error(500, "internal", issued.error().message);
    if (!store_->get_tenant(tenant)) {
      store::TenantRecord rec;
      rec.name = tenant;
      rec.created_at = format_rfc3339(Clock::now());
      if (auto st = store_->put_tenant(rec); !st.ok())
        return net::HttpResponseOut::error(500, "internal", st.error().message);
    }
    spdlog::info("api: issued bootstrap token {} for tenant {} (expires {})", issued->id, tenant,
                 format_rfc3339(issued->expires_at));
    return json_ok({{"tenant", tenant},
                    {"token", issued->token},
                    {"expires_at", format_rfc3339(issued->expires_at)},
                    {"coordinator_url", cfg_.external_url},
                    {"ca_sha256", ca_->sha256()}},
                   201);
  });
  r.add("GET", "/v1/tokens", [this](auto&, auto&) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& t : tokens_->list())
      list.push_back({{"id", t.id},
                      {"tenant", t.tenant},
                      {"state", enroll::token_state(t)},
                      {"expires_at", format_rfc3339(t.expires_at)}});
    return json_ok({{"tokens", list}});
  });
}

std::string Coordinator::prometheus_metrics() const {
  std::ostringstream o;
  auto gauge = [&](const char* name, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << " " << v << "\n";
  };
  gauge("factory_agents_connected", "Agents connected to this coordinator now.");
  o << "factory_agents_connected " << agents_->connected_count() << "\n";
  std::map<std::string, int> phases;
  for (auto p : {"pending", "enrolled", "provisioning", "ready", "failed"}) phases[p] = 0;
  auto tenants = store_->list_tenants();
  for (auto& t : tenants) phases[t.phase]++;
  gauge("factory_tenants", "Tenants by lifecycle phase.");
  for (auto& [p, n] : phases) o << "factory_tenants{phase=\"" << p << "\"} " << n << "\n";
  gauge("factory_tenant_agent_connected", "1 when the tenant's agent is connected.");
  for (auto& t : tenants) {
    auto l = agents_->live(t.name);
    o << "factory_tenant_agent_connected{tenant=\"" << t.name << "\"} "
      << (l && l->connected ? 1 : 0) << "\n";
  }
  const auto& m = agents_->metrics();
  counter("factory_enrollments_accepted_total", "Agent enrollments accepted.", m.enrollments_accepted);
  counter("factory_enrollments_refused_total", "Agent enrollments refused (bad token or CSR).",
          m.enrollments_refused);
  counter("factory_agent_connections_refused_total",
          "Agent connections refused (revoked certificate, wrong tenant).", m.connections_refused);
  counter("factory_events_stored_total", "Agent events stored.", m.events_stored);
  counter("factory_events_duplicate_total", "Replayed agent events dropped as duplicates.",
          m.events_duplicate);
  counter("factory_frames_rejected_total", "Malformed frames from agents.", m.frames_rejected);
  counter("factory_frames_unknown_type_total", "Frames of an unknown type, ignored.",
          m.frames_unknown_type);
  counter("factory_certificates_renewed_total", "Agent certificates renewed.",
          m.certificates_renewed);
  return o.str();
}

Status Coordinator::start() {
  auto server_cert = ca_->issue_server_certificate(server_hosts(cfg_), std::chrono::hours(24 * 30));
  if (!server_cert) return server_cert.error().with_context("server certificate");
  net::TlsServerOptions tls;
  tls.cert_chain_pem = server_cert->certificate_pem;
  tls.key_pem = server_cert->private_key_pem;

  net::HttpsServerOptions ao;
  ao.listen = cfg_.agents_listen;
  ao.tls = tls;
  ao.tls.client_ca_pem = ca_->certificate_pem();
  ao.ws_idle_timeout = cfg_.agents_idle_timeout;
  // Beast's own limit is the hard ceiling (a frame above it closes the
  // connection with 1009); the protocol's 64 KiB cap per type is enforced by
  // proto::parse, which rejects the frame with an error and keeps the session.
  ao.ws_max_frame = proto::kMaxPlanFrameBytes;
  ao.name = "agents";
  net_->agents = std::make_unique<net::HttpsServer>(net_->ioc, ao);
  net_->agents->on_websocket(
      [this](const net::HttpRequestIn& req, const net::PeerInfo& peer) { return agents_->accept(req, peer); });
  net_->agents->on_http([this](const net::HttpRequestIn& req, const net::PeerInfo&) {
    if (req.method == "GET" && req.path == "/healthz") return json_ok({{"status", "ok"}});
    if (req.method == "GET" && req.path == "/v1/agent/binary") {
      if (agent_sha256_.empty())
        return net::HttpResponseOut::error(404, "not_found",
                                           "the coordinator has no agent binary (agents.binary)");
      net::HttpResponseOut out;
      out.content_type = "application/octet-stream";
      out.file_path = agent_binary_;
      out.headers["X-Factory-Agent-Sha256"] = agent_sha256_;
      return out;
    }
    return net::HttpResponseOut::error(404, "not_found", "no such path: " + req.path);
  });

  net::HttpsServerOptions po;
  po.listen = cfg_.api_listen;
  po.tls = tls;
  po.name = "api";
  net_->api = std::make_unique<net::HttpsServer>(net_->ioc, po);
  net_->api->on_http(
      [this](const net::HttpRequestIn& req, const net::PeerInfo& peer) { return router_->handle(req, peer); });

  if (auto st = net_->agents->start(); !st.ok()) return st.error().with_context("agents endpoint");
  if (auto st = net_->api->start(); !st.ok()) return st.error().with_context("api endpoint");
  spdlog::info("agents endpoint on {} (agents dial {}), API on {}; CA sha256 {}",
               cfg_.agents_listen, cfg_.external_url, cfg_.api_listen, ca_->sha256());
  return {};
}

void Coordinator::run() {
  net_->signals = std::make_unique<boost::asio::signal_set>(net_->ioc, SIGINT, SIGTERM);
  net_->signals->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    stop();
  });
  net_->ioc.run();
}

void Coordinator::stop() {
  if (net_->agents) net_->agents->stop();
  if (net_->api) net_->api->stop();
  net_->ioc.stop();
}

int Coordinator::agents_port() const { return net_->agents ? net_->agents->port() : 0; }
int Coordinator::api_port() const { return net_->api ? net_->api->port() : 0; }

}  // namespace factory::coordinator
