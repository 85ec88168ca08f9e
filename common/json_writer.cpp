#include "common/json_writer.hpp"

namespace factory {

void append_json_string(std::string& out, std::string_view s) {
  // Printable ASCII but the quote and the backslash is written as it is,
  // which is nearly every string a hot path writes (names, versions, times,
  // codes). Anything else, a control character or a byte of a multi-byte
  // sequence (valid or not), goes through nlohmann's own serializer, so
  // its escapes and its replacement of invalid UTF-8 are exactly the tree's.
  bool plain = true;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      plain = false;
      break;
    }
  }
  if (plain) {
    out += '"';
    out += s;
    out += '"';
    return;
  }
  out +=
      nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void JsonText::value(double d) {
  // nlohmann's number form (shortest round trip, "700.0", null for NaN).
  raw(nlohmann::json(d).dump());
}

void JsonText::value(const nlohmann::json& j) {
  raw(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace factory
