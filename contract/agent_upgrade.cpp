#include "contract/agent_upgrade.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "common/display.hpp"
#include "common/pki.hpp"
#include "common/validation.hpp"
#include "contract/protocol.hpp"

namespace factory::proto {

using nlohmann::json;
namespace limits = agent_upgrade_limits;

namespace {

Error agent_upgrade_bad(const char* what, const char* field, const std::string& why) {
  return validation::bad(std::string(what) + ": " + field, why);
}

bool is_agent_upgrade_id(std::string_view s) {
  if (s.empty() || s.size() > limits::kUpgradeId) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// https:// and then only printable ASCII without spaces: the agent hands it
// to its HTTP client, and it is shown in logs.
bool is_download_url(const std::string& s) {
  if (s.size() > limits::kUrl || !validation::is_https_url(s)) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

Status expect_tag(const char* what, const json& body, const char* key, std::string_view want,
                  bool required) {
  auto it = body.find(key);
  if (it == body.end()) {
    if (required) return agent_upgrade_bad(what, key, "missing");
    return Status{};
  }
  if (it->is_string() && it->get_ref<const std::string&>() == want) return Status{};
  return agent_upgrade_bad(what, key,
                           "want '" + std::string(want) + "', got " +
                               (it->is_string() ? validation::quoted(it->get<std::string>())
                                                : validation::type_name(*it)));
}

// An unsigned count in [lo, hi], or why not.
Result<std::uint64_t> count_field(const char* what, const json& body, const char* key,
                                  std::uint64_t lo, std::uint64_t hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return agent_upgrade_bad(what, key, "missing");
  if (!it->is_number_integer())
    return agent_upgrade_bad(what, key, "want a whole number, got " + validation::type_name(*it));
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v >= lo && v <= hi) return v;
  } else if (auto v = it->get<std::int64_t>();
             v >= 0 && static_cast<std::uint64_t>(v) >= lo && static_cast<std::uint64_t>(v) <= hi) {
    return static_cast<std::uint64_t>(v);
  }
  return agent_upgrade_bad(
      what, key,
      "want " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + it->dump());
}

}  // namespace

bool is_agent_version(std::string_view s) {
  if (s.empty() || s.size() > limits::kVersion) return false;
  if (!std::isalnum(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '~' ||
           c == '_' || c == '-';
  });
}

const char* state_name(AgentUpgradeState s) {
  switch (s) {
    case AgentUpgradeState::installing:
      return "installing";
    case AgentUpgradeState::refused:
      return "refused";
    case AgentUpgradeState::upgraded:
      return "upgraded";
    case AgentUpgradeState::rolled_back:
      return "rolled_back";
  }
  return "unknown";
}

json AgentUpgradeOrder::to_json() const {
  return {{"action", action::kUpgrade},
          {"upgrade_id", upgrade_id},
          {"version", version},
          {"sha256", sha256},
          {"url", url},
          {"size", size},
          {"confirm_within_s", confirm_within_s}};
}

json AgentUpgradeEvent::to_json() const {
  return {{"kind", kAgentUpgradeEventKind}, {"upgrade_id", upgrade_id},
          {"state", state_name(state)},     {"from_version", from_version},
          {"to_version", to_version},       {"reason", reason}};
}

Result<AgentUpgradeOrder> decode_agent_upgrade_order(const json& body) {
  constexpr const char* what = "agent upgrade";
  if (!body.is_object())
    return Error(Errc::invalid_argument,
                 std::string(what) + ": want an object, got " + validation::type_name(body));
  if (auto st = expect_tag(what, body, "action", action::kUpgrade, false); !st.ok())
    return st.error();
  AgentUpgradeOrder o;

  auto id = validation::string_field(body, "upgrade_id", what);
  if (!id) return id.error();
  if (!is_agent_upgrade_id(*id))
    return agent_upgrade_bad(
        what, "upgrade_id",
        "want 1 to 64 characters of A-Z a-z 0-9 . _ -, got " + validation::quoted(*id));
  o.upgrade_id = std::move(*id);

  auto version = validation::string_field(body, "version", what);
  if (!version) return version.error();
  if (!is_agent_version(*version))
    return agent_upgrade_bad(
        what, "version",
        "want 1 to 64 characters of A-Z a-z 0-9 . + ~ _ - starting with a letter or a "
        "digit, got " +
            validation::quoted(*version));
  o.version = std::move(*version);

  auto sha = validation::string_field(body, "sha256", what);
  if (!sha) return sha.error();
  if (!pki::is_sha256_hex(*sha))
    return agent_upgrade_bad(what, "sha256",
                             "want 64 lower-case hex digits, got " + validation::quoted(*sha));
  o.sha256 = std::move(*sha);

  auto url = validation::string_field(body, "url", what);
  if (!url) return url.error();
  if (!is_download_url(*url))
    return agent_upgrade_bad(what, "url",
                             "want an https:// URL of at most " + std::to_string(limits::kUrl) +
                                 " printable characters without spaces, got " +
                                 validation::quoted(*url));
  o.url = std::move(*url);

  auto size = count_field(what, body, "size", 1, limits::kMaxSize);
  if (!size) return size.error();
  o.size = *size;

  if (body.contains("confirm_within_s") && !body["confirm_within_s"].is_null()) {
    auto c = count_field(what, body, "confirm_within_s", limits::kMinConfirmSeconds,
                         limits::kMaxConfirmSeconds);
    if (!c) return c.error();
    o.confirm_within_s = static_cast<int>(*c);
  }
  return o;
}

Result<AgentUpgradeEvent> decode_agent_upgrade_event(const json& body) {
  constexpr const char* what = "agent upgrade event";
  if (!body.is_object())
    return Error(Errc::invalid_argument,
                 std::string(what) + ": want an object, got " + validation::type_name(body));
  if (auto st = expect_tag(what, body, "kind", kAgentUpgradeEventKind, true); !st.ok())
    return st.error();
  AgentUpgradeEvent e;

  auto id = validation::string_field(body, "upgrade_id", what);
  if (!id) return id.error();
  if (!is_agent_upgrade_id(*id))
    return agent_upgrade_bad(
        what, "upgrade_id",
        "want 1 to 64 characters of A-Z a-z 0-9 . _ -, got " + validation::quoted(*id));
  e.upgrade_id = std::move(*id);

  auto state = validation::string_field(body, "state", what);
  if (!state) return state.error();
  bool known = false;
  for (auto s : {AgentUpgradeState::installing, AgentUpgradeState::refused,
                 AgentUpgradeState::upgraded, AgentUpgradeState::rolled_back})
    if (*state == state_name(s)) {
      e.state = s;
      known = true;
    }
  if (!known)
    return agent_upgrade_bad(
        what, "state",
        "want installing, refused, upgraded or rolled_back, got " + validation::quoted(*state));

  for (auto [key, out] :
       {std::pair{"from_version", &e.from_version}, std::pair{"to_version", &e.to_version}}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;  // unknown
    if (!it->is_string())
      return agent_upgrade_bad(what, key, "want a string, got " + validation::type_name(*it));
    const auto& v = it->get_ref<const std::string&>();
    if (!v.empty() && !is_agent_version(v))
      return agent_upgrade_bad(what, key, "not a version: " + validation::quoted(v));
    *out = v;
  }

  if (auto it = body.find("reason"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return agent_upgrade_bad(what, "reason", "want a string, got " + validation::type_name(*it));
    const auto& r = it->get_ref<const std::string&>();
    if (r.size() > limits::kReason)
      return agent_upgrade_bad(what, "reason",
                               std::to_string(r.size()) + " bytes, more than the " +
                                   std::to_string(limits::kReason) + " allowed");
    if (!display::is_display_safe(r))
      return agent_upgrade_bad(what, "reason", "holds a control character or is not valid UTF-8");
    e.reason = r;
  }
  return e;
}

Result<std::string> agent_binary_version(std::string_view binary) {
  // The mark is in every binary that links this file, as the needle of this
  // very search, followed by a NUL: the version is at the first mark that
  // is followed by something else.
  std::optional<Error> malformed;
  for (auto at = binary.find(kAgentVersionMark); at != std::string_view::npos;
       at = binary.find(kAgentVersionMark, at + 1)) {
    std::string_view rest = binary.substr(at + kAgentVersionMark.size());
    if (rest.empty() || rest.front() == '\0') continue;
    auto end = rest.find('\0');
    std::string version(rest.substr(0, std::min(end, limits::kVersion + 1)));
    if (end != std::string_view::npos && is_agent_version(version)) return version;
    malformed = Error(Errc::invalid_argument, "the factory-agent version mark holds " +
                                                  validation::quoted(version) +
                                                  ", not a version of at most 64 bytes");
  }
  if (malformed) return *malformed;
  return Error(Errc::not_found,
               "no factory-agent version mark: not an agent binary, or one built before agents "
               "could update themselves");
}

}  // namespace factory::proto
