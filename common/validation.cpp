#include "common/validation.hpp"

#include <algorithm>

#include "common/display.hpp"

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

std::string quoted(const std::string& value) {
  constexpr std::size_t kShown = 80;
  std::string shown = display::sanitize(value.size() > kShown ? value.substr(0, kShown) : value);
  return "'" + shown + (value.size() > kShown ? "...'" : "'");
}

Result<std::string> string_field(const nlohmann::json& body, const char* key,
                                 const std::string& where) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return bad(where + ": " + key, "missing");
  if (!it->is_string()) return bad(where + ": " + key, "want a string, got " + type_name(*it));
  return it->get<std::string>();
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

Result<ConfigMap> ConfigMap::open(const json& node, std::string file, std::string path) {
  if (!node.is_null() && !node.is_object())
    return bad(file, (path.empty() ? "" : path + ": ") + "want a map, got " + type_name(node));
  return ConfigMap(node, std::move(file), std::move(path));
}

std::string ConfigMap::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

const json* ConfigMap::take(const char* key) {
  known_.push_back(key);
  if (!node_.is_object()) return nullptr;
  auto it = node_.find(key);
  if (it == node_.end() || it->is_null()) return nullptr;
  return &*it;
}

Error ConfigMap::wrong_type(const char* key, const std::string& want) const {
  auto it = node_.find(key);
  return bad(file_, key_path(key) + ": want " + want + ", got " +
                        (it == node_.end() ? std::string("nothing") : type_name(*it)));
}

Error ConfigMap::bad_value(const char* key, const std::string& what) const {
  return bad(file_, key_path(key) + ": " + what);
}

Status ConfigMap::read(const char* key, std::string& out) {
  const json* v = take(key);
  if (!v) return {};
  if (!v->is_string()) return wrong_type(key, "a string");
  out = v->get<std::string>();
  return {};
}

Status ConfigMap::read(const char* key, bool& out) {
  const json* v = take(key);
  if (!v) return {};
  if (!v->is_boolean()) return wrong_type(key, "true or false");
  out = v->get<bool>();
  return {};
}

Status ConfigMap::read(const char* key, std::size_t& out, std::size_t max) {
  const json* v = take(key);
  if (!v) return {};
  // YAML's whole numbers arrive as signed integers: a negative one is out
  // of range like a too large one.
  const bool whole =
      v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0);
  if (!whole || v->get<std::uint64_t>() > max)
    return wrong_type(key, "a whole number from 0 to " + std::to_string(max));
  out = static_cast<std::size_t>(v->get<std::uint64_t>());
  return {};
}

Result<ConfigMap> ConfigMap::section(const char* key) {
  const json* v = take(key);
  static const json empty;
  if (!v) return ConfigMap(empty, file_, key_path(key));
  if (!v->is_object()) return wrong_type(key, "a map");
  return ConfigMap(*v, file_, key_path(key));
}

Status ConfigMap::done() const {
  if (!node_.is_object()) return {};
  for (auto& [key, _] : node_.items())
    if (std::find(known_.begin(), known_.end(), key) == known_.end())
      return bad(file_, "unknown key '" + key_path(key) + "' (known: " + join(known_) + ")");
  return {};
}

bool is_https_url(const std::string& s) {
  return s.rfind("https://", 0) == 0 && s.size() > 8;
}

bool is_http_url(const std::string& s) {
  return is_https_url(s) || (s.rfind("http://", 0) == 0 && s.size() > 7);
}

}  // namespace factory::validation
