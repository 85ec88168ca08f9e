#include "contract/maintenance.hpp"

#include <algorithm>
#include <cctype>

#include "common/display.hpp"
#include "common/durations.hpp"
#include "common/validation.hpp"
#include "contract/protocol.hpp"

namespace factory::proto {

using nlohmann::json;

namespace {

Error maintenance_bad(const char* field, const std::string& what) {
  return validation::bad(std::string("maintenance notice: ") + field, what);
}

bool is_notice_id(std::string_view s) {
  if (s.empty() || s.size() > maintenance_limits::kNoticeId) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// A DNS-1123 subdomain as Kubernetes names nodes, with upper-case letters
// allowed too: a QEMU host is named by its hostname, which may have them.
// Labels of letters, digits and hyphens, 1 to 63 each, starting and ending
// with a letter or a digit.
bool is_node_name(std::string_view s) {
  if (s.empty() || s.size() > maintenance_limits::kNode) return false;
  std::size_t start = 0;
  for (;;) {
    std::size_t dot = s.find('.', start);
    std::string_view label = s.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (label.empty() || label.size() > 63) return false;
    auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
    if (!alnum(label.front()) || !alnum(label.back())) return false;
    if (!std::all_of(label.begin(), label.end(), [&](char c) { return alnum(c) || c == '-'; }))
      return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

// parse_rfc3339 reads the date and the time and ignores what follows them,
// so an offset would be read as UTC and a day past the month's end rolls
// into the next month. Here the rest is read too: an optional fraction
// (dropped: the deadline is to the second), then "Z"; and the time must
// read back as written, which refuses 2026-02-30 and a leap second.
Result<std::chrono::system_clock::time_point> parse_deadline(const std::string& s) {
  constexpr std::size_t kSeconds = 19;  // 2026-11-30T09:00:00
  auto refused = [&] {
    return maintenance_bad(
        "deadline",
        "want an RFC 3339 time in UTC like 2026-11-30T09:00:00Z, got " + validation::quoted(s));
  };
  if (s.size() < kSeconds + 1 || s.size() > 40) return refused();
  std::size_t i = kSeconds;
  if (s[i] == '.') {
    std::size_t digits = 0;
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) ++digits;
    if (digits == 0 || digits > 9) return refused();
  }
  if (s.substr(i) != "Z" && s.substr(i) != "z") return refused();
  const std::string whole = s.substr(0, kSeconds);
  auto t = parse_rfc3339(whole);
  if (!t || format_rfc3339(*t) != whole + "Z") return refused();
  return *t;
}

// A line break is the one control character a notice's message may hold:
// every line must show on a terminal as it is (no escape sequence, no bidi
// override, valid UTF-8), since `wall` puts it on every logged-in user's.
bool is_message(const std::string& s) {
  std::size_t start = 0;
  for (;;) {
    std::size_t nl = s.find('\n', start);
    std::string_view line(s.data() + start, (nl == std::string::npos ? s.size() : nl) - start);
    if (!display::is_display_safe(line)) return false;
    if (nl == std::string::npos) return true;
    start = nl + 1;
  }
}

}  // namespace

const char* state_name(MaintenanceState s) {
  switch (s) {
    case MaintenanceState::scheduled:
      return "scheduled";
    case MaintenanceState::cancelled:
      return "cancelled";
  }
  return "unknown";
}

json MaintenanceNotice::to_json() const {
  return {{"action", action::kMaintenance},       {"notice_id", notice_id},
          {"state", state_name(state)},           {"node", node},
          {"deadline", format_rfc3339(deadline)}, {"message", message}};
}

json MaintenanceNotice::event() const {
  return {{"kind", kMaintenanceEventKind},
          {"notice_id", notice_id},
          {"state", state == MaintenanceState::scheduled ? kMaintenanceEventReceived
                                                         : kMaintenanceEventCancelled},
          {"node", node},
          {"deadline", format_rfc3339(deadline)}};
}

Result<MaintenanceNotice> decode_maintenance_notice(const json& body) {
  if (!body.is_object())
    return Error(Errc::invalid_argument,
                 "maintenance notice: want an object, got " + validation::type_name(body));
  if (auto a = body.find("action");
      a != body.end() &&
      !(a->is_string() && a->get_ref<const std::string&>() == action::kMaintenance))
    return maintenance_bad("action", "want '" + std::string(action::kMaintenance) + "', got " +
                                         (a->is_string() ? validation::quoted(a->get<std::string>())
                                                         : validation::type_name(*a)));
  MaintenanceNotice n;

  auto id = validation::string_field(body, "notice_id", "maintenance notice");
  if (!id) return id.error();
  if (!is_notice_id(*id))
    return maintenance_bad("notice_id", "want 1 to 64 characters of A-Z a-z 0-9 . _ -, got " +
                                            validation::quoted(*id));
  n.notice_id = std::move(*id);

  auto state = validation::string_field(body, "state", "maintenance notice");
  if (!state) return state.error();
  if (*state == "scheduled")
    n.state = MaintenanceState::scheduled;
  else if (*state == "cancelled")
    n.state = MaintenanceState::cancelled;
  else
    return maintenance_bad("state",
                           "want scheduled or cancelled, got " + validation::quoted(*state));

  auto node = validation::string_field(body, "node", "maintenance notice");
  if (!node) return node.error();
  if (!is_node_name(*node))
    return maintenance_bad("node",
                           "want a host name (DNS labels of letters, digits and hyphens, at most " +
                               std::to_string(maintenance_limits::kNode) + " bytes), got " +
                               validation::quoted(*node));
  n.node = std::move(*node);

  auto deadline = validation::string_field(body, "deadline", "maintenance notice");
  if (!deadline) return deadline.error();
  auto t = parse_deadline(*deadline);
  if (!t) return t.error();
  n.deadline = *t;

  // The message is optional: a notice says enough without one.
  if (auto m = body.find("message"); m != body.end() && !m->is_null()) {
    if (!m->is_string())
      return maintenance_bad("message", "want a string, got " + validation::type_name(*m));
    const auto& text = m->get_ref<const std::string&>();
    if (text.size() > maintenance_limits::kMessage)
      return maintenance_bad("message", std::to_string(text.size()) + " bytes, more than the " +
                                            std::to_string(maintenance_limits::kMessage) +
                                            " allowed");
    if (!is_message(text))
      return maintenance_bad(
          "message", "holds a control character other than a line break, or is not valid UTF-8");
    n.message = text;
  }
  return n;
}

}  // namespace factory::proto
