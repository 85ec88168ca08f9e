// `factory status`: the status feed's tenants (GET /v1/tenants) as a table.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

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

// Health is what a guest reported: any shape may arrive here, and one
// tenant's odd report must not keep `factory status` from printing every
// other tenant. These readers answer a fallback instead of throwing.
const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}
std::string text_or(const json& j, const char* key, const std::string& fallback) {
  const json* v = member(j, key);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}
// A whole number within what a table cell needs, or nothing.
std::optional<long long> whole(const json& j, const char* key) {
  const json* v = member(j, key);
  if (!v || !v->is_number()) return std::nullopt;
  double d = v->get<double>();
  if (!(d >= -1e12 && d <= 1e12)) return std::nullopt;
  return static_cast<long long>(d);
}
const json& list_or_empty(const json& j, const char* key) {
  static const json empty = json::array();
  const json* v = member(j, key);
  return v && v->is_array() ? *v : empty;
}

// One cell that says what the tenant's GPU is doing: the card and driver,
// then what the tier made of it (a model on the GPU, or HAMi's split).
std::string gpu_summary(const json& t) {
  const json* h = member(t, "health");
  if (!h || !h->is_object()) return "-";
  std::string out;
  if (const json* g = member(*h, "gpu"); g && g->is_object()) {
    for (const auto& card : list_or_empty(*g, "gpus")) {
      if (!card.is_object()) continue;
      if (!out.empty()) out += ", ";
      out += text_or(card, "name", "?");
    }
    if (const json* d = member(*g, "driver_version"); d && d->is_string())
      out += " (" + d->get<std::string>() + ")";
  }
  if (const json* o = member(*h, "ollama"); o && o->is_object())
    for (const auto& m : list_or_empty(*o, "models")) {
      if (!m.is_object()) continue;
      out += "; " + text_or(m, "name", "?");
      if (auto pct = whole(m, "gpu_percent")) out += " " + std::to_string(*pct) + "% GPU";
    }
  if (const json* k = member(*h, "k8s"); k && k->is_object())
    if (auto n = whole(*k, "allocatable"))
      out += "; " + std::to_string(*n) + " x " + text_or(*k, "resource", "nvidia.com/gpu");
  return out.empty() ? "-" : out;
}

// The table of `factory status`.
void print_status(const json& res) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : list_or_empty(res, "tenants")) {
    static const json none = json::object();
    const json* found = member(t, "agent");
    const json& a = found && found->is_object() ? *found : none;
    const json* connected = member(a, "connected");
    bool up = connected && connected->is_boolean() && connected->get<bool>();
    // How the last connection ended tells a planned stop from a crash.
    std::string state = text_or(a, "state", "");
    std::string link = up ? "yes"
                       : (state.empty() || state == "never_connected" || state == "unknown")
                           ? "no"
                           : "no: " + state;
    std::string tier = text_or(t, "tier", "");
    std::string version = text_or(a, "version", "");
    rows.push_back({text_or(t, "name", ""), tier.empty() ? "-" : tier, text_or(t, "phase", ""),
                    link, version.empty() ? "-" : version,
                    up ? age(text_or(a, "connected_since", ""), " ago") : "-",
                    age(text_or(a, "last_seen", ""), " ago"), gpu_summary(t)});
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
  set_examples(*cmd, {{"factory status", "one line per tenant"},
                      {"factory status -o json", "what the API answers, for scripts"},
                      {"FACTORY_SERVER=https://coord:8444 factory status",
                       "another coordinator (with FACTORY_TOKEN_FILE)"}});
  cmd->callback([&ctx, out] {
    ctx.run = [&ctx, out] {
      warn_if_ca_expires_soon(ctx.global);
      return list_from_coordinator(ctx.global, "/v1/tenants", *out, print_status);
    };
  });
}

}  // namespace factory::cli
