#include "coordinator/cli/admin_client.hpp"

#include <filesystem>
#include <iostream>

#include "common/atomic_file.hpp"
#include "common/net/http_client.hpp"
#include "coordinator/server/coordinator.hpp"

namespace factory::cli {
namespace fs = std::filesystem;

Result<AdminClient> AdminClient::from(const GlobalOptions& g) {
  auto cfg = load_config(g);
  if (!cfg) return cfg.error();
  AdminClient c;
  c.cfg_ = *cfg;
  c.base_ = g.server.empty() ? cfg->api_url() : g.server;
  while (!c.base_.empty() && c.base_.back() == '/') c.base_.pop_back();
  fs::path token_file = g.token_file.empty()
                            ? fs::path(cfg->state_dir) / coordinator::kAdminTokenFile
                            : fs::path(g.token_file);
  auto tok = read_file(token_file);
  // read_file's message names the file ("read <path>: <why>"): said once.
  if (!tok)
    return Error(tok.error().code, "admin token: " + tok.error().message +
                                       "; run as the coordinator's user, or pass --token-file");
  c.token_ = *tok;
  while (!c.token_.empty() && (c.token_.back() == '\n' || c.token_.back() == '\r'))
    c.token_.pop_back();
  auto ca = read_file(fs::path(cfg->state_dir) / "ca.crt");
  if (!ca)
    return Error(ca.error().code, "coordinator CA: " + ca.error().message +
                                      "; has `factory serve` run with this config?");
  c.ca_pem_ = *ca;
  return c;
}

Result<nlohmann::json> AdminClient::call(const std::string& method, const std::string& path,
                                         const nlohmann::json& body) const {
  net::TlsClientOptions tls;
  tls.ca_pem = ca_pem_;
  net::HttpClient http(tls);
  net::HttpRequest req;
  req.method = method;
  req.url = base_ + path;
  req.headers["Authorization"] = "Bearer " + token_;
  req.headers["Accept"] = "application/json";
  if (!body.is_null()) {
    req.body = body.dump();
    req.headers["Content-Type"] = "application/json";
  }
  req.timeout = std::chrono::seconds(30);
  auto res = http.request(req);
  if (!res) {
    Error e = res.error();
    // The HTTP client's message starts with the URL it dialled.
    if (e.code == Errc::unavailable || e.code == Errc::timeout)
      e.message = "cannot reach the coordinator API at " + e.message +
                  " (is `factory serve` running with this config?)";
    return e;
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status / 100 != 2) {
    std::string msg = "HTTP " + std::to_string(res->status);
    if (!j.is_discarded() && j.contains("error")) msg = j["error"].value("message", msg);
    Errc code = res->status == 401       ? Errc::unauthenticated
                : res->status == 403     ? Errc::permission_denied
                : res->status == 404     ? Errc::not_found
                : res->status == 409     ? Errc::conflict
                : res->status / 100 == 4 ? Errc::invalid_argument
                                         : Errc::unavailable;
    return Error(code, msg);
  }
  if (j.is_discarded()) return Error(Errc::protocol, "the coordinator answered with invalid JSON");
  return j;
}

Result<nlohmann::json> call_coordinator(const GlobalOptions& g, const std::string& method,
                                        const std::string& path, const nlohmann::json& body) {
  auto client = AdminClient::from(g);
  if (!client) return client.error();
  return client->call(method, path, body);
}

int list_from_coordinator(const GlobalOptions& g, const std::string& path, OutputFormat out,
                          const std::function<void(const nlohmann::json&)>& print_table_of) {
  auto res = call_coordinator(g, "GET", path);
  if (!res) return fail(res.error());
  if (!print_document(std::cout, out, *res)) print_table_of(*res);
  return 0;
}

}  // namespace factory::cli
