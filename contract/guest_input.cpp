#include "contract/guest_input.hpp"

#include <algorithm>
#include <cmath>

#include "common/durations.hpp"

namespace factory::proto {

using nlohmann::json;

const char* reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::missing:
      return "missing";
    case RejectReason::wrong_type:
      return "wrong_type";
    case RejectReason::too_long:
      return "too_long";
    case RejectReason::too_many:
      return "too_many";
    case RejectReason::too_deep:
      return "too_deep";
    case RejectReason::out_of_range:
      return "out_of_range";
    case RejectReason::bad_format:
      return "bad_format";
    case RejectReason::unknown_value:
      return "unknown_value";
    case RejectReason::unknown_field:
      return "unknown_field";
  }
  return "unknown";
}

void Rejections::add(std::string field, RejectReason r) {
  ++counts_[static_cast<std::size_t>(r)];
  ++total_;
  if (kept_.size() >= kKept) return;
  if (field.size() > kMaxFieldName) field = field.substr(0, kMaxFieldName - 3) + "...";
  kept_.push_back({std::move(field), r});
}

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

bool is_version(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-' || c == '+' || c == '~';
  });
}

bool is_hostname(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  std::size_t label = 0;
  for (char c : s) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return true;
}

bool is_hex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

bool is_clean_text(const std::string& s, std::size_t max) {
  if (s.size() > max) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    // C1 controls (U+0080..U+009F) are 0xC2 0x80..0x9F in UTF-8: some
    // terminals act on them as on ESC sequences.
    if (c == 0xc2 && i + 1 < s.size()) {
      auto n = static_cast<unsigned char>(s[i + 1]);
      if (n >= 0x80 && n <= 0x9f) return false;
    }
  }
  return true;
}

json bounded(const json& v, const std::string& where, int depth, Rejections& out,
             const FreeFormLimits& lim) {
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().size() > lim.string) {
      out.add(where, RejectReason::too_long);
      return json();
    }
    return v;
  }
  if (!v.is_object() && !v.is_array()) return v;  // numbers (always finite), booleans, null
  if (depth >= lim.depth) {
    out.add(where, RejectReason::too_deep);
    return json();
  }
  if (v.is_array()) {
    json a = json::array();
    std::size_t i = 0;
    for (const auto& item : v) {
      if (i == lim.items) {
        out.add(where, RejectReason::too_many);
        break;
      }
      json b = bounded(item, where + "[" + std::to_string(i) + "]", depth + 1, out, lim);
      if (!b.is_null() || item.is_null()) a.push_back(std::move(b));
      ++i;
    }
    return a;
  }
  json o = json::object();
  std::size_t n = 0;
  for (const auto& [k, item] : v.items()) {
    if (n == lim.items) {
      out.add(where, RejectReason::too_many);
      break;
    }
    const std::string at = where.empty() ? k : where + "." + k;
    if (k.empty() || k.size() > lim.key || !is_name(k)) {
      out.add(where.empty() ? "(key)" : where + ".(key)", RejectReason::bad_format);
      continue;
    }
    json b = bounded(item, at, depth + 1, out, lim);
    if (!b.is_null() || item.is_null()) o[k] = std::move(b);
    ++n;
  }
  return o;
}

const json* FieldReader::get(const char* key) {
  known_.insert(key);
  if (!obj_.is_object()) return nullptr;
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> FieldReader::string(const char* key, std::size_t max) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return reject(key, RejectReason::wrong_type), std::nullopt;
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max) return reject(key, RejectReason::too_long), std::nullopt;
  return s;
}

std::optional<std::string> FieldReader::clean_text(const char* key, std::size_t max) {
  return matching(key, max, [max](const std::string& s) { return is_clean_text(s, max); });
}

std::optional<std::string> FieldReader::name(const char* key, std::size_t max) {
  return matching(key, max, [](const std::string& s) { return is_name(s); });
}

std::optional<std::string> FieldReader::one_of(const char* key,
                                               std::initializer_list<std::string_view> vals,
                                               std::size_t max) {
  auto s = string(key, max);
  if (!s) return s;
  if (std::find(vals.begin(), vals.end(), *s) == vals.end())
    return reject(key, RejectReason::unknown_value), std::nullopt;
  return s;
}

std::optional<std::string> FieldReader::time(const char* key, std::size_t max) {
  return matching(key, max, [](const std::string& s) { return parse_rfc3339(s).ok(); });
}

std::optional<long double> FieldReader::whole(const char* key, long double lo, long double hi) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) return reject(key, RejectReason::wrong_type), std::nullopt;
  // Parsed text holds a non-negative number as unsigned, JSON built in C++
  // as signed: both are the same number. A long double holds either exactly.
  long double x = v->is_number_unsigned() ? static_cast<long double>(v->get<std::uint64_t>())
                                          : static_cast<long double>(v->get<std::int64_t>());
  if (x < lo || x > hi) return reject(key, RejectReason::out_of_range), std::nullopt;
  return x;
}

std::optional<double> FieldReader::number(const char* key, double lo, double hi) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return reject(key, RejectReason::wrong_type), std::nullopt;
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return reject(key, RejectReason::out_of_range), std::nullopt;
  return d;
}

std::optional<bool> FieldReader::boolean(const char* key) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return reject(key, RejectReason::wrong_type), std::nullopt;
  return v->get<bool>();
}

std::optional<json> FieldReader::free_form(const char* key, bool any_type,
                                           const FreeFormLimits& lim) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!any_type && !v->is_object()) return reject(key, RejectReason::wrong_type), std::nullopt;
  return bounded(*v, at(key), 1, out_, lim);
}

std::vector<const json*> FieldReader::objects(const char* key, std::size_t max) {
  std::vector<const json*> out;
  const json* v = get(key);
  if (!v) return out;
  if (!v->is_array()) return reject(key, RejectReason::wrong_type), out;
  std::size_t i = 0;
  for (const auto& e : *v) {
    if (out.size() == max) {
      reject(key, RejectReason::too_many);
      break;
    }
    if (!e.is_object()) {
      out_.add(item(key, i++), RejectReason::wrong_type);
      continue;
    }
    out.push_back(&e);
    ++i;
  }
  return out;
}

void FieldReader::known(std::initializer_list<const char*> keys) {
  for (const char* k : keys) known_.insert(k);
}

void FieldReader::finish() {
  if (!obj_.is_object()) return;
  for (const auto& [k, v] : obj_.items())
    if (!known_.count(k))
      out_.add(prefix_.empty() ? k : prefix_ + "." + k, RejectReason::unknown_field);
}

}  // namespace factory::proto
