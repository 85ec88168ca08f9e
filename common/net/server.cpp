#include "common/net/server.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <csignal>
#include <deque>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "common/net/url.hpp"
#include "common/net/ws_codec.hpp"
#include "common/pki.hpp"

namespace factory::net {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// IoPool

// An io_context whose shutdown() (protected in execution_context) the pool
// may call.
struct IoPool::Context : asio::io_context {
  Context() : asio::io_context(1) {}
  using asio::io_context::shutdown;
};

IoPool::IoPool(std::size_t threads) {
  if (threads == 0) threads = 1;
  for (std::size_t i = 0; i < threads; ++i) contexts_.push_back(std::make_unique<Context>());
}

asio::io_context& IoPool::at(std::size_t i) {
  return *contexts_.at(i);
}

asio::io_context& IoPool::main() {
  return *contexts_.front();
}

IoPool::~IoPool() {
  stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  // Every context's pending handlers are destroyed before any context is: a
  // handler queued on one may hold the last reference to objects of another
  // (a connection holds its server, whose acceptor and sweep timers belong to
  // other contexts), and those must go while their context still exists.
  // AddressSanitizer found the acceptor destroyed after its context, in
  // ServerTest.ConnectionsAreSpreadOverTheIoThreads.
  for (auto& c : contexts_) c->shutdown();
}

asio::io_context& IoPool::next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()];
}

