#include "coordinator/tenants/progress.hpp"

#include <map>
#include <sstream>

namespace factory::tenants {

using nlohmann::json;

namespace {

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

const json& field(const json& j, const char* key) {
  static const json null;
  return j.is_object() && j.contains(key) ? j[key] : null;
}

std::string vm_line(const json& vm) {
  if (!str(vm, "error").empty()) return "VM: cannot read it from the cluster: " + str(vm, "error");
  if (!vm.value("exists", false)) return "VM: not found in the cluster";
  std::string s = "VM: " + (str(vm, "status").empty() ? std::string("created") : str(vm, "status"));
  if (!str(vm, "phase").empty()) s += ", VMI " + str(vm, "phase");
  if (!str(vm, "node").empty()) s += " on " + str(vm, "node");
  if (!str(vm, "ip").empty()) s += ", IP " + str(vm, "ip");
  int port = vm.value("ssh_node_port", 0);
  if (port != 0 && str(vm, "phase") == "Running") s += ", SSH node port " + std::to_string(port);
  return s;
}

std::string step_line(const json& s) {
  std::string state = str(s, "state");
  std::string line = "step " + str(s, "id") + ": " + state;
  if (s.contains("percent") && s["percent"].is_number() && state == "progress")
    line += " " + std::to_string(s["percent"].get<int>()) + "%";
  std::string msg = str(s, "message");
  if (!msg.empty()) line += " - " + msg;
  return line;
}

// A step's identity for change detection: what the line shows.
std::string step_key(const json& s) { return step_line(s); }

}  // namespace

std::vector<std::string> progress_lines(const json& before, const json& now) {
  std::vector<std::string> out;
  const bool first = before.is_null();

  const json& vm0 = field(before, "vm");
  const json& vm1 = field(now, "vm");
  if (!vm1.is_null()) {
    std::string l1 = vm_line(vm1);
    if (first || vm_line(vm0) != l1) out.push_back(l1);
    std::string r1 = str(vm1, "reason");
    if (!r1.empty() && (first || str(vm0, "reason") != r1))
      out.push_back("VM cannot start yet: " + r1);
  }

  const json& a0 = field(before, "agent");
  const json& a1 = field(now, "agent");
  bool c0 = a0.is_object() && a0.value("connected", false);
  bool c1 = a1.is_object() && a1.value("connected", false);
  if (c1 && (first || !c0)) {
    std::string who = str(a1, "version").empty() ? "" : " (factory-agent " + str(a1, "version");
    if (!who.empty() && !str(a1, "hostname").empty()) who += " on " + str(a1, "hostname");
    if (!who.empty()) who += ")";
    out.push_back("agent connected" + who);
  } else if (!c1 && c0) {
    out.push_back("agent disconnected (a reboot is expected once, for the driver)");
  }

  std::string p0 = str(before, "phase"), p1 = str(now, "phase");
  if (!p1.empty() && (first || p0 != p1)) out.push_back("phase " + p1);

  std::map<std::string, std::string> seen;
  for (const auto& s : field(before, "plan_steps"))
    if (s.is_object()) seen[str(s, "id")] = step_key(s);
  for (const auto& s : field(now, "plan_steps")) {
    if (!s.is_object() || str(s, "state") == "pending") continue;
    auto it = seen.find(str(s, "id"));
    if (it == seen.end() || it->second != step_key(s)) out.push_back(step_line(s));
  }

  const json& d0 = field(before, "diagnoses");
  const json& d1 = field(now, "diagnoses");
  if (!d1.is_object()) return out;
  for (const auto& [code, d] : d1.items()) {
    if (d0.is_object() && d0.contains(code) && d0[code] == d) continue;
    std::string line = "diagnosis " + code;
    if (!str(d, "summary").empty()) line += ": " + str(d, "summary");
    if (!str(d, "fix").empty()) line += " (fix: " + str(d, "fix") + ")";
    out.push_back(line);
  }
  return out;
}

std::vector<std::string> failure_report(const json& t) {
  std::vector<std::string> out;
  std::string kube_error = str(field(t, "kube"), "error");
  if (!kube_error.empty()) out.push_back("create failed: " + kube_error);
  const json* failed = nullptr;
  std::string failed_id = str(field(t, "plan"), "failed_step");
  for (const auto& s : field(t, "plan_steps")) {
    if (!s.is_object()) continue;
    if ((failed_id.empty() && str(s, "state") == "failed") ||
        (!failed_id.empty() && str(s, "id") == failed_id)) {
      failed = &s;
      break;
    }
  }
  if (failed) {
    out.push_back("step " + str(*failed, "id") + " failed" +
                  (str(*failed, "message").empty() ? "" : ": " + str(*failed, "message")));
    const json& d = field(*failed, "diagnosis");
    if (d.is_object()) {
      out.push_back("diagnosis " + str(d, "code") + ": " + str(d, "summary"));
      if (!str(d, "fix").empty()) out.push_back("fix: " + str(d, "fix"));
    }
    std::string tail = str(*failed, "output_tail");
    if (!tail.empty()) {
      out.push_back("output (last lines):");
      std::istringstream in(tail);
      std::string line;
      while (std::getline(in, line)) out.push_back("  " + line);
    }
  } else if (!str(field(t, "plan"), "message").empty()) {
    out.push_back("plan failed: " + str(field(t, "plan"), "message"));
  }
  std::string name = str(t, "name");
  if (failed)
    out.push_back("fix the cause, then: factory tenant retry " + name + " --step " +
                  str(*failed, "id"));
  return out;
}

std::string failure_summary(const json& t) {
  std::string name = str(t, "name");
  std::string kube_error = str(field(t, "kube"), "error");
  if (!kube_error.empty()) return "tenant " + name + " failed to create: " + kube_error;
  for (const auto& s : field(t, "plan_steps"))
    if (s.is_object() && str(s, "state") == "failed")
      return "tenant " + name + " failed at step " + str(s, "id") +
             (str(s, "message").empty() ? "" : ": " + str(s, "message"));
  std::string msg = str(field(t, "plan"), "message");
  return "tenant " + name + " failed" + (msg.empty() ? "" : ": " + msg);
}

}  // namespace factory::tenants
