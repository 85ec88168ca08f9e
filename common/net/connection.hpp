#pragma once
// One accepted connection: the TLS transport it always is (tls_connection.cpp:
// the handshake, reading into the io thread's buffer, the output queue, the
// deadlines, the end), and the session it carries, HTTP until an upgrade
// (http_session.cpp), then a websocket that takes over (ws_session.cpp). The
// session's state is a variant: a connection holds the state of the one it
// speaks, never both. Every end goes through fail(), which asks
// decide_close (server_close.hpp) what to do.
//
// Lives on one io thread; only the methods marked "any thread" are called
// from elsewhere. An idle connection holds no read or write buffer, no timer
// and no coroutine frame: the thread's sweep keeps its deadline.
#include <openssl/ssl.h>

#include <atomic>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/net/server_close.hpp"
#include "common/net/server_impl.hpp"
#include "common/net/ws_codec.hpp"

namespace factory::net {

class Exchange;

// The HTTP session's state (http_session.cpp). Outside Conn: a variant of
// nested classes with default member initializers is not default-constructible
// before the enclosing class is complete.
struct HttpSessionState {
  std::unique_ptr<boost::beast::http::request_parser<boost::beast::http::string_body>> parser;
  std::string held_in;  // bytes read, not yet parsed
  bool request_started = false;
  bool head_checked = false;  // check_head() ran for the request being parsed
  bool keep_alive = true;
  // While an answer is prepared (http_wait) with on_gone set, the socket
  // is watched for the client's departure; bytes the client sends
  // meanwhile (its next request, pipelined) end the watch: they wait,
  // unread, for their turn as before.
  bool departure_watch_over = false;
  std::weak_ptr<Exchange> exchange;
  std::function<void()> on_gone;
};
// The websocket session's state (ws_session.cpp).
struct WsSessionState {
  std::unique_ptr<ws::Decoder> decoder;
  std::shared_ptr<WsHandler> handler;  // null once on_close was called
  Clock::time_point last_rx;
  bool ping_outstanding = false;
  CloseInfo close_info;
};

class Conn : public WsConnection, public std::enable_shared_from_this<Conn> {
 public:
  enum class State {
    handshake,   // TLS
    http_read,   // HTTP: reading a request
    http_wait,   // HTTP: the handler prepares the answer
    http_write,  // HTTP: the answer goes out
    streaming,   // HTTP: a streamed answer (Server-Sent Events)
    websocket,   // the websocket session
    closing,     // our last bytes go out; the peer's end is awaited
    closed
  };

  Conn(std::shared_ptr<Server::Impl> srv, ThreadConns& tc, tcp::socket sock, SSL* ssl,
       bool stranger_slot, std::string address);
  ~Conn() override;

  void start(std::list<std::shared_ptr<Conn>>::iterator self_it);

  // WsConnection (any thread)
  bool send(std::string text) override;
  void close(std::string_view reason, std::uint16_t code) override;
  const PeerInfo& peer() const override { return peer_; }
  void post(std::function<void()> fn) override;

  // From the sweep, on the io thread.
  void tick(Clock::time_point now);
  // From ~Server once the io threads are gone: ends the connection at once,
  // the application's on_close included (a handler holding its connection
  // would otherwise keep both alive).
  void end_now() { fail(CloseReason::server_stopped); }
  // From Server::stop, on the io thread.
  void shut_down() { fail(CloseReason::server_stopping); }

  // From an Exchange, on the io thread unless marked.
  void deliver_response(HttpResponseOut r, bool keep_alive);
  void queue_stream_head(int status, const std::string& content_type,
                         const std::map<std::string, std::string>& headers);  // any thread
  void begin_stream();
  bool queue_stream_chunk(std::string chunk, bool past_limit = false);  // any thread
  bool queue_stream_chunk(std::shared_ptr<const std::string> chunk);    // any thread
  void finish_stream(bool keep_alive);
  bool gone() const { return gone_.load(); }  // any thread
  void set_on_gone(std::function<void()> f);
  boost::asio::io_context& io();

 private:
  // --- the TLS transport (tls_connection.cpp) ---
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

