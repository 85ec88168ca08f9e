// `factory agents upgrade`: the admin's side of agent self-update
// (coordinator/tenants/agent_rollout.hpp, docs/agent-rollouts.md). The
// coordinator orders the upgrades and keeps them journaled; this command
// asks for a rollout, then follows it until every tenant has its outcome.
#include <iostream>
#include <memory>
#include <optional>

#include "common/durations.hpp"
#include "contract/agent_upgrade.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/follow.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

using nlohmann::json;

namespace {

struct UpgradeOptions {
  std::vector<std::string> tenants;
  bool all = false, dry_run = false, no_wait = false;
  int max_unavailable = 1;
  std::string confirm_within = "2m";
  std::string timeout = "30m";
  std::string poll = "2s";
  OutputFormat out = OutputFormat::table;
};

std::string rollout_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

std::string short_sha(const std::string& sha) {
  return sha.size() > 12 ? sha.substr(0, 12) + "…" : sha;
}

bool ended_badly(const std::string& state) {
  return state == "rolled_back" || state == "refused" || state == "failed" || state == "held";
}

// One line of a tenant's state: "rolled back: no health report within 120 s".
std::string state_line(const json& t) {
  std::string s = rollout_field(t, "state");
  if (s == "rolled_back") s = "rolled back";
  const std::string reason = rollout_field(t, "reason");
  if (!reason.empty() && rollout_field(t, "state") != "held") s += ": " + reason;
  if (!reason.empty() && rollout_field(t, "state") == "held") s = reason;
  return s;
}

void print_rollout_tenants(const json& doc) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : doc.value("tenants", json::array())) {
    std::string what =
        rollout_field(t, "state").empty() ? rollout_field(t, "action") : state_line(t);
    if (rollout_field(t, "action") == "skip") what = "skip: " + rollout_field(t, "why");
    if (rollout_field(t, "action") == "current" && rollout_field(t, "state").empty())
      what = "current (runs " + rollout_field(t, "version") + ")";
    rows.push_back(
        {display_text(rollout_field(t, "tenant")),
         display_text(rollout_field(t, "version").empty() ? "-" : rollout_field(t, "version")),
         t.value("connected", false) ? "yes" : "no", display_text(what)});
  }
  if (rows.empty()) {
    std::cout << "no tenant\n";
    return;
  }
  print_table(std::cout, {"TENANT", "AGENT", "CONNECTED", "UPGRADE"}, rows);
}

std::string target(const json& doc) {
  return display_text(rollout_field(doc, "version").empty() ? "?" : rollout_field(doc, "version")) +
         " (sha256 " + short_sha(rollout_field(doc, "sha256")) + ")";
}

// The end of a rollout: one line per tenant that did not make it, exit 1
// if any; 0 when every tenant upgraded or ran the version already.
int judge(const json& doc, const std::vector<std::string>& named_skips) {
  int bad = 0;
  for (const auto& t : doc.value("tenants", json::array())) {
    if (!ended_badly(rollout_field(t, "state"))) continue;
    ++bad;
    std::cerr << display_text(rollout_field(t, "tenant")) << ": " << display_text(state_line(t))
              << "\n";
  }
  for (const auto& s : named_skips) {
    ++bad;
    std::cerr << display_text(s) << "\n";
  }
  if (bad == 0) {
    std::cerr << "every agent asked for runs " << target(doc) << "\n";
    return 0;
  }
  std::cerr << "factory: " << bad << " agent(s) not upgraded to " << target(doc)
            << "; see `factory agents upgrade status`\n";
  return 1;
}

// Follows GET /v1/agents/upgrade until the rollout is done, printing each
// change of a tenant's state with the time since the start.
int follow_rollout(const GlobalOptions& g, const UpgradeOptions& o, const std::string& rollout_id,
                   const std::vector<std::string>& named_skips) {
  FollowSpec spec;
  spec.path = "/v1/agents/upgrade";
  spec.timeout = *parse_duration(o.timeout);
  spec.poll = *parse_duration(o.poll);
  spec.tenant_of = [](const json& e) { return rollout_field(e, "tenant"); };
  spec.state_line = state_line;
  spec.judge = [&](const json& doc, const std::string&) -> std::optional<int> {
    if (rollout_field(doc, "rollout_id") != rollout_id)
      return fail(Error(Errc::conflict, "rollout " + rollout_id + " is no longer the latest (" +
                                            rollout_field(doc, "rollout_id") + " is)"));
    if (doc.value("done", false)) return judge(doc, named_skips);
    return std::nullopt;
  };
  spec.on_timeout = "rollout " + rollout_id + " not done after " + format_duration(spec.timeout) +
                    ": it goes on; follow it with `factory agents upgrade status`";
  return follow(g, spec);
}

