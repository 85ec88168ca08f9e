#include "agent/guest/mig.hpp"

#include <cctype>
#include <regex>
#include <sstream>

#include "common/subprocess.hpp"
#include "contract/mig_cards.hpp"

namespace factory::agent {

namespace {

// std::regex recurses per character: a line longer than any nvidia-smi row
// is refused before a pattern sees it.
constexpr std::size_t kMaxLine = 400;

Error bad_output(const std::string& what, const std::string& why) {
  return Error(Errc::protocol, what + ": " + why);
}

std::string mig_trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Result<std::vector<std::string>> bounded_lines(const std::string& output, const std::string& what) {
  if (output.size() > kMigMaxOutput)
    return bad_output(what, "output of " + std::to_string(output.size()) + " bytes, more than " +
                                std::to_string(kMigMaxOutput));
  std::vector<std::string> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > kMaxLine)
      return bad_output(what, "a line of " + std::to_string(line.size()) + " characters");
    out.push_back(std::move(line));
  }
  return out;
}

// The regexes below take at most 6 digits per number: stoi cannot overflow.
int to_int(const std::ssub_match& m) {
  return std::stoi(m.str());
}

bool says_none(const std::vector<std::string>& lines) {
  for (const auto& l : lines) {
    std::string t = mig_trim(l);
    if (t == "No MIG-enabled devices found." || t == "No GPU instances found." ||
        t == "No compute instances found." || t == "No MIG-supported devices found.")
      return true;
  }
  return false;
}

// A table row that names a profile ("| 0  MIG 1g.18gb ...") but does not
// match its table's pattern: the output is not what the parser knows.
bool looks_like_row(const std::string& line) {
  return line.size() > 1 && line[0] == '|' && line.find(" MIG ") != std::string::npos;
}

}  // namespace

std::vector<std::string> mig_mode_query_args() {
  return {"--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader"};
}

bool valid_mig_profile_name(const std::string& name) {
  return factory::valid_mig_profile_name(name);
}

int mig_profile_slices(const std::string& name) {
  if (!valid_mig_profile_name(name)) return 0;
  return name[0] - '0';
}

Result<std::vector<MigProfile>> parse_mig_profiles(const std::string& output) {
  const std::string what = "nvidia-smi mig -lgip";
  auto lines = bounded_lines(output, what);
  if (!lines) return lines.error();
  // "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |"
  static const std::regex row(
      R"(^\|\s+(\d{1,6})\s+MIG\s+(\S{1,32})\s+(\d{1,6})\s+(\d{1,6})/(\d{1,6})\s+(\d{1,6}(?:\.\d{1,3})?)\s+(?:Yes|No)\s+(\d{1,6})\s)");
  std::vector<MigProfile> out;
  bool header = false;
  for (const auto& l : *lines) {
    if (l.find("GPU instance profiles:") != std::string::npos) header = true;
    std::smatch m;
    if (!std::regex_search(l, m, row)) {
      if (looks_like_row(l))
        return bad_output(what, "a row it does not know: '" + mig_trim(l) + "'");
      continue;
    }
    if (out.size() >= kMigMaxEntries) return bad_output(what, "too many profiles");
    MigProfile p;
    p.gpu = to_int(m[1]);
    p.name = m[2];
    p.id = to_int(m[3]);
    p.free = to_int(m[4]);
    p.total = to_int(m[5]);
    p.memory_gib = std::stod(m[6].str());
    p.sm = to_int(m[7]);
    if (!valid_mig_profile_name(p.name))
      return bad_output(what, "profile name '" + p.name + "' is not one MIG names");
    if (p.free > p.total) return bad_output(what, p.name + ": more free instances than total");
    out.push_back(std::move(p));
  }
  if (out.empty() && !header && !says_none(*lines))
    return bad_output(what, "no profile table in its output");
  return out;
}

