#include "agent/upgrade/upgrade_state.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/atomic_file.hpp"
#include "common/display.hpp"
#include "common/pki.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxText = proto::agent_upgrade_limits::kReason;

Error bad(const std::string& field, const std::string& why) {
  return Error(Errc::invalid_argument, "upgrade state: " + field + ": " + why);
}

// A string field: absent or null reads as "".
Status read_string(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) return bad(key, "want a string");
  const auto& v = it->get_ref<const std::string&>();
  if (v.size() > 4096 || !display::is_display_safe(v))
    return bad(key, "longer than 4096 bytes, or holds a control character");
  out = v;
  return {};
}

Status check_version(const char* key, const std::string& v) {
  if (!v.empty() && !proto::is_agent_version(v)) return bad(key, "not a version");
  return {};
}

Status check_sha(const char* key, const std::string& v) {
  if (!v.empty() && !pki::is_sha256_hex(v)) return bad(key, "not a SHA-256");
  return {};
}

Status check_path(const char* key, const std::string& v) {
  if (!v.empty() && v.front() != '/') return bad(key, "not an absolute path");
  return {};
}

Status read_int(const json& j, const char* key, int lo, int hi, int& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_number_integer()) return bad(key, "want a whole number");
  auto v = it->get<long long>();
  if (v < lo || v > hi) return bad(key, "want " + std::to_string(lo) + " to " + std::to_string(hi));
  out = static_cast<int>(v);
  return {};
}

const char* const kKnownKeys[] = {"upgrade_id", "from_version", "to_version",       "from_sha256",
                                  "to_sha256",  "binary_path",  "stable",           "candidate",
                                  "phase",      "deadline",     "confirm_within_s", "starts",
                                  "last_exit",  "reason",       "reported"};

}  // namespace

const char* phase_name(UpgradePhase p) {
  switch (p) {
    case UpgradePhase::installing:
      return "installing";
    case UpgradePhase::refused:
      return "refused";
    case UpgradePhase::trying:
      return "trying";
    case UpgradePhase::confirmed:
      return "confirmed";
    case UpgradePhase::rolled_back:
      return "rolled_back";
  }
  return "unknown";
}

json UpgradeState::to_json() const {
  json j = extra.is_object() ? extra : json::object();
  j["upgrade_id"] = upgrade_id;
  j["from_version"] = from_version;
  j["to_version"] = to_version;
  j["from_sha256"] = from_sha256;
  j["to_sha256"] = to_sha256;
  j["binary_path"] = binary_path;
  j["stable"] = stable;
  j["candidate"] = candidate;
  j["phase"] = phase_name(phase);
  j["deadline"] = deadline ? json(format_rfc3339(*deadline)) : json();
  j["confirm_within_s"] = confirm_within_s;
  j["starts"] = starts;
  j["last_exit"] = last_exit ? json({{"service_result", last_exit->service_result},
                                     {"exit_code", last_exit->exit_code},
                                     {"exit_status", last_exit->exit_status}})
                             : json();
  j["reason"] = reason;
  j["reported"] = reported;
  return j;
}

Result<UpgradeState> UpgradeState::from_json(const json& j) {
  if (!j.is_object()) return bad("the file", "not a JSON object");
  UpgradeState s;
  s.binary_path.clear();
  for (auto [key, out] :
       {std::pair{"upgrade_id", &s.upgrade_id}, std::pair{"from_version", &s.from_version},
        std::pair{"to_version", &s.to_version}, std::pair{"from_sha256", &s.from_sha256},
        std::pair{"to_sha256", &s.to_sha256}, std::pair{"binary_path", &s.binary_path},
        std::pair{"stable", &s.stable}, std::pair{"candidate", &s.candidate},
        std::pair{"reason", &s.reason}})
    if (auto st = read_string(j, key, *out); !st.ok()) return st.error();
  if (s.upgrade_id.empty()) return bad("upgrade_id", "missing");
  if (s.binary_path.empty()) return bad("binary_path", "missing");
  for (auto st :
       {check_version("from_version", s.from_version), check_version("to_version", s.to_version),
        check_sha("from_sha256", s.from_sha256), check_sha("to_sha256", s.to_sha256),
        check_path("binary_path", s.binary_path), check_path("stable", s.stable),
        check_path("candidate", s.candidate)})
    if (!st.ok()) return st.error();
  if (s.reason.size() > kMaxText) s.reason.resize(kMaxText);

  std::string phase;
  if (auto st = read_string(j, "phase", phase); !st.ok()) return st.error();
  bool known = false;
  for (auto p : {UpgradePhase::installing, UpgradePhase::refused, UpgradePhase::trying,
                 UpgradePhase::confirmed, UpgradePhase::rolled_back})
    if (phase == phase_name(p)) {
      s.phase = p;
      known = true;
    }
  if (!known) return bad("phase", "want installing, refused, trying, confirmed or rolled_back");

  std::string deadline;
  if (auto st = read_string(j, "deadline", deadline); !st.ok()) return st.error();
  if (!deadline.empty()) {
    auto t = parse_rfc3339(deadline);
    if (!t) return bad("deadline", t.error().message);
    s.deadline = *t;
  }
  if (s.phase == UpgradePhase::trying && (!s.deadline || s.stable.empty() || s.candidate.empty()))
    return bad("phase", "trying without a deadline, a stable slot and a candidate slot");

  for (auto st : {read_int(j, "confirm_within_s", 0, 86400, s.confirm_within_s),
                  read_int(j, "starts", 0, 1'000'000, s.starts)})
    if (!st.ok()) return st.error();

  if (auto it = j.find("last_exit"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("last_exit", "want an object");
    ServiceExit e;
    for (auto [key, out] :
         {std::pair{"service_result", &e.service_result}, std::pair{"exit_code", &e.exit_code},
          std::pair{"exit_status", &e.exit_status}})
      if (auto st = read_string(*it, key, *out); !st.ok())
        return st.error().with_context("last_exit");
    s.last_exit = e;
  }
  if (auto it = j.find("reported"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("reported", "want true or false");
    s.reported = it->get<bool>();
  }
  for (auto& [k, v] : j.items())
    if (std::find(std::begin(kKnownKeys), std::end(kKnownKeys), k) == std::end(kKnownKeys))
      s.extra[k] = v;
  return s;
}

Result<std::optional<UpgradeState>> load_upgrade_state(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::optional<UpgradeState>();
  auto text = read_file(file);
  if (!text) return text.error();
  auto j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Error(Errc::invalid_argument, file.string() + ": not JSON");
  auto s = UpgradeState::from_json(j);
  if (!s) return s.error().with_context(file.string());
  return std::optional<UpgradeState>(std::move(*s));
}

Status save_upgrade_state(const std::filesystem::path& file, const UpgradeState& s) {
  if (auto st = ensure_dir(file.parent_path(), 0700); !st.ok()) return st;
  return write_file_atomic(file, s.to_json().dump(2) + "\n", 0600);
}

Result<UpgradeStateLock> UpgradeStateLock::acquire(const std::filesystem::path& state_file) {
  if (auto st = ensure_dir(state_file.parent_path(), 0700); !st.ok()) return st.error();
  const std::string path = state_file.string() + ".lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("open " + path, errno);
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd);
    return errno_error("lock " + path, err);
  }
  return UpgradeStateLock(fd);
}

UpgradeStateLock::~UpgradeStateLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

}  // namespace factory::agent
