// `factory token create|list`: bootstrap tokens, through the admin API; and
// `factory token create --read-only`: an API token that reads the status
// feed (tenants, events, metrics, the dashboard) and changes nothing.
#include <iostream>
#include <memory>

#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

void add_token_commands(CLI::App& app, Context& ctx) {
  auto* token =
      app.add_subcommand("token", "Bootstrap tokens agents enroll with, and read-only API tokens");
  token->require_subcommand(1);
  struct Opts {
    std::string tenant, ttl;
    bool read_only = false;
    OutputFormat out = OutputFormat::table;
  };
  auto o = std::make_shared<Opts>();
  auto* create = token->add_subcommand(
      "create", "Create a one-time token bound to one tenant (printed once, stored hashed)");
  auto* tenant_opt =
      create->add_option("--tenant", o->tenant, "Tenant the token enrolls (DNS-1123 label)")
          ->check(tenant_name_rule());
  auto* ttl_opt = create->add_option("--ttl", o->ttl,
                                     "Lifetime, e.g. 30m, 1h (default: tokens.default_ttl, 1h)");
  auto* ro = create->add_flag("--read-only", o->read_only,
                              "An API token instead, for monitoring and the dashboard: GET of "
                              "/v1/tenants, /v1/events and /metrics, nothing else (no expiry)");
  ro->excludes(tenant_opt)->excludes(ttl_opt);
  add_output_option(*create, o->out);
  set_examples(
      *create,
      {{"factory token create --tenant alice", "valid for tokens.default_ttl"},
       {"factory token create --tenant alice --ttl 30m -o json", "with the CA pin, for a script"},
       {"factory token create --read-only", "for Prometheus or the dashboard at the API's /"}});
  create->callback([&ctx, o] {
    if (!o->read_only && o->tenant.empty())
      throw CLI::RequiredError("--tenant (or --read-only for an API token)");
    ctx.run = [&ctx, o]() -> int {
      if (o->read_only) {
        auto res =
            call_coordinator(ctx.global, "POST", "/v1/api-tokens", {{"access", "read-only"}});
        if (!res) return fail(res.error());
        if (print_document(std::cout, o->out, *res)) return 0;
        std::cout << res->value("token", "") << "\n";
        std::cerr << "Read-only API token " << res->value("id", "")
                  << " (printed once, stored hashed): GET /v1/tenants, /v1/events and /metrics "
                     "with Authorization: Bearer TOKEN, or sign in to the dashboard at the API's "
                     "/ with it.\n";
        return 0;
      }
      nlohmann::json body = {{"tenant", o->tenant}};
      if (!o->ttl.empty()) body["ttl"] = o->ttl;
      auto res = call_coordinator(ctx.global, "POST", "/v1/tokens", body);
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
  auto* list =
      token->add_subcommand("list", "List tokens (ids and states; secrets are never stored)");
  auto lo = std::make_shared<OutputFormat>(OutputFormat::table);
  add_output_option(*list, *lo);
  list->callback([&ctx, lo] {
    ctx.run = [&ctx, lo] {
      return list_from_coordinator(ctx.global, "/v1/tokens", *lo, [](const nlohmann::json& res) {
        std::vector<std::vector<std::string>> rows;
        for (auto& t : res["tokens"])
          rows.push_back({t.value("id", ""), t.value("tenant", ""), t.value("state", ""),
                          t.value("expires_at", "")});
        print_table(std::cout, {"id", "tenant", "state", "expires"}, rows);
      });
    };
  });
}

}  // namespace factory::cli