Result<std::vector<MigGpuInstance>> parse_mig_gpu_instances(const std::string& output) {
  const std::string what = "nvidia-smi mig -lgi";
  auto lines = bounded_lines(output, what);
  if (!lines) return lines.error();
  // "|   0  MIG 1g.18gb          19        7          0:1     |"
  static const std::regex row(
      R"(^\|\s+(\d{1,6})\s+MIG\s+(\S{1,32})\s+(\d{1,6})\s+(\d{1,6})\s+(\d{1,6}):(\d{1,6})\s+\|)");
  std::vector<MigGpuInstance> out;
  bool header = false;
  for (const auto& l : *lines) {
    if (l.find("GPU instances:") != std::string::npos) header = true;
    std::smatch m;
    if (!std::regex_search(l, m, row)) {
      if (looks_like_row(l))
        return bad_output(what, "a row it does not know: '" + mig_trim(l) + "'");
      continue;
    }
    if (out.size() >= kMigMaxEntries) return bad_output(what, "too many GPU instances");
    MigGpuInstance g;
    g.gpu = to_int(m[1]);
    g.profile = m[2];
    g.profile_id = to_int(m[3]);
    g.instance_id = to_int(m[4]);
    g.placement_start = to_int(m[5]);
    g.placement_size = to_int(m[6]);
    if (!valid_mig_profile_name(g.profile))
      return bad_output(what, "profile name '" + g.profile + "' is not one MIG names");
    out.push_back(std::move(g));
  }
  if (out.empty() && !header && !says_none(*lines))
    return bad_output(what, "no GPU instance table in its output");
  return out;
}

Result<std::vector<MigComputeInstance>> parse_mig_compute_instances(const std::string& output) {
  const std::string what = "nvidia-smi mig -lci";
  auto lines = bounded_lines(output, what);
  if (!lines) return lines.error();
  // "|   0      1       MIG 3g.71gb          2         0          0:3     |"
  static const std::regex row(
      R"(^\|\s+(\d{1,6})\s+(\d{1,6})\s+MIG\s+(\S{1,32})\s+(\d{1,6})\s+(\d{1,6})\s+\d{1,6}:\d{1,6}\s+\|)");
  std::vector<MigComputeInstance> out;
  bool header = false;
  for (const auto& l : *lines) {
    if (l.find("Compute instances:") != std::string::npos) header = true;
    std::smatch m;
    if (!std::regex_search(l, m, row)) {
      if (looks_like_row(l))
        return bad_output(what, "a row it does not know: '" + mig_trim(l) + "'");
      continue;
    }
    if (out.size() >= kMigMaxEntries) return bad_output(what, "too many compute instances");
    MigComputeInstance c;
    c.gpu = to_int(m[1]);
    c.gpu_instance_id = to_int(m[2]);
    c.profile = m[3];
    c.profile_id = to_int(m[4]);
    c.instance_id = to_int(m[5]);
    out.push_back(std::move(c));
  }
  if (out.empty() && !header && !says_none(*lines))
    return bad_output(what, "no compute instance table in its output");
  return out;
}

