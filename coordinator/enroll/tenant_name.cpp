#include "coordinator/enroll/tenant_name.hpp"

#include <string>

namespace factory::enroll {

namespace {
bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

Error invalid(std::string_view name, const std::string& why) {
  // Printable names are echoed; anything else could mess up a terminal or a log.
  bool printable = name.size() <= 100;
  for (char c : name) printable = printable && c >= 0x20 && c < 0x7f;
  std::string shown = printable ? "'" + std::string(name) + "'" : "(not printable)";
  return Error(Errc::invalid_argument,
               "invalid tenant name " + shown + ": " + why +
                   " (use lower-case letters, digits and '-', e.g. team-a)");
}
}  // namespace

Status validate_tenant_name(std::string_view name) {
  if (name.empty()) return invalid(name, "it is empty");
  if (name.size() > kMaxTenantNameLength)
    return invalid(name, "it is longer than " + std::to_string(kMaxTenantNameLength) +
                             " characters");
  for (char c : name)
    if (!lower_alnum(c) && c != '-')
      return invalid(name, "it contains a character other than a-z, 0-9 and '-'");
  if (!lower_alnum(name.front()) || !lower_alnum(name.back()))
    return invalid(name, "it must start and end with a letter or digit");
  return {};
}

}  // namespace factory::enroll