  void set_deadline(Clock::time_point t);
  bool stranger_limited() const { return srv_->strangers_apply && !trusted_; }
  void pump();
  void step();
  void do_handshake();
  void read_available();
  void on_bytes(std::string_view data);
  bool flush();
  // After an SSL call that made no progress: true when TLS asked for the
  // socket to be readable or writable and the wait is set; false when the
  // connection cannot go on (the caller says why).
  bool wait_as_tls_asks(int ssl_ret);
  void coalesce_head();
  void wait_read();
  void wait_write();
  void post_flush();
  // The same after `delay`: what else is queued meanwhile goes with it.
  void post_delayed_flush(std::chrono::milliseconds delay);
  void enqueue_raw(std::string bytes);
  // Queues items (bytes in all) from any thread, within limit (0: none),
  // and has the io thread flush them, `delay` later at most; false when
  // closing or past the limit.
  bool enqueue_posted(OutItem* items, std::size_t n, std::size_t bytes, std::size_t limit,
                      std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  void start_closing();
  void end_handshake();
  // Ends the connection as decide_close says for why.
  void fail(CloseReason why, CloseDetail detail = {});
  void finish();

  // --- the HTTP session (http_session.cpp) ---
  void start_http_request();
  void on_http_bytes(std::string_view data);
  std::optional<HttpResponseOut> check_head();
  void watch_departure();
  void handle_request();
  void respond_now(HttpResponseOut r, bool keep_alive);
  // Everything of an answer is out: the next request, or the end.
  void answer_written();

  // --- the websocket session (ws_session.cpp) ---
  void upgrade(HttpRequestIn in, bool version_11);
  void on_ws_bytes(std::string_view data);
  bool enqueue_ws(std::string frame);
  // Our close frame (a peer's close answered with its own code), then the
  // closing handshake.
  void send_close_frame(const CloseInfo& info);
  void notify_closed();
  void ws_tick(Clock::time_point now);

  HttpSessionState* http() { return std::get_if<HttpSessionState>(&session_); }
  WsSessionState* websocket() { return std::get_if<WsSessionState>(&session_); }

  std::shared_ptr<Server::Impl> srv_;
  ThreadConns& tc_;
  tcp::socket sock_;
  SSL* ssl_;
  std::list<std::shared_ptr<Conn>>::iterator self_it_;
  PeerInfo peer_;
  State state_ = State::handshake;
  Clock::time_point opened_, deadline_ = Clock::time_point::max();
  bool stranger_slot_ = false;
  bool address_counted_ = false;  // holds a place in the admission's per-address count
  bool handshaking_ = true;       // counted in the admission's handshakes until it ends
  bool trusted_ = false;          // proved a client certificate
  bool read_waiting_ = false, write_waiting_ = false;
  bool in_pump_ = false, pump_again_ = false;
  bool want_write_ = false;  // SSL asked to write before it can go on
  // An SSL_write that could not finish: it must be called again with the
  // same bytes (OpenSSL's "bad write retry" otherwise), so the head item is
  // not coalesced with others until it has gone.
  bool write_retry_ = false;
  bool shutdown_sent_ = false;
  std::atomic<bool> gone_{false};

  std::variant<HttpSessionState, WsSessionState> session_;

  // output, filled from any thread
  std::mutex out_mu_;
  std::vector<OutItem> out_;
  std::size_t out_head_ = 0;
  std::size_t out_bytes_ = 0;
  bool flush_posted_ = false;
  bool closing_output_ = false;  // nothing more is accepted
  // A stream's delayed flush (ServerOptions::stream_flush_delay); made on
  // the io thread at the first one, used only there.
  std::unique_ptr<boost::asio::steady_timer> flush_timer_;
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Conn> c, HttpRequestIn req, PeerInfo peer, bool keep_alive)
      : conn_(std::move(c)),
        req_(std::move(req)),
        peer_(std::move(peer)),
        keep_alive_(keep_alive) {}
  ~Exchange() override;
  const HttpRequestIn& request() const override { return req_; }
  const PeerInfo& peer() const override { return peer_; }
  void respond(HttpResponseOut r) override;
  void start_stream(int status, std::string content_type,
                    std::map<std::string, std::string> headers) override;
  bool write(std::string chunk) override;
  bool write_shared(std::shared_ptr<const std::string> chunk) override;
  void end() override;
  void end_with(std::string last) override;
  bool gone() const override { return conn_->gone(); }
  void on_gone(std::function<void()> f) override;

 private:
  std::shared_ptr<Conn> conn_;
  HttpRequestIn req_;
  PeerInfo peer_;
  bool keep_alive_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> streaming_{false};
  std::atomic<bool> ended_{false};
};

}  // namespace factory::net
