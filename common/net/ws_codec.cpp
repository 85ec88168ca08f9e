#include "common/net/ws_codec.hpp"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cstring>

namespace factory::net::ws {

namespace {

bool is_control(std::uint8_t op) {
  return (op & 0x8) != 0;
}

bool known_opcode(std::uint8_t op) {
  return op == 0x0 || op == 0x1 || op == 0x2 || op == 0x8 || op == 0x9 || op == 0xA;
}

// Codes a peer may put in a close frame (RFC 6455 7.4.1 and the IANA registry).
bool valid_close_code(std::uint16_t c) {
  if (c >= 3000 && c <= 4999) return true;
  return c == 1000 || c == 1001 || c == 1002 || c == 1003 || (c >= 1007 && c <= 1011);
}

void release(std::string& s) {
  std::string().swap(s);
}

}  // namespace

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    std::uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

bool Decoder::fail(std::uint16_t code, std::string reason) {
  failed_ = true;
  violation_ = {code, std::move(reason)};
  release(partial_);
  release(message_);
  return false;
}

bool Decoder::take_frame(std::string_view d, std::size_t& used, std::vector<Message>& out) {
  used = 0;
  if (d.size() < 2) return true;
  const auto b0 = static_cast<std::uint8_t>(d[0]);
  const auto b1 = static_cast<std::uint8_t>(d[1]);
  const bool fin = (b0 & 0x80) != 0;
  const std::uint8_t op = b0 & 0x0F;
  if (b0 & 0x70)
    return fail(close_code::protocol_error, "reserved bits set (no extension was agreed)");
  if (!known_opcode(op))
    return fail(close_code::protocol_error, "unknown opcode " + std::to_string(op));
  if (!(b1 & 0x80)) return fail(close_code::protocol_error, "client frames must be masked");
  std::uint64_t len = b1 & 0x7F;
  std::size_t header = 2;
  if (is_control(op)) {
    if (!fin) return fail(close_code::protocol_error, "fragmented control frame");
    if (len > 125) return fail(close_code::protocol_error, "control frame over 125 bytes");
  }
  if (len == 126) {
    if (d.size() < 4) return true;
    len = (std::uint64_t{static_cast<std::uint8_t>(d[2])} << 8) | static_cast<std::uint8_t>(d[3]);
    header = 4;
  } else if (len == 127) {
    if (d.size() < 10) return true;
    len = 0;
    for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<std::uint8_t>(d[2 + i]);
    if (len >> 63) return fail(close_code::protocol_error, "frame length with the top bit set");
    header = 10;
  }
  if (!is_control(op)) {
    if (op == 0x0 && !in_message_)
      return fail(close_code::protocol_error, "continuation frame outside a fragmented message");
    if (op != 0x0 && in_message_)
      return fail(close_code::protocol_error, "new message inside a fragmented one");
    // Refused on the header: a peer that announces more than the limit is
    // never given the memory to send it.
    const std::uint64_t so_far = in_message_ ? message_.size() : 0;
    if (len > max_message_ || so_far + len > max_message_)
      return fail(close_code::too_big, "message of " + std::to_string(so_far + len) +
                                           " bytes over the " + std::to_string(max_message_) +
                                           "-byte limit");
  }
  const std::size_t mask_at = header;
  header += 4;
  if (d.size() < header || d.size() - header < len) return true;
  const auto* mask = reinterpret_cast<const std::uint8_t*>(d.data() + mask_at);
  std::string payload(d.substr(header, static_cast<std::size_t>(len)));
  for (std::size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(payload[i] ^ mask[i & 3]);
  used = header + static_cast<std::size_t>(len);

  if (is_control(op)) {
    Message m;
    m.op = static_cast<Opcode>(op);
    if (m.op == Opcode::close) {
      if (payload.size() == 1) return fail(close_code::protocol_error, "close frame of one byte");
      if (payload.size() >= 2) {
        m.close_code = static_cast<std::uint16_t>((static_cast<std::uint8_t>(payload[0]) << 8) |
                                                  static_cast<std::uint8_t>(payload[1]));
        if (!valid_close_code(m.close_code))
          return fail(close_code::protocol_error,
                      "invalid close code " + std::to_string(m.close_code));
        payload.erase(0, 2);
        if (!valid_utf8(payload))
          return fail(close_code::invalid_payload, "close reason is not UTF-8");
      }
    }
    m.payload = std::move(payload);
    out.push_back(std::move(m));
    return true;
  }
  if (!in_message_ && fin) {
    if (op == 0x1 && !valid_utf8(payload))
      return fail(close_code::invalid_payload, "text is not UTF-8");
    out.push_back({static_cast<Opcode>(op), std::move(payload), close_code::no_status});
    return true;
  }
  if (!in_message_) {
    in_message_ = true;
    message_op_ = static_cast<Opcode>(op);
  }
  message_ += payload;
  if (fin) {
    if (message_op_ == Opcode::text && !valid_utf8(message_))
      return fail(close_code::invalid_payload, "text is not UTF-8");
    out.push_back({message_op_, std::move(message_), close_code::no_status});
    release(message_);
    in_message_ = false;
  }
  return true;
}

bool Decoder::feed(std::string_view bytes, std::vector<Message>& out) {
  if (failed_) return false;
  // Common case: nothing held over, whole frames in this read; no copy of
  // the input is made.
  std::string_view data = bytes;
  if (!partial_.empty()) {
    partial_.append(bytes);
    data = partial_;
  }
  std::size_t pos = 0;
  for (;;) {
    std::size_t used = 0;
    if (!take_frame(data.substr(pos), used, out)) return false;
    if (used == 0) break;
    pos += used;
  }
  if (pos == data.size()) {
    release(partial_);
  } else if (partial_.empty()) {
    partial_.assign(data.substr(pos));
  } else {
    partial_.erase(0, pos);
  }
  return true;
}

namespace {

void append_length(std::string& f, std::size_t n, std::uint8_t mask_bit) {
  if (n < 126) {
    f.push_back(static_cast<char>(mask_bit | n));
  } else if (n <= 0xFFFF) {
    f.push_back(static_cast<char>(mask_bit | 126));
    f.push_back(static_cast<char>(n >> 8));
    f.push_back(static_cast<char>(n & 0xFF));
  } else {
    f.push_back(static_cast<char>(mask_bit | 127));
    for (int i = 7; i >= 0; --i)
      f.push_back(static_cast<char>((static_cast<std::uint64_t>(n) >> (8 * i)) & 0xFF));
  }
}

}  // namespace

std::string encode_frame(Opcode op, std::string_view payload) {
  std::string f;
  f.reserve(payload.size() + 10);
  f.push_back(static_cast<char>(0x80 | static_cast<std::uint8_t>(op)));
  append_length(f, payload.size(), 0);
  f.append(payload);
  return f;
}

std::string encode_close(std::uint16_t code, std::string_view reason) {
  std::size_t n = std::min<std::size_t>(reason.size(), 123);
  // Do not cut a UTF-8 sequence in two.
  while (n > 0 && n < reason.size() && (static_cast<std::uint8_t>(reason[n]) & 0xC0) == 0x80) --n;
  std::string payload;
  payload.push_back(static_cast<char>(code >> 8));
  payload.push_back(static_cast<char>(code & 0xFF));
  payload.append(reason.substr(0, n));
  return encode_frame(Opcode::close, payload);
}

std::string encode_client_frame(Opcode op, std::string_view payload, const std::uint8_t mask[4],
                                bool fin) {
  std::string f;
  f.push_back(static_cast<char>((fin ? 0x80 : 0) | static_cast<std::uint8_t>(op)));
  append_length(f, payload.size(), 0x80);
  f.append(reinterpret_cast<const char*>(mask), 4);
  for (std::size_t i = 0; i < payload.size(); ++i)
    f.push_back(static_cast<char>(payload[i] ^ mask[i & 3]));
  return f;
}

std::string accept_key(std::string_view client_key) {
  static constexpr std::string_view kGuid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  std::string in(client_key);
  in.append(kGuid);
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(in.data()), in.size(), digest);
  unsigned char b64[4 * ((SHA_DIGEST_LENGTH + 2) / 3) + 1];
  int n = EVP_EncodeBlock(b64, digest, SHA_DIGEST_LENGTH);
  return std::string(reinterpret_cast<char*>(b64), static_cast<std::size_t>(n));
}

}  // namespace factory::net::ws