void IoPool::run() {
  // Each context is kept alive by a guard until stop(): a thread with no
  // connection yet must not return.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  for (auto& c : contexts_) guards.push_back(asio::make_work_guard(*c));
  for (std::size_t i = 1; i < contexts_.size(); ++i)
    threads_.emplace_back([c = contexts_[i].get()] { c->run(); });
  contexts_.front()->run();
  for (auto& c : contexts_) c->stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void IoPool::stop() {
  for (auto& c : contexts_) c->stop();
}

// ---------------------------------------------------------------------------
// small helpers

HttpResponseOut HttpResponseOut::error(int status, const std::string& code,
                                       const std::string& message) {
  nlohmann::json j = {{"error", {{"code", code}, {"message", message}}}};
  return json(status, j.dump());
}

HttpHandler immediate(std::function<HttpResponseOut(const HttpRequestIn&, const PeerInfo&)> f) {
  return [f = std::move(f)](std::shared_ptr<HttpExchange> x) {
    x->respond(f(x->request(), x->peer()));
  };
}

std::optional<std::string> bearer_token(std::string_view h) {
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!h.empty() && blank(h.front())) h.remove_prefix(1);
  constexpr std::string_view kScheme = "bearer";
  if (h.size() <= kScheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < kScheme.size(); i++) {
    char c = h[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return std::nullopt;
  }
  h.remove_prefix(kScheme.size());
  if (!blank(h.front())) return std::nullopt;
  while (!h.empty() && blank(h.front())) h.remove_prefix(1);
  while (!h.empty() && blank(h.back())) h.remove_suffix(1);
  if (h.empty() || std::find_if(h.begin(), h.end(), blank) != h.end()) return std::nullopt;
  return std::string(h);
}

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

namespace {

HttpRequestIn to_request_in(const http::request<http::string_body>& req) {
  HttpRequestIn in;
  in.method = std::string(req.method_string());
  in.target = std::string(req.target());
  auto q = in.target.find('?');
  in.path = percent_decode(std::string_view(in.target).substr(0, q), false);
  if (q != std::string::npos) {
    std::string_view qs = std::string_view(in.target).substr(q + 1);
    std::size_t pos = 0;
    while (pos <= qs.size()) {
      std::size_t amp = qs.find('&', pos);
      std::string_view kv =
          qs.substr(pos, amp == std::string_view::npos ? std::string_view::npos : amp - pos);
      auto eq = kv.find('=');
      if (!kv.empty())
        in.query[percent_decode(kv.substr(0, eq), true)] =
            eq == std::string_view::npos ? "" : percent_decode(kv.substr(eq + 1), true);
      if (amp == std::string_view::npos) break;
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

bool header_has_token(const std::string& value, std::string_view token) {
  std::string v = value;
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::size_t pos = 0;
  while (pos < v.size()) {
    std::size_t comma = v.find(',', pos);
    std::string_view part = std::string_view(v).substr(
        pos, comma == std::string::npos ? std::string::npos : comma - pos);
    while (!part.empty() && (part.front() == ' ' || part.front() == '\t')) part.remove_prefix(1);
    while (!part.empty() && (part.back() == ' ' || part.back() == '\t')) part.remove_suffix(1);
    if (part == token) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

std::string status_line(int status) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
}

std::string format_remote(const tcp::endpoint& ep) {
  std::ostringstream os;
  if (ep.address().is_v6())
    os << "[" << ep.address().to_string() << "]:" << ep.port();
  else
    os << ep.address().to_string() << ":" << ep.port();
  return os.str();
}

void fill_peer_certificate(SSL* ssl, PeerInfo& p, bool accept_expired) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return;
  long vr = SSL_get_verify_result(ssl);
  bool expired = vr == X509_V_ERR_CERT_HAS_EXPIRED;
  if (vr != X509_V_OK && !(expired && accept_expired)) return;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<std::size_t>(len));
  BIO_free(bio);
  auto info = pki::inspect_certificate(pem);
  if (!info) return;
  p.has_client_cert = true;
  p.client_cert_expired = expired;
  p.subject_cn = info->subject_cn;
  p.subject_o = info->subject_o;
  p.serial_hex = info->serial_hex;
  p.not_after_unix = unix_seconds(info->not_after);
}

// One buffer per io thread for what SSL_read returns: connections hold no
// read buffer of their own between messages.
thread_local char tl_read_buffer[16 * 1024];

}  // namespace

// ---------------------------------------------------------------------------
// the server's state

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
  bool strangers_apply = false;

  mutable std::mutex tls_mu;
  std::shared_ptr<asio::ssl::context> tls_ctx;

  // The stranger pool: connections still in their handshake, or done with
  // it without a certificate. When it is full the acceptor stops taking
  // connections (they wait in the kernel's listen queue) instead of closing
  // them: a closed connection doubles a returning agent's backoff, and after
  // a restart every agent of the fleet returns at once. An address over its
  // share waits in a bounded queue of accepted sockets (no TLS state yet) for
  // one of its own slots; only past that bound is it refused.
  struct Waiting {
    tcp::socket sock;
    std::size_t thread;
    Clock::time_point since;
  };
  std::mutex strangers_mu;
  std::unordered_map<std::string, std::size_t> strangers_by_address;
  std::unordered_map<std::string, std::deque<Waiting>> waiting_by_address;
  std::size_t strangers_total = 0;
  std::size_t waiting_total = 0;
  // TLS handshakes under way. Bounded apart from the pool: a few thousand at
  // once on two cores all miss their deadline together (a restart storm
  // stalled 35 s that way); a few hundred finish in well under a second.
  std::size_t handshaking = 0;
  bool accept_paused = false;
  bool room_locked() const {
    return strangers_total < opts.strangers.max_total && handshaking < opts.max_handshakes;
  }
  // Under strangers_mu, when a slot or a handshake ended: true when the
  // acceptor was paused and there is room again (then resume_accepting()).
  bool unpause_locked() {
    if (!accept_paused || !room_locked()) return false;
    accept_paused = false;
    return true;
  }
  void resume_accepting() {
    asio::post(pool.main(), [self = shared_from_this()] { self->accept_next(); });
  }

  std::vector<std::shared_ptr<ThreadConns>> threads;  // one per io context
  std::size_t next_thread = 0;                        // the acceptor's, on the main thread

  // Open connections by source address, for max_connections_per_address:
  // taken by admit() on the main thread, given back by a connection's end
  // on its own.
  std::mutex addresses_mu;
  std::unordered_map<std::string, std::size_t> open_by_address;
  // False when the address has max_connections_per_address already.
  bool take_address(const std::string& address);
  void release_address(const std::string& address);

  // On the main thread. A flood past the caps (thousands of connections a
  // second) is said in one line every 10 s with its count, not one line a
  // connection; accept failing for want of descriptors once, until it works.
  std::uint64_t refusals_unlogged = 0;
  Clock::time_point refusal_logged_at{};
  std::uint64_t accept_failures = 0;
  void log_refusal(const std::string& address, const std::string& why);

  struct Counters {
    std::atomic<std::uint64_t> accepted{0}, open{0}, refused_capacity{0}, handshake_failures{0},
        handshakes_full{0}, handshakes_resumed{0}, deadline_closes{0}, oversize_closes{0};
  } counters;

  Impl(IoPool& p, ServerOptions o) : pool(p), opts(std::move(o)), acceptor(p.main()) {}

  void accept_next();
  void on_accept(const boost::system::error_code& ec, tcp::socket sock, std::size_t thread);
  void admit(tcp::socket sock, std::size_t thread);
  void start_conn(tcp::socket sock, std::size_t thread, bool stranger_slot, std::string address);
  enum class Slot { granted, waiting, refused };
  // Takes a slot for address, or queues sock to wait for one (then sock is
  // moved from), or refuses.
  Slot take_stranger_slot(const std::string& address, tcp::socket& sock, std::size_t thread);
  // Hands the slot to the next connection waiting at that address, or
  // returns it to the pool (and resumes a paused acceptor).
  void release_stranger_slot(const std::string& address);
  void drop_waiting();
  void handshake_ended();
  std::shared_ptr<asio::ssl::context> context() const {
    std::lock_guard lk(tls_mu);
    return tls_ctx;
  }
};

// The connections of one io thread, and the sweep that keeps their deadlines.
struct ThreadConns : std::enable_shared_from_this<ThreadConns> {
  explicit ThreadConns(asio::io_context& io) : io(io), sweep(io) {}
  asio::io_context& io;
  asio::steady_timer sweep;
  std::list<std::shared_ptr<Conn>> conns;
  bool sweeping = false;
  void start_sweep();
  void close_all();
};

// ---------------------------------------------------------------------------
// one connection

class Exchange;

class Conn : public WsConnection, public std::enable_shared_from_this<Conn> {
 public:
  enum class State {
    handshake,
    http_read,
    http_wait,
    http_write,
    streaming,
    websocket,
    closing,
    closed
  };

  Conn(std::shared_ptr<Server::Impl> srv, ThreadConns& tc, tcp::socket sock, SSL* ssl,
       bool stranger_slot, std::string address)
      : srv_(std::move(srv)),
        tc_(tc),
        sock_(std::move(sock)),
        ssl_(ssl),
        stranger_slot_(stranger_slot),
        address_counted_(srv_->opts.max_connections_per_address > 0) {
    peer_.address = std::move(address);
  }
  ~Conn() override {
    if (ssl_) SSL_free(ssl_);
  }

  void start(std::list<std::shared_ptr<Conn>>::iterator self_it) {
    self_it_ = self_it;
    boost::system::error_code ec;
    peer_.remote = format_remote(sock_.remote_endpoint(ec));
    sock_.set_option(tcp::no_delay(true), ec);
    sock_.non_blocking(true, ec);
    SSL_set_fd(ssl_, static_cast<int>(sock_.native_handle()));
    SSL_set_accept_state(ssl_);
    opened_ = Clock::now();
    set_deadline(opened_ + srv_->opts.handshake_timeout);
    pump();
  }

  // WsConnection
  bool send(std::string text) override {
    return enqueue_ws(ws::encode_frame(ws::Opcode::text, text));
  }
  void close(std::string_view reason, std::uint16_t code) override {
    asio::post(tc_.io, [self = shared_from_this(), r = std::string(reason), code] {
      self->close_ws(code, r, false);
    });
  }
  const PeerInfo& peer() const override { return peer_; }
  void post(std::function<void()> fn) override { asio::post(tc_.io, std::move(fn)); }

  // From the sweep, on the io thread.
  void tick(Clock::time_point now);
  // From ~Server once the io threads are gone: ends the connection at once,
  // the application's on_close included (a handler holding its connection
  // would otherwise keep both alive).
  void end_now() {
    if (close_info_.reason.empty() && close_info_.code == 0)
      close_info_ = {false, ws::close_code::going_away, "server stopped"};
    finish();
  }
  // From Server::stop, on the io thread.
  void shut_down() {
    if (state_ == State::websocket)
      close_ws(ws::close_code::going_away, "server stopping", false);
    else if (state_ != State::closed)
      finish();
  }

  // From an Exchange, on the io thread.
  void deliver_response(HttpResponseOut r, bool keep_alive);
  void queue_stream_head(int status, const std::string& content_type,
                         const std::map<std::string, std::string>& headers);  // any thread
  void begin_stream();
  bool queue_stream_chunk(std::string chunk, bool past_limit = false);  // any thread
  bool queue_stream_chunk(std::shared_ptr<const std::string> chunk);    // any thread
  // Has the io thread flush what was queued from another thread.
  void post_flush();
  void finish_stream(bool keep_alive);
  bool gone() const { return gone_.load(); }
  void set_on_gone(std::function<void()> f);
  asio::io_context& io() { return tc_.io; }

 private:
  // Bytes waiting to be written. Always behind a pointer: the io thread
  // writes from an item with out_mu_ released while other threads push onto
  // out_, and a std::string held in the vector itself would move when it
  // grows (a short one, the chunk's CRLF or a ping, keeps its characters
  // inside the object), leaving SSL_write reading freed memory and OpenSSL
  // refusing the retry of a write that had to wait ("bad write retry").
  struct OutItem {
    std::shared_ptr<const std::string> bytes;
    std::size_t off = 0;
    std::string_view rest() const { return std::string_view(*bytes).substr(off); }
  };
  static OutItem owned(std::string s) {
    return {std::make_shared<const std::string>(std::move(s)), 0};
  }

  void set_deadline(Clock::time_point t) {
    // A stranger's whole life is bounded, whatever it is doing.
    if (stranger_limited()) t = std::min(t, opened_ + srv_->opts.strangers.deadline);
    deadline_ = t;
  }
  bool stranger_limited() const { return srv_->strangers_apply && !trusted_; }

  void pump();
  void step();
  void do_handshake();
  void read_available();
  void on_bytes(std::string_view data);
  void on_http_bytes(std::string_view data);
  void on_ws_bytes(std::string_view data);
  std::optional<HttpResponseOut> check_head();
  void watch_departure();
  void handle_request();
  void upgrade(HttpRequestIn in, bool version_11);
  void respond_now(HttpResponseOut r, bool keep_alive);
  bool flush();
  void wait_read();
  void wait_write();
  void enqueue_raw(std::string bytes);
  bool enqueue_ws(std::string frame);
  void close_ws(std::uint16_t code, const std::string& reason, bool by_peer);
  void start_closing();
  void notify_closed();
  void finish();
  void fail_io(const char* what);

  std::shared_ptr<Server::Impl> srv_;
  ThreadConns& tc_;
  tcp::socket sock_;
  SSL* ssl_;
  std::list<std::shared_ptr<Conn>>::iterator self_it_;
  PeerInfo peer_;
  State state_ = State::handshake;
  Clock::time_point opened_, deadline_ = Clock::time_point::max();
  bool stranger_slot_ = false;
  bool address_counted_ = false;  // holds a place in Impl::open_by_address
  bool handshaking_ = true;       // counted in Impl::handshaking until it ends
  void end_handshake() {
    if (!handshaking_) return;
    handshaking_ = false;
    srv_->handshake_ended();
  }
  bool trusted_ = false;  // proved a client certificate

  // HTTP
  std::unique_ptr<http::request_parser<http::string_body>> parser_;
  std::string held_in_;  // bytes read, not yet parsed
  bool request_started_ = false;
  bool head_checked_ = false;  // check_head() ran for the request being parsed
  bool keep_alive_ = true;
  std::weak_ptr<Exchange> exchange_;
  std::function<void()> on_gone_;
  std::atomic<bool> gone_{false};
  // While an answer is prepared (http_wait) with on_gone_ set, the socket is
  // watched for the client's departure; bytes the client sends meanwhile
  // (its next request, pipelined) end the watch: they wait, unread, for
  // their turn as before.
  bool departure_watch_over_ = false;

  // websocket
  std::unique_ptr<ws::Decoder> decoder_;
  std::shared_ptr<WsHandler> handler_;
  Clock::time_point last_rx_;
  bool ping_outstanding_ = false;
  bool open_notified_ = false;
  CloseInfo close_info_;

  // output, filled from any thread
  std::mutex out_mu_;
  std::vector<OutItem> out_;
  std::size_t out_head_ = 0;
  std::size_t out_bytes_ = 0;
  bool flush_posted_ = false;
  bool closing_output_ = false;  // nothing more is accepted

  bool read_waiting_ = false, write_waiting_ = false;
  bool in_pump_ = false, pump_again_ = false;
  bool want_write_ = false;  // SSL asked to write before it can go on
  bool shutdown_sent_ = false;
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Conn> c, HttpRequestIn req, PeerInfo peer, bool keep_alive)
      : conn_(std::move(c)),
        req_(std::move(req)),
        peer_(std::move(peer)),
        keep_alive_(keep_alive) {}
  ~Exchange() override {
    // A handler that dropped its exchange without answering: the client
    // still gets an answer and the connection goes on.
    if (!answered_.exchange(true)) {
      asio::post(conn_->io(), [c = conn_, keep = keep_alive_] {
        c->deliver_response(HttpResponseOut::error(500, "internal", "the request got no answer"),
                            keep);
      });
    } else if (streaming_ && !ended_.exchange(true)) {
      asio::post(conn_->io(), [c = conn_, keep = keep_alive_] { c->finish_stream(keep); });
    }
  }
  const HttpRequestIn& request() const override { return req_; }
  const PeerInfo& peer() const override { return peer_; }
  void respond(HttpResponseOut r) override {
    if (answered_.exchange(true)) return;
    asio::post(conn_->io(), [c = conn_, r = std::move(r), keep = keep_alive_]() mutable {
      c->deliver_response(std::move(r), keep);
    });
  }
  void start_stream(int status, std::string content_type,
                    std::map<std::string, std::string> headers) override {
    if (answered_.exchange(true)) return;
    // The head is queued now, so every chunk written after this call goes
    // out after it, whichever thread writes.
    conn_->queue_stream_head(status, content_type, headers);
    streaming_ = true;
    asio::post(conn_->io(), [c = conn_] { c->begin_stream(); });
  }
  bool write(std::string chunk) override {
    if (!streaming_ || ended_) return false;
    return conn_->queue_stream_chunk(std::move(chunk));
  }
  bool write_shared(std::shared_ptr<const std::string> chunk) override {
    if (!streaming_ || ended_ || !chunk) return false;
    return conn_->queue_stream_chunk(std::move(chunk));
  }
  void end() override {
    if (!streaming_ || ended_.exchange(true)) return;
    asio::post(conn_->io(), [c = conn_, keep = keep_alive_] { c->finish_stream(keep); });
  }
  void end_with(std::string last) override {
    if (!streaming_ || ended_.exchange(true)) return;
    conn_->queue_stream_chunk(std::move(last), true);
    asio::post(conn_->io(), [c = conn_] { c->finish_stream(false); });
  }
  bool gone() const override { return conn_->gone(); }
  void on_gone(std::function<void()> f) override {
    asio::dispatch(conn_->io(), [c = conn_, f = std::move(f)]() mutable {
      if (c->gone())
        f();
      else
        c->set_on_gone(std::move(f));
    });
  }

 private:
  std::shared_ptr<Conn> conn_;
  HttpRequestIn req_;
  PeerInfo peer_;
  bool keep_alive_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> streaming_{false};
  std::atomic<bool> ended_{false};
};

// --- the state machine ------------------------------------------------------

void Conn::pump() {
  if (in_pump_) {
    pump_again_ = true;
    return;
  }
  in_pump_ = true;
  do {
    pump_again_ = false;
    step();
  } while (pump_again_ && state_ != State::closed);
  in_pump_ = false;
}

void Conn::step() {
  if (state_ == State::handshake) {
    do_handshake();
    if (state_ == State::handshake || state_ == State::closed) return;
  }
  if (state_ == State::closed) return;
  if (!flush()) return;
  if (state_ == State::http_read || state_ == State::websocket || state_ == State::streaming ||
      state_ == State::closing)
    read_available();
  else if (state_ == State::http_wait && on_gone_ && !departure_watch_over_)
    watch_departure();
  if (state_ == State::closed) return;
  if (!flush()) return;
  if (state_ == State::closing) {
    std::lock_guard lk(out_mu_);
    if (out_head_ == out_.size()) {
      // Everything, the close frame included, is out: say close_notify and
      // stop writing; reading goes on until the peer hangs up or the short
      // closing deadline passes.
      if (!want_write_ && !shutdown_sent_) {
        shutdown_sent_ = true;
        SSL_shutdown(ssl_);
        boost::system::error_code ec;
        sock_.shutdown(tcp::socket::shutdown_send, ec);
      }
    }
  }
}

void Conn::do_handshake() {
  ERR_clear_error();
  int r = SSL_do_handshake(ssl_);
  if (r == 1) {
    end_handshake();
    peer_.resumed = SSL_session_reused(ssl_) == 1;
    (peer_.resumed ? srv_->counters.handshakes_resumed : srv_->counters.handshakes_full)++;
    fill_peer_certificate(ssl_, peer_, srv_->opts.tls.accept_expired_client_certs);
    if (peer_.has_client_cert && !peer_.client_cert_expired) {
      trusted_ = true;
      if (stranger_slot_) {
        srv_->release_stranger_slot(peer_.address);
        stranger_slot_ = false;
      }
    }
    state_ = State::http_read;
    parser_ = std::make_unique<http::request_parser<http::string_body>>();
    parser_->header_limit(static_cast<std::uint32_t>(srv_->opts.max_request_header));
    parser_->body_limit(stranger_limited() ? srv_->opts.strangers.max_request_body
                                           : srv_->opts.max_request_body);
    head_checked_ = false;
    set_deadline(Clock::now() + srv_->opts.request_timeout);
    return;
  }
  int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ) return wait_read();
  if (e == SSL_ERROR_WANT_WRITE) return wait_write();
  srv_->counters.handshake_failures++;
  end_handshake();
  unsigned long err = ERR_peek_last_error();
  char buf[256] = {0};
  if (err) ERR_error_string_n(err, buf, sizeof buf);
  spdlog::debug("{}: TLS handshake with {} failed: {}", srv_->opts.name, peer_.remote,
                err ? buf : "connection closed");
  ERR_clear_error();
  finish();
}

