// The server: the acceptor, admission (server_admission.hpp), the io
// threads' sweeps, and the public face of server.hpp. A connection's own
// life is in connection.hpp.
#include "common/net/server.hpp"

#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <csignal>

#include "common/net/connection.hpp"
#include "common/net/server_impl.hpp"

namespace factory::net {

namespace asio = boost::asio;

Result<std::pair<std::string, std::uint16_t>> split_host_port(std::string_view hp) {
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
  return std::pair{host, static_cast<std::uint16_t>(p)};
}

// --- threads, sweep, accept ---------------------------------------------------

void ThreadConns::start_sweep() {
  sweep.expires_after(std::chrono::milliseconds(250));
  sweep.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec) return;
    auto now = Clock::now();
    // tick() may close (and erase) the connection it is called on.
    for (auto it = self->conns.begin(); it != self->conns.end();) {
      auto c = *it++;
      c->tick(now);
    }
    self->start_sweep();
  });
}

void ThreadConns::close_all() {
  sweep.cancel();
  for (auto it = conns.begin(); it != conns.end();) {
    auto c = *it++;
    c->shut_down();
  }
}

void Server::Impl::release_stranger_slot(const std::string& address) {
  auto released = admission.release_stranger_slot(address, stopped);
  counters.deadline_closes += released.expired.size();
  for (auto& s : released.expired) {
    boost::system::error_code ec;
    s.close(ec);
    admission.release_address(address);
  }
  if (released.next) {
    start_conn(std::move(released.next->sock), released.next->thread, true, address);
  } else if (released.resume_accepting) {
    resume_accepting();
  }
}

void Server::Impl::handshake_ended() {
  if (admission.handshake_ended()) resume_accepting();
}

void Server::Impl::resume_accepting() {
  asio::post(pool.main(), [self = shared_from_this()] { self->accept_next(); });
}

void Server::Impl::accept_next() {
  if (stopped) return;
  // Newcomers wait in the listen queue until a slot is released.
  if (strangers_apply && !admission.room_or_pause()) return;
  // Connections are dealt to the io threads in turn; each stays on its own.
  const std::size_t index = next_thread++ % threads.size();
  acceptor.async_accept(
      threads[index]->io,
      [self = shared_from_this(), index](const boost::system::error_code& ec, tcp::socket sock) {
        self->on_accept(ec, std::move(sock), index);
      });
}

void Server::Impl::on_accept(const boost::system::error_code& ec, tcp::socket sock,
                             std::size_t index) {
  if (stopped) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of file descriptors and the like: pause instead of spinning, and
    // say so once, not ten times a second for as long as it lasts.
    if (accept_failures++ == 0)
      spdlog::warn("{}: accept failed: {}; trying again every 100 ms", opts.name, ec.message());
    auto t = std::make_shared<asio::steady_timer>(pool.main(), std::chrono::milliseconds(100));
    t->async_wait(
        [self = shared_from_this(), t](const boost::system::error_code&) { self->accept_next(); });
    return;
  }
  if (accept_failures > 0) {
    spdlog::info("{}: accepting again after {} failed attempts", opts.name, accept_failures);
    accept_failures = 0;
  }
  counters.accepted++;
  // Admitted before the next accept, so that the pool's count is current
  // when accept_next looks at it.
  admit(std::move(sock), index);
  accept_next();
}

void Server::Impl::admit(tcp::socket sock, std::size_t index) {
  boost::system::error_code rec;
  auto remote = sock.remote_endpoint(rec);
  if (rec) return;
  std::string address = remote.address().to_string();
  // Refused connections are closed here, as soon as accepted: a flood past
  // the caps costs an accept and a close each, never a descriptor held.
  if (opts.max_connections && counters.open.load() >= opts.max_connections) {
    counters.refused_capacity++;
    log_refusal(address,
                std::to_string(counters.open.load()) + " connections open (max_connections)");
    return;
  }
  // Held from here until the socket closes, waiting for a stranger's slot included.
  if (!admission.take_address(address)) {
    counters.refused_capacity++;
    log_refusal(address, "max_connections_per_address (" +
                             std::to_string(opts.max_connections_per_address) + ") from it");
    return;
  }
  bool slot = false;
  if (strangers_apply) {
    // Every connection is a stranger until its handshake shows a certificate.
    switch (admission.take_stranger_slot(address, sock, index)) {
      case Admission::Slot::granted:
        slot = true;
        break;
      case Admission::Slot::waiting:
        return;
      case Admission::Slot::refused:
        counters.refused_capacity++;
        admission.release_address(address);
        spdlog::warn("{}: refusing {}: too many connections without a certificate from it",
                     opts.name, address);
        return;
    }
  }
  start_conn(std::move(sock), index, slot, std::move(address));
}

