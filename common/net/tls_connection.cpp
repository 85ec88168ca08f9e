// The TLS transport of a connection: the handshake, reading into the io
// thread's buffer, the output queue any thread may fill, the deadlines, and
// the one way a connection ends (fail, then finish).
#include <openssl/err.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <sstream>

#include "common/net/connection.hpp"
#include "common/pki.hpp"

namespace factory::net {

namespace asio = boost::asio;

namespace {

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
  // Read where OpenSSL holds it: no PEM written and parsed again per handshake.
  auto info = pki::inspect_certificate(cert);
  if (!info) return;
  // A resumed session carries the verification of its first handshake, when
  // the certificate may still have been valid: its notAfter is judged now.
  if (!expired && info->not_after <= std::chrono::system_clock::now()) {
    if (!accept_expired) return;
    expired = true;
  }
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

Conn::Conn(std::shared_ptr<Server::Impl> srv, ThreadConns& tc, tcp::socket sock, SSL* ssl,
           bool stranger_slot, std::string address)
    : srv_(std::move(srv)),
      tc_(tc),
      sock_(std::move(sock)),
      ssl_(ssl),
      stranger_slot_(stranger_slot),
      address_counted_(srv_->opts.max_connections_per_address > 0) {
  peer_.address = std::move(address);
}

Conn::~Conn() {
  if (ssl_) SSL_free(ssl_);
}

void Conn::start(std::list<std::shared_ptr<Conn>>::iterator self_it) {
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

void Conn::post(std::function<void()> fn) {
  asio::post(tc_.io, std::move(fn));
}

asio::io_context& Conn::io() {
  return tc_.io;
}

void Conn::set_deadline(Clock::time_point t) {
  // A stranger's whole life is bounded, whatever it is doing.
  if (stranger_limited()) t = std::min(t, opened_ + srv_->opts.strangers.deadline);
  deadline_ = t;
}

void Conn::end_handshake() {
  if (!handshaking_) return;
  handshaking_ = false;
  srv_->handshake_ended();
}

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
      state_ == State::closing) {
    read_available();
  } else if (state_ == State::http_wait) {
    auto* h = http();
    if (h && h->on_gone && !h->departure_watch_over) watch_departure();
  }
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
    want_write_ = false;
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
    start_http_request();
    set_deadline(Clock::now() + srv_->opts.request_timeout);
    return;
  }
  if (wait_as_tls_asks(r)) return;
  end_handshake();
  unsigned long err = ERR_peek_last_error();
  char buf[256] = {0};
  if (err) ERR_error_string_n(err, buf, sizeof buf);
  ERR_clear_error();
  fail(CloseReason::handshake_failed, {0, err ? buf : ""});
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
    if (wait_as_tls_asks(n)) return;
    // close_notify, a reset, or the peer just went.
    ERR_clear_error();
    return fail(CloseReason::peer_hung_up);
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
      if (!write_retry_) coalesce_head();
      chunk = out_[out_head_].rest();
    }
    ERR_clear_error();
    int n = SSL_write(ssl_, chunk.data(),
                      static_cast<int>(std::min<std::size_t>(chunk.size(), 1 << 30)));
    if (n > 0) {
      want_write_ = false;
      write_retry_ = false;
      srv_->counters.tls_writes++;
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
    if (wait_as_tls_asks(n)) {
      write_retry_ = true;
      return true;
    }
    ERR_clear_error();
    fail(CloseReason::write_failed, {0, "write"});
    return false;
  }
  // Nothing left to write.
  if (state_ == State::http_write) answer_written();
  return state_ != State::closed;
}

// Small messages queued behind one another (the acknowledgements of a
// batch of events, a feed's lines) become one TLS record and one write(2)
// instead of one each: a record carries up to 16 KiB, and its header, MAC
// and system call cost the same for 30 bytes as for 16,000. An item over
// that is written by itself, uncopied. Under out_mu_.
void Conn::coalesce_head() {
  constexpr std::size_t kRecord = 16 * 1024;
  std::size_t total = 0, end = out_head_;
  while (end < out_.size() && total + out_[end].rest().size() <= kRecord)
    total += out_[end++].rest().size();
  if (end - out_head_ < 2) return;
  std::string merged;
  merged.reserve(total);
  for (std::size_t i = out_head_; i < end; ++i) {
    merged += out_[i].rest();
    out_[i] = OutItem{};
  }
  out_head_ = end - 1;
  out_[out_head_] = owned(std::move(merged));
}

