#pragma once
// How a connection ends, decided in one place: every path that ends a
// connection (a failed handshake, a peer that hangs up, a deadline, a
// websocket frame the codec refuses, the application's close, the server
// stopping) names its reason, and decide_close says what follows: a close
// frame and the closing handshake, the socket cut at once, or nothing (a
// close already under way ends it); what the application's on_close hears;
// which counter of ServerStats it adds to; and the log line. Pure: the
// connection (Conn::fail) carries the decision out.
#include <chrono>
#include <cstdint>
#include <string>

#include "common/net/server.hpp"

namespace factory::net {

enum class CloseReason : std::uint8_t {
  handshake_failed,       // the TLS handshake failed (detail: OpenSSL's words)
  peer_hung_up,           // close_notify, a FIN or a reset
  left_before_answer,     // the client hung up while its answer was prepared
  write_failed,           // the socket refused our bytes
  too_much_pipelined,     // requests sent ahead of their answers, past the limits
  deadline,               // handshake, request, keep-alive, closing, or a stranger's life
  idle_timeout,           // a websocket that did not answer the ping
  protocol_violation,     // a websocket frame the codec refused (detail: code, reason)
  handler_failed,         // the application's handler threw
  closed_by_application,  // WsConnection::close (detail: code, reason)
  closed_by_peer,         // the peer's close frame (detail: its code and reason)
  server_stopping,        // Server::stop, the io threads running
  server_stopped,         // ~Server, after the io threads stopped
};
const char* close_reason_name(CloseReason r);

// The variable part of a reason: a close code and its text, or what failed.
struct CloseDetail {
  std::uint16_t code = 0;
  std::string text;
};

// Where the connection is when the reason comes.
struct CloseContext {
  enum class Phase { before_websocket, websocket, closing } phase = Phase::before_websocket;
  bool stranger = false;  // no certificate yet, on a server that asks for one
  std::chrono::seconds stranger_deadline{10};
};

struct CloseAction {
  enum class Kind {
    none,         // already closing: the closing handshake under way ends it
    close_frame,  // an open websocket: our close frame, then up to 2 s for the peer's
    cut,          // the socket closed now
  } kind = Kind::cut;
  // What on_close hears (a websocket), and the close frame's code and text.
  CloseInfo info;
  enum class Count { none, handshake_failure, deadline, oversize } count = Count::none;
  // For the log, after the server's name and the peer's address; warn: the
  // peer broke a protocol (worth an operator's eye), else debug.
  std::string log;
  bool warn = false;
};

CloseAction decide_close(CloseReason why, const CloseDetail& detail, const CloseContext& ctx);

}  // namespace factory::net
