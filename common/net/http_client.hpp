#pragma once
// A small synchronous HTTP/1.1 client over Beast, for http:// and https://
// URLs: the admin CLI talking to the coordinator, the Kubernetes client, the
// agent talking to Ollama on loopback. One connection per request unless the
// caller keeps the client; TLS verifies the peer and the host name unless told
// otherwise. IPv6 literals ([::1]) work.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::net {

struct TlsClientOptions {
  std::string ca_pem;                 // trust only these CAs (empty: system store)
  bool insecure_skip_verify = false;  // kubeconfig's insecure-skip-tls-verify
  std::string client_cert_pem;        // mTLS
  std::string client_key_pem;
  std::string server_name;  // override SNI / verified host name
};

// Ends a request under way from another thread (a proxy whose own client
// hung up): whatever the request waits for (the connection, the answer's
// head, more of its body) ends at once, and request() or stream() returns
// Errc::unavailable "<origin>: cancelled". cancel() is thread-safe and may
// come before, during or after the request.
class HttpCancel {
 public:
  void cancel();
  bool cancelled() const;
  // For HttpClient: while a request runs, what cancel() calls to stop it
  // (on the canceller's thread). False when cancel() came first.
  bool arm(std::function<void()> stop);
  void disarm();

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> stop_;
};

struct HttpRequest {
  std::string method = "GET";
  std::string url;                             // http(s)://host[:port]/path?query
  std::map<std::string, std::string> headers;  // e.g. Authorization, Content-Type
  std::string body;
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // stream() only: each wait for more of the body once the head is in
  // (zero: timeout, which then bounds both).
  std::chrono::milliseconds idle_timeout{0};
  std::shared_ptr<HttpCancel> cancel;  // optional
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // keys lower-case
  std::string body;
};

class HttpClient {
 public:
  explicit HttpClient(TlsClientOptions tls = {});
  // Errors: unavailable (connect refused / DNS, cancelled, or this process
  // out of descriptors: never thrown), timeout, protocol, and
  // unauthenticated for a TLS verification failure. Messages start with the
  // origin ("https://127.0.0.1:6443: connection refused"). Bodies over 64 MiB
  // are refused (protocol). HTTP error statuses are
  // NOT errors: the caller reads status.
  Result<HttpResponse> request(const HttpRequest& req);
  // Streams the body as it arrives (watch streams, progress). on_data returns
  // false to stop early. Returns the HTTP status. on_head, if given, sees the
  // status and headers before any body (so a caller can collect an error
  // body instead of parsing it as stream data); returning false stops there.
  // req.timeout bounds the connect, handshake and headers (the first byte
  // of the answer), then req.idle_timeout (or timeout) each wait for more
  // body, since a stream may run indefinitely.
  // A stream cut before its end (chunked body unfinished) is unavailable.
  Result<int> stream(const HttpRequest& req,
                     const std::function<bool(std::string_view chunk)>& on_data,
                     const std::function<bool(const HttpResponse& head)>& on_head = nullptr);

 private:
  TlsClientOptions tls_;
};

}  // namespace factory::net
