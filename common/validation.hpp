#pragma once
// The wording validation errors share, so the catalog (catalog.hpp) and the
// step parameters (step_params.hpp) say "must be a map, got a list" alike and
// every error is one line naming where it is: "<where>: <what>".
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

// Rejects keys outside `allowed`, so a typo ("pakages") is an error, not a default.
Status only_keys(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                 const std::string& where);

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ");

bool is_https_url(const std::string& s);
bool is_http_url(const std::string& s);  // http:// or https://

}  // namespace factory::validation
