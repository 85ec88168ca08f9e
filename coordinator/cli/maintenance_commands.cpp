// `factory host drain NODE` and `factory host undrain NODE`: the admin's side
// of host maintenance (coordinator/tenants/maintenance.hpp). The coordinator
// does the work and keeps it journaled; these commands ask for it, then
// follow it until every tenant of the node is where it was asked to be.
#include <iostream>
#include <memory>
#include <optional>

#include "common/durations.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/follow.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

using nlohmann::json;

namespace {

struct MaintenanceOptions {
  std::string node;
  std::string notice = "10m";
  std::string message;
  bool move = false, dry_run = false, no_wait = false;
  std::string timeout = "30m";
  std::string poll = "2s";
  OutputFormat out = OutputFormat::table;
};

std::string field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

void print_tenants(const json& doc, bool impact) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : doc.value("tenants", json::array())) {
    std::string move = t.value("can_move", false) ? "yes" : "no: " + field(t, "why_not");
    std::string state = field(t, "state");
    if (state.empty()) state = impact ? "runs here" : "-";
    if (!field(t, "error").empty()) state += " (" + field(t, "error") + ")";
    rows.push_back({display_text(field(t, "tenant")), display_text(field(t, "tier")),
                    display_text(field(t, "phase")),
                    t.value("agent_connected", false) ? "connected" : "not connected",
                    display_text(move), display_text(state)});
  }
  if (rows.empty()) {
    std::cout << "no tenant runs on " << display_text(field(doc, "node")) << "\n";
    return;
  }
  print_table(std::cout, {"TENANT", "TIER", "PHASE", "AGENT", "CAN MOVE", "STATE"}, rows);
  for (const auto& u : doc.value("unknown", json::array()))
    if (u.is_string())
      std::cout << "not known whether it runs there: " << display_text(u.get<std::string>())
                << "\n";
}

// Follows GET /v1/hosts/{node}/maintenance until done, printing each change
// of a tenant's state with the time since the start.
int follow_maintenance(const GlobalOptions& g, const MaintenanceOptions& o, const char* what) {
  auto timeout = parse_duration(o.timeout);
  if (!timeout) return fail(timeout.error().with_context("--timeout"));
  auto poll = parse_duration(o.poll);
  if (!poll) return fail(poll.error().with_context("--poll"));
  FollowSpec spec;
  spec.path = api_path({"v1", "hosts", o.node, "maintenance"});
  spec.timeout = *timeout;
  spec.poll = *poll;
  spec.tenant_of = [](const json& e) { return field(e, "tenant"); };
  spec.state_line = [](const json& e) {
    std::string line = field(e, "state");
    if (!field(e, "error").empty()) line += ": " + field(e, "error");
    return line;
  };
  spec.judge = [&](const json& doc, const std::string& elapsed) -> std::optional<int> {
    if (!doc.value("done", false)) return std::nullopt;
    std::cerr << elapsed << " " << what << " of " << o.node << " done\n";
    return 0;
  };
  spec.on_timeout = std::string(what) + " of " + o.node + " not done after " +
                    format_duration(*timeout) + ": it goes on; follow it with `factory host " +
                    what + " " + o.node + " --dry-run`";
  return follow(g, spec);
}

// Every flag checked before anything is asked of the coordinator.
Status check_flags(const MaintenanceOptions& o) {
  for (auto [flag, value] : {std::pair{"--timeout", &o.timeout}, std::pair{"--poll", &o.poll}})
    if (auto d = parse_duration(*value); !d) return d.error().with_context(flag);
  return {};
}

int drain(const Context& ctx, const MaintenanceOptions& o) {
  auto notice = parse_duration(o.notice);
  if (!notice) return fail(notice.error().with_context("--notice"));
  if (auto st = check_flags(o); !st.ok()) return fail(st.error());
  json body = {{"notice_seconds", notice->count()}, {"move", o.move}, {"dry_run", o.dry_run}};
  if (!o.message.empty()) body["message"] = o.message;
  auto res = call_coordinator(ctx.global, "POST", api_path({"v1", "hosts", o.node, "drain"}), body);
  if (!res) return fail(res.error());
  if (print_document(std::cout, o.out, *res))
    return o.dry_run || o.no_wait ? 0 : follow_maintenance(ctx.global, o, "drain");
  print_tenants(*res, o.dry_run);
  if (o.dry_run) {
    std::cout << "dry run: nothing changed. A drain cordons " << display_text(o.node)
              << ", gives each tenant's guest notice until "
              << display_text(field(*res, "deadline")) << " (--notice " << o.notice
              << "), then shuts each VM down cleanly.\n";
    return 0;
  }
  std::cout << o.node << " cordoned; notice " << display_text(field(*res, "notice_id"))
            << " given until " << display_text(field(*res, "deadline")) << "\n";
  if (o.no_wait) {
    std::cout << "follow it with `factory host drain " << o.node << " --dry-run` or the feed\n";
    return 0;
  }
  return follow_maintenance(ctx.global, o, "drain");
}