void Server::Impl::log_refusal(const std::string& address, const std::string& why) {
  ++refusals_unlogged;
  const auto now = Clock::now();
  if (now - refusal_logged_at < std::chrono::seconds(10)) return;
  if (refusals_unlogged == 1)
    spdlog::warn("{}: refusing {}: {}", opts.name, address, why);
  else
    spdlog::warn("{}: refused {} connections in the last {} s, the latest from {}: {}", opts.name,
                 refusals_unlogged,
                 std::chrono::duration_cast<std::chrono::seconds>(now - refusal_logged_at).count(),
                 address, why);
  refusals_unlogged = 0;
  refusal_logged_at = now;
}

void Server::Impl::start_conn(tcp::socket sock, std::size_t index, bool slot, std::string address) {
  auto ctx = context();
  SSL* ssl = SSL_new(ctx->native_handle());
  if (!ssl) {
    if (slot) release_stranger_slot(address);
    admission.release_address(address);
    spdlog::error("{}: SSL_new failed", opts.name);
    return;
  }
  counters.open++;
  admission.handshake_started();
  auto tc = threads[index];
  asio::post(tc->io, [self = shared_from_this(), tc, s = std::move(sock), ssl, slot,
                      address = std::move(address)]() mutable {
    auto conn = std::make_shared<Conn>(self, *tc, std::move(s), ssl, slot, std::move(address));
    tc->conns.push_front(conn);
    conn->start(tc->conns.begin());
  });
}

// ---------------------------------------------------------------------------
// Server

Server::Server(IoPool& pool, ServerOptions opts)
    : impl_(std::make_shared<Impl>(pool, std::move(opts))) {
  for (std::size_t i = 0; i < pool.size(); ++i)
    impl_->threads.push_back(std::make_shared<ThreadConns>(pool.at(i)));
}

Server::~Server() {
  stop();
  // Once the pool has stopped (its run() returned), the close_all that stop()
  // posted never runs, and each connection still holds the server that holds
  // it (Conn -> Impl -> ThreadConns -> Conn), and a websocket handler may hold
  // its connection until on_close: cycles LeakSanitizer found in every test
  // that stopped the pool first. Ended here, on_close included; on running
  // threads close_all ends them.
  for (auto& t : impl_->threads) {
    if (!t->io.stopped()) continue;
    t->sweep.cancel();
    for (auto it = t->conns.begin(); it != t->conns.end();) {
      auto c = *it++;
      c->end_now();
    }
  }
}

void Server::on_http(HttpHandler h) {
  impl_->http_handler = std::move(h);
}
void Server::on_head(HeadHandler h) {
  impl_->head_handler = std::move(h);
}
void Server::on_websocket(WsAcceptor a) {
  impl_->ws_acceptor = std::move(a);
}

Status Server::start() {
  // OpenSSL writes to the socket with write(2): a peer that hung up would
  // kill the process with SIGPIPE instead of failing the one write.
  ::signal(SIGPIPE, SIG_IGN);
  auto ctx = make_server_context(impl_->opts.tls);
  if (!ctx) return ctx.error();
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
  if (ec) {
    boost::system::error_code ignored;
    acc.close(ignored);
    return Error(Errc::unavailable, "cannot listen on " + impl_->opts.listen + ": " + ec.message());
  }
  {
    std::lock_guard lk(impl_->tls_mu);
    impl_->tls_ctx = *ctx;
  }
  impl_->strangers_apply = !impl_->opts.tls.client_ca_pem.empty();
  for (auto& t : impl_->threads)
    asio::post(t->io, [t] {
      if (!t->sweeping) {
        t->sweeping = true;
        t->start_sweep();
      }
    });
  asio::post(impl_->pool.main(), [impl = impl_] { impl->accept_next(); });
  return {};
}

void Server::stop() {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  asio::post(impl_->pool.main(), [impl = impl_] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
  });
  for (auto& [address, waiting] : impl_->admission.take_all_waiting())
    for (auto& w : waiting) {
      boost::system::error_code ec;
      w.sock.close(ec);
      impl_->admission.release_address(address);
    }
  for (auto& t : impl_->threads) asio::post(t->io, [t] { t->close_all(); });
}

int Server::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

Status Server::update_tls(const TlsServerOptions& tls) {
  auto ctx = make_server_context(tls);
  if (!ctx) return ctx.error();
  std::lock_guard lk(impl_->tls_mu);
  impl_->tls_ctx = *ctx;
  return {};
}

ServerStats Server::stats() const {
  ServerStats s;
  auto& c = impl_->counters;
  s.accepted = c.accepted;
  s.open = c.open;
  s.refused_capacity = c.refused_capacity;
  s.handshake_failures = c.handshake_failures;
  s.handshakes_full = c.handshakes_full;
  s.handshakes_resumed = c.handshakes_resumed;
  s.tls_writes = c.tls_writes;
  s.deadline_closes = c.deadline_closes;
  s.oversize_closes = c.oversize_closes;
  s.strangers_open = impl_->admission.strangers_open();
  s.strangers_waiting = impl_->admission.strangers_waiting();
  return s;
}

}  // namespace factory::net