void Conn::read_available() {
  for (;;) {
    if (state_ == State::closed) return;
    ERR_clear_error();
    int n = SSL_read(ssl_, tl_read_buffer, sizeof tl_read_buffer);
    if (n > 0) {
      // The thread's buffer is reused by the next SSL_read: on_bytes copies
      // what it keeps.
      on_bytes(std::string_view(tl_read_buffer, static_cast<std::size_t>(n)));
      // A request being answered: read no further until it is (no pipelining).
      if (state_ == State::http_wait || state_ == State::http_write) return;
      continue;
    }
    int e = SSL_get_error(ssl_, n);
    if (e == SSL_ERROR_WANT_READ) return wait_read();
    if (e == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return wait_write();
    }
    // close_notify, a reset, or the peer just went.
    ERR_clear_error();
    if (state_ == State::websocket && !close_info_.by_peer) {
      close_info_ = {false, 1006, "connection closed without a close frame"};
    }
    finish();
    return;
  }
}

void Conn::on_bytes(std::string_view data) {
  switch (state_) {
    case State::http_read:
    case State::http_wait:
    case State::http_write:
      on_http_bytes(data);
      break;
    case State::websocket:
      on_ws_bytes(data);
      break;
    case State::streaming:
    case State::closing:
    case State::handshake:
    case State::closed:
      break;  // a stream's client has nothing to say; drop it
  }
}

