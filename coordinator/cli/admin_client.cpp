#include "coordinator/cli/admin_client.hpp"

#include <filesystem>
#include <iostream>

#include "common/atomic_file.hpp"
#include "common/net/http_client.hpp"
#include "common/net/url.hpp"
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

Status AdminClient::follow(const std::string& path, const std::string& last_event_id,
                           const std::function<void()>& on_open,
                           const std::function<bool(const ServerEvent&)>& on_event) const {
  net::TlsClientOptions tls;
  tls.ca_pem = ca_pem_;
  net::HttpClient http(tls);
  net::HttpRequest req;
  req.url = base_ + path;
  req.headers["Authorization"] = "Bearer " + token_;
  req.headers["Accept"] = "text/event-stream";
  if (!last_event_id.empty()) req.headers["Last-Event-ID"] = last_event_id;
  // An idle limit: the coordinator sends a heartbeat every api.events_heartbeat.
  req.timeout = std::chrono::seconds(90);
  int status = 0;
  std::string error_body, buf;
  ServerEvent ev;
  bool stopped = false;
  auto res = http.stream(
      req,
      [&](std::string_view chunk) {
        if (status != 200) {
          error_body.append(chunk);
          return error_body.size() < 64 * 1024;
        }
        buf.append(chunk);
        for (std::size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
          std::string line = buf.substr(0, nl);
          buf.erase(0, nl + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.empty()) {
            // A blank line ends an event (one without data is not dispatched).
            if (!ev.data.empty() || !ev.type.empty())
              if (!on_event(ev)) {
                stopped = true;
                return false;
              }
            ev.type.clear();
            ev.data.clear();
            continue;
          }
          if (line[0] == ':') continue;
          auto colon = line.find(':');
          std::string field = line.substr(0, colon), value;
          if (colon != std::string::npos) {
            value = line.substr(colon + 1);
            if (!value.empty() && value[0] == ' ') value.erase(0, 1);
          }
          if (field == "id")
            ev.id = value;
          else if (field == "event")
            ev.type = value;
          else if (field == "data")
            ev.data += (ev.data.empty() ? "" : "\n") + value;
        }
        return true;
      },
      [&](const net::HttpResponse& head) {
        status = head.status;
        if (status == 200 && on_open) on_open();
        return true;
      });
  if (stopped) return {};
  if (status != 0 && status != 200) {
    auto j = nlohmann::json::parse(error_body, nullptr, false);
    std::string msg = "HTTP " + std::to_string(status);
    if (!j.is_discarded() && j.contains("error")) msg = j["error"].value("message", msg);
    return Error(status == 401   ? Errc::unauthenticated
                 : status == 403 ? Errc::permission_denied
                                 : Errc::unavailable,
                 msg);
  }
  if (!res) {
    Error e = res.error();
    if (status == 0 && (e.code == Errc::unavailable || e.code == Errc::timeout))
      e.message = "cannot reach the coordinator API at " + e.message +
                  " (is `factory serve` running with this config?)";
    return e;
  }
  return {};
}

std::string api_path(std::initializer_list<std::string_view> segments) {
  std::string path;
  for (auto s : segments) path += "/" + net::percent_encode(s);
  return path;
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
