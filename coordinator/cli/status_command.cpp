// `factory status`: the status feed's tenants (GET /v1/tenants) at a glance,
// one row each: what the tenant is, where its plan is, whether its agent is
// connected, what its GPU is doing (utilization, memory used of total,
// temperature), what the tier made of it (models on the GPU or allocatable
// slices) and what is wrong.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/pki.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/server/coordinator.hpp"

namespace factory::cli {

namespace {

using nlohmann::json;

const json& at(const json& j, const char* key) {
  static const json null;
  return j.is_object() && j.contains(key) ? j[key] : null;
}

// A guest's words in a terminal cell: no control characters (an escape
// sequence in a model name is an attack on the admin's terminal).
std::string cell(const std::string& s, size_t max = 40) {
  std::string out;
  for (unsigned char c : s) out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  if (out.size() > max) out = out.substr(0, max - 3) + "...";
  return out.empty() ? "-" : out;
}

std::string text(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

std::string gib(double mib) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", mib / 1024.0);
  return b;
}

struct GpuCells {
  std::string name = "-", util = "-", memory = "-", temp = "-";
};

GpuCells gpu_cells(const json& health) {
  GpuCells c;
  const json& gpus = at(at(health, "gpu"), "gpus");
  if (!gpus.is_array() || gpus.empty()) return c;
  std::string names, utils;
  double used = 0, total = 0;
  bool have_mem = false;
  int temp = -1000;
  for (const auto& g : gpus) {
    std::string n = text(g, "name");
    if (names.find(n) == std::string::npos) names += (names.empty() ? "" : ", ") + n;
    const json& u = at(g, "utilization_percent");
    utils +=
        (utils.empty() ? "" : ",") + (u.is_number() ? std::to_string(u.get<int>()) + "%" : "?");
    if (at(g, "memory_used_mib").is_number() && at(g, "memory_total_mib").is_number()) {
      used += at(g, "memory_used_mib").get<double>();
      total += at(g, "memory_total_mib").get<double>();
      have_mem = true;
    }
    if (at(g, "temperature_c").is_number())
      temp = std::max(temp, at(g, "temperature_c").get<int>());
  }
  if (gpus.size() > 1) names = std::to_string(gpus.size()) + "x " + names;
  c.name = cell(names, 24);
  c.util = utils;
  if (have_mem) c.memory = gib(used) + "/" + gib(total) + " GiB";
  if (temp > -1000) c.temp = std::to_string(temp) + "C";
  return c;
}

// What the tier made of the GPU: Ollama's models and their share on it, or
// the guest cluster's allocatable slices.
std::string workload(const json& health) {
  std::string out;
  for (const auto& m : at(at(health, "ollama"), "models")) {
    const json& p = at(m, "gpu_percent");
    out += (out.empty() ? "" : ", ") + cell(text(m, "name"), 24) + " " +
           (p.is_number() ? std::to_string(p.get<int>()) : "?") + "% GPU";
  }
  const json& k = at(health, "k8s");
  if (k.is_object()) {
    const json& a = at(k, "allocatable");
    const json& c = at(k, "capacity");
    std::string slices = (a.is_number() ? std::to_string(a.get<long long>()) : "0");
    if (c.is_number()) slices += "/" + std::to_string(c.get<long long>());
    out += (out.empty() ? "" : ", ") + slices + " " + cell(text(k, "resource"), 24);
  }
  return out.empty() ? "-" : out;
}

// Whether the agent is connected; if not, how its last connection ended
// (a planned stop or a reboot is not a crash) and when.
std::string connected(const json& t) {
  const json& a = at(t, "agent");
  if (at(a, "connected").is_boolean() && a["connected"].get<bool>()) return "yes";
  std::string state = text(a, "state");
  // Before its first connection an agent is simply not there yet.
  if (state.empty() || state == "never_connected" || state == "unknown") return "no";
  return "no: " + cell(state, 16) + " " + age(text(a, "last_seen"), " ago");
}

std::string problems(const json& t) {
  std::vector<std::string> p;
  for (const auto& d : at(t, "active_diagnoses")) {
    std::string code = cell(text(d, "code"), 40);
    if (std::find(p.begin(), p.end(), code) == p.end()) p.push_back(code);
  }
  if (p.empty()) return "-";
  std::string out = p[0];
  if (p.size() > 1) out += ", " + p[1];
  if (p.size() > 2) out += " +" + std::to_string(p.size() - 2);
  return out;
}

std::string phase(const json& t) {
  std::string ph = text(t, "phase");
  const json& plan = at(t, "plan");
  // Where a plan under way is: "provisioning 2/4".
  if (ph == "provisioning" && at(plan, "steps_total").is_number())
    ph += " " +
          std::to_string(at(plan, "steps_done").is_number() ? plan["steps_done"].get<int>() : 0) +
          "/" + std::to_string(plan["steps_total"].get<int>());
  return ph.empty() ? "-" : ph;
}

const std::vector<std::string> kHeaders = {"tenant", "tier",          "phase",   "connected",
                                           "agent",  "gpu",           "util",    "memory",
                                           "temp",   "models/slices", "problems"};

// The version the agent reported (an upgrade's progress at a glance).
std::string agent_version(const json& t) {
  std::string v = text(at(t, "agent"), "version");
  return v.empty() ? "-" : cell(v, 24);
}

std::vector<std::vector<std::string>> status_rows(const json& res) {
  std::vector<std::vector<std::string>> rows;
  const json& tenants = at(res, "tenants");
  if (!tenants.is_array()) return rows;
  for (const auto& t : tenants) {
    const json& h = at(t, "health");
    GpuCells g = gpu_cells(h);
    rows.push_back({text(t, "name"), text(t, "tier").empty() ? "-" : text(t, "tier"), phase(t),
                    connected(t), agent_version(t), g.name, g.util, g.memory, g.temp, workload(h),
                    problems(t)});
  }
  return rows;
}

void print_status(const json& res) {
  auto rows = status_rows(res);
  const json& tenants = at(res, "tenants");
  if (rows.empty()) {
    std::cout << "No tenants yet. Create one with `factory tenant create` or `factory token "
                 "create`.\n";
    return;
  }
  print_table(std::cout, kHeaders, rows);
  // The agent binary served: what `factory agents upgrade` would install.
  if (const json& bin = at(res, "agent_binary"); bin.is_object() && bin.contains("sha256")) {
    std::string sha = text(bin, "sha256");
    std::cout << "\nagent binary served: "
              << (text(bin, "version").empty() ? "no version mark" : cell(text(bin, "version"), 64))
              << " (sha256 " << sha.substr(0, 12) << ")\n";
  }
  for (const auto& t : tenants) {
    const json& d = at(at(t, "agent"), "dropped_events");
    auto dropped = d.is_number_unsigned() ? d.get<uint64_t>() : 0;
    if (dropped > 0)
      std::cout << "\n"
                << cell(text(t, "name"), 64) << ": its agent dropped " << dropped
                << " event(s) that the coordinator never received (its spool was full, or a "
                   "record in it was damaged)\n";
  }
}

// `factory status --watch`: the table, then again whenever GET /v1/events
// says something changed. On a terminal the screen is redrawn; into a pipe
// only the rows that changed are printed, as `kubectl get -w` does. Runs
// until interrupted; a stream that ends (the coordinator restarting, a
// reader dropped for falling behind) is resumed from the last event.
int watch_status(const GlobalOptions& g) {
  auto client = AdminClient::from(g);
  if (!client) return fail(client.error());
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  std::map<std::string, std::vector<std::string>> shown;
  bool first = true;
  auto refresh = [&]() -> Status {
    auto res = client->call("GET", "/v1/tenants");
    if (!res) return res.error();
    if (tty) {
      std::cout << "\x1b[H\x1b[2J";
      print_status(*res);
      std::cout << std::flush;
      return {};
    }
    auto rows = status_rows(*res);
    std::vector<std::vector<std::string>> changed;
    for (const auto& r : rows) {
      auto& before = shown[r[0]];
      if (before != r) changed.push_back(r);
      before = r;
    }
    if (first) {
      print_status(*res);
    } else if (!changed.empty()) {
      // The header was printed once, at the top.
      std::ostringstream os;
      print_table(os, kHeaders, changed);
      std::string t = os.str();
      std::cout << t.substr(t.find('\n') + 1);
    }
    first = false;
    std::cout << std::flush;
    return {};
  };
  std::string last_id;
  for (int failures = 0;;) {
    Status fetched;
    auto st = client->follow(
        "/v1/events", last_id, [&] { fetched = refresh(); },
        [&](const AdminClient::ServerEvent& e) {
          if (!e.id.empty()) last_id = e.id;
          if (e.type == "dropped") return true;  // the stream ends next; resumed below
          fetched = refresh();
          return fetched.ok();
        });
    if (!fetched.ok()) return fail(fetched.error());
    if (!st.ok() &&
        (st.error().code == Errc::unauthenticated || st.error().code == Errc::permission_denied))
      return fail(st.error());
    if (st.ok()) failures = 0;
    if (!st.ok() && ++failures == 1)
      std::cerr << "factory: the event stream broke (" << st.error().message << "); reconnecting\n";
    std::this_thread::sleep_for(std::chrono::seconds(std::min(failures + 1, 5)));
  }
}

}  // namespace

namespace {

// The CA every agent pins and every admin client verifies against: nothing
// renews it, so its end is announced well before it comes (on stderr, so
// `-o json` stays a document).
void warn_if_ca_expires_soon(const GlobalOptions& g) {
  auto cfg = load_config(g);
  if (!cfg) return;
  auto path = std::filesystem::path(cfg->state_dir) / "ca.crt";
  auto pem = read_file(path);
  if (!pem) return;
  auto info = pki::inspect_certificate(*pem);
  if (!info) return;
  auto left = info->not_after - Clock::now();
  if (left >= coordinator::kCaExpiryWarning) return;
  auto days = std::chrono::duration_cast<std::chrono::hours>(left).count() / 24;
  std::cerr << "warning: the coordinator's CA " << path.string()
            << (left.count() <= 0 ? " expired at " : " expires at ")
            << format_rfc3339(info->not_after)
            << (left.count() <= 0 ? "" : " (in " + std::to_string(days) + " days)")
            << ": from then on no agent or admin client can verify this coordinator; plan a new "
               "CA before then (every agent then re-enrolls with a new token)\n";
}

}  // namespace

void add_status_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "status",
      "Tenants at a glance: phase, GPU utilization, memory, temperature, models or "
      "slices, problems");
  auto out = std::make_shared<OutputFormat>(OutputFormat::table);
  auto watch = std::make_shared<bool>(false);
  add_output_option(*cmd, *out);
  cmd->add_flag("-w,--watch", *watch,
                "Keep watching: redraw whenever a tenant changes (GET /v1/events), like kubectl "
                "get -w");
  set_examples(*cmd, {{"factory status", "one line per tenant"},
                      {"factory status -o json", "what the API answers, for scripts"},
                      {"factory status --watch", "redrawn as tenants change"},
                      {"FACTORY_SERVER=https://coord:8444 factory status",
                       "another coordinator (with FACTORY_TOKEN_FILE)"}});
  cmd->callback([&ctx, out, watch] {
    if (*watch && *out != OutputFormat::table)
      throw CLI::ValidationError("--watch", "draws the table; it takes no -o");
    ctx.run = [&ctx, out, watch] {
      warn_if_ca_expires_soon(ctx.global);
      if (*watch) return watch_status(ctx.global);
      return list_from_coordinator(ctx.global, "/v1/tenants", *out, print_status);
    };
  });
}

}  // namespace factory::cli