void Conn::on_http_bytes(std::string_view data) {
  if (state_ != State::http_read) {
    // Pipelined bytes of the next request: kept, within the header limit.
    if (held_in_.size() + data.size() >
        srv_->opts.max_request_header + srv_->opts.max_request_body) {
      srv_->counters.oversize_closes++;
      return finish();
    }
    held_in_.append(data);
    return;
  }
  if (!request_started_) {
    request_started_ = true;
    set_deadline(Clock::now() + srv_->opts.request_timeout);
  }
  std::string_view buf = data;
  if (!held_in_.empty()) {
    held_in_.append(data);
    buf = held_in_;
  }
  std::size_t used = 0;
  boost::beast::error_code ec;
  while (used < buf.size() && !parser_->is_done()) {
    // Not eager: the parser stops at the end of the head, so the head is
    // judged before a byte of the body is taken.
    std::size_t n = parser_->put(asio::buffer(buf.data() + used, buf.size() - used), ec);
    used += n;
    const bool need_more = ec == http::error::need_more;
    if (need_more) ec = {};
    if (ec) break;
    if (!head_checked_ && parser_->is_header_done()) {
      head_checked_ = true;
      if (auto early = check_head()) {
        // Answered on its head: the body (if any) is never read; what comes
        // of it is dropped as it arrives while the answer goes out, and the
        // connection then closes.
        std::string().swap(held_in_);
        parser_.reset();
        request_started_ = false;
        return respond_now(std::move(*early), false);
      }
    }
    if (need_more || n == 0) break;
  }
  // Keep what the parser did not take (a header not yet whole, or the next request).
  std::string rest(buf.substr(used));
  held_in_ = std::move(rest);
  if (held_in_.capacity() > 4096 && held_in_.empty()) std::string().swap(held_in_);
  if (ec) {
    bool too_big = ec == http::error::body_limit || ec == http::error::header_limit;
    if (too_big) srv_->counters.oversize_closes++;
    int status = ec == http::error::body_limit ? 413 : ec == http::error::header_limit ? 431 : 400;
    spdlog::debug("{}: bad request from {}: {}", srv_->opts.name, peer_.remote, ec.message());
    respond_now(HttpResponseOut::error(status, status == 400 ? "bad_request" : "too_large",
                                       status == 400 ? "malformed HTTP request: " + ec.message()
                                                     : "request too large"),
                false);
    return;
  }
  if (parser_->is_done()) handle_request();
}

