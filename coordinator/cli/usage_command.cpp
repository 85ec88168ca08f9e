// `factory usage`: GPU time and model endpoint use per tenant over a window
// (GET /v1/usage; coordinator/tenants/usage_report.hpp, docs/usage.md).
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>

#include "common/durations.hpp"
#include "common/net/url.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/tenants/usage_report.hpp"

namespace factory::cli {

using nlohmann::json;

namespace {

struct UsageOptions {
  std::string tenant, project, since, until;
  std::string out = "table";
};

std::string usage_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

std::uint64_t usage_count(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return static_cast<std::uint64_t>(std::llround(j[key].get<double>()));
}

// A CSV field as RFC 4180 writes one: quoted when it holds a comma, a quote
// or a line break, quotes doubled.
std::string usage_csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void print_csv(const json& doc) {
  const char* header[] = {"tenant",        "project",           "tier",      "gpu_model",
                          "gpu_seconds",   "gpu_busy_seconds",  "key",       "requests",
                          "prompt_tokens", "completion_tokens", "deleted_at"};
  std::string line;
  for (const char* h : header) line += (line.empty() ? "" : ",") + std::string(h);
  std::cout << line << "\n";
  auto row = [](std::initializer_list<std::string> cells) {
    std::string l;
    bool first = true;
    for (const auto& c : cells) {
      l += (first ? "" : ",") + usage_csv_cell(c);
      first = false;
    }
    std::cout << l << "\n";
  };
  for (const auto& t : doc.value("tenants", json::array())) {
    const std::string name = usage_field(t, "name"), project = usage_field(t, "project"),
                      tier = usage_field(t, "tier"), model = usage_field(t, "gpu_model"),
                      deleted = usage_field(t, "deleted_at");
    row({name, project, tier, model, std::to_string(usage_count(t, "gpu_seconds")),
         std::to_string(usage_count(t, "gpu_busy_seconds")), "", "", "", "", deleted});
    for (const auto& k : t.value("keys", json::array()))
      row({name, project, tier, model, "", "", usage_field(k, "name"),
           std::to_string(usage_count(k, "requests")),
           std::to_string(usage_count(k, "prompt_tokens")),
           std::to_string(usage_count(k, "completion_tokens")), deleted});
  }
}

// 3,600 s as "1h0m0s"-free hours people read: "1.00".
std::string usage_hours(std::uint64_t seconds) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << static_cast<double>(seconds) / 3600.0;
  return o.str();
}

void print_usage_table(const json& doc) {
  std::cout << "from " << display_text(usage_field(doc, "since")) << " to "
            << display_text(usage_field(doc, "until")) << "\n";
  std::vector<std::vector<std::string>> rows, keys;
  for (const auto& t : doc.value("tenants", json::array())) {
    std::uint64_t requests = 0, prompt = 0, completion = 0;
    for (const auto& k : t.value("keys", json::array())) {
      requests += usage_count(k, "requests");
      prompt += usage_count(k, "prompt_tokens");
      completion += usage_count(k, "completion_tokens");
      keys.push_back({display_text(usage_field(t, "name")), display_text(usage_field(k, "name")),
                      std::to_string(usage_count(k, "requests")),
                      std::to_string(usage_count(k, "prompt_tokens")),
                      std::to_string(usage_count(k, "completion_tokens"))});
    }
    std::string name = usage_field(t, "name");
    if (!usage_field(t, "deleted_at").empty()) name += " (deleted)";
    rows.push_back(
        {display_text(name), display_text(usage_field(t, "project")),
         display_text(usage_field(t, "tier")),
         display_text(usage_field(t, "gpu_model").empty() ? "-" : usage_field(t, "gpu_model")),
         std::to_string(usage_count(t, "gpu_seconds")), usage_hours(usage_count(t, "gpu_seconds")),
         std::to_string(usage_count(t, "gpu_busy_seconds")), std::to_string(requests),
         std::to_string(prompt), std::to_string(completion)});
  }
  if (rows.empty()) {
    std::cout << "no tenant\n";
    return;
  }
  print_table(std::cout,
              {"TENANT", "PROJECT", "TIER", "GPU MODEL", "GPU-SECONDS", "GPU-HOURS",
               "BUSY GPU-SECONDS", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS"},
              rows);
  if (!keys.empty()) {
    std::cout << "\n";
    print_table(std::cout, {"TENANT", "KEY", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS"},
                keys);
  }
}

int usage(const Context& ctx, const UsageOptions& o) {
  // The window is resolved here, by this clock, and checked before any call.
  auto q = tenants::usage_query(o.since, o.until, o.tenant, o.project, unix_seconds(Clock::now()));
  if (!q) return fail(q.error());
  auto at = [](std::int64_t t) { return format_rfc3339(Clock::from_time_t(t)); };
  std::string path = "/v1/usage?since=" + net::percent_encode(at(q->since)) +
                     "&until=" + net::percent_encode(at(q->until));
  if (!o.tenant.empty()) path += "&tenant=" + net::percent_encode(o.tenant);
  if (!o.project.empty()) path += "&project=" + net::percent_encode(o.project);
  auto res = call_coordinator(ctx.global, "GET", path);
  if (!res) return fail(res.error());
  if (o.out == "json" || o.out == "yaml") {
    print_document(std::cout, o.out == "json" ? OutputFormat::json : OutputFormat::yaml, *res);
    return 0;
  }
  if (o.out == "csv") {
    print_csv(*res);
    return 0;
  }
  print_usage_table(*res);
  return 0;
}

}  // namespace

void add_usage_command(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<UsageOptions>();
  auto* u = app.add_subcommand(
      "usage",
      "GPU time per tenant over a window (GPU-seconds its VM ran with its cards, as the VM "
      "provider saw them; busy GPU-seconds from its health) and its model endpoint's use per key; "
      "deleted tenants included");
  u->add_option("--tenant", o->tenant, "Only this tenant")->check(tenant_name_rule());
  u->add_option("--project", o->project, "Only the tenants of this project")->check(project_rule());
  u->add_option("--since", o->since,
                "Start of the window: RFC 3339 (2026-12-01T00:00:00Z) or a duration ago (24h, 7d); "
                "default 30d");
  u->add_option("--until", o->until, "End of the window, the same way; default now");
  u->add_option("-o,--output", o->out, "Output format: table, json, yaml or csv")
      ->check(CLI::IsMember({"table", "json", "yaml", "csv"}))
      ->capture_default_str();
  set_examples(*u, {{"factory usage", "every tenant over the last 30 days"},
                    {"factory usage --since 24h --project ml", "project ml's last day"},
                    {"factory usage --tenant alice --since 2026-12-01T00:00:00Z "
                     "--until 2026-12-02T00:00:00Z -o json",
                     "one tenant's day, for scripts"},
                    {"factory usage --since 7d -o csv > usage.csv", "a week, for a spreadsheet"}});
  u->callback([&ctx, o] { ctx.run = [&ctx, o] { return usage(ctx, *o); }; });
}

}  // namespace factory::cli
