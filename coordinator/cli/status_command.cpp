// `factory status`: the status feed's tenants (GET /v1/tenants) as a table.
#include <filesystem>
#include <iostream>
#include <memory>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/pki.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/server/coordinator.hpp"

namespace factory::cli {

namespace {
// One cell that says what the tenant's GPU is doing: the card and driver,
// then what the tier made of it (a model on the GPU, or HAMi's split).
std::string gpu_summary(const nlohmann::json& t) {
  if (!t.contains("health") || !t["health"].is_object()) return "-";
  const auto& h = t["health"];
  std::string out;
  if (h.contains("gpu") && h["gpu"].is_object()) {
    const auto& g = h["gpu"];
    for (auto& card : g.value("gpus", nlohmann::json::array())) {
      if (!out.empty()) out += ", ";
      out += card.value("name", "?");
    }
    if (g.contains("driver_version") && g["driver_version"].is_string())
      out += " (" + g["driver_version"].get<std::string>() + ")";
  }
  if (h.contains("ollama") && h["ollama"].is_object())
    for (auto& m : h["ollama"].value("models", nlohmann::json::array()))
      out +=
          "; " + m.value("name", "?") + " " + std::to_string(m.value("gpu_percent", 0)) + "% GPU";
  if (h.contains("k8s") && h["k8s"].is_object() && h["k8s"].contains("allocatable") &&
      h["k8s"]["allocatable"].is_number())
    out += "; " + std::to_string(h["k8s"]["allocatable"].get<int>()) + " x " +
           h["k8s"].value("resource", "nvidia.com/gpu");
  return out.empty() ? "-" : out;
}
// The table of `factory status`.
void print_status(const nlohmann::json& res) {
  std::vector<std::vector<std::string>> rows;
  for (auto& t : res["tenants"]) {
    const auto& a = t["agent"];
    bool up = a.value("connected", false);
    // How the last connection ended tells a planned stop from a crash.
    std::string state = a.value("state", "");
    std::string link = up ? "yes"
                       : (state.empty() || state == "never_connected" || state == "unknown")
                           ? "no"
                           : "no: " + state;
    rows.push_back({t.value("name", ""), t.value("tier", "").empty() ? "-" : t.value("tier", ""),
                    t.value("phase", ""), link,
                    a.value("version", "").empty() ? "-" : a.value("version", ""),
                    up ? age(a.value("connected_since", ""), " ago") : "-",
                    age(a.value("last_seen", ""), " ago"), gpu_summary(t)});
  }
  if (rows.empty()) {
    std::cout << "No tenants yet. Create one with `factory tenant create` or `factory token "
                 "create`.\n";
    return;
  }
  print_table(std::cout,
              {"tenant", "tier", "phase", "connected", "agent", "since", "last seen", "gpu"}, rows);
  for (auto& t : res["tenants"]) {
    auto dropped = t["agent"].value("dropped_events", uint64_t{0});
    if (dropped > 0)
      std::cout << "\n"
                << t.value("name", "") << ": its agent dropped " << dropped
                << " event(s) that the coordinator never received (its spool was full, or a "
                   "record in it was damaged)\n";
  }
}

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
  auto* cmd = app.add_subcommand("status", "Tenants, their agents and what they report");
  auto out = std::make_shared<OutputFormat>(OutputFormat::table);
  add_output_option(*cmd, *out);
  cmd->callback([&ctx, out] {
    ctx.run = [&ctx, out] {
      warn_if_ca_expires_soon(ctx.global);
      return list_from_coordinator(ctx.global, "/v1/tenants", *out, print_status);
    };
  });
}

}  // namespace factory::cli