int upgrade(const Context& ctx, const UpgradeOptions& o) {
  auto confirm = parse_duration(o.confirm_within);
  if (!confirm) return fail(confirm.error().with_context("--confirm-within"));
  namespace lim = proto::agent_upgrade_limits;
  if (confirm->count() < lim::kMinConfirmSeconds || confirm->count() > lim::kMaxConfirmSeconds)
    return fail(Error(Errc::invalid_argument,
                      "--confirm-within: want " + std::to_string(lim::kMinConfirmSeconds) +
                          "s to " + format_duration(std::chrono::seconds(lim::kMaxConfirmSeconds)) +
                          ", got " + o.confirm_within));
  for (auto [flag, value] : {std::pair{"--timeout", &o.timeout}, std::pair{"--poll", &o.poll}})
    if (auto d = parse_duration(*value); !d) return fail(d.error().with_context(flag));
  json body = {{"max_unavailable", o.max_unavailable},
               {"confirm_within_s", confirm->count()},
               {"dry_run", o.dry_run}};
  if (o.all)
    body["all"] = true;
  else
    body["tenants"] = o.tenants;
  auto res = call_coordinator(ctx.global, "POST", "/v1/agents/upgrade", body);
  if (!res) return fail(res.error());
  const std::string id = rollout_field(*res, "rollout_id");
  // Tenants named on the command line that the rollout passes over are
  // failures of the command; with --all they are only reported.
  std::vector<std::string> named_skips;
  if (!o.all)
    for (const auto& t : res->value("tenants", json::array()))
      if (rollout_field(t, "action") == "skip")
        named_skips.push_back(rollout_field(t, "tenant") + ": skipped: " + rollout_field(t, "why"));
  if (print_document(std::cout, o.out, *res)) {
    if (o.dry_run || o.no_wait) return 0;
    return id.empty() ? judge(*res, named_skips) : follow_rollout(ctx.global, o, id, named_skips);
  }
  print_rollout_tenants(*res);
  if (o.dry_run) {
    if (!rollout_field(*res, "cannot_upgrade").empty())
      std::cout << display_text(rollout_field(*res, "cannot_upgrade")) << "\n";
    std::cout << "dry run: nothing changed. The rollout would upgrade each agent marked upgrade to "
              << target(*res) << ", " << o.max_unavailable
              << " at a time, each new agent confirming within " << o.confirm_within << ".\n";
    return 0;
  }
  if (id.empty()) {
    std::cout << "nothing to upgrade\n";
    return judge(*res, named_skips);
  }
  std::cout << "rollout " << display_text(id) << ": agents to " << target(*res) << ", "
            << o.max_unavailable << " at a time\n";
  if (o.no_wait) {
    std::cout << "follow it with `factory agents upgrade status` or the feed\n";
    return 0;
  }
  return follow_rollout(ctx.global, o, id, named_skips);
}

int upgrade_status(const Context& ctx, OutputFormat out) {
  auto res = call_coordinator(ctx.global, "GET", "/v1/agents/upgrade", json());
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  if (rollout_field(*res, "rollout_id").empty()) {
    std::cout << "no agent rollout yet\n";
    return 0;
  }
  std::cout << "rollout " << display_text(rollout_field(*res, "rollout_id")) << ": agents to "
            << target(*res) << ", " << res->value("max_unavailable", 1) << " at a time, "
            << (res->value("done", false) ? "done" : "under way") << "\n";
  print_rollout_tenants(*res);
  return 0;
}

}  // namespace

void add_agent_commands(CLI::App& app, Context& ctx) {
  auto* agents = app.add_subcommand("agents", "The tenants' agents: self-update across the fleet");
  agents->require_subcommand(1);
  auto o = std::make_shared<UpgradeOptions>();
  auto* up = agents->add_subcommand(
      "upgrade",
      "Upgrade tenants' agents to the binary this coordinator serves (agents.binary), a few at a "
      "time; a guest whose new agent does not confirm rolls itself back, and the rollout holds");
  up->require_subcommand(0, 1);
  auto* named =
      up->add_option("--tenant", o->tenants, "A tenant whose agent to upgrade (again for more)")
          ->check(tenant_name_rule());
  auto* all = up->add_flag("--all", o->all, "Every tenant's agent");
  named->excludes(all);
  up->add_option("--max-unavailable", o->max_unavailable,
                 "How many agents may be upgrading at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  up->add_option("--confirm-within", o->confirm_within,
                 "How long a new agent has to connect and report health before its guest puts the "
                 "old one back (10s to 1h)")
      ->capture_default_str();
  up->add_flag("--dry-run", o->dry_run,
               "List every tenant, the version its agent runs and what the rollout would do; "
               "change nothing");
  up->add_flag("--no-wait", o->no_wait, "Return once the rollout is journaled");
  up->add_option("--timeout", o->timeout, "How long to follow the rollout")->capture_default_str();
  up->add_option("--poll", o->poll, "How often to ask the coordinator")->capture_default_str();
  add_output_option(*up, o->out);
  set_examples(*up, {{"factory agents upgrade --all --dry-run",
                      "which agents run which version, and what would be upgraded"},
                     {"factory agents upgrade --tenant alice", "alice's agent first"},
                     {"factory agents upgrade --all --max-unavailable 5 --confirm-within 5m",
                      "the whole fleet, five at a time"},
                     {"factory agents upgrade status", "where the latest rollout is"}});
  up->callback([&ctx, o, up] {
    if (up->get_subcommands().empty()) {
      if (o->tenants.empty() && !o->all)
        throw CLI::ValidationError("--tenant", "name tenants with --tenant NAME, or use --all");
      ctx.run = [&ctx, o] { return upgrade(ctx, *o); };
    }
  });

  auto status_out = std::make_shared<OutputFormat>(OutputFormat::table);
  auto* st = up->add_subcommand("status", "Where the latest agent rollout is, tenant by tenant");
  add_output_option(*st, *status_out);
  set_examples(*st, {{"factory agents upgrade status", "each tenant's upgrade state"},
                     {"factory agents upgrade status -o json", "for scripts"}});
  st->callback([&ctx, status_out] {
    ctx.run = [&ctx, status_out] { return upgrade_status(ctx, *status_out); };
  });
}

}  // namespace factory::cli
