#include "coordinator/catalog/source.hpp"

#include <filesystem>
#include <system_error>

#include "common/yaml_json.hpp"

namespace factory::catalog {

Result<std::string> configured_path(const std::string& flag_path, const std::string& config_path) {
  if (!flag_path.empty()) return flag_path;
  std::error_code ec;
  if (config_path.empty() || !std::filesystem::exists(config_path, ec)) return std::string();
  auto cfg = load_yaml_file(config_path);
  if (!cfg) return cfg.error();
  if (!cfg->is_object() || !cfg->contains("catalog") || (*cfg)["catalog"].is_null())
    return std::string();
  if (!(*cfg)["catalog"].is_string())
    return Error(Errc::invalid_argument,
                 "config " + config_path + ": catalog: must be the path of a catalog file");
  std::filesystem::path p = (*cfg)["catalog"].get<std::string>();
  if (p.empty()) return std::string();
  if (p.is_relative()) p = std::filesystem::path(config_path).parent_path() / p;
  return p.string();
}

Result<Catalog> load_configured(const std::string& flag_path, const std::string& config_path) {
  auto path = configured_path(flag_path, config_path);
  if (!path) return path.error();
  return load(*path);
}

}  // namespace factory::catalog
