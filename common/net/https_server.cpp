#include "common/net/https_server.hpp"

#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <sstream>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "common/pki.hpp"

namespace factory::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using asio::awaitable;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// The seam: every agent connection is this stream type. A cheaper stream
// (SSL_set_fd with released buffers) can replace it here alone.
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

HttpResponseOut HttpResponseOut::error(int status, const std::string& code,
                                       const std::string& message) {
  nlohmann::json j = {{"error", {{"code", code}, {"message", message}}}};
  return json(status, j.dump());
}

Result<std::pair<std::string, uint16_t>> split_host_port(std::string_view hp) {
  std::string host;
  std::string_view port;
  if (!hp.empty() && hp.front() == '[') {
    auto close = hp.find(']');
    if (close == std::string_view::npos || close + 1 >= hp.size() || hp[close + 1] != ':')
      return Error(Errc::invalid_argument, "invalid address '" + std::string(hp) + "'");
    host = std::string(hp.substr(1, close - 1));
    port = hp.substr(close + 2);
  } else {
    auto colon = hp.rfind(':');
    if (colon == std::string_view::npos)
      return Error(Errc::invalid_argument,
                   "invalid address '" + std::string(hp) + "' (want host:port)");
    host = std::string(hp.substr(0, colon));
    port = hp.substr(colon + 1);
  }
  int p = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || p > 65535)
      return Error(Errc::invalid_argument, "invalid port in '" + std::string(hp) + "'");
    p = p * 10 + (c - '0');
  }
  if (port.empty() || p > 65535)
    return Error(Errc::invalid_argument, "invalid port in '" + std::string(hp) + "'");
  return std::pair{host, static_cast<uint16_t>(p)};
}

namespace {

PeerInfo peer_of(TlsStream& s, const tcp::endpoint& ep) {
  PeerInfo p;
  std::ostringstream os;
  if (ep.address().is_v6()) os << "[" << ep.address().to_string() << "]:" << ep.port();
  else os << ep.address().to_string() << ":" << ep.port();
  p.remote = os.str();
  X509* cert = SSL_get0_peer_certificate(s.native_handle());
  if (!cert || SSL_get_verify_result(s.native_handle()) != X509_V_OK) return p;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(len));
  BIO_free(bio);
  auto info = pki::inspect_certificate(pem);
  if (!info) return p;
  p.has_client_cert = true;
  p.subject_cn = info->subject_cn;
  p.subject_o = info->subject_o;
  p.serial_hex = info->serial_hex;
  p.not_after_unix = unix_seconds(info->not_after);
  return p;
}

