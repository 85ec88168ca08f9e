#include "coordinator/tenants/k8s_names.hpp"

#include <array>
#include <string>

#include "coordinator/enroll/tenant_name.hpp"

namespace factory::tenants {

namespace {

bool lower_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
bool alnum(char c) {
  return lower_alnum(c) || (c >= 'A' && c <= 'Z');
}
bool digit(char c) {
  return c >= '0' && c <= '9';
}

// Echoes input only when it is short and printable, so a message never
// carries terminal escapes or a pasted blob into a log.
std::string shown(std::string_view s) {
  bool printable = s.size() <= 100;
  for (char c : s) printable = printable && c >= 0x20 && c < 0x7f;
  return printable ? "'" + std::string(s) + "'" : "(not printable)";
}

Error invalid_k8s_name(std::string message) {
  return Error(Errc::invalid_argument, std::move(message));
}

}  // namespace

bool is_dns1123_subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    std::string_view part = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    // A subdomain's parts are not limited to 63 on their own, only the whole.
    if (part.empty()) return false;
    for (char c : part)
      if (!lower_alnum(c) && c != '-') return false;
    if (!lower_alnum(part.front()) || !lower_alnum(part.back())) return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

namespace {

// ([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9], at most 63 characters: the name
// part of a qualified name, and (when not empty) a label value.
bool is_qualified_name_part(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  return alnum(s.front()) && alnum(s.back());
}

// "[prefix/]name" where prefix is a DNS subdomain.
bool is_qualified_name(std::string_view s, bool require_prefix) {
  size_t slash = s.find('/');
  if (slash == std::string_view::npos) return !require_prefix && is_qualified_name_part(s);
  return is_dns1123_subdomain(s.substr(0, slash)) && is_qualified_name_part(s.substr(slash + 1));
}

}  // namespace

bool is_dns1123_label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!lower_alnum(c) && c != '-') return false;
  return lower_alnum(s.front()) && lower_alnum(s.back());
}

Status validate_vm_name(std::string_view name) {
  if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st;
  if (!(name.front() >= 'a' && name.front() <= 'z'))
    return invalid_k8s_name("invalid tenant name " + shown(name) +
                            ": it must start with a letter, because its SSH Service '<name>-ssh' "
                            "must be a DNS-1035 label");
  if (name.size() > kMaxVmNameLength)
    return invalid_k8s_name("invalid tenant name " + shown(name) + ": it is longer than " +
                            std::to_string(kMaxVmNameLength) +
                            " characters, which leaves no room for its SSH Service '<name>-ssh'");
  return {};
}

Status validate_namespace_name(std::string_view name) {
  if (!is_dns1123_label(name))
    return invalid_k8s_name(
        "invalid namespace " + shown(name) +
        ": want a DNS-1123 label (1-63 of a-z, 0-9 and '-', starting and ending "
        "with a letter or digit)");
  return {};
}

Status validate_node_port(int port) {
  if (port < kMinNodePort || port > kMaxNodePort)
    return invalid_k8s_name("node port " + std::to_string(port) + " is out of range: pick one in " +
                            std::to_string(kMinNodePort) + "-" + std::to_string(kMaxNodePort) +
                            ", or leave it out and Kubernetes picks a free one");
  return {};
}

Status validate_quantity(std::string_view what, std::string_view q) {
  auto bad = [&](const std::string& why) {
    return invalid_k8s_name(std::string(what) + " " + shown(q) +
                            " is not a Kubernetes quantity: " + why + " (e.g. 8, 500m, 16Gi)");
  };
  size_t i = 0;
  size_t digits = 0, dots = 0;
  bool nonzero = false;
  for (; i < q.size() && (digit(q[i]) || q[i] == '.'); ++i) {
    if (q[i] == '.')
      ++dots;
    else {
      ++digits;
      nonzero = nonzero || q[i] != '0';
    }
  }
  if (digits == 0 || dots > 1) return bad("it must start with a number");
  std::string_view suffix = q.substr(i);
  static constexpr std::array<std::string_view, 15> kSuffixes = {
      "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P"};
  bool known = suffix == "E";
  for (auto s : kSuffixes) known = known || suffix == s;
  if (!known && (suffix.front() == 'e' || suffix.front() == 'E')) {
    // A decimal exponent: e or E, an optional sign, and digits.
    std::string_view exp = suffix.substr(1);
    if (!exp.empty() && (exp.front() == '+' || exp.front() == '-')) exp.remove_prefix(1);
    known = !exp.empty();
    for (char c : exp) known = known && digit(c);
  }
  if (!known) return bad("unknown suffix " + shown(suffix));
  if (!nonzero) return bad("it must be more than zero");
  return {};
}

Status validate_resource_name(std::string_view name) {
  if (name.find('/') == std::string_view::npos || !is_qualified_name(name, true))
    return invalid_k8s_name("invalid GPU resource name " + shown(name) +
                            ": want a device plugin resource such as nvidia.com/AD104GL_L4 (see "
                            "`factory kubevirt allowlist`)");
  return {};
}

Status validate_label(std::string_view key, std::string_view value) {
  if (!is_qualified_name(key, false))
    return invalid_k8s_name(
        "invalid label key " + shown(key) +
        ": want [prefix/]name, the name 1-63 of A-Z, a-z, 0-9, '-', '_' and '.'");
  if (!value.empty() && !is_qualified_name_part(value))
    return invalid_k8s_name(
        "invalid value " + shown(value) + " for label " + shown(key) +
        ": want at most 63 of A-Z, a-z, 0-9, '-', '_' and '.', starting and ending "
        "with a letter or digit");
  return {};
}

}  // namespace factory::tenants
