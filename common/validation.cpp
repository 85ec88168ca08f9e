#include "common/validation.hpp"

#include <algorithm>

namespace factory::validation {

using nlohmann::json;

std::string type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::object:
      return "a map";
    case json::value_t::array:
      return "a list";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "empty";
    default:
      return "a number";
  }
}

Error bad(const std::string& where, const std::string& what) {
  return Error(Errc::invalid_argument, where + ": " + what);
}

Status only_keys(const json& obj, const std::vector<std::string>& allowed,
                 const std::string& where) {
  for (auto& [key, _] : obj.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      return bad(where, "unknown key '" + key + "' (known: " + join(allowed) + ")");
  return ok_status();
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

bool is_https_url(const std::string& s) {
  return s.rfind("https://", 0) == 0 && s.size() > 8;
}

bool is_http_url(const std::string& s) {
  return is_https_url(s) || (s.rfind("http://", 0) == 0 && s.size() > 7);
}

}  // namespace factory::validation
