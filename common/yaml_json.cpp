#include "common/yaml_json.hpp"

#include <cctype>
#include <charconv>
#include <sstream>
#include <string_view>

#include "common/atomic_file.hpp"
#include "common/display.hpp"

namespace factory {

namespace {
nlohmann::json scalar_to_json(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  // Quoted scalars ("123") stay strings; plain ones are typed as YAML 1.2 core.
  if (node.Tag() == "!") return s;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == "null" || s == "~" || s == "Null" || s.empty()) return nullptr;
  int64_t i;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec == std::errc() && p == s.data() + s.size()) return i;
  double d;
  auto [p2, ec2] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec2 == std::errc() && p2 == s.data() + s.size() &&
      s.find_first_of(".eE") != std::string::npos)
    return d;
  return s;
}

// A literal block (|) keeps a string exactly only when it is lines of
// printable text ending in exactly one newline (the block's clip chomping)
// and its first line does not start with a blank (which would need an
// indentation indicator). Anything else (a \r, a control character, no
// final newline) is double-quoted, where YAML escapes what it must.
bool literal_keeps(const std::string& s) {
  if (s.size() < 2 || s.back() != '\n' || s[s.size() - 2] == '\n') return false;
  if (s[0] == ' ' || s[0] == '\t' || s[0] == '\n') return false;
  std::string_view rest(s);
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    if (!display::is_display_safe(rest.substr(0, nl))) return false;
    rest.remove_prefix(nl + 1);
  }
  return true;
}

// Keys Factory writes are names; anything else is quoted too.
bool plain_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' &&
        c != '/')
      return false;
  return true;
}

void emit(YAML::Emitter& out, const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      out << YAML::BeginMap;
      for (auto& [k, v] : j.items()) {
        out << YAML::Key;
        if (plain_key(k))
          out << k;
        else
          out << YAML::DoubleQuoted << k;
        out << YAML::Value;
        emit(out, v);
      }
      out << YAML::EndMap;
      break;
    case nlohmann::json::value_t::array:
      out << YAML::BeginSeq;
      for (auto& v : j) emit(out, v);
      out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (literal_keeps(s))
        out << YAML::Literal << s;
      else
        out << YAML::DoubleQuoted << s;
      break;
    }
    case nlohmann::json::value_t::boolean:
      out << j.get<bool>();
      break;
    case nlohmann::json::value_t::null:
      out << YAML::Null;
      break;
    case nlohmann::json::value_t::number_integer:
      out << j.get<int64_t>();
      break;
    case nlohmann::json::value_t::number_unsigned:
      out << j.get<uint64_t>();
      break;
    case nlohmann::json::value_t::number_float:
      out << j.get<double>();
      break;
    default:
      out << YAML::Null;
      break;
  }
}
}  // namespace

nlohmann::json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (auto it = node.begin(); it != node.end(); ++it)
        o[it->first.as<std::string>()] = yaml_to_json(it->second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& n : node) a.push_back(yaml_to_json(n));
      return a;
    }
    case YAML::NodeType::Scalar:
      return scalar_to_json(node);
    default:
      return nullptr;
  }
}

Result<nlohmann::json> parse_yaml(const std::string& text, const std::string& what) {
  try {
    return yaml_to_json(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return Error(Errc::invalid_argument,
                 what + ": invalid YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

Result<nlohmann::json> load_yaml_file(const std::string& path) {
  auto text = read_file(path);
  if (!text) return text.error();
  return parse_yaml(*text, path);
}

std::string to_yaml(const nlohmann::json& j) {
  YAML::Emitter out;
  emit(out, j);
  std::string text = std::string(out.c_str()) + "\n";
  // yaml-cpp writes DEL as it is, which YAML does not allow unescaped; only
  // a double-quoted scalar can hold one (literal_keeps, plain_key), where
  // \x7f is its escape.
  for (auto at = text.find('\x7f'); at != std::string::npos; at = text.find('\x7f', at))
    text.replace(at, 1, "\\x7f");
  return text;
}

}  // namespace factory
