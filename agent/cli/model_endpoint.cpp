#include "agent/cli/model_endpoint.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "common/pki.hpp"
#include "contract/endpoint_usage.hpp"
#include "contract/guest_input.hpp"
#include "contract/protocol.hpp"

namespace factory::agent {

using nlohmann::json;

ModelEndpoint::ModelEndpoint(ModelEndpointOptions opts) : opts_(std::move(opts)) {}

ModelEndpoint::~ModelEndpoint() {
  stop();
}

void ModelEndpoint::set_link(Request request, Withdraw withdraw) {
  std::lock_guard lk(mu_);
  request_ = std::move(request);
  withdraw_ = std::move(withdraw);
}

void ModelEndpoint::set_emit(Emit emit) {
  std::lock_guard lk(mu_);
  emit_ = std::move(emit);
}

void ModelEndpoint::on_link_lost() {
  std::lock_guard lk(mu_);
  link_lost_ = true;
  if (proxy_) proxy_->link_lost();
}

void ModelEndpoint::on_plan(const json& plan) {
  std::unique_lock lk(mu_);
  if (stopping_) return;
  const json probe = plan.value("/health/probe"_json_pointer, json());
  if (probe.is_object()) {
    probe_every_ = std::chrono::seconds(probe.value("every_seconds", int64_t{0}));
    probe_model_ = probe.value("model", "");
    probe_prompt_ = probe.value("prompt", "Say OK.");
    if (probe_every_.count() > 0 && !probe_model_.empty() && !probe_thread_.joinable())
      probe_thread_ = std::thread([this] { probe_loop(); });
    cv_.notify_all();
  }
  const json ep = plan.value("endpoint", json());
  if (!ep.is_object()) return;
  const int port = ep.value("port", 0);
  if (port < 1 || port > 65535) {
    spdlog::warn("endpoint: the plan's endpoint port {} is not a port; not serving", port);
    return;
  }
  if (proxy_ && port == port_) return;
  if (proxy_) proxy_->stop();
  endpoint::ProxyOptions po;
  po.listen = opts_.listen.empty() ? "0.0.0.0:" + std::to_string(port) : opts_.listen;
  po.upstream = opts_.ollama_url;
  po.state_dir = opts_.state_dir / "endpoint";
  po.max_connections = opts_.max_connections;
  po.max_connections_per_address = opts_.max_connections_per_address;
  po.upstream_first_byte_timeout = opts_.first_byte_timeout;
  proxy_ = std::make_unique<endpoint::Proxy>(po);
  proxy_->set_named_keys(named_keys_);
  if (link_lost_) proxy_->link_lost();
  if (!usage_thread_.joinable()) usage_thread_ = std::thread([this] { usage_loop(); });
  port_ = port;
  auto saved = proxy_->load_saved();
  if (!saved) spdlog::warn("endpoint: saved credentials unreadable: {}", saved.error().message);
  const bool have = saved && *saved;
  const auto left = std::chrono::seconds(proxy_->certificate_not_after()) -
                    std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch());
  if (have)
    spdlog::info("endpoint: serving on {} with the saved certificate ({} left)", po.listen,
                 format_duration(std::chrono::duration_cast<std::chrono::seconds>(left)));
  if (!have || left < opts_.renew_before) ask_for_certificate();
}

void ModelEndpoint::ask_for_certificate() {
  auto kc = endpoint::make_key_and_csr("endpoint");
  if (!kc) {
    spdlog::error("endpoint: cannot make a key and CSR: {}", kc.error().message);
    return;
  }
  pending_key_ = kc->private_key_pem;
  if (request_) request_(std::string(proto::type::kEndpointCsr), json{{"csr", kc->csr_pem}});
}

namespace {

// The frame's named keys, each checked: a key that is not whole is left
// out (and so refused), never served half.
std::vector<endpoint::NamedKey> named_keys_of(const json& body) {
  std::vector<endpoint::NamedKey> out;
  const json keys = body.value("keys", json::array());
  if (!keys.is_array()) return out;
  auto limit = [](const json& k, const char* f) -> std::optional<std::int64_t> {
    auto it = k.find(f);
    if (it == k.end() || !it->is_number_integer() || it->get<std::int64_t>() < 1)
      return std::nullopt;
    return it->get<std::int64_t>();
  };
  for (const auto& k : keys) {
    if (out.size() >= 64) break;
    if (!k.is_object()) continue;
    const std::string name = k.value("name", ""), sha = k.value("sha256", "");
    if (!proto::is_name(name) || name == endpoint::kDefaultKey || !pki::is_sha256_hex(sha)) {
      spdlog::warn("endpoint: a named key in the coordinator's frame is not whole; left out");
      continue;
    }
    out.push_back({name, sha, limit(k, "rpm"), limit(k, "tpm")});
  }
  return out;
}

}  // namespace

