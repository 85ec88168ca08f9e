#include "agent/guest/ollama_api.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/net/http_client.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

std::string strip_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// {"error":"..."} bodies become the error text; anything else is quoted short.
std::string error_text(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"];
  std::string b = body.substr(0, 200);
  while (!b.empty() && (b.back() == '\n' || b.back() == '\r')) b.pop_back();
  return b;
}

Result<json> get_json(const std::string& url, std::chrono::milliseconds timeout) {
  net::HttpClient client;
  net::HttpRequest req;
  req.method = "GET";
  req.url = url;
  req.timeout = timeout;
  auto r = client.request(req);
  if (!r) return r.error();
  if (r->status != 200)
    return Error(Errc::unavailable,
                 url + ": HTTP " + std::to_string(r->status) + ": " + error_text(r->body));
  auto j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Error(Errc::protocol, url + ": the answer is not a JSON object");
  return j;
}

std::uint64_t u64(const json& j, const char* key) {
  if (!j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer())
    return static_cast<std::uint64_t>(std::max<std::int64_t>(0, v.get<std::int64_t>()));
  if (v.is_number_float()) {
    // 1e61 bytes is no size; casting it to an integer is undefined (UBSan
    // found it in a pull's progress line, under the ollama_json target).
    const double d = v.get<double>();
    if (!(d > 0)) return 0;
    if (d >= 18446744073709551615.0) return UINT64_MAX;
    return static_cast<std::uint64_t>(d);
  }
  return 0;
}

std::string str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

}  // namespace

int OllamaRunningModel::gpu_percent() const {
  // `ollama ps`: cpu% = round((size - size_vram) / size * 100), gpu% = 100 - cpu%.
  if (size == 0) return 0;
  std::uint64_t on_cpu = size - std::min(size, size_vram);
  int cpu = static_cast<int>(
      std::lround(100.0 * static_cast<double>(on_cpu) / static_cast<double>(size)));
  return 100 - cpu;
}

void PullProgress::add(const PullEvent& e) {
  if (e.digest.empty() || e.total == 0) return;
  auto& l = layers_[e.digest];
  l.first = std::max(l.first, std::min(e.completed, e.total));
  l.second = e.total;
}

std::uint64_t PullProgress::completed() const {
  std::uint64_t c = 0;
  for (auto& [d, l] : layers_) c += l.first;
  return c;
}

std::uint64_t PullProgress::total() const {
  std::uint64_t t = 0;
  for (auto& [d, l] : layers_) t += l.second;
  return t;
}

int PullProgress::percent() const {
  std::uint64_t t = total();
  if (t == 0) return 0;
  return static_cast<int>(100.0 * static_cast<double>(completed()) / static_cast<double>(t));
}

Result<std::string> OllamaApi::version(std::chrono::milliseconds timeout) {
  auto j = get_json(strip_slash(base_) + "/api/version", timeout);
  if (!j) return j.error();
  std::string v = str(*j, "version");
  if (v.empty()) return Error(Errc::protocol, base_ + "/api/version: no version in the answer");
  return v;
}

namespace {

std::vector<OllamaModel> tags_from(const json& j) {
  std::vector<OllamaModel> out;
  if (j.contains("models") && j["models"].is_array()) {
    for (const auto& m : j["models"]) {
      OllamaModel om;
      om.name = str(m, "name");
      if (om.name.empty()) om.name = str(m, "model");
      om.size = u64(m, "size");
      om.digest = str(m, "digest");
      out.push_back(std::move(om));
    }
  }
  return out;
}

std::vector<OllamaRunningModel> ps_from(const json& j) {
  std::vector<OllamaRunningModel> out;
  if (j.contains("models") && j["models"].is_array()) {
    for (const auto& m : j["models"]) {
      OllamaRunningModel rm;
      rm.name = str(m, "name");
      if (rm.name.empty()) rm.name = str(m, "model");
      rm.size = u64(m, "size");
      rm.size_vram = u64(m, "size_vram");
      if (m.contains("context_length") && m["context_length"].is_number_integer())
        rm.context_length = m["context_length"].get<std::int64_t>();
      rm.expires_at = str(m, "expires_at");
      out.push_back(std::move(rm));
    }
  }
  return out;
}

Result<json> object_body(const std::string& body, const char* what) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Error(Errc::protocol, std::string(what) + ": the answer is not a JSON object");
  return j;
}

}  // namespace

Result<std::vector<OllamaModel>> parse_tags(const std::string& body) {
  auto j = object_body(body, "/api/tags");
  if (!j) return j.error();
  return tags_from(*j);
}

Result<std::vector<OllamaRunningModel>> parse_ps(const std::string& body) {
  auto j = object_body(body, "/api/ps");
  if (!j) return j.error();
  return ps_from(*j);
}

