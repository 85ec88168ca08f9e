#include "common/net/server_close.hpp"

#include "common/net/ws_codec.hpp"

namespace factory::net {

const char* close_reason_name(CloseReason r) {
  switch (r) {
    case CloseReason::handshake_failed:
      return "handshake_failed";
    case CloseReason::peer_hung_up:
      return "peer_hung_up";
    case CloseReason::left_before_answer:
      return "left_before_answer";
    case CloseReason::write_failed:
      return "write_failed";
    case CloseReason::too_much_pipelined:
      return "too_much_pipelined";
    case CloseReason::deadline:
      return "deadline";
    case CloseReason::idle_timeout:
      return "idle_timeout";
    case CloseReason::protocol_violation:
      return "protocol_violation";
    case CloseReason::handler_failed:
      return "handler_failed";
    case CloseReason::closed_by_application:
      return "closed_by_application";
    case CloseReason::closed_by_peer:
      return "closed_by_peer";
    case CloseReason::server_stopping:
      return "server_stopping";
    case CloseReason::server_stopped:
      return "server_stopped";
  }
  return "unknown";
}

namespace {

using Kind = CloseAction::Kind;
using Count = CloseAction::Count;
using Phase = CloseContext::Phase;

// A close the application hears without a close frame from either side:
// 1006, "abnormal closure" (RFC 6455 7.4.1), never sent on the wire.
CloseInfo abnormal(std::string why) {
  return {false, ws::close_code::abnormal, std::move(why)};
}

// A reason that ends a websocket with our close frame: sent when the
// websocket is open; nothing more once it is closing (the frame is out or
// going); before any websocket, the connection is cut.
CloseAction with_frame(const CloseContext& ctx, CloseInfo info) {
  CloseAction a;
  a.info = std::move(info);
  a.kind = ctx.phase == Phase::websocket ? Kind::close_frame
           : ctx.phase == Phase::closing ? Kind::none
                                         : Kind::cut;
  return a;
}

CloseAction cut(CloseInfo info = {}) {
  CloseAction a;
  a.kind = Kind::cut;
  a.info = std::move(info);
  return a;
}

}  // namespace

CloseAction decide_close(CloseReason why, const CloseDetail& d, const CloseContext& ctx) {
  switch (why) {
    case CloseReason::handshake_failed: {
      auto a = cut();
      a.count = Count::handshake_failure;
      a.log = "TLS handshake failed: " + (d.text.empty() ? "connection closed" : d.text);
      return a;
    }
    case CloseReason::peer_hung_up:
      return cut(abnormal("connection closed without a close frame"));
    case CloseReason::left_before_answer: {
      auto a = cut();
      a.log = "left before its answer";
      return a;
    }
    case CloseReason::write_failed: {
      auto a = cut(abnormal("connection lost"));
      a.log = (d.text.empty() ? std::string("write") : d.text) + " failed";
      return a;
    }
    case CloseReason::too_much_pipelined: {
      auto a = cut();
      a.count = Count::oversize;
      a.log = "sent more ahead of its answers than a request may hold";
      return a;
    }
    case CloseReason::deadline: {
      // A closing connection's deadline (2 s for the peer's close) ends it
      // too: cut, like any connection that is not an open websocket.
      std::string text = ctx.stranger ? "stranger deadline: no certificate, enroll within " +
                                            std::to_string(ctx.stranger_deadline.count()) + "s"
                                      : "deadline passed";
      CloseAction a = ctx.phase == Phase::websocket
                          ? with_frame(ctx, {false, ws::close_code::policy, std::move(text)})
                          : cut();
      a.count = Count::deadline;
      return a;
    }
    case CloseReason::idle_timeout: {
      auto a = with_frame(ctx, {false, ws::close_code::policy, "idle timeout (no pong)"});
      a.count = Count::deadline;
      return a;
    }
    case CloseReason::protocol_violation: {
      auto a = with_frame(ctx, {false, d.code, d.text});
      if (d.code == ws::close_code::too_big) a.count = Count::oversize;
      a.log =
          "broke the websocket protocol (" + d.text + "); closing with " + std::to_string(d.code);
      a.warn = true;
      return a;
    }
    case CloseReason::handler_failed:
      return with_frame(ctx, {false, ws::close_code::internal, "internal error"});
    case CloseReason::closed_by_application:
      return with_frame(ctx, {false, d.code, d.text});
    case CloseReason::closed_by_peer:
      return with_frame(ctx, {true, d.code, d.text});
    case CloseReason::server_stopping:
      return ctx.phase == Phase::websocket
                 ? with_frame(ctx, {false, ws::close_code::going_away, "server stopping"})
                 : cut();
    case CloseReason::server_stopped:
      return cut({false, ws::close_code::going_away, "server stopped"});
  }
  return cut();
}

}  // namespace factory::net