void ModelEndpoint::on_endpoint(const json& body) {
  std::lock_guard lk(mu_);
  if (stopping_) return;
  const std::string sha = body.value("key_sha256", "");
  if (!pki::is_sha256_hex(sha)) {
    spdlog::warn("endpoint: the coordinator's endpoint frame has no key hash; ignored");
    return;
  }
  // The named keys whole, replacing the set before: a revoked key is one
  // left out. A frame is the coordinator's word: they serve again.
  named_keys_ = named_keys_of(body);
  link_lost_ = false;
  if (!proxy_) return;
  proxy_->set_named_keys(named_keys_);
  key_sha256_ = sha;
  endpoint::Credentials c;
  c.key_sha256 = sha;
  const std::string cert = body.value("certificate", "");
  if (!cert.empty()) {
    if (pending_key_.empty() || !pki::key_matches_certificate(pending_key_, cert)) {
      spdlog::warn("endpoint: a certificate for a key this agent did not ask with; ignored");
      return;
    }
    c.certificate_pem = cert;
    c.private_key_pem = pending_key_;
  } else {
    auto saved = proxy_->saved();
    if (!saved) return;  // no certificate yet: its answer carries the hash too
    if (saved->key_sha256 == sha && proxy_->serving()) return;
    c.certificate_pem = saved->certificate_pem;
    c.private_key_pem = saved->private_key_pem;
  }
  if (auto st = proxy_->apply(c); !st.ok()) {
    spdlog::error("endpoint: cannot apply the coordinator's credentials: {}", st.error().message);
    return;
  }
  if (!cert.empty()) {
    pending_key_.clear();
    if (withdraw_) withdraw_(std::string(proto::type::kEndpointCsr));
    spdlog::info("endpoint: new certificate, serving on port {} until {}", proxy_->port(),
                 body.value("expires_at", ""));
  } else {
    spdlog::info("endpoint: API key rotated; the old key is refused from now on");
  }
}

std::optional<proto::EndpointSection> ModelEndpoint::health() const {
  std::lock_guard lk(mu_);
  if (!proxy_ && probe_every_.count() == 0) return std::nullopt;
  proto::EndpointSection s;
  if (proxy_) {
    auto st = proxy_->stats();
    s.serving = proxy_->serving();
    s.requests = st.requests;
    s.served = st.served;
    s.unauthorized = st.unauthorized;
    s.refused_paths = st.refused_paths;
    s.busy = st.busy;
    s.upstream_errors = st.upstream_errors;
    s.in_flight = st.in_flight;
    if (auto na = proxy_->certificate_not_after())
      s.certificate_expires_at = format_rfc3339(Clock::time_point(std::chrono::seconds(na)));
  }
  s.probe = last_probe_;
  return s;
}

void ModelEndpoint::probe_loop() {
  std::unique_lock lk(mu_);
  // The first probe after a short while (the model is loaded by then on a
  // ready guest).
  auto next = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!stopping_) {
    if (cv_.wait_until(lk, next, [this] { return stopping_; })) break;
    const std::string model = probe_model_, prompt = probe_prompt_, url = opts_.ollama_url;
    const auto every = probe_every_;
    lk.unlock();
    auto r = endpoint::probe(url, model, prompt, std::chrono::minutes(2));
    proto::ProbeSample p;
    p.model = model;
    p.ok = r.ok;
    if (r.ok) {
      p.ttft_ms = r.ttft_ms;
      p.total_ms = r.total_ms;
    }
    p.error = r.error;
    p.at = format_rfc3339(Clock::now());
    lk.lock();
    last_probe_ = p;
    // Until one succeeds (a guest still pulling its model), once a minute;
    // then every probe_every_.
    auto wait = every.count() > 0 ? std::chrono::duration_cast<std::chrono::seconds>(every)
                                  : std::chrono::seconds(3600);
    if (!r.ok && !ever_ok_) wait = std::min(wait, std::chrono::seconds(60));
    ever_ok_ = ever_ok_ || r.ok;
    next = std::chrono::steady_clock::now() + wait;
  }
}

void ModelEndpoint::report_usage() {
  if (!proxy_ || !emit_) return;
  for (const auto& [key, u] : proxy_->take_usage()) {
    if (u.empty()) continue;
    proto::EndpointUsageEvent e;
    e.key = key;
    e.requests = u.requests;
    e.errors = u.errors;
    e.prompt_tokens = u.prompt_tokens;
    e.completion_tokens = u.completion_tokens;
    emit_(e.to_json());
  }
}

void ModelEndpoint::usage_loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (cv_.wait_for(lk, opts_.usage_every, [this] { return stopping_; })) break;
    report_usage();
  }
}

void ModelEndpoint::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (proxy_) proxy_->stop();
    // What was counted since the last report, now that nothing more is.
    report_usage();
  }
  cv_.notify_all();
  if (probe_thread_.joinable()) probe_thread_.join();
  if (usage_thread_.joinable()) usage_thread_.join();
}

}  // namespace factory::agent
