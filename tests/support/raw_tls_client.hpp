#pragma once
// A TLS client that says exactly the bytes a test tells it to: for testing a
// server at the protocol level (malformed requests, half-sent frames,
// strangers that never finish, a client certificate of the test's making),
// which no well-behaved client library would do. Blocking, with deadlines.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "common/net/ws_codec.hpp"

namespace factory::testing {

struct RawTlsOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string ca_pem;             // the server must chain to it; empty: not verified
  std::string cert_pem, key_pem;  // client certificate, optional
  std::string source_address;     // bind before connecting (127.0.0.2, ...)
  std::chrono::milliseconds timeout{5000};
};

// A frame as the server sent it (unmasked).
struct ServerFrame {
  net::ws::Opcode op = net::ws::Opcode::text;
  bool fin = true;
  std::string payload;  // for close: the reason
  std::uint16_t close_code = 0;
};

class RawTlsClient {
 public:
  static Result<std::unique_ptr<RawTlsClient>> connect(const RawTlsOptions& o);
  ~RawTlsClient();
  RawTlsClient(const RawTlsClient&) = delete;
  RawTlsClient& operator=(const RawTlsClient&) = delete;

  Status write(std::string_view bytes);
  // Whatever arrives within the timeout (at least one byte), or an error:
  // unavailable at EOF or reset, timeout when nothing came.
  Result<std::string> read_some(std::chrono::milliseconds timeout);
  // Everything up to and including marker (the rest is kept for later reads).
  Result<std::string> read_until(std::string_view marker, std::chrono::milliseconds timeout);
  // True when the server closed the connection within the timeout (what
  // arrives before is read and thrown away).
  bool wait_closed(std::chrono::milliseconds timeout);

  // Websocket on top: the upgrade (true on 101), masked frames out, frames in.
  Result<std::string> ws_upgrade(const std::string& path, const std::string& extra_headers = "");
  Status ws_send(net::ws::Opcode op, std::string_view payload, bool fin = true);
  Status ws_send_text(std::string_view text) { return ws_send(net::ws::Opcode::text, text); }
  Result<ServerFrame> ws_read(std::chrono::milliseconds timeout);

  bool resumed() const;
  // The socket, for a test that polls many connections at once.
  int fd() const { return fd_; }
  // A TLS session to resume with on the next connect (RawTlsOptions has no
  // field for it: tests of resumption use connect_resuming).
  std::string session_der() const;
  static Result<std::unique_ptr<RawTlsClient>> connect_resuming(const RawTlsOptions& o,
                                                                const std::string& session_der);

 private:
  RawTlsClient() = default;
  Result<std::string> take_buffered(std::size_t n);
  int fd_ = -1;
  void* ctx_ = nullptr;  // SSL_CTX*
  void* ssl_ = nullptr;  // SSL*
  std::string buffer_;
};

}  // namespace factory::testing
