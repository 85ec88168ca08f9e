#pragma once
// What a tier with a model endpoint adds to the agent (docs/model-endpoint.md):
// the authenticating proxy (agent/endpoint/proxy.hpp) configured from the
// plan's "endpoint" section, its credentials obtained over the link (an
// `endpoint_csr` request answered by an `endpoint` frame) and kept by the
// proxy, and the health probe of the plan's health.probe, on any tier.
//
// Threads: on_plan and on_endpoint come from the link's and the runtime's
// threads; health() from health's. All take mu_. The probe runs on a thread
// of its own and never holds mu_ while it waits on Ollama.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "agent/endpoint/proxy.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

struct ModelEndpointOptions {
  std::filesystem::path state_dir;  // the proxy's files go to <state_dir>/endpoint
  std::string ollama_url = "http://127.0.0.1:11434";
  // "" = 0.0.0.0:<the plan's port>; the guest simulator sets where its
  // stand-in for the NodePort forwards (127.0.0.1:<node port>).
  std::string listen;
  // The proxy's limits (endpoint::ProxyOptions says what each bounds).
  std::size_t max_connections = endpoint::ProxyOptions{}.max_connections;
  std::size_t max_connections_per_address = endpoint::ProxyOptions{}.max_connections_per_address;
  std::chrono::milliseconds first_byte_timeout =
      endpoint::ProxyOptions{}.upstream_first_byte_timeout;
  // Asked for a new certificate when less than this is left of it.
  std::chrono::seconds renew_before{std::chrono::hours(24 * 10)};
  // How often the keys' usage is reported (endpoint_usage events), at most;
  // and once more at stop.
  std::chrono::milliseconds usage_every{std::chrono::seconds(60)};
};

class ModelEndpoint {
 public:
  // request(type, body): offer a frame to the link until withdraw(type).
  using Request = std::function<void(const std::string& type, nlohmann::json body)>;
  using Withdraw = std::function<void(const std::string& type)>;
  // A durable event (the spool): how the keys' usage is reported.
  using Emit = std::function<void(nlohmann::json event)>;

  explicit ModelEndpoint(ModelEndpointOptions opts);
  ~ModelEndpoint();
  ModelEndpoint(const ModelEndpoint&) = delete;
  ModelEndpoint& operator=(const ModelEndpoint&) = delete;

  void set_link(Request request, Withdraw withdraw);
  void set_emit(Emit emit);
  // The session with the coordinator ended: named keys stop serving 3 s
  // later, until its next endpoint frame (agent/endpoint/named_keys.hpp).
  void on_link_lost();
  // A plan (its "endpoint" and "health.probe" sections): starts what it asks
  // for. The proxy serves from saved credentials at once, before the
  // coordinator answers; it asks for a certificate when it has none or its
  // own is near its end.
  void on_plan(const nlohmann::json& plan);
  // The coordinator's `endpoint` frame.
  void on_endpoint(const nlohmann::json& body);
  // For health: nullopt when the plan has neither an endpoint nor a probe.
  std::optional<proto::EndpointSection> health() const;
  void stop();

 private:
  void ask_for_certificate();  // mu_ held
  void probe_loop();
  void usage_loop();
  void report_usage();  // mu_ held

  ModelEndpointOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Request request_;
  Withdraw withdraw_;
  std::unique_ptr<endpoint::Proxy> proxy_;
  int port_ = 0;
  std::string pending_key_;  // the key of the CSR asked for
  std::string key_sha256_;   // the latest hash the coordinator sent
  Emit emit_;
  // The latest named keys the coordinator sent, for a proxy made after them;
  // whether the link dropped since.
  std::vector<endpoint::NamedKey> named_keys_;
  bool link_lost_ = false;
  std::thread usage_thread_;
  // health.probe
  std::chrono::seconds probe_every_{0};
  std::string probe_model_, probe_prompt_;
  std::optional<proto::ProbeSample> last_probe_;
  bool ever_ok_ = false;
  bool stopping_ = false;
  std::thread probe_thread_;
};

}  // namespace factory::agent
