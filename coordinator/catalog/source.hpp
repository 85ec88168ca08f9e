#pragma once
// Which catalog the coordinator uses: `--catalog FILE` when given, else the
// `catalog:` key of the coordinator config (a path, relative to the config
// file's folder), else the built-in catalog compiled into the binary.
// Every command that needs tiers (catalog, tenant create, serve) goes through
// here so they all see the same products.
#include <string>

#include "common/error.hpp"
#include "contract/catalog.hpp"

namespace factory::catalog {

// The catalog file the flag or the config names; empty for the built-in one.
// A missing config file is not an error (the built-in catalog applies).
Result<std::string> configured_path(const std::string& flag_path, const std::string& config_path);

Result<Catalog> load_configured(const std::string& flag_path, const std::string& config_path);

}  // namespace factory::catalog
