#pragma once
// The server's side of RFC 6455 framing, as plain functions over bytes: the
// decoder takes whatever the TLS layer read (any split, any size) and yields
// whole messages; the encoder makes the server's (unmasked) frames. Nothing
// here does I/O, so every rule is unit-tested and fuzzed on bytes alone.
//
// Why our own: an idle connection must cost almost nothing. The decoder owns
// no buffer while the peer is between frames (the partial frame, if any, is
// the only thing it keeps), and gives its memory back once a message is out.
//
// What a client may send, and what closes its connection (with the code the
// RFC names): unmasked frames, RSV bits, unknown opcodes, fragmented or long
// control frames, a continuation that continues nothing (1002); a message
// longer than the limit, which is refused as soon as a frame header declares
// it (1009); text that is not UTF-8 (1007). No extensions are negotiated.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace factory::net::ws {

enum class Opcode : std::uint8_t {
  continuation = 0x0,
  text = 0x1,
  binary = 0x2,
  close = 0x8,
  ping = 0x9,
  pong = 0xA,
};

namespace close_code {
inline constexpr std::uint16_t normal = 1000;
inline constexpr std::uint16_t going_away = 1001;
inline constexpr std::uint16_t protocol_error = 1002;
inline constexpr std::uint16_t unsupported = 1003;
inline constexpr std::uint16_t no_status = 1005;  // never sent: "the close frame had no code"
inline constexpr std::uint16_t abnormal = 1006;   // never sent: "no close frame at all"
inline constexpr std::uint16_t invalid_payload = 1007;
inline constexpr std::uint16_t policy = 1008;
inline constexpr std::uint16_t too_big = 1009;
inline constexpr std::uint16_t internal = 1011;
}  // namespace close_code

// One complete thing the peer said.
struct Message {
  Opcode op = Opcode::text;  // text, binary, ping, pong or close
  std::string payload;       // for close: the reason text (the code is apart)
  std::uint16_t close_code = close_code::no_status;
};

// Why the decoder gave up: the connection must be closed with this code.
struct Violation {
  std::uint16_t code = close_code::protocol_error;
  std::string reason;
};

class Decoder {
 public:
  explicit Decoder(std::size_t max_message) : max_message_(max_message) {}

  // The limit may change over a connection's life (e.g. once it is trusted).
  void set_max_message(std::size_t n) { max_message_ = n; }
  std::size_t max_message() const { return max_message_; }

  // Consumes all of bytes and appends every message it completes to out.
  // After a violation the decoder is spent: every later call returns it again.
  // Returns false on a violation (see violation()).
  bool feed(std::string_view bytes, std::vector<Message>& out);
  const Violation& violation() const { return violation_; }
  bool failed() const { return failed_; }

  // Bytes held for a frame or message not yet complete; 0 between messages,
  // and then the decoder holds no heap memory.
  std::size_t buffered() const { return partial_.size() + message_.size(); }

 private:
  bool fail(std::uint16_t code, std::string reason);
  // Tries to take one frame from the front of data; returns bytes used (0: need more).
  bool take_frame(std::string_view data, std::size_t& used, std::vector<Message>& out);

  std::size_t max_message_;
  std::string partial_;  // the start of a frame whose end has not arrived
  std::string message_;  // data frames of a fragmented message so far
  Opcode message_op_ = Opcode::text;
  bool in_message_ = false;
  bool failed_ = false;
  Violation violation_;
};

// A server frame (FIN set, unmasked).
std::string encode_frame(Opcode op, std::string_view payload);
// A close frame: the code, then at most 123 bytes of reason (cut on a UTF-8
// boundary so the frame stays valid).
std::string encode_close(std::uint16_t code, std::string_view reason);

// A client frame (masked with the given key), for tests and test clients.
std::string encode_client_frame(Opcode op, std::string_view payload, const std::uint8_t mask[4],
                                bool fin = true);

bool valid_utf8(std::string_view s);

// Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 section 4.2.2).
std::string accept_key(std::string_view client_key);

}  // namespace factory::net::ws
