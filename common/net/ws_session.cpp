// The websocket session: it takes over a connection at the upgrade (the
// HTTP session's state gives way to its own), decodes frames with our codec,
// hands text messages to the application's WsHandler, pings an idle peer,
// and ends with a close frame.
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "common/net/connection.hpp"

namespace factory::net {

namespace asio = boost::asio;

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
  // What the client sent after its upgrade request is the websocket's.
  std::string early = std::move(http()->held_in);
  auto& w = session_.emplace<WsSessionState>();
  state_ = State::websocket;
  w.handler = std::move(handler);
  w.decoder = std::make_unique<ws::Decoder>(stranger_limited() ? srv_->opts.strangers.max_message
                                                               : srv_->opts.ws_max_message);
  w.last_rx = Clock::now();
  set_deadline(Clock::time_point::max());
  try {
    w.handler->on_open(std::static_pointer_cast<WsConnection>(shared_from_this()));
  } catch (const std::exception& e) {
    spdlog::error("{}: websocket open handler threw: {}", srv_->opts.name, e.what());
    return fail(CloseReason::handler_failed);
  }
  if (!early.empty() && state_ == State::websocket) on_ws_bytes(early);
}

void Conn::on_ws_bytes(std::string_view data) {
  auto* w = websocket();
  w->last_rx = Clock::now();
  w->ping_outstanding = false;
  std::vector<ws::Message> msgs;
  bool ok = w->decoder->feed(data, msgs);
  for (auto& m : msgs) {
    // A message may end the session (the handler closes, the peer's close).
    if (state_ != State::websocket) return;
    switch (m.op) {
      case ws::Opcode::text:
        try {
          w->handler->on_message(m.payload);
        } catch (const std::exception& e) {
          spdlog::error("{}: handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
          fail(CloseReason::handler_failed);
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
        return fail(CloseReason::closed_by_peer, {m.close_code, m.payload});
      default:
        break;
    }
  }
  if (!ok && state_ == State::websocket) {
    const auto& v = w->decoder->violation();
    fail(CloseReason::protocol_violation, {v.code, v.reason});
  }
}

bool Conn::send(std::string text) {
  return enqueue_ws(ws::encode_frame(ws::Opcode::text, text));
}

void Conn::close(std::string_view reason, std::uint16_t code) {
  asio::post(tc_.io, [self = shared_from_this(), r = std::string(reason), code]() mutable {
    self->fail(CloseReason::closed_by_application, {code, std::move(r)});
  });
}

bool Conn::enqueue_ws(std::string frame) {
  const std::size_t bytes = frame.size();
  OutItem item = owned(std::move(frame));
  return enqueue_posted(&item, 1, bytes, srv_->opts.ws_send_queue_bytes);
}

void Conn::send_close_frame(const CloseInfo& info) {
  auto* w = websocket();
  w->close_info = info;
  notify_closed();
  // Answer a peer's close with its own code; ours carry why.
  const std::uint16_t code =
      info.code == ws::close_code::no_status ? ws::close_code::normal : info.code;
  {
    std::lock_guard lk(out_mu_);
    std::string frame =
        ws::encode_close(code, info.by_peer ? std::string_view{} : std::string_view(info.reason));
    out_bytes_ += frame.size();
    out_.push_back(owned(std::move(frame)));
    closing_output_ = true;
  }
  start_closing();
  pump();
}

// The application hears of the end when it is decided (a close frame sent or
// received, a deadline, a lost connection), not when the closing handshake
// is over: nothing it sends from then on would arrive anyway.
void Conn::notify_closed() {
  auto* w = websocket();
  if (!w || !w->handler) return;
  if (w->close_info.reason.empty() && w->close_info.code == 0)
    w->close_info = {false, ws::close_code::abnormal, "closed"};
  auto h = std::move(w->handler);
  try {
    h->on_close(w->close_info);
  } catch (const std::exception& e) {
    spdlog::error("{}: close handler threw: {}", srv_->opts.name, e.what());
  }
}

void Conn::ws_tick(Clock::time_point now) {
  auto* w = websocket();
  const auto idle = std::chrono::duration_cast<Clock::duration>(srv_->opts.ws_idle_timeout);
  if (now - w->last_rx >= idle) return fail(CloseReason::idle_timeout);
  if (now - w->last_rx >= idle / 2 && !w->ping_outstanding) {
    w->ping_outstanding = true;
    enqueue_ws(ws::encode_frame(ws::Opcode::ping, {}));
  }
}

}  // namespace factory::net
