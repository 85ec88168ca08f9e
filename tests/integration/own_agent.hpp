#pragma once
// A client of our own that speaks the agent protocol with exactly the frames
// a test gives it: what a customer with root in its VM can do with the
// agent's key, or a stranger on the agent port without one. It enrolls with
// a real bootstrap token, then connects with the certificate it got.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/pki.hpp"
#include "contract/protocol.hpp"
#include "tests/support/coordinator_harness.hpp"
#include "tests/support/raw_tls_client.hpp"

namespace factory::testing {

inline std::string agent_frame(const std::string& type, uint64_t seq, const nlohmann::json& body) {
  proto::Envelope e;
  e.type = type;
  e.seq = seq;
  e.body = body;
  return proto::serialize(e);
}

class OwnAgent {
 public:
  // Enrolls as `tenant` with a fresh token; enroll_body's fields are added
  // to the enroll frame (a hostile hostname, say).
  OwnAgent(CoordinatorHarness& h, const std::string& tenant,
           const nlohmann::json& enroll_body = nlohmann::json::object())
      : h_(h), tenant_(tenant) {
    ca_ = slurp(h.state_dir() / "ca.crt");
    auto token = h.create_token(tenant);
    auto key = pki::generate_private_key();
    EXPECT_TRUE(key.ok());
    key_ = key.ok() ? *key : "";
    auto csr = pki::make_csr(key_, tenant);
    EXPECT_TRUE(csr.ok());
    auto c = stranger();
    if (!c) return;
    nlohmann::json body = enroll_body;
    body["token"] = token.value("token", "");
    body["csr"] = csr.ok() ? *csr : "";
    EXPECT_TRUE(c->ws_send_text(agent_frame("enroll", 1, body)).ok());
    auto enrolled = read_type(*c, "enrolled");
    EXPECT_TRUE(enrolled) << "enrollment of " << tenant << " failed";
    if (enrolled) cert_ = (*enrolled)["body"].value("certificate", "");
  }

  bool enrolled() const { return !cert_.empty(); }

  // A connection without a certificate, upgraded to the agent path.
  std::unique_ptr<RawTlsClient> stranger(const std::string& source_address = "") const {
    RawTlsOptions o;
    o.port = h_.agents_port();
    o.ca_pem = ca_;
    o.source_address = source_address;
    auto c = RawTlsClient::connect(o);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    if (!c.ok()) return nullptr;
    auto up = (*c)->ws_upgrade(std::string(proto::kAgentPath));
    EXPECT_TRUE(up.ok()) << (up.ok() ? "" : up.error().message);
    return up.ok() ? std::move(*c) : nullptr;
  }

  // Connects with the certificate and says hello (with these fields);
  // nullptr unless welcomed.
  std::unique_ptr<RawTlsClient> session(const nlohmann::json& hello = nlohmann::json::object()) {
    RawTlsOptions o;
    o.port = h_.agents_port();
    o.ca_pem = ca_;
    o.cert_pem = cert_;
    o.key_pem = key_;
    auto c = RawTlsClient::connect(o);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    if (!c.ok()) return nullptr;
    if (!(*c)->ws_upgrade(std::string(proto::kAgentPath)).ok()) return nullptr;
    seq_ = 0;
    if (!(*c)->ws_send_text(agent_frame("hello", ++seq_, hello)).ok()) return nullptr;
    last_ = read_type(**c, "welcome");
    if (!last_) return nullptr;
    return std::move(*c);
  }

  // Sends one frame of the session.
  bool send(RawTlsClient& c, const std::string& type, const nlohmann::json& body) {
    return c.ws_send_text(agent_frame(type, ++seq_, body)).ok();
  }

  // Frames until one of `type` (or an error frame, or the close); every
  // frame read is kept in seen().
  std::optional<nlohmann::json> read_type(
      RawTlsClient& c, const std::string& type,
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      auto f = c.ws_read(std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now()));
      if (!f.ok()) return std::nullopt;
      if (f->op == net::ws::Opcode::close) {
        closed_ = f->payload;
        return std::nullopt;
      }
      if (f->op != net::ws::Opcode::text) continue;
      auto j = nlohmann::json::parse(f->payload, nullptr, false);
      if (j.is_discarded()) continue;
      seen_.push_back(j);
      if (j.value("type", "") == type) return j;
    }
    return std::nullopt;
  }

  // Reads until `timeout` passes with nothing arriving (or the close).
  void drain(RawTlsClient& c, std::chrono::milliseconds quiet = std::chrono::milliseconds(800)) {
    while (read_type(c, "\x01never", quiet)) {
    }
  }

  const std::vector<nlohmann::json>& seen() const { return seen_; }
  const std::string& close_reason() const { return closed_; }
  // Error frames seen, as "code: message".
  std::vector<std::string> errors() const {
    std::vector<std::string> out;
    for (const auto& j : seen_)
      if (j.value("type", "") == "error")
        out.push_back(j["body"].value("code", "") + ": " + j["body"].value("message", ""));
    return out;
  }
  std::set<uint64_t> acked_events() const {
    std::set<uint64_t> out;
    for (const auto& j : seen_)
      if (j.value("type", "") == "ack" && j["body"].contains("event_id"))
        out.insert(j["body"]["event_id"].get<uint64_t>());
    return out;
  }

 private:
  CoordinatorHarness& h_;
  std::string tenant_, ca_, key_, cert_;
  uint64_t seq_ = 0;
  std::optional<nlohmann::json> last_;
  std::vector<nlohmann::json> seen_;
  std::string closed_;
};

// Bytes a terminal would act on: C0 controls but the newline, DEL, C1
// controls (UTF-8 C2 80-9F) and the bidi controls. Empty when there are none,
// else where the first one is, with its neighbourhood.
inline std::string control_characters_in(const std::string& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    bool bad = (c < 0x20 && c != '\n') || c == 0x7F;
    if (c == 0xC2 && i + 1 < s.size()) {
      auto d = static_cast<unsigned char>(s[i + 1]);
      bad = d >= 0x80 && d <= 0x9F;
    }
    if (c == 0xE2 && i + 2 < s.size()) {
      auto d = static_cast<unsigned char>(s[i + 1]), e = static_cast<unsigned char>(s[i + 2]);
      bad = (d == 0x80 && e >= 0xAA && e <= 0xAE) || (d == 0x81 && e >= 0xA6 && e <= 0xA9);
    }
    if (bad) {
      std::size_t from = i < 40 ? 0 : i - 40;
      nlohmann::json around = std::string(s.substr(from, 80));
      return "byte " + std::to_string(c) + " at " + std::to_string(i) + ": " +
             around.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  return "";
}

}  // namespace factory::testing
