// `factory token create|list`: bootstrap tokens, through the admin API.
#include <iostream>
#include <memory>

#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

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
  create->add_option("--tenant", o->tenant, "Tenant the token enrolls (DNS-1123 label)")
      ->required();
  create->add_option("--ttl", o->ttl, "Lifetime, e.g. 30m, 1h (default: tokens.default_ttl, 1h)");
  add_output_option(*create, o->out);
  set_examples(*create, {{"factory token create --tenant alice", "valid for tokens.default_ttl"},
                         {"factory token create --tenant alice --ttl 30m -o json",
                          "with the CA pin, for a script"}});
  create->callback([&ctx, o] {
    ctx.run = [&ctx, o]() -> int {
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