bool Conn::wait_as_tls_asks(int ret) {
  switch (SSL_get_error(ssl_, ret)) {
    case SSL_ERROR_WANT_READ:
      wait_read();
      return true;
    case SSL_ERROR_WANT_WRITE:
      want_write_ = true;
      wait_write();
      return true;
    default:
      return false;
  }
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

void Conn::post_flush() {
  asio::post(tc_.io, [self = shared_from_this()] {
    {
      std::lock_guard lk(self->out_mu_);
      self->flush_posted_ = false;
    }
    self->pump();
  });
}

void Conn::enqueue_raw(std::string bytes) {
  std::lock_guard lk(out_mu_);
  out_bytes_ += bytes.size();
  out_.push_back(owned(std::move(bytes)));
}

void Conn::post_delayed_flush(std::chrono::milliseconds delay) {
  asio::post(tc_.io, [self = shared_from_this(), delay] {
    if (!self->flush_timer_)
      self->flush_timer_ = std::make_unique<asio::steady_timer>(self->tc_.io);
    self->flush_timer_->expires_after(delay);
    self->flush_timer_->async_wait([self](const boost::system::error_code&) {
      {
        std::lock_guard lk(self->out_mu_);
        self->flush_posted_ = false;
      }
      self->pump();
    });
  });
}

bool Conn::enqueue_posted(OutItem* items, std::size_t n, std::size_t bytes, std::size_t limit,
                          std::chrono::milliseconds delay) {
  bool post = false;
  {
    std::lock_guard lk(out_mu_);
    if (closing_output_ || gone_) return false;
    if (limit && out_bytes_ + bytes > limit) return false;
    out_bytes_ += bytes;
    for (std::size_t i = 0; i < n; ++i) out_.push_back(std::move(items[i]));
    if (!flush_posted_) post = flush_posted_ = true;
  }
  // Always through the io context, never inline: a handler sending to
  // another connection of this thread must not run that connection's read
  // loop (and its use of the thread's read buffer) in the middle of its own.
  if (post) {
    if (delay.count() > 0)
      post_delayed_flush(delay);
    else
      post_flush();
  }
  return true;
}

void Conn::start_closing() {
  if (state_ == State::closing || state_ == State::closed) return;
  state_ = State::closing;
  deadline_ = Clock::now() + std::chrono::seconds(2);
  pump_again_ = true;
  if (!in_pump_) pump();
}

void Conn::fail(CloseReason why, CloseDetail detail) {
  if (state_ == State::closed) return;
  CloseContext ctx;
  ctx.phase = state_ == State::websocket ? CloseContext::Phase::websocket
              : state_ == State::closing ? CloseContext::Phase::closing
                                         : CloseContext::Phase::before_websocket;
  ctx.stranger = stranger_limited();
  ctx.stranger_deadline = srv_->opts.strangers.deadline;
  CloseAction act = decide_close(why, detail, ctx);
  srv_->counters.add(act.count);
  if (!act.log.empty()) {
    if (act.warn)
      spdlog::warn("{}: {} {}", srv_->opts.name, peer_.remote, act.log);
    else
      spdlog::debug("{}: {} {}", srv_->opts.name, peer_.remote, act.log);
  }
  switch (act.kind) {
    case CloseAction::Kind::none:
      return;
    case CloseAction::Kind::close_frame:
      return send_close_frame(act.info);
    case CloseAction::Kind::cut:
      // What an open websocket's application hears; one that is closing
      // has heard already.
      if (auto* w = websocket(); w && state_ == State::websocket && act.info.code != 0)
        w->close_info = std::move(act.info);
      return finish();
  }
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
    srv_->admission.release_address(peer_.address);
    address_counted_ = false;
  }
  srv_->counters.open--;
  notify_closed();
  std::function<void()> on_gone;
  if (auto* h = http()) {
    if (was == State::streaming || was == State::http_wait || was == State::http_write)
      on_gone = std::move(h->on_gone);
  }
  // The session's buffers go now; the object may live on in an Exchange.
  session_.emplace<HttpSessionState>();
  if (on_gone) on_gone();
  // Last: this may drop the final reference to this connection.
  auto keep = shared_from_this();
  tc_.conns.erase(self_it_);
}

void Conn::tick(Clock::time_point now) {
  if (state_ == State::closed) return;
  if (now >= deadline_) return fail(CloseReason::deadline);
  if (state_ == State::websocket) ws_tick(now);
}

}  // namespace factory::net
