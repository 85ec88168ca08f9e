#pragma once
// A reader of the coordinator's status feed (GET /v1/events, Server-Sent
// Events) for integration tests: the stream read on a thread of its own, its
// events parsed, waited for by type and field.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.hpp"
#include "tests/support/coordinator_harness.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {

struct Sse {
  std::string id, type;
  nlohmann::json data;
};

inline std::vector<Sse> parse_sse(const std::string& text) {
  std::vector<Sse> out;
  std::size_t pos = 0;
  for (std::size_t end; (end = text.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    Sse e;
    std::string data;
    std::istringstream lines(text.substr(pos, end - pos));
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind("id: ", 0) == 0) e.id = l.substr(4);
      if (l.rfind("event: ", 0) == 0) e.type = l.substr(7);
      if (l.rfind("data: ", 0) == 0) data = l.substr(6);
    }
    if (e.type.empty()) continue;  // comments, the retry line
    e.data = nlohmann::json::parse(data, nullptr, false);
    out.push_back(std::move(e));
  }
  return out;
}

// GET path as a stream, read on a thread of its own until destroyed.
class EventReader {
 public:
  EventReader(CoordinatorHarness& h, const std::string& path,
              std::map<std::string, std::string> headers) {
    const std::string ca = slurp(h.state_dir() / "ca.crt");
    const std::string url = "https://127.0.0.1:" + std::to_string(h.api_port()) + path;
    thread_ = std::thread([this, ca, url, headers] {
      factory::net::TlsClientOptions tls;
      tls.ca_pem = ca;
      factory::net::HttpClient c(tls);
      factory::net::HttpRequest req;
      req.url = url;
      req.headers = headers;
      req.timeout = std::chrono::seconds(10);
      auto r = c.stream(
          req,
          [this](std::string_view d) {
            std::lock_guard lk(mu_);
            text_.append(d);
            return !stop_.load();
          },
          [this](const factory::net::HttpResponse& head) {
            std::lock_guard lk(mu_);
            status_ = head.status;
            head_ = head.headers;
            return true;
          });
      done_ = true;
    });
  }
  ~EventReader() {
    stop_ = true;  // seen at the next heartbeat
    thread_.join();
  }
  std::string text() {
    std::lock_guard lk(mu_);
    return text_;
  }
  int status() {
    std::lock_guard lk(mu_);
    return status_;
  }
  std::vector<Sse> events() { return parse_sse(text()); }
  // The first event of `type` whose data holds `key` = `value`.
  std::optional<Sse> wait_for(const std::string& type, const std::string& key,
                              const nlohmann::json& value,
                              std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::optional<Sse> found;
    eventually(
        [&] {
          for (auto& e : events())
            if (e.type == type && e.data.is_object() && e.data.contains(key) &&
                e.data[key] == value) {
              found = e;
              return true;
            }
          return false;
        },
        timeout);
    return found;
  }
  bool done() const { return done_; }

 private:
  std::mutex mu_;
  std::string text_;
  int status_ = 0;
  std::map<std::string, std::string> head_;
  std::atomic<bool> stop_{false}, done_{false};
  std::thread thread_;
};

}  // namespace factory::testing
