#pragma once
// The coordinator's HTTPS + websocket server: TLS 1.3 owned directly on the
// socket (OpenSSL on the file descriptor, no Asio/Beast stream layers), HTTP/1.1
// requests parsed by Beast's parser, websockets by our own codec
// (common/net/ws_codec.hpp). Built for many idle agents: an idle connection
// holds no read or write buffer, no timer and no coroutine frame; deadlines
// are kept by one sweep per io thread.
//
// The parts, each in its own file: the io threads (io_pool), the admission
// of connections and the stranger pool (server_admission), the TLS
// connection and its output queue (tls_connection.cpp), the HTTP session
// (http_session.cpp), the websocket session that takes over at the upgrade
// (ws_session.cpp), and the one decision of how a connection ends
// (server_close).
//
// Threads: the server runs on an IoPool. Each connection lives on one io
// thread, and its handlers (HttpHandler, WsHandler callbacks) run there. The
// calls a handler makes back (HttpExchange::respond/write, WsConnection::send/
// close) are thread-safe: a handler may hand its work to a worker and answer
// from there, which is how an io thread never waits on Kubernetes, a disk or
// a signature.
//
// Strangers: on a server that asks for client certificates, a connection
// without one (which may only enroll) gets small messages, a deadline for its
// whole life, and a place in a bounded pool (in all and per source address)
// from the moment it is accepted until it proves a certificate.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/net/io_pool.hpp"
#include "common/net/tls.hpp"

namespace factory::net {

// What the TLS handshake proved about the peer.
struct PeerInfo {
  std::string remote;   // "127.0.0.1:53422", "[::1]:40000"
  std::string address;  // "127.0.0.1"
  bool has_client_cert = false;
  // The certificate chains to the client CA but is past its notAfter: the
  // server let it through (TlsServerOptions::accept_expired_client_certs) for
  // the application to decide (agents: renewal only, within a grace period).
  bool client_cert_expired = false;
  std::string subject_cn;  // from the verified client certificate
  std::string subject_o;
  std::string serial_hex;
  std::int64_t not_after_unix = 0;
  bool resumed = false;  // TLS session resumed from a ticket
};

struct HttpRequestIn {
  std::string method;
  std::string target;  // path + query, as sent (percent-encoded)
  // Without the query, percent-decoded: for logs and fixed paths. A router
  // that takes names out of the path splits `target` into segments and
  // decodes each one, so an encoded '/' or '?' inside a name stays in it.
  std::string path;
  std::map<std::string, std::string> query;    // percent-decoded
  std::map<std::string, std::string> headers;  // lower-case keys
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

// The credentials of an `Authorization: Bearer <token>` header, nullopt for
// any other scheme or shape. The scheme is case-insensitive (RFC 9110
// 11.1: "bearer" and "BEARER" are "Bearer"); the token is one token68, so
// one with a space inside is none.
std::optional<std::string> bearer_token(std::string_view authorization);

struct HttpResponseOut {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // A large body shared between responses (the agent binary): sent instead of body.
  std::shared_ptr<const std::string> shared_body;
  std::map<std::string, std::string> headers;

  static HttpResponseOut json(int status, std::string body) {
    HttpResponseOut r;
    r.status = status;
    r.body = std::move(body);
    return r;
  }
  // {"error":{"code":..., "message":...}}
  static HttpResponseOut error(int status, const std::string& code, const std::string& message);
};

// One request waiting for its answer: respond() once, or start a stream.
// Every method is thread-safe.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequestIn& request() const = 0;
  virtual const PeerInfo& peer() const = 0;
  virtual void respond(HttpResponseOut r) = 0;

