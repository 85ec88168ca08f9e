#pragma once
// YAML <-> JSON, so configs and the catalog are YAML on disk and JSON inside,
// and every `-o yaml` output is the same document as `-o json`.
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"

namespace factory {

nlohmann::json yaml_to_json(const YAML::Node& node);
Result<nlohmann::json> parse_yaml(const std::string& text, const std::string& what);
Result<nlohmann::json> load_yaml_file(const std::string& path);
std::string to_yaml(const nlohmann::json& j);

}  // namespace factory
