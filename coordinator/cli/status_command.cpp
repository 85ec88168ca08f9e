// `factory status`: the status feed's tenants (GET /v1/tenants) as a table.
#include <iostream>
#include <memory>

#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"

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
    rows.push_back({t.value("name", ""), t.value("tier", "").empty() ? "-" : t.value("tier", ""),
                    t.value("phase", ""), up ? "yes" : "no",
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
}

}  // namespace

void add_status_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("status", "Tenants, their agents and what they report");
  auto out = std::make_shared<OutputFormat>(OutputFormat::table);
  add_output_option(*cmd, *out);
  set_examples(*cmd, {{"factory status", "one line per tenant"},
                      {"factory status -o json", "what the API answers, for scripts"},
                      {"FACTORY_SERVER=https://coord:8444 factory status",
                       "another coordinator (with FACTORY_TOKEN_FILE)"}});
  cmd->callback([&ctx, out] {
    ctx.run = [&ctx, out] {
      return list_from_coordinator(ctx.global, "/v1/tenants", *out, print_status);
    };
  });
}

}  // namespace factory::cli