  // A streamed response (Server-Sent Events): the head now, then chunks.
  // write() is false when the client has gone or more than
  // max_stream_queue bytes wait for it (a slow reader: the caller decides).
  virtual void start_stream(int status, std::string content_type,
                            std::map<std::string, std::string> headers = {}) = 0;
  virtual bool write(std::string chunk) = 0;
  // The same bytes queued by reference: many readers of one stream (the
  // status feed) hold one copy of an event between them, not one each. The
  // bytes count against max_stream_queue as if they were copied.
  virtual bool write_shared(std::shared_ptr<const std::string> chunk) = 0;
  virtual void end() = 0;
  // Queues `last` past max_stream_queue, then ends the stream and the
  // connection: how a reader that fell behind is told it is dropped. The
  // request timeout bounds how long a reader that reads nothing keeps it.
  virtual void end_with(std::string last) = 0;
  virtual bool gone() const = 0;
  // Called once, on the connection's io thread, when the client goes away
  // before the response or stream ended. From then on the server watches
  // the connection while the answer is prepared (not only once it is being
  // written), so a client that hangs up is noticed at once: a handler
  // waiting on something slow can stop waiting.
  virtual void on_gone(std::function<void()> f) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

// Sees a request's method, target, path and headers once its head is whole,
// before a byte of its body is read (HttpRequestIn::body is empty). An answer
// returned here is sent at once and the connection closed: the body is never
// read, so a refusal costs no buffer (how a model endpoint turns away a
// request without its key, whatever body it announces). nullopt: the request
// goes on, its body is read, and the HttpHandler (or the websocket acceptor)
// gets it. Runs on the io thread, so it must decide at once.
using HeadHandler =
    std::function<std::optional<HttpResponseOut>(const HttpRequestIn& head, const PeerInfo& peer)>;

// A handler that answers at once, on the io thread (for cheap, in-memory answers).
HttpHandler immediate(std::function<HttpResponseOut(const HttpRequestIn&, const PeerInfo&)> f);

// How a websocket ended.
struct CloseInfo {
  bool by_peer = false;    // the peer sent a close frame
  std::uint16_t code = 0;  // the peer's code (by_peer) or the one we sent
  std::string reason;      // the peer's reason text, or why we closed
};

// One websocket connection as the application sees it. Thread-safe.
class WsConnection {
 public:
  virtual ~WsConnection() = default;
  // Queues a text message. False when the connection is closing or more
  // than ws_send_queue_bytes wait already (the caller decides whether that
  // peer is too slow and should be dropped).
  virtual bool send(std::string text) = 0;
  // Sends a close frame (policy violation 1008 unless code given) and ends
  // the connection once it is out.
  virtual void close(std::string_view reason, std::uint16_t code = 1008) = 0;
  virtual const PeerInfo& peer() const = 0;
  // Runs fn on the connection's io thread, after what is queued there: how
  // work done elsewhere (a worker, the store's writer) comes back to the
  // handler, one callback at a time. Runs even after the connection closed.
  virtual void post(std::function<void()> fn) = 0;
};

// Callbacks run on the connection's io thread, one at a time.
class WsHandler {
 public:
  virtual ~WsHandler() = default;
  virtual void on_open(std::shared_ptr<WsConnection> conn) = 0;
  virtual void on_message(std::string_view text) = 0;
  // Exactly once, whatever ended the connection.
  virtual void on_close(const CloseInfo& info) = 0;
};

// Returns nullptr to refuse the upgrade (404).
using WsAcceptor = std::function<std::shared_ptr<WsHandler>(const HttpRequestIn&, const PeerInfo&)>;

struct StrangerLimits {
  std::size_t max_message = 64 * 1024;  // websocket messages before a certificate
  std::size_t max_request_body = 4 * 1024;
  std::chrono::seconds deadline{10};  // a stranger's whole connection
  // Strangers (and handshakes) at once. When the pool is full, new
  // connections wait in the listen queue: they are not refused.
  std::size_t max_total = 4096;
  // One address's share of the pool. Past it, its connections wait (up to
  // max_waiting of them in all, each at most `deadline`) for a slot of that
  // address: many agents behind one NAT come back after a restart.
  std::size_t max_per_address = 256;
  std::size_t max_waiting = 16384;
};

struct ServerOptions {
  std::string listen = "127.0.0.1:8443";  // host:port, [v6]:port; port 0 = any
  TlsServerOptions tls;
  std::string name = "https";  // for logs
  std::chrono::seconds handshake_timeout{10};
  std::chrono::seconds request_timeout{30};    // to receive one request, head and body
  std::chrono::seconds keepalive_timeout{60};  // between requests
  std::chrono::seconds ws_idle_timeout{60};    // ping at half; closed when nothing comes back
  std::size_t max_request_header = 16 * 1024;
  std::size_t max_request_body = 1 << 20;
  std::size_t ws_max_message = 1 << 20;
  std::size_t ws_send_queue_bytes = 8 << 20;
  std::size_t max_stream_queue = 1 << 20;
  // How long a streamed answer's chunk may wait for the chunks after it,
  // so that a stream fed many small events a second (the status feed: a
  // health sample of every agent) writes them in one TLS record and one
  // system call instead of one each. 0: each is written as soon as the io
  // thread gets to it.
  std::chrono::milliseconds stream_flush_delay{0};
  // 0: no cap but the file-descriptor limit (then accept pauses, it does not spin).
  std::size_t max_connections = 0;
  // Connections from one source address at once, whatever they are; past it
  // a newcomer from that address is closed as soon as it is accepted. 0: no
  // cap. (Strangers have their own share below, which waits instead.)
  std::size_t max_connections_per_address = 0;
  // TLS handshakes under way at once; past it, newcomers wait in the listen
  // queue. At about 2.6 ms of CPU each, 256 finish in a fraction of a second
  // on two cores, where thousands at once would all miss handshake_timeout.
  std::size_t max_handshakes = 256;
  // Applied when tls.client_ca_pem is set, to peers without a client certificate.
  StrangerLimits strangers;
};

// Counters, for /metrics and tests. Read from any thread.
struct ServerStats {
  std::uint64_t accepted = 0;
  std::uint64_t open = 0;
  std::uint64_t strangers_open = 0;
  std::uint64_t strangers_waiting = 0;  // accepted, waiting for their address's slot
  // max_connections or max_connections_per_address, or a stranger's address
  // past its share and the wait
  std::uint64_t refused_capacity = 0;
  std::uint64_t handshake_failures = 0;
  std::uint64_t handshakes_full = 0;
  std::uint64_t handshakes_resumed = 0;
  // SSL_write calls that wrote: one per TLS record the server sent, where
  // queued messages are coalesced up to a record's 16 KiB (Conn::flush).
  std::uint64_t tls_writes = 0;
  std::uint64_t deadline_closes = 0;  // handshake, request, stranger or idle deadline
  std::uint64_t oversize_closes = 0;  // a message or body over its limit
};

class Server {
 public:
  Server(IoPool& pool, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void on_http(HttpHandler h);
  // Before start(); optional (see HeadHandler).
  void on_head(HeadHandler h);
  void on_websocket(WsAcceptor a);
  // Binds and starts accepting. Errors: address in use, bad address, TLS setup.
  // Creates nothing that outlives a failure.
  Status start();
  // Stops accepting and closes every connection (websockets with 1001
  // "going away"). Thread-safe.
  void stop();
  int port() const;
  // New certificate and key for connections accepted from now on
  // (certificate renewal while running). Thread-safe.
  Status update_tls(const TlsServerOptions& tls);
  ServerStats stats() const;

  struct Impl;  // opaque; public only so the connection code beside it can name it

 private:
  std::shared_ptr<Impl> impl_;
};

// Splits "host:port" / "[::1]:port".
Result<std::pair<std::string, std::uint16_t>> split_host_port(std::string_view hostport);

}  // namespace factory::net
