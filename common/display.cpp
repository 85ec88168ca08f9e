#include "common/display.hpp"

#include <cstdint>

namespace factory::display {

namespace {

constexpr char kHex[] = "0123456789abcdef";

// The code point starting at s[i] and its length in bytes; length 0 when
// the bytes there are not well-formed UTF-8 (overlong forms, surrogates and
// values past U+10FFFF included), as RFC 3629 defines it.
struct Decoded {
  std::uint32_t cp = 0;
  std::size_t len = 0;
};

Decoded decode(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](std::size_t k) -> int {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    return (b & 0xC0) == 0x80 ? (b & 0x3F) : -1;
  };
  if (b0 < 0x80) return {b0, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    int c1 = cont(1);
    if (c1 < 0) return {};
    return {static_cast<std::uint32_t>(((b0 & 0x1F) << 6) | c1), 2};
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    int c1 = cont(1), c2 = cont(2);
    if (c1 < 0 || c2 < 0) return {};
    std::uint32_t cp = ((b0 & 0x0F) << 12) | (c1 << 6) | c2;
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
    return {cp, 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    int c1 = cont(1), c2 = cont(2), c3 = cont(3);
    if (c1 < 0 || c2 < 0 || c3 < 0) return {};
    std::uint32_t cp = ((b0 & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3;
    if (cp < 0x10000 || cp > 0x10FFFF) return {};
    return {cp, 4};
  }
  return {};
}

// Code points that are valid UTF-8 but that a terminal or a text renderer
// acts on: C1 controls (some terminals take U+009B as CSI), the bidi
// embeddings, overrides, isolates and marks, and the separators that some
// renderers break lines at.
bool escaped_code_point(std::uint32_t cp) {
  if (cp >= 0x80 && cp <= 0x9F) return true;
  if (cp >= 0x202A && cp <= 0x202E) return true;
  if (cp >= 0x2066 && cp <= 0x2069) return true;
  return cp == 0x200E || cp == 0x200F || cp == 0x061C || cp == 0x2028 || cp == 0x2029;
}

bool escaped_ascii(unsigned char b) {
  return b < 0x20 || b == 0x7F;
}

void append_byte_escape(std::string& out, unsigned char b) {
  switch (b) {
    case '\n':
      out += "\\n";
      return;
    case '\r':
      out += "\\r";
      return;
    case '\t':
      out += "\\t";
      return;
    default:
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
  }
}

void append_code_point_escape(std::string& out, std::uint32_t cp) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 0xF];
}

}  // namespace

bool is_display_safe(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (escaped_ascii(b)) return false;
      ++i;
      continue;
    }
    Decoded d = decode(text, i);
    if (d.len == 0 || escaped_code_point(d.cp)) return false;
    i += d.len;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  if (is_display_safe(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (escaped_ascii(b))
        append_byte_escape(out, b);
      else
        out += static_cast<char>(b);
      ++i;
      continue;
    }
    Decoded d = decode(text, i);
    if (d.len == 0) {
      append_byte_escape(out, b);
      ++i;
    } else if (escaped_code_point(d.cp)) {
      append_code_point_escape(out, d.cp);
      i += d.len;
    } else {
      out.append(text.substr(i, d.len));
      i += d.len;
    }
  }
  return out;
}

std::size_t columns(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace factory::display
