// `factory serve`, `factory token create`, `factory status`.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/server/coordinator.hpp"

namespace factory::cli {

void add_serve_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("serve", "Run the coordinator: agents endpoint, admin API, status feed");
  cmd->callback([&ctx] {
    ctx.run = [&ctx]() -> int {
      bool explicit_config = ctx.global.config_path != GlobalOptions{}.config_path;
      auto cfg = coordinator::load_coordinator_config(ctx.global.config_path, explicit_config);
      if (!cfg) return fail(cfg.error());
      // The server logs at info unless told otherwise; the CLI default (warn) is for commands.
      if (ctx.global.log_level == "warn") setup_logging("factory", cfg->log_level);
      auto c = coordinator::Coordinator::open(*cfg);
      if (!c) return fail(c.error());
      if (auto st = (*c)->start(); !st.ok()) return fail(st.error());
      (*c)->run();
      // Everything the coordinator keeps is durable the moment it is written
      // (fsync'd files), so nothing is left to flush but the log. Exit here
      // rather than tear down live sessions inside the io_context's
      // destructor, where their sockets would outlive the reactor.
      spdlog::info("stopped");
      spdlog::shutdown();
      std::fflush(nullptr);
      std::_Exit(0);
    };
  });
}

void add_token_commands(CLI::App& app, Context& ctx) {
  auto* token = app.add_subcommand("token", "Bootstrap tokens agents enroll with");
  token->require_subcommand(1);
  struct Opts {
    std::string tenant, ttl;
    OutputFormat out = OutputFormat::table;
  };
  auto o = std::make_shared<Opts>();
  auto* create = token->add_subcommand(
      "create", "Create a one-time token bound to one tenant (printed once, stored hashed)");
  create->add_option("--tenant", o->tenant, "Tenant the token enrolls (DNS-1123 label)")->required();
  create->add_option("--ttl", o->ttl, "Lifetime, e.g. 30m, 1h (default: tokens.default_ttl, 1h)");
  add_output_option(*create, o->out);
  create->callback([&ctx, o] {
    ctx.run = [&ctx, o]() -> int {
      auto client = AdminClient::from(ctx.global);
      if (!client) return fail(client.error());
      nlohmann::json body = {{"tenant", o->tenant}};
      if (!o->ttl.empty()) body["ttl"] = o->ttl;
      auto res = client->call("POST", "/v1/tokens", body);
      if (!res) return fail(res.error());
      if (print_document(std::cout, o->out, *res)) return 0;
      const auto& r = *res;
      std::cout << r.value("token", "") << "\n";
      std::cerr << "One-time token for tenant " << r.value("tenant", "") << ", valid until "
                << r.value("expires_at", "") << ". Enroll with:\n  factory-agent --coordinator-url "
                << r.value("coordinator_url", "") << " --ca-sha256 " << r.value("ca_sha256", "")
                << " --token-file FILE\n";
      return 0;
    };
  });
  auto* list = token->add_subcommand("list", "List tokens (ids and states; secrets are never stored)");
  auto lo = std::make_shared<OutputFormat>(OutputFormat::table);
  add_output_option(*list, *lo);
  list->callback([&ctx, lo] {
    ctx.run = [&ctx, lo]() -> int {
      auto client = AdminClient::from(ctx.global);
      if (!client) return fail(client.error());
      auto res = client->call("GET", "/v1/tokens");
      if (!res) return fail(res.error());
      if (print_document(std::cout, *lo, *res)) return 0;
      std::vector<std::vector<std::string>> rows;
      for (auto& t : (*res)["tokens"])
        rows.push_back({t.value("id", ""), t.value("tenant", ""), t.value("state", ""),
                        t.value("expires_at", "")});
      print_table(std::cout, {"id", "tenant", "state", "expires"}, rows);
      return 0;
    };
  });
}

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
      out += "; " + m.value("name", "?") + " " + std::to_string(m.value("gpu_percent", 0)) + "% GPU";
  if (h.contains("k8s") && h["k8s"].is_object() && h["k8s"].contains("allocatable") &&
      h["k8s"]["allocatable"].is_number())
    out += "; " + std::to_string(h["k8s"]["allocatable"].get<int>()) + " x " +
           h["k8s"].value("resource", "nvidia.com/gpu");
  return out.empty() ? "-" : out;
}

std::string ago(const std::string& ts) {
  if (ts.empty()) return "-";
  auto t = parse_rfc3339(ts);
  if (!t) return ts;
  auto d = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - *t);
  return format_duration(std::max(d, std::chrono::seconds(0))) + " ago";
}
}  // namespace

void add_status_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("status", "Tenants, their agents and what they report");
  auto out = std::make_shared<OutputFormat>(OutputFormat::table);
  add_output_option(*cmd, *out);
  cmd->callback([&ctx, out] {
    ctx.run = [&ctx, out]() -> int {
      auto client = AdminClient::from(ctx.global);
      if (!client) return fail(client.error());
      auto res = client->call("GET", "/v1/tenants");
      if (!res) return fail(res.error());
      if (print_document(std::cout, *out, *res)) return 0;
      std::vector<std::vector<std::string>> rows;
      for (auto& t : (*res)["tenants"]) {
        const auto& a = t["agent"];
        bool up = a.value("connected", false);
        rows.push_back({t.value("name", ""), t.value("tier", "").empty() ? "-" : t.value("tier", ""),
                        t.value("phase", ""), up ? "yes" : "no",
                        a.value("version", "").empty() ? "-" : a.value("version", ""),
                        up ? ago(a.value("connected_since", "")) : "-", ago(a.value("last_seen", "")),
                        gpu_summary(t)});
      }
      if (rows.empty()) {
        std::cout << "No tenants yet. Create one with `factory tenant create` or `factory token create`.\n";
        return 0;
      }
      print_table(std::cout,
                  {"tenant", "tier", "phase", "connected", "agent", "since", "last seen", "gpu"},
                  rows);
      return 0;
    };
  });
}

}  // namespace factory::cli