HttpRequestIn to_request_in(const http::request<http::string_body>& req) {
  HttpRequestIn in;
  in.method = std::string(req.method_string());
  in.target = std::string(req.target());
  auto q = in.target.find('?');
  in.path = in.target.substr(0, q);
  if (q != std::string::npos) {
    std::string qs = in.target.substr(q + 1);
    size_t pos = 0;
    while (pos <= qs.size()) {
      size_t amp = qs.find('&', pos);
      std::string kv = qs.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      auto eq = kv.find('=');
      if (!kv.empty()) in.query[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
  }
  for (auto& f : req) {
    std::string k(f.name_string());
    for (auto& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    in.headers[k] = std::string(f.value());
  }
  in.body = req.body();
  return in;
}

bool benign(const boost::system::error_code& ec) {
  // A peer that closes without close_notify is common and harmless (Beast's
  // advanced server treats stream_truncated the same way).
  return ec == ssl::error::stream_truncated || ec == http::error::end_of_stream ||
         ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::operation_aborted || ec == beast::error::timeout ||
         ec == websocket::error::closed;
}

}  // namespace

struct HttpsServer::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& ioc;
  HttpsServerOptions opts;
  std::shared_ptr<ssl::context> ctx;
  tcp::acceptor acceptor;
  HttpHandler http_handler;
  WsAcceptor ws_acceptor;
  size_t active = 0;
  bool stopped = false;

  Impl(asio::io_context& io, HttpsServerOptions o)
      : ioc(io), opts(std::move(o)), acceptor(io) {}

  awaitable<void> accept_loop();
  awaitable<void> session(tcp::socket sock);
  awaitable<void> run_websocket(TlsStream stream, http::request<http::string_body> req,
                                PeerInfo peer, std::shared_ptr<WsHandler> handler);
  HttpResponseOut dispatch(const HttpRequestIn& in, const PeerInfo& peer);
};

// One websocket connection: one read loop, one write loop, a bounded queue.
class WsSession : public WsConnection, public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(TlsStream stream, PeerInfo peer, size_t queue_limit)
      : ws(std::move(stream)), peer_(std::move(peer)), limit_(queue_limit),
        wake_(ws.get_executor()) {
    wake_.expires_at(asio::steady_timer::time_point::max());
  }

  bool send(std::string text) override {
    if (closing_ || queue_.size() >= limit_) return false;
    queue_.push_back(std::move(text));
    wake_.cancel();
    return true;
  }
  void close(std::string_view reason) override {
    if (closing_) return;
    closing_ = true;
    close_reason_ = std::string(reason);
    wake_.cancel();
  }
  const PeerInfo& peer() const override { return peer_; }

  awaitable<void> write_loop() {
    auto self = shared_from_this();
    for (;;) {
      if (!queue_.empty() && !finished_) {
        std::string msg = std::move(queue_.front());
        queue_.pop_front();
        ws.text(true);
        auto [ec, n] = co_await ws.async_write(asio::buffer(msg), use_tuple);
        if (ec) break;
        continue;
      }
      if (finished_) break;
      if (closing_) {
        websocket::close_reason cr(websocket::close_code::policy_error);
        cr.reason = close_reason_.substr(0, 120);
        co_await ws.async_close(cr, use_tuple);
        break;
      }
      wake_.expires_at(asio::steady_timer::time_point::max());
      co_await wake_.async_wait(use_tuple);
    }
  }
  void finish() {
    finished_ = true;
    closing_ = true;
    wake_.cancel();
  }

  websocket::stream<TlsStream> ws;

 private:
  PeerInfo peer_;
  size_t limit_;
  asio::steady_timer wake_;
  std::deque<std::string> queue_;
  bool closing_ = false;
  bool finished_ = false;
  std::string close_reason_;
};

HttpResponseOut HttpsServer::Impl::dispatch(const HttpRequestIn& in, const PeerInfo& peer) {
  if (!http_handler) return HttpResponseOut::error(404, "not_found", "no such path: " + in.path);
  try {
    return http_handler(in, peer);
  } catch (const std::exception& e) {
    spdlog::error("{}: handler for {} {} threw: {}", opts.name, in.method, in.path, e.what());
    return HttpResponseOut::error(500, "internal", "internal error; see the coordinator log");
  }
}

awaitable<void> HttpsServer::Impl::accept_loop() {
  auto self = shared_from_this();
  for (;;) {
    auto [ec, sock] = co_await acceptor.async_accept(use_tuple);
    if (stopped) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      spdlog::warn("{}: accept failed: {}", opts.name, ec.message());
      // Out of file descriptors and the like: do not spin.
      asio::steady_timer t(ioc, std::chrono::milliseconds(100));
      co_await t.async_wait(use_tuple);
      continue;
    }
    if (active >= opts.max_connections) {
      spdlog::warn("{}: refusing connection: {} connections open (max_connections)", opts.name,
                   active);
      continue;
    }
    ++active;
    asio::co_spawn(ioc, session(std::move(sock)), [self](std::exception_ptr e) {
      --self->active;
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        spdlog::error("{}: session ended by an unexpected error: {}", self->opts.name, x.what());
      }
    });
  }
}

