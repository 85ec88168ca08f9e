#pragma once
// A tenant's name becomes a Kubernetes namespace, object names, and the CN of
// its agent's client certificate, so it must be a DNS-1123 label: the
// strictest of those places.
#include <string_view>

#include "common/error.hpp"

namespace factory::enroll {

inline constexpr size_t kMaxTenantNameLength = 63;

// OK when `name` is 1..63 characters of [a-z0-9-], starting and ending with
// [a-z0-9]; otherwise Errc::invalid_argument saying which rule it broke.
Status validate_tenant_name(std::string_view name);

}  // namespace factory::enroll
