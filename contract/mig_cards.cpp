#include "contract/mig_cards.hpp"

#include <cctype>
#include <regex>

namespace factory {

bool valid_mig_profile_name(std::string_view name) {
  static const std::regex re(R"(^[1-8]g\.[0-9]{1,4}gb(\+[a-z]{1,8})?$)");
  return name.size() <= 24 && std::regex_match(name.begin(), name.end(), re);
}

bool tier_needs_mig(const catalog::Tier& tier) {
  for (const auto& st : tier.steps) {
    if (st.kind == "mig" && st.params.value("enabled", true)) return true;
    if (st.kind != "helm_release") continue;
    const nlohmann::json& v = st.params.value("values", nlohmann::json::object());
    const auto ptr = nlohmann::json::json_pointer("/migManager/config/data");
    if (v.is_object() && v.contains(ptr)) return true;
  }
  return false;
}

std::optional<std::string> mig_chip(std::uint32_t vendor, std::uint32_t device) {
  if (vendor != 0x10de) return std::nullopt;
  if (device >= 0x20b0 && device <= 0x20ff) return "GA100";
  if (device >= 0x2300 && device <= 0x23ff) return "GH100";
  if (device >= 0x2900 && device <= 0x29ff) return "GB100";
  return std::nullopt;
}

std::optional<PciId> parse_pci_selector(std::string_view s) {
  if (s.size() != 9 || s[4] != ':') return std::nullopt;
  auto hex = [](std::string_view h) -> std::optional<std::uint32_t> {
    std::uint32_t v = 0;
    for (char c : h) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
      v = v * 16 +
          static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                         ? c - '0'
                                         : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
    }
    return v;
  };
  auto v = hex(s.substr(0, 4));
  auto d = hex(s.substr(5, 4));
  if (!v || !d) return std::nullopt;
  return PciId{*v, *d};
}

}  // namespace factory
