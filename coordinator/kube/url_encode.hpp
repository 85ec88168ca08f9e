#pragma once
// Percent-encoding for the query strings and path segments the client
// builds (label selectors, field selectors, container names).
#include <string>

namespace factory::kube {

// RFC 3986's unreserved characters stay; every other byte becomes %XX.
std::string url_encode(const std::string& s);

}  // namespace factory::kube