// What a request's head alone decides, before any of its body is read.
std::optional<HttpResponseOut> Conn::check_head() {
  const auto& head = parser_->get();
  // RFC 9112 6.3: a request whose last transfer coding is not chunked has no
  // length a server can tell, and must be refused; taken as "no body" (which
  // Beast does), what follows would be read as the next request.
  if (head.count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
    spdlog::debug("{}: bad request from {}: Transfer-Encoding '{}'", srv_->opts.name, peer_.remote,
                  std::string(head[http::field::transfer_encoding]));
    return HttpResponseOut::error(
        400, "bad_request", "malformed HTTP request: the last Transfer-Encoding must be chunked");
  }
  if (!srv_->head_handler) return std::nullopt;
  try {
    return srv_->head_handler(to_request_in(head), peer_);
  } catch (const std::exception& e) {
    spdlog::error("{}: head handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
    return HttpResponseOut::error(500, "internal", "internal error");
  }
}

// A client that hangs up (close_notify, a FIN, a reset) while its answer is
// prepared is noticed now, so the handler's on_gone can stop what it waits
// on, rather than when the answer is written. SSL_peek takes nothing away:
// bytes the client sent meanwhile (its next request) stay for their turn.
void Conn::watch_departure() {
  ERR_clear_error();
  char byte = 0;
  int n = SSL_peek(ssl_, &byte, 1);
  if (n > 0) {
    // It talks, so it is there; reading waits for the answer to be out.
    departure_watch_over_ = true;
    return;
  }
  int e = SSL_get_error(ssl_, n);
  if (e == SSL_ERROR_WANT_READ) return wait_read();
  if (e == SSL_ERROR_WANT_WRITE) {
    want_write_ = true;
    return wait_write();
  }
  ERR_clear_error();
  spdlog::debug("{}: {} left before its answer", srv_->opts.name, peer_.remote);
  finish();
}

void Conn::set_on_gone(std::function<void()> f) {
  on_gone_ = std::move(f);
  // The watch starts now (a handler registers while its answer is prepared).
  if (state_ == State::http_wait) pump();
}

void Conn::handle_request() {
  auto req = parser_->release();
  parser_.reset();
  request_started_ = false;
  HttpRequestIn in = to_request_in(req);
  const bool v11 = req.version() >= 11;
  keep_alive_ = req.keep_alive();
  if (header_has_token(in.header("upgrade"), "websocket")) {
    return upgrade(std::move(in), v11);
  }
  if (!srv_->http_handler) {
    return respond_now(HttpResponseOut::error(404, "not_found", "no such path: " + in.path),
                       keep_alive_);
  }
  state_ = State::http_wait;
  // The handler owns the time it takes (a Kubernetes call has its own
  // deadline); only a stranger's overall deadline still applies.
  set_deadline(Clock::time_point::max());
  auto x = std::make_shared<Exchange>(shared_from_this(), std::move(in), peer_, keep_alive_);
  exchange_ = x;
  try {
    srv_->http_handler(std::move(x));
  } catch (const std::exception& e) {
    spdlog::error("{}: handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
  }
}

void Conn::upgrade(HttpRequestIn in, bool version_11) {
  const std::string key = in.header("sec-websocket-key");
  if (in.method != "GET" || !version_11 || !header_has_token(in.header("connection"), "upgrade") ||
      key.size() != 24) {
    return respond_now(
        HttpResponseOut::error(400, "bad_request", "not a websocket upgrade request"), false);
  }
  if (in.header("sec-websocket-version") != "13") {
    auto r = HttpResponseOut::error(426, "upgrade_required", "websocket version 13 only");
    r.headers["Sec-WebSocket-Version"] = "13";
    return respond_now(std::move(r), false);
  }
  std::shared_ptr<WsHandler> handler;
  if (srv_->ws_acceptor) {
    try {
      handler = srv_->ws_acceptor(in, peer_);
    } catch (const std::exception& e) {
      spdlog::error("{}: websocket acceptor threw: {}", srv_->opts.name, e.what());
    }
  }
  if (!handler)
    return respond_now(HttpResponseOut::error(404, "not_found", "no websocket at " + in.path),
                       false);
  enqueue_raw(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: " +
      ws::accept_key(key) + "\r\nServer: factory\r\n\r\n");
  state_ = State::websocket;
  handler_ = std::move(handler);
  decoder_ = std::make_unique<ws::Decoder>(stranger_limited() ? srv_->opts.strangers.max_message
                                                              : srv_->opts.ws_max_message);
  last_rx_ = Clock::now();
  set_deadline(Clock::time_point::max());
  open_notified_ = true;
  try {
    handler_->on_open(std::static_pointer_cast<WsConnection>(shared_from_this()));
  } catch (const std::exception& e) {
    spdlog::error("{}: websocket open handler threw: {}", srv_->opts.name, e.what());
    return close_ws(ws::close_code::internal, "internal error", false);
  }
  if (!held_in_.empty()) {
    std::string early = std::move(held_in_);
    std::string().swap(held_in_);
    on_ws_bytes(early);
  }
}

void Conn::on_ws_bytes(std::string_view data) {
  last_rx_ = Clock::now();
  ping_outstanding_ = false;
  std::vector<ws::Message> msgs;
  bool ok = decoder_->feed(data, msgs);
  for (auto& m : msgs) {
    if (state_ != State::websocket) return;
    switch (m.op) {
      case ws::Opcode::text:
        try {
          handler_->on_message(m.payload);
        } catch (const std::exception& e) {
          spdlog::error("{}: handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
          close_ws(ws::close_code::internal, "internal error", false);
        }
        break;
      case ws::Opcode::binary:
        // Not part of any protocol spoken here; the connection survives.
        spdlog::warn("{}: {} sent a binary message; ignored", srv_->opts.name, peer_.remote);
        break;
      case ws::Opcode::ping:
        enqueue_ws(ws::encode_frame(ws::Opcode::pong, m.payload));
        break;
      case ws::Opcode::pong:
        break;
      case ws::Opcode::close:
        close_ws(m.close_code, m.payload, true);
        return;
      default:
        break;
    }
  }
  if (!ok) {
    const auto& v = decoder_->violation();
    if (v.code == ws::close_code::too_big) srv_->counters.oversize_closes++;
    spdlog::warn("{}: {} broke the websocket protocol ({}); closing with {}", srv_->opts.name,
                 peer_.remote, v.reason, v.code);
    close_ws(v.code, v.reason, false);
  }
}

void Conn::respond_now(HttpResponseOut r, bool keep_alive) {
  state_ = State::http_wait;
  deliver_response(std::move(r), keep_alive);
}

void Conn::deliver_response(HttpResponseOut r, bool keep_alive) {
  if (state_ != State::http_wait) return;
  if (srv_->stopped) keep_alive = false;
  std::string head = status_line(r.status);
  head += "Server: factory\r\nContent-Type: " + r.content_type + "\r\n";
  const std::size_t len = r.shared_body ? r.shared_body->size() : r.body.size();
  head += "Content-Length: " + std::to_string(len) + "\r\n";
  for (auto& [k, v] : r.headers) head += k + ": " + v + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  head += "\r\n";
  {
    std::lock_guard lk(out_mu_);
    out_.push_back(owned(std::move(head)));
    if (r.shared_body)
      out_.push_back({std::move(r.shared_body), 0});
    else if (!r.body.empty())
      out_.push_back(owned(std::move(r.body)));
  }
  keep_alive_ = keep_alive;
  state_ = State::http_write;
  // A large body is given time in proportion to it: 1 MiB a second at least.
  set_deadline(Clock::now() + srv_->opts.request_timeout + std::chrono::seconds(len >> 20));
  pump();
}

void Conn::queue_stream_head(int status, const std::string& content_type,
                             const std::map<std::string, std::string>& headers) {
  std::string head = status_line(status);
  head += "Server: factory\r\nContent-Type: " + content_type +
          "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
  for (auto& [k, v] : headers) head += k + ": " + v + "\r\n";
  head += "\r\n";
  enqueue_raw(std::move(head));
}

void Conn::begin_stream() {
  if (state_ != State::http_wait) return;
  state_ = State::streaming;
  set_deadline(Clock::time_point::max());
  pump();
}

namespace {
// A chunk's size line, as chunked transfer coding frames it.
std::string chunk_size_line(std::size_t n) {
  char line[24];
  int len = std::snprintf(line, sizeof line, "%zx\r\n", n);
  return std::string(line, static_cast<std::size_t>(len));
}
}  // namespace

bool Conn::queue_stream_chunk(std::string chunk, bool past_limit) {
  if (chunk.empty()) return true;
  std::string framed = chunk_size_line(chunk.size());
  framed += chunk;
  framed += "\r\n";
  bool post = false;
  {
    std::lock_guard lk(out_mu_);
    if (closing_output_ || gone_) return false;
    if (!past_limit && out_bytes_ + framed.size() > srv_->opts.max_stream_queue) return false;
    out_bytes_ += framed.size();
    out_.push_back(owned(std::move(framed)));
    if (!flush_posted_) post = flush_posted_ = true;
  }
  if (post) post_flush();
  return true;
}

bool Conn::queue_stream_chunk(std::shared_ptr<const std::string> chunk) {
  if (chunk->empty()) return true;
  std::string size_line = chunk_size_line(chunk->size());
  const std::size_t bytes = size_line.size() + chunk->size() + 2;
  bool post = false;
  {
    std::lock_guard lk(out_mu_);
    if (closing_output_ || gone_) return false;
    if (out_bytes_ + bytes > srv_->opts.max_stream_queue) return false;
    out_bytes_ += bytes;
    out_.push_back(owned(std::move(size_line)));
    out_.push_back({std::move(chunk), 0});
    static const auto kCrlf = std::make_shared<const std::string>("\r\n");
    out_.push_back({kCrlf, 0});
    if (!flush_posted_) post = flush_posted_ = true;
  }
  if (post) post_flush();
  return true;
}

void Conn::post_flush() {
  asio::post(tc_.io, [self = shared_from_this()] {
    {
      std::lock_guard lk(self->out_mu_);
      self->flush_posted_ = false;
    }
    self->pump();
  });
}

void Conn::finish_stream(bool keep_alive) {
  if (state_ != State::streaming) return;
  enqueue_raw("0\r\n\r\n");
  state_ = State::http_write;
  keep_alive_ = keep_alive && !srv_->stopped;
  set_deadline(Clock::now() + srv_->opts.request_timeout);
  pump();
}

bool Conn::flush() {
  for (;;) {
    std::string_view chunk;
    {
      std::lock_guard lk(out_mu_);
      if (out_head_ == out_.size()) {
        // All written: give the queue's memory back.
        if (!out_.empty()) {
          std::vector<OutItem>().swap(out_);
          out_head_ = 0;
        }
        out_bytes_ = 0;
        break;
      }
      chunk = out_[out_head_].rest();
    }
    ERR_clear_error();
    int n = SSL_write(ssl_, chunk.data(),
                      static_cast<int>(std::min<std::size_t>(chunk.size(), 1 << 30)));
    if (n > 0) {
      want_write_ = false;
      std::lock_guard lk(out_mu_);
      auto& item = out_[out_head_];
      item.off += static_cast<std::size_t>(n);
      out_bytes_ -= std::min<std::size_t>(out_bytes_, static_cast<std::size_t>(n));
      if (item.rest().empty()) {
        item = OutItem{};
        ++out_head_;
      }
      continue;
    }
    int e = SSL_get_error(ssl_, n);
    if (e == SSL_ERROR_WANT_WRITE) {
      wait_write();
      return true;
    }
    if (e == SSL_ERROR_WANT_READ) {
      wait_read();
      return true;
    }
    ERR_clear_error();
    fail_io("write");
    return false;
  }
  // Nothing left to write.
  if (state_ == State::http_write) {
    if (!keep_alive_) {
      start_closing();
      return state_ != State::closed;
    }
    state_ = State::http_read;
    parser_ = std::make_unique<http::request_parser<http::string_body>>();
    parser_->header_limit(static_cast<std::uint32_t>(srv_->opts.max_request_header));
    parser_->body_limit(stranger_limited() ? srv_->opts.strangers.max_request_body
                                           : srv_->opts.max_request_body);
    head_checked_ = false;
    // The answered request's hook is done with: the next request's client
    // leaving is not news to it.
    on_gone_ = nullptr;
    departure_watch_over_ = false;
    set_deadline(Clock::now() + srv_->opts.keepalive_timeout);
    // The next request may already sit decrypted inside SSL, where no
    // socket readiness will announce it: read again.
    pump_again_ = true;
    if (!held_in_.empty()) {
      std::string early = std::move(held_in_);
      std::string().swap(held_in_);
      on_http_bytes(early);
    }
  }
  return true;
}

void Conn::wait_read() {
  if (read_waiting_ || state_ == State::closed) return;
  read_waiting_ = true;
  sock_.async_wait(tcp::socket::wait_read,
                   [self = shared_from_this()](const boost::system::error_code& ec) {
                     self->read_waiting_ = false;
                     if (ec || self->state_ == State::closed) return;
                     self->pump();
                   });
}

void Conn::wait_write() {
  if (write_waiting_ || state_ == State::closed) return;
  write_waiting_ = true;
  sock_.async_wait(tcp::socket::wait_write,
                   [self = shared_from_this()](const boost::system::error_code& ec) {
                     self->write_waiting_ = false;
                     if (ec || self->state_ == State::closed) return;
                     self->pump();
                   });
}

void Conn::enqueue_raw(std::string bytes) {
  std::lock_guard lk(out_mu_);
  out_bytes_ += bytes.size();
  out_.push_back(owned(std::move(bytes)));
}

bool Conn::enqueue_ws(std::string frame) {
  bool post = false;
  {
    std::lock_guard lk(out_mu_);
    if (closing_output_) return false;
    if (out_bytes_ + frame.size() > srv_->opts.ws_send_queue_bytes) return false;
    out_bytes_ += frame.size();
    out_.push_back(owned(std::move(frame)));
    if (!flush_posted_) post = flush_posted_ = true;
  }
  // Always through the io context, never inline: a handler sending to
  // another connection of this thread must not run that connection's read
  // loop (and its use of the thread's read buffer) in the middle of its own.
  if (post) post_flush();
  return true;
}

void Conn::close_ws(std::uint16_t code, const std::string& reason, bool by_peer) {
  if (state_ != State::websocket) {
    if (state_ != State::closing && state_ != State::closed) finish();
    return;
  }
  close_info_ = {by_peer, code, reason};
  notify_closed();
  // Answer a peer's close with its own code; ours carry why.
  std::uint16_t send_code = code == ws::close_code::no_status ? ws::close_code::normal : code;
  {
    std::lock_guard lk(out_mu_);
    std::string frame =
        ws::encode_close(send_code, by_peer ? std::string_view{} : std::string_view(reason));
    out_bytes_ += frame.size();
    out_.push_back(owned(std::move(frame)));
    closing_output_ = true;
  }
  start_closing();
  pump();
}

void Conn::start_closing() {
  if (state_ == State::closing || state_ == State::closed) return;
  state_ = State::closing;
  deadline_ = Clock::now() + std::chrono::seconds(2);
  pump_again_ = true;
  if (!in_pump_) pump();
}

void Conn::fail_io(const char* what) {
  spdlog::debug("{}: {} to {} failed", srv_->opts.name, what, peer_.remote);
  if (state_ == State::websocket && !close_info_.by_peer)
    close_info_ = {false, 1006, "connection lost"};
  finish();
}

void Conn::finish() {
  if (state_ == State::closed) return;
  const State was = state_;
  state_ = State::closed;
  gone_ = true;
  {
    std::lock_guard lk(out_mu_);
    closing_output_ = true;
    std::vector<OutItem>().swap(out_);
    out_head_ = 0;
    out_bytes_ = 0;
  }
  boost::system::error_code ec;
  sock_.close(ec);
  end_handshake();
  if (stranger_slot_) {
    srv_->release_stranger_slot(peer_.address);
    stranger_slot_ = false;
  }
  if (address_counted_) {
    srv_->release_address(peer_.address);
    address_counted_ = false;
  }
  srv_->counters.open--;
  parser_.reset();
  decoder_.reset();
  std::string().swap(held_in_);
  notify_closed();
  if (on_gone_ &&
      (was == State::streaming || was == State::http_wait || was == State::http_write)) {
    auto f = std::move(on_gone_);
    f();
  }
  on_gone_ = nullptr;
  // Last: this may drop the final reference to this connection.
  auto keep = shared_from_this();
  tc_.conns.erase(self_it_);
}

// The application hears of the end when it is decided (a close frame sent or
// received, a deadline, a lost connection), not when the closing handshake
// is over: nothing it sends from then on would arrive anyway.
void Conn::notify_closed() {
  if (!handler_ || !open_notified_) return;
  if (close_info_.reason.empty() && close_info_.code == 0) close_info_ = {false, 1006, "closed"};
  auto h = std::move(handler_);
  try {
    h->on_close(close_info_);
  } catch (const std::exception& e) {
    spdlog::error("{}: close handler threw: {}", srv_->opts.name, e.what());
  }
}

void Conn::tick(Clock::time_point now) {
  if (state_ == State::closed) return;
  if (now >= deadline_) {
    srv_->counters.deadline_closes++;
    if (state_ == State::websocket) {
      close_ws(ws::close_code::policy,
               stranger_limited() ? "stranger deadline: no certificate, enroll within " +
                                        std::to_string(srv_->opts.strangers.deadline.count()) + "s"
                                  : "deadline passed",
               false);
    } else {
      finish();
    }
    return;
  }
  if (state_ == State::websocket) {
    const auto idle = std::chrono::duration_cast<Clock::duration>(srv_->opts.ws_idle_timeout);
    if (now - last_rx_ >= idle) {
      srv_->counters.deadline_closes++;
      close_ws(ws::close_code::policy, "idle timeout (no pong)", false);
    } else if (now - last_rx_ >= idle / 2 && !ping_outstanding_) {
      ping_outstanding_ = true;
      enqueue_ws(ws::encode_frame(ws::Opcode::ping, {}));
    }
  }
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

Server::Impl::Slot Server::Impl::take_stranger_slot(const std::string& address, tcp::socket& sock,
                                                    std::size_t thread) {
  std::lock_guard lk(strangers_mu);
  auto& mine = strangers_by_address[address];
  if (strangers_total < opts.strangers.max_total && mine < opts.strangers.max_per_address) {
    ++mine;
    ++strangers_total;
    return Slot::granted;
  }
  if (mine == 0) strangers_by_address.erase(address);
  if (mine == 0 || waiting_total >= opts.strangers.max_waiting) return Slot::refused;
  waiting_by_address[address].push_back({std::move(sock), thread, Clock::now()});
  ++waiting_total;
  return Slot::waiting;
}

void Server::Impl::release_stranger_slot(const std::string& address) {
  std::optional<Waiting> next;
  bool resume = false;
  std::vector<tcp::socket> expired;  // closed outside the lock
  {
    std::lock_guard lk(strangers_mu);
    auto wit = waiting_by_address.find(address);
    if (wit != waiting_by_address.end()) {
      // The slot passes to the next one waiting at this address that has
      // not waited past a stranger's deadline (its client has given up).
      auto& q = wit->second;
      const auto oldest = Clock::now() - opts.strangers.deadline;
      while (!q.empty() && !next) {
        Waiting w = std::move(q.front());
        q.pop_front();
        --waiting_total;
        if (w.since < oldest || stopped)
          expired.push_back(std::move(w.sock));
        else
          next = std::move(w);
      }
      if (q.empty()) waiting_by_address.erase(wit);
    }
    if (!next) {
      auto it = strangers_by_address.find(address);
      if (it != strangers_by_address.end() && --it->second == 0) strangers_by_address.erase(it);
      if (strangers_total > 0) --strangers_total;
      resume = unpause_locked();
    }
  }
  counters.deadline_closes += expired.size();
  for (auto& s : expired) {
    boost::system::error_code ec;
    s.close(ec);
    release_address(address);
  }
  if (next) {
    start_conn(std::move(next->sock), next->thread, true, address);
  } else if (resume) {
    resume_accepting();
  }
}

void Server::Impl::handshake_ended() {
  bool resume = false;
  {
    std::lock_guard lk(strangers_mu);
    if (handshaking > 0) --handshaking;
    resume = unpause_locked();
  }
  if (resume) resume_accepting();
}

void Server::Impl::drop_waiting() {
  std::unordered_map<std::string, std::deque<Waiting>> dropped;
  {
    std::lock_guard lk(strangers_mu);
    dropped.swap(waiting_by_address);
    waiting_total = 0;
  }
  for (auto& [address, q] : dropped)
    for (auto& w : q) {
      boost::system::error_code ec;
      w.sock.close(ec);
      release_address(address);
    }
}

void Server::Impl::accept_next() {
  if (stopped) return;
  if (strangers_apply) {
    std::lock_guard lk(strangers_mu);
    if (!room_locked()) {
      // Newcomers wait in the listen queue until a slot is released.
      accept_paused = true;
      return;
    }
  }
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
  if (!take_address(address)) {
    counters.refused_capacity++;
    log_refusal(address, "max_connections_per_address (" +
                             std::to_string(opts.max_connections_per_address) + ") from it");
    return;
  }
  bool slot = false;
  if (strangers_apply) {
    // Every connection is a stranger until its handshake shows a certificate.
    switch (take_stranger_slot(address, sock, index)) {
      case Slot::granted:
        slot = true;
        break;
      case Slot::waiting:
        return;
      case Slot::refused:
        counters.refused_capacity++;
        release_address(address);
        spdlog::warn("{}: refusing {}: too many connections without a certificate from it",
                     opts.name, address);
        return;
    }
  }
  start_conn(std::move(sock), index, slot, std::move(address));
}

bool Server::Impl::take_address(const std::string& address) {
  if (opts.max_connections_per_address == 0) return true;
  std::lock_guard lk(addresses_mu);
  auto& open = open_by_address[address];
  if (open >= opts.max_connections_per_address) return false;
  ++open;
  return true;
}

void Server::Impl::release_address(const std::string& address) {
  if (opts.max_connections_per_address == 0) return;
  std::lock_guard lk(addresses_mu);
  auto it = open_by_address.find(address);
  if (it == open_by_address.end()) return;
  if (--it->second == 0) open_by_address.erase(it);
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
    release_address(address);
    spdlog::error("{}: SSL_new failed", opts.name);
    return;
  }
  counters.open++;
  {
    std::lock_guard lk(strangers_mu);
    ++handshaking;
  }
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
  impl_->drop_waiting();
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
  s.deadline_closes = c.deadline_closes;
  s.oversize_closes = c.oversize_closes;
  {
    std::lock_guard lk(impl_->strangers_mu);
    s.strangers_open = impl_->strangers_total;
    s.strangers_waiting = impl_->waiting_total;
  }
  return s;
}

}  // namespace factory::net
