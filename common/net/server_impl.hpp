#pragma once
// The server's insides, shared by its parts (server.cpp, tls_connection.cpp,
// http_session.cpp, ws_session.cpp): not for the server's users.
#include <openssl/ssl.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net/server.hpp"
#include "common/net/server_admission.hpp"
#include "common/net/server_close.hpp"

namespace factory::net {

using Clock = std::chrono::steady_clock;
using tcp = boost::asio::ip::tcp;

struct ThreadConns;
class Conn;

struct Server::Impl : std::enable_shared_from_this<Impl> {
  IoPool& pool;
  ServerOptions opts;
  tcp::acceptor acceptor;
  HttpHandler http_handler;
  HeadHandler head_handler;
  WsAcceptor ws_acceptor;
  std::atomic<bool> stopped{false};
  // The server asks for client certificates: connections without one are
  // strangers (StrangerLimits). Set by start(), before the first accept.
  bool strangers_apply = false;
  Admission admission;

  mutable std::mutex tls_mu;
  std::shared_ptr<boost::asio::ssl::context> tls_ctx;

  std::vector<std::shared_ptr<ThreadConns>> threads;  // one per io context
  std::size_t next_thread = 0;                        // the acceptor's, on the main thread

  // On the main thread. A flood past the caps (thousands of connections a
  // second) is said in one line every 10 s with its count, not one line a
  // connection; accept failing for want of descriptors once, until it works.
  std::uint64_t refusals_unlogged = 0;
  Clock::time_point refusal_logged_at{};
  std::uint64_t accept_failures = 0;
  void log_refusal(const std::string& address, const std::string& why);

  struct Counters {
    std::atomic<std::uint64_t> accepted{0}, open{0}, refused_capacity{0}, handshake_failures{0},
        handshakes_full{0}, handshakes_resumed{0}, tls_writes{0}, deadline_closes{0},
        oversize_closes{0};
    // The counter a close adds to, as decide_close named it.
    void add(CloseAction::Count c) {
      switch (c) {
        case CloseAction::Count::none:
          return;
        case CloseAction::Count::handshake_failure:
          handshake_failures++;
          return;
        case CloseAction::Count::deadline:
          deadline_closes++;
          return;
        case CloseAction::Count::oversize:
          oversize_closes++;
          return;
      }
    }
  } counters;

  Impl(IoPool& p, ServerOptions o)
      : pool(p), opts(std::move(o)), acceptor(p.main()), admission(opts) {}

  void accept_next();
  void on_accept(const boost::system::error_code& ec, tcp::socket sock, std::size_t thread);
  void admit(tcp::socket sock, std::size_t thread);
  void start_conn(tcp::socket sock, std::size_t thread, bool stranger_slot, std::string address);
  // A connection's stranger slot given back: to the next one waiting at its
  // address, or to the pool.
  void release_stranger_slot(const std::string& address);
  void handshake_ended();
  void resume_accepting();
  std::shared_ptr<boost::asio::ssl::context> context() const {
    std::lock_guard lk(tls_mu);
    return tls_ctx;
  }
};

// The connections of one io thread, and the sweep that keeps their deadlines.
struct ThreadConns : std::enable_shared_from_this<ThreadConns> {
  explicit ThreadConns(boost::asio::io_context& io) : io(io), sweep(io) {}
  boost::asio::io_context& io;
  boost::asio::steady_timer sweep;
  std::list<std::shared_ptr<Conn>> conns;
  bool sweeping = false;
  void start_sweep();
  void close_all();
};

// HTTP pieces the sessions share (http_session.cpp).
HttpRequestIn to_request_in(
    const boost::beast::http::request<boost::beast::http::string_body>& req);
// A comma-separated header value holds token (case-insensitive): "Upgrade"
// in "keep-alive, Upgrade".
bool header_has_token(const std::string& value, std::string_view token);
std::string status_line(int status);

}  // namespace factory::net