awaitable<void> HttpsServer::Impl::session(tcp::socket sock) {
  boost::system::error_code ec;
  auto remote = sock.remote_endpoint(ec);
  sock.set_option(tcp::no_delay(true), ec);
  TlsStream stream(std::move(sock), *ctx);
  beast::get_lowest_layer(stream).expires_after(opts.handshake_timeout);
  auto [hec] = co_await stream.async_handshake(ssl::stream_base::server, use_tuple);
  if (hec) {
    spdlog::debug("{}: TLS handshake with {} failed: {}", opts.name, remote.address().to_string(),
                  hec.message());
    co_return;
  }
  PeerInfo peer = peer_of(stream, remote);
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(opts.max_request_body);
    parser.header_limit(16 * 1024);
    beast::get_lowest_layer(stream).expires_after(opts.request_timeout);
    auto [rec, n] = co_await http::async_read(stream, buffer, parser, use_tuple);
    if (rec) {
      if (rec == http::error::body_limit) {
        http::response<http::string_body> res{http::status::payload_too_large, 11};
        res.set(http::field::content_type, "application/json");
        res.body() = HttpResponseOut::error(413, "too_large", "request body too large").body;
        res.prepare_payload();
        co_await http::async_write(stream, res, use_tuple);
      } else if (!benign(rec)) {
        spdlog::debug("{}: read from {} failed: {}", opts.name, peer.remote, rec.message());
      }
      break;
    }
    auto req = parser.release();
    HttpRequestIn in = to_request_in(req);
    if (websocket::is_upgrade(req)) {
      std::shared_ptr<WsHandler> handler;
      if (ws_acceptor) {
        try {
          handler = ws_acceptor(in, peer);
        } catch (const std::exception& e) {
          spdlog::error("{}: websocket acceptor threw: {}", opts.name, e.what());
        }
      }
      if (handler) {
        co_await run_websocket(std::move(stream), std::move(req), std::move(peer),
                               std::move(handler));
        co_return;
      }
      HttpResponseOut out = HttpResponseOut::error(404, "not_found", "no websocket at " + in.path);
      http::response<http::string_body> res{http::status::not_found, req.version()};
      res.set(http::field::content_type, out.content_type);
      res.body() = out.body;
      res.keep_alive(false);
      res.prepare_payload();
      co_await http::async_write(stream, res, use_tuple);
      break;
    }
    HttpResponseOut out = dispatch(in, peer);
    bool keep = req.keep_alive();
    if (!out.file_path.empty()) {
      http::response<http::file_body> res{static_cast<http::status>(out.status), req.version()};
      beast::error_code fec;
      res.body().open(out.file_path.c_str(), beast::file_mode::scan, fec);
      if (fec) {
        out = HttpResponseOut::error(500, "internal", "cannot read " + out.file_path);
      } else {
        res.set(http::field::content_type, out.content_type);
        for (auto& [k, v] : out.headers) res.set(k, v);
        res.keep_alive(keep);
        res.prepare_payload();
        // A large body: give it time proportional to its size.
        beast::get_lowest_layer(stream).expires_after(std::chrono::minutes(5));
        auto [wec, wn] = co_await http::async_write(stream, res, use_tuple);
        if (wec || !keep) break;
        continue;
      }
    }
    http::response<http::string_body> res{static_cast<http::status>(out.status), req.version()};
    res.set(http::field::content_type, out.content_type);
    res.set(http::field::server, "factory");
    for (auto& [k, v] : out.headers) res.set(k, v);
    res.body() = std::move(out.body);
    res.keep_alive(keep);
    res.prepare_payload();
    auto [wec, wn] = co_await http::async_write(stream, res, use_tuple);
    if (wec || !keep) break;
  }
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(2));
  co_await stream.async_shutdown(use_tuple);
}