Result<std::optional<PullEvent>> parse_pull_line(const std::string& line) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return std::optional<PullEvent>{};
  auto j = json::parse(line, nullptr, false);
  if (!j.is_object()) return Error(Errc::protocol, "not JSON: " + line.substr(0, 120));
  if (j.contains("error"))
    return Error(Errc::failed_precondition,
                 j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump());
  PullEvent e;
  e.status = str(j, "status");
  e.digest = str(j, "digest");
  e.total = u64(j, "total");
  e.completed = u64(j, "completed");
  return std::optional<PullEvent>{std::move(e)};
}

Result<std::vector<OllamaModel>> OllamaApi::tags(std::chrono::milliseconds timeout) {
  auto j = get_json(strip_slash(base_) + "/api/tags", timeout);
  if (!j) return j.error();
  return tags_from(*j);
}

Result<std::vector<OllamaRunningModel>> OllamaApi::ps(std::chrono::milliseconds timeout) {
  auto j = get_json(strip_slash(base_) + "/api/ps", timeout);
  if (!j) return j.error();
  return ps_from(*j);
}

Status OllamaApi::pull(const std::string& model,
                       const std::function<void(const PullEvent&)>& on_event,
                       std::chrono::milliseconds idle_timeout, PullFailure* failure) {
  PullFailure local;
  PullFailure& f = failure ? *failure : local;
  net::HttpClient client;
  net::HttpRequest req;
  req.method = "POST";
  req.url = strip_slash(base_) + "/api/pull";
  req.headers["Content-Type"] = "application/json";
  req.body = json{{"model", model}, {"stream", true}}.dump();
  req.timeout = idle_timeout;

  int status = 0;
  std::string pending;     // a partial NDJSON line between chunks
  std::string error_body;  // the body of an HTTP error
  PullProgress progress;
  bool success = false;

  auto handle_line = [&](const std::string& line) -> bool {
    auto parsed = parse_pull_line(line);
    if (!parsed) {
      f.server_error = parsed.error().message;
      return false;
    }
    if (!*parsed) return true;  // a blank line
    const PullEvent& e = **parsed;
    progress.add(e);
    f.last_status = e.status;
    f.percent = progress.percent();
    if (e.status == "success") success = true;
    if (on_event) on_event(e);
    return true;
  };

  auto r = client.stream(
      req,
      [&](std::string_view chunk) {
        if (status >= 400) {
          error_body.append(chunk);
          return error_body.size() < 64 * 1024;
        }
        pending.append(chunk);
        size_t nl;
        while ((nl = pending.find('\n')) != std::string::npos) {
          std::string line = pending.substr(0, nl);
          pending.erase(0, nl + 1);
          if (!handle_line(line)) return false;
        }
        return true;
      },
      [&](const net::HttpResponse& head) {
        status = head.status;
        f.http_status = head.status;
        return true;
      });
  if (!pending.empty() && f.server_error.empty()) handle_line(pending);

  if (status >= 400) {
    f.server_error = error_text(error_body);
    return Error(Errc::failed_precondition,
                 "pull " + model + ": HTTP " + std::to_string(status) + ": " + f.server_error);
  }
  if (!f.server_error.empty())
    return Error(Errc::failed_precondition, "pull " + model + ": " + f.server_error);
  if (!r) {
    f.interrupted = true;
    f.server_error = r.error().message;
    return Error(r.error().code, "pull " + model + ": " + r.error().message);
  }
  if (!success) {
    f.interrupted = true;
    f.server_error = "the stream ended at " + std::to_string(f.percent) + "% without \"success\"" +
                     (f.last_status.empty() ? "" : " (last: " + f.last_status + ")");
    return Error(Errc::unavailable, "pull " + model + ": " + f.server_error);
  }
  return ok_status();
}

Status OllamaApi::load(const std::string& model, const std::string& keep_alive,
                       std::chrono::milliseconds timeout) {
  net::HttpClient client;
  net::HttpRequest req;
  req.method = "POST";
  req.url = strip_slash(base_) + "/api/generate";
  req.headers["Content-Type"] = "application/json";
  // No prompt: Ollama only loads the model. stream=false: one JSON answer.
  req.body = json{{"model", model}, {"keep_alive", keep_alive}, {"stream", false}}.dump();
  req.timeout = timeout;
  auto r = client.request(req);
  if (!r) return r.error().with_context("load " + model);
  if (r->status != 200)
    return Error(
        r->status == 404 ? Errc::not_found : Errc::failed_precondition,
        "load " + model + ": HTTP " + std::to_string(r->status) + ": " + error_text(r->body));
  return ok_status();
}

std::string normalize_model_name(const std::string& name) {
  auto slash = name.rfind('/');
  auto colon = name.rfind(':');
  if (colon == std::string::npos || (slash != std::string::npos && colon < slash))
    return name + ":latest";
  return name;
}

bool same_model(const std::string& a, const std::string& b) {
  return normalize_model_name(a) == normalize_model_name(b);
}

}  // namespace factory::agent
