#pragma once
// How commands print: `-o table|json|yaml` and the tables, as both binaries
// print them (common/cli/output.hpp), and the cells only `factory` shows.
#include <string>

#include "common/cli/output.hpp"

namespace factory::cli {

// A table cell for how long ago an RFC 3339 time was ("5m" + suffix): "-"
// when there is none, the text as it is when it is not a time.
std::string age(const std::string& rfc3339, const std::string& suffix = "");

}  // namespace factory::cli