Result<std::vector<MigDevice>> parse_mig_devices(const std::string& output) {
  const std::string what = "nvidia-smi -L";
  auto lines = bounded_lines(output, what);
  if (!lines) return lines.error();
  static const std::regex gpu_line(R"(^GPU (\d{1,6}): )");
  // "  MIG 1g.18gb     Device  0: (UUID: MIG-1b2c...)"
  static const std::regex mig_line(
      R"(^\s+MIG\s+(\S{1,32})\s+Device\s+(\d{1,6}):\s+\(UUID:\s+(MIG-[0-9A-Za-z-]{1,64})\))");
  std::vector<MigDevice> out;
  std::optional<int> gpu;
  for (const auto& l : *lines) {
    std::smatch m;
    if (std::regex_search(l, m, gpu_line)) {
      gpu = to_int(m[1]);
      continue;
    }
    if (!std::regex_search(l, m, mig_line)) {
      if (mig_trim(l).rfind("MIG ", 0) == 0)
        return bad_output(what, "a MIG line it does not know: '" + mig_trim(l) + "'");
      continue;
    }
    if (!gpu) return bad_output(what, "a MIG device before any GPU line");
    if (out.size() >= kMigMaxEntries) return bad_output(what, "too many MIG devices");
    MigDevice d;
    d.gpu = *gpu;
    d.profile = m[1];
    d.device = to_int(m[2]);
    d.uuid = m[3];
    if (!valid_mig_profile_name(d.profile))
      return bad_output(what, "profile name '" + d.profile + "' is not one MIG names");
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<MigMode>> parse_mig_modes(const std::string& output) {
  const std::string what = "nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending";
  auto lines = bounded_lines(output, what);
  if (!lines) return lines.error();
  auto mode = [](const std::string& v) -> Result<std::optional<bool>> {
    if (v == "Enabled") return std::optional<bool>(true);
    if (v == "Disabled") return std::optional<bool>(false);
    if (v.empty() || v == "N/A" || v.front() == '[') return std::optional<bool>();
    return Error(Errc::protocol, "mode '" + v + "'");
  };
  static const std::regex line_re(R"(^\s*(\d{1,6}),\s*([^,]{0,40}),\s*([^,]{0,40})$)");
  std::vector<MigMode> out;
  for (const auto& l : *lines) {
    if (mig_trim(l).empty()) continue;
    std::smatch m;
    if (!std::regex_match(l, m, line_re))
      return bad_output(what, "a line it does not know: '" + mig_trim(l) + "'");
    if (out.size() >= kMigMaxEntries) return bad_output(what, "too many GPUs");
    MigMode g;
    g.gpu = to_int(m[1]);
    auto c = mode(mig_trim(m[2]));
    if (!c) return bad_output(what, c.error().message);
    auto p = mode(mig_trim(m[3]));
    if (!p) return bad_output(what, p.error().message);
    g.current = *c;
    g.pending = *p;
    out.push_back(g);
  }
  if (out.empty()) return bad_output(what, "no GPU in its output");
  return out;
}

MigModeResult parse_mig_mode_change(const std::string& output, int exit_code) {
  MigModeResult r;
  auto lines = bounded_lines(output, "nvidia-smi -mig");
  if (!lines) {
    r.reason = lines.error().message;
    return r;
  }
  std::string first;
  bool done = false, pending = false;
  for (const auto& l : *lines) {
    std::string t = mig_trim(l);
    if (t.empty() || t == "All done.") continue;
    if (first.empty()) first = t;
    if (t.rfind("Enabled MIG Mode for GPU", 0) == 0 || t.rfind("Disabled MIG Mode for GPU", 0) == 0)
      done = true;
    else if (t.find("MIG mode is in pending") != std::string::npos) {
      pending = true;
      r.reason = t;
    } else if (r.reason.empty() && !done)
      r.reason = t;
  }
  if (pending) {
    r.change = MigModeChange::pending;
  } else if (done && exit_code == 0) {
    r.change = MigModeChange::done;
    r.reason.clear();
  } else {
    r.change = MigModeChange::refused;
    if (r.reason.empty())
      r.reason = first.empty() ? "exit " + std::to_string(exit_code) + " with no message" : first;
  }
  return r;
}

MigCreateResult parse_mig_create(const std::string& output) {
  MigCreateResult r;
  auto lines = bounded_lines(output, "nvidia-smi mig -cgi");
  if (!lines) {
    r.failure = lines.error().message;
    return r;
  }
  static const std::regex gi(R"(^Successfully created GPU instance ID\s+(\d{1,6}) on GPU\s+\d)");
  static const std::regex ci(R"(^Successfully created compute instance ID\s+\d{1,6} on GPU)");
  for (const auto& l : *lines) {
    std::string t = mig_trim(l);
    std::smatch m;
    if (std::regex_search(t, m, gi)) {
      if (r.gpu_instances.size() < kMigMaxEntries) r.gpu_instances.push_back(to_int(m[1]));
    } else if (std::regex_search(t, ci)) {
      ++r.compute_instances;
    } else if (r.failure.empty() && !t.empty()) {
      r.failure = t;
    }
  }
  return r;
}

void add_mig_instances(std::vector<proto::GpuSample>& gpus, const std::vector<std::string>& prefix,
                       std::chrono::milliseconds timeout) {
  bool any = false;
  for (const auto& g : gpus) any |= g.mig_mode == "Enabled";
  if (!any) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto run = [&](std::vector<std::string> args) -> std::optional<std::string> {
    CommandSpec spec;
    spec.argv = prefix;
    spec.argv.push_back("nvidia-smi");
    for (auto& a : args) spec.argv.push_back(std::move(a));
    spec.timeout = std::max(std::chrono::milliseconds(1),
                            std::chrono::duration_cast<std::chrono::milliseconds>(
                                deadline - std::chrono::steady_clock::now()));
    auto r = run_command(spec);
    if (!r || !r->ok()) return std::nullopt;
    return r->output;
  };
  auto list = run({"-L"});
  if (!list) return;
  auto devices = parse_mig_devices(*list);
  if (!devices) return;
  std::vector<MigProfile> profiles;
  if (auto lgip = run({"mig", "-lgip"}))
    if (auto p = parse_mig_profiles(*lgip)) profiles = std::move(*p);
  for (auto& g : gpus) {
    if (g.mig_mode != "Enabled") continue;
    g.mig_instances.clear();
    for (const auto& d : *devices) {
      if (d.gpu != g.index) continue;
      if (g.mig_instances.size() >= proto::health_limits::kMigInstances) break;
      proto::MigInstanceSample m;
      m.profile = d.profile;
      m.uuid = d.uuid;
      for (const auto& p : profiles)
        if (p.gpu == g.index && p.name == d.profile) m.memory_gib = p.memory_gib;
      g.mig_instances.push_back(std::move(m));
    }
  }
}

}  // namespace factory::agent