awaitable<void> HttpsServer::Impl::run_websocket(TlsStream stream,
                                                 http::request<http::string_body> req,
                                                 PeerInfo peer,
                                                 std::shared_ptr<WsHandler> handler) {
  auto self = shared_from_this();
  auto conn = std::make_shared<WsSession>(std::move(stream), std::move(peer),
                                          opts.ws_send_queue_limit);
  auto& ws = conn->ws;
  beast::get_lowest_layer(ws).expires_never();
  websocket::stream_base::timeout t{};
  t.handshake_timeout = opts.handshake_timeout;
  t.idle_timeout = opts.ws_idle_timeout;
  t.keep_alive_pings = true;
  ws.set_option(t);
  ws.read_message_max(opts.ws_max_frame);
  ws.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, "factory"); }));
  auto [aec] = co_await ws.async_accept(req, use_tuple);
  if (aec) {
    spdlog::debug("{}: websocket handshake with {} failed: {}", opts.name, conn->peer().remote,
                  aec.message());
    co_return;
  }
  handler->on_open(conn);
  asio::co_spawn(ws.get_executor(), conn->write_loop(), asio::detached);
  beast::flat_buffer buf;
  std::string reason = "closed";
  for (;;) {
    auto [ec, n] = co_await ws.async_read(buf, use_tuple);
    if (ec) {
      if (ec == websocket::error::message_too_big) {
        reason = "frame over the " + std::to_string(opts.ws_max_frame) + "-byte cap";
        spdlog::warn("{}: {} sent a {}; connection closed (1009)", opts.name,
                     conn->peer().remote, reason);
      } else if (ec == websocket::error::closed) {
        reason = "closed by peer";
      } else if (ec == beast::error::timeout) {
        reason = "idle timeout (no pong)";
      } else {
        reason = ec.message();
      }
      break;
    }
    if (!ws.got_text()) {
      // Binary frames are not part of the protocol; the connection survives.
      buf.consume(buf.size());
      spdlog::warn("{}: {} sent a binary frame; ignored", opts.name, conn->peer().remote);
      continue;
    }
    std::string text = beast::buffers_to_string(buf.data());
    buf.consume(buf.size());
    try {
      handler->on_message(text);
    } catch (const std::exception& e) {
      spdlog::error("{}: handler for {} threw: {}", opts.name, conn->peer().remote, e.what());
      conn->close("internal error");
    }
  }
  conn->finish();
  try {
    handler->on_close(reason);
  } catch (const std::exception& e) {
    spdlog::error("{}: close handler threw: {}", opts.name, e.what());
  }
}

HttpsServer::HttpsServer(asio::io_context& ioc, HttpsServerOptions opts)
    : impl_(std::make_shared<Impl>(ioc, std::move(opts))) {}

HttpsServer::~HttpsServer() { stop(); }

void HttpsServer::on_http(HttpHandler h) { impl_->http_handler = std::move(h); }
void HttpsServer::on_websocket(WsAcceptor a) { impl_->ws_acceptor = std::move(a); }

Status HttpsServer::start() {
  auto ctx = make_server_context(impl_->opts.tls);
  if (!ctx) return ctx.error();
  impl_->ctx = *ctx;
  auto hp = split_host_port(impl_->opts.listen);
  if (!hp) return hp.error();
  std::string host = hp->first == "localhost" ? "127.0.0.1" : hp->first;
  if (host.empty()) host = "0.0.0.0";
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec)
    return Error(Errc::invalid_argument,
                 "listen address '" + impl_->opts.listen + "': not an IP address");
  tcp::endpoint ep(addr, hp->second);
  auto& acc = impl_->acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Error(Errc::unavailable, "cannot listen on " + impl_->opts.listen + ": " + ec.message());
  asio::co_spawn(impl_->ioc, impl_->accept_loop(), [name = impl_->opts.name](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      spdlog::critical("{}: accept loop died: {}", name, x.what());
    }
  });
  return {};
}

void HttpsServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
}

int HttpsServer::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

size_t HttpsServer::connections() const { return impl_->active; }

}  // namespace factory::net
