#pragma once
// The wording validation errors share, so the catalog (contract/catalog.hpp)
// and the step parameters (contract/step_params.hpp) say "must be a map, got a
// list" alike and every error is one line naming where it is: "<where>: <what>".
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::validation {

// How a value reads in an error: "a map", "a list", "a string", "a boolean",
// "a number", "empty".
std::string type_name(const nlohmann::json& j);

// invalid_argument "<where>: <what>".
Error bad(const std::string& where, const std::string& what);

// A value quoted in an error: 'value', escaped as display::sanitize does and
// cut at 80 characters ('…...'), so the log line it ends up in carries
// neither its escapes nor all of a long one.
std::string quoted(const std::string& value);

// body[key] as a required string, or "<where>: <key>: missing" / "want a
// string, got a number".
Result<std::string> string_field(const nlohmann::json& body, const char* key,
                                 const std::string& where);

// Rejects keys outside `allowed`, so a typo ("pakages") is an error, not a default.
Status only_keys(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                 const std::string& where);

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ");

// One mapping of a config file, read strictly. Each read names its key and
// the type it wants; every message names the key by its path from the top
// of the file ("<file>: agents.listen: want a string, got a number"); and
// done() refuses any key that no read asked for, naming it the same way
// ("<file>: unknown key 'agents.listn' (known: listen, ...)"), so a typo is
// an error, not a silent default. An absent key, or one written with no
// value (`key:`), leaves the default in place.
class ConfigMap {
 public:
  // node must be a map or null (an empty section); path is its place in the
  // file ("" at the top, "agents" below it).
  static Result<ConfigMap> open(const nlohmann::json& node, std::string file,
                                std::string path = "");

  Status read(const char* key, std::string& out);
  Status read(const char* key, bool& out);
  Status read(const char* key, std::size_t& out, std::size_t max);
  // The value for a caller that reads its own type (nullptr when absent or
  // empty), and errors about it worded like the others.
  const nlohmann::json* take(const char* key);
  Error wrong_type(const char* key, const std::string& want) const;
  Error bad_value(const char* key, const std::string& what) const;
  // A mapping inside this one, read the same way (its done() is the caller's).
  Result<ConfigMap> section(const char* key);

  Status done() const;

 private:
  ConfigMap(const nlohmann::json& node, std::string file, std::string path)
      : node_(node), file_(std::move(file)), path_(std::move(path)) {}
  std::string key_path(const std::string& key) const;

  const nlohmann::json& node_;
  std::string file_, path_;
  std::vector<std::string> known_;
};

bool is_https_url(const std::string& s);
bool is_http_url(const std::string& s);  // http:// or https://

}  // namespace factory::validation
