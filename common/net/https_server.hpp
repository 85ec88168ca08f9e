#pragma once
// An HTTPS server on one listening address that answers plain requests and
// upgrades to websockets. One session per connection, each a coroutine on the
// server's io_context; the handlers below run on that same thread, so they
// need no locks. Beast types stay inside https_server.cpp.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "common/net/tls.hpp"

namespace boost::asio {
class io_context;
}

namespace factory::net {

// What the TLS handshake proved about the peer.
struct PeerInfo {
  std::string remote;          // "127.0.0.1:53422"
  bool has_client_cert = false;
  std::string subject_cn;      // from the verified client certificate
  std::string subject_o;
  std::string serial_hex;
  int64_t not_after_unix = 0;
};

struct HttpRequestIn {
  std::string method;
  std::string target;  // path + query
  std::string path;    // without the query
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // lower-case keys
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

struct HttpResponseOut {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;
  // For a large static body (the agent binary): served from this file instead of body.
  std::string file_path;

  static HttpResponseOut json(int status, const std::string& body) {
    HttpResponseOut r;
    r.status = status;
    r.body = body;
    return r;
  }
  // {"error":{"code":..., "message":...}}
  static HttpResponseOut error(int status, const std::string& code, const std::string& message);
};

// One websocket connection as the application sees it.
class WsConnection {
 public:
  virtual ~WsConnection() = default;
  // Queues a text frame. False when the send queue is full (the caller decides
  // whether that peer is too slow and should be dropped) or the connection closed.
  virtual bool send(std::string text) = 0;
  virtual void close(std::string_view reason) = 0;
  virtual const PeerInfo& peer() const = 0;
};

class WsHandler {
 public:
  virtual ~WsHandler() = default;
  virtual void on_open(std::shared_ptr<WsConnection> conn) = 0;
  virtual void on_message(std::string_view text) = 0;
  // Exactly once, whatever ended the connection.
  virtual void on_close(std::string_view reason) = 0;
};

struct HttpsServerOptions {
  std::string listen = "127.0.0.1:8443";  // host:port, [v6]:port; port 0 = any
  TlsServerOptions tls;
  std::chrono::seconds handshake_timeout{10};
  std::chrono::seconds request_timeout{30};
  std::chrono::seconds ws_idle_timeout{60};  // ping sent at half; closed if no pong
  size_t ws_max_frame = 64 * 1024;
  size_t ws_send_queue_limit = 1024;
  size_t max_request_body = 1 << 20;
  size_t max_connections = 10000;
  std::string name = "https";  // for logs
};

using HttpHandler = std::function<HttpResponseOut(const HttpRequestIn&, const PeerInfo&)>;
// Returns nullptr to refuse the upgrade (404).
using WsAcceptor =
    std::function<std::shared_ptr<WsHandler>(const HttpRequestIn&, const PeerInfo&)>;
class HttpsServer {
 public:
  HttpsServer(boost::asio::io_context& ioc, HttpsServerOptions opts);
  ~HttpsServer();
  HttpsServer(const HttpsServer&) = delete;
  HttpsServer& operator=(const HttpsServer&) = delete;

  void on_http(HttpHandler h);
  void on_websocket(WsAcceptor a);
  // Binds and starts accepting. Errors: address in use, bad address, TLS setup.
  Status start();
  void stop();
  int port() const;
  size_t connections() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Splits "host:port" / "[::1]:port".
Result<std::pair<std::string, uint16_t>> split_host_port(std::string_view hostport);

}  // namespace factory::net