int undrain(const Context& ctx, const MaintenanceOptions& o) {
  if (auto st = check_flags(o); !st.ok()) return fail(st.error());
  auto res = call_coordinator(ctx.global, "POST", api_path({"v1", "hosts", o.node, "undrain"}),
                              json{{"dry_run", o.dry_run}});
  if (!res) return fail(res.error());
  if (print_document(std::cout, o.out, *res))
    return o.dry_run || o.no_wait ? 0 : follow_maintenance(ctx.global, o, "undrain");
  print_tenants(*res, false);
  if (o.dry_run) {
    std::cout << "dry run: nothing changed. An undrain uncordons " << display_text(o.node)
              << ", withdraws notices not acted on and starts each drained VM.\n";
    return 0;
  }
  std::cout << o.node << " uncordoned\n";
  if (o.no_wait) return 0;
  return follow_maintenance(ctx.global, o, "undrain");
}

}  // namespace

void add_host_maintenance_commands(CLI::App* host, Context& ctx) {
  auto d = std::make_shared<MaintenanceOptions>();
  auto* dc = host->add_subcommand(
      "drain",
      "Take a node out for maintenance: cordon it, give every tenant on it notice, then shut each "
      "VM down cleanly; journaled, and finished by the coordinator if it restarts");
  dc->add_option("NODE", d->node, "The node (KubeVirt), or this host's name (QEMU)")->required();
  dc->add_option("--notice", d->notice, "How long the tenants have before their VM stops, e.g. 10m")
      ->capture_default_str();
  dc->add_option("--message", d->message, "Shown to the guests' users with the notice");
  dc->add_flag("--move", d->move,
               "Start each tenant that can move on another node with a free card (its disk "
               "must not be node-local)");
  dc->add_flag("--dry-run", d->dry_run,
               "List every tenant on the node, its tier and whether it could move; change nothing");
  dc->add_flag("--no-wait", d->no_wait, "Return once the notices are out");
  dc->add_option("--timeout", d->timeout, "How long to follow the drain")->capture_default_str();
  dc->add_option("--poll", d->poll, "How often to ask the coordinator")->capture_default_str();
  add_output_option(*dc, d->out);
  set_examples(*dc,
               {{"factory host drain utho --dry-run -o json", "who is on utho, nothing changed"},
                {"factory host drain utho --notice 30m --message 'kernel update'",
                 "30 minutes' notice, then every VM on utho shut down"},
                {"factory host drain utho --move", "and started again on other nodes"}});
  dc->callback([&ctx, d] { ctx.run = [&ctx, d] { return drain(ctx, *d); }; });

  auto u = std::make_shared<MaintenanceOptions>();
  auto* uc = host->add_subcommand(
      "undrain",
      "Bring a drained node back: uncordon it, withdraw notices not acted on, start every "
      "drained VM and wait until each is ready (same disk and identity, no re-enrollment)");
  uc->add_option("NODE", u->node, "The node drained")->required();
  uc->add_flag("--dry-run", u->dry_run, "List what would be started; change nothing");
  uc->add_flag("--no-wait", u->no_wait, "Return once the node is uncordoned");
  uc->add_option("--timeout", u->timeout, "How long to wait for every tenant to be ready")
      ->capture_default_str();
  uc->add_option("--poll", u->poll, "How often to ask the coordinator")->capture_default_str();
  add_output_option(*uc, u->out);
  set_examples(*uc, {{"factory host undrain utho", "every tenant of utho back and ready"}});
  uc->callback([&ctx, u] { ctx.run = [&ctx, u] { return undrain(ctx, *u); }; });
}

}  // namespace factory::cli
