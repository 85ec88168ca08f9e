// `factory tenant keys create|list|revoke`: a model endpoint's named keys
// (coordinator/tenants/endpoint_keys.hpp), through the admin API.
#include <iostream>
#include <memory>

#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/endpoint_keys.hpp"

namespace factory::cli {
namespace {

using nlohmann::json;

std::string keys_str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// A usage error (exit 2) before anything is sent, as tenant names are.
CLI::Validator key_name_rule() {
  return CLI::Validator(
      [](std::string& v) {
        auto st = tenants::validate_key_name(v);
        return st.ok() ? std::string() : st.error().message;
      },
      "KEY", "key name");
}

Status check_names(const std::string& tenant, const std::string& key) {
  if (auto st = enroll::validate_tenant_name(tenant); !st.ok())
    return st.error().with_context("tenant name");
  if (auto st = tenants::validate_key_name(key); !st.ok())
    return st.error().with_context("--key-name");
  return {};
}

int keys_create(const Context& ctx, const std::string& tenant, const std::string& key,
                std::int64_t rpm, std::int64_t tpm, bool dry_run, OutputFormat out) {
  if (auto st = check_names(tenant, key); !st.ok()) return fail(st.error());
  json body = {{"name", key}, {"dry_run", dry_run}};
  if (rpm > 0) body["rpm"] = rpm;
  if (tpm > 0) body["tpm"] = tpm;
  auto res =
      call_coordinator(ctx.global, "POST", api_path({"v1", "tenants", tenant, "keys"}), body);
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  const json& r = *res;
  auto limits = [&] {
    std::string s;
    if (!keys_str(r, "rpm").empty()) s += " rpm " + keys_str(r, "rpm");
    if (!keys_str(r, "tpm").empty()) s += " tpm " + keys_str(r, "tpm");
    return s.empty() ? std::string(" (no limit)") : s;
  };
  if (dry_run) {
    std::cout << "would create key " << display_text(key) << " of tenant " << tenant << limits()
              << "; nothing changed\n";
    return 0;
  }
  if (!keys_str(r, "note").empty())
    std::cerr << "note: " << display_text(keys_str(r, "note")) << "\n";
  // The key goes to stdout alone, once: what a script captures.
  std::cerr << "created key " << display_text(key) << " of tenant " << tenant << limits()
            << "; it is shown once, now:\n";
  std::cout << keys_str(r, "api_key") << "\n";
  return 0;
}

int keys_list(const Context& ctx, const std::string& tenant, OutputFormat out) {
  if (auto st = enroll::validate_tenant_name(tenant); !st.ok())
    return fail(st.error().with_context("tenant name"));
  return list_from_coordinator(
      ctx.global, api_path({"v1", "tenants", tenant, "keys"}), out, [](const json& r) {
        std::vector<std::vector<std::string>> rows;
        for (const auto& k : r.value("keys", json::array())) {
          json u = k.value("usage", json::object());
          auto n = [&](const char* f) { return u.contains(f) ? keys_str(u, f) : std::string("0"); };
          rows.push_back({keys_str(k, "name"), keys_str(k, "created_at"),
                          keys_str(k, "rpm").empty() ? "-" : keys_str(k, "rpm"),
                          keys_str(k, "tpm").empty() ? "-" : keys_str(k, "tpm"), n("requests"),
                          n("errors"), n("prompt_tokens"), n("completion_tokens")});
        }
        print_table(std::cout,
                    {"KEY", "CREATED", "RPM", "TPM", "REQUESTS", "ERRORS", "PROMPT", "COMPLETION"},
                    rows);
      });
}

int keys_revoke(const Context& ctx, const std::string& tenant, const std::string& key, bool dry_run,
                OutputFormat out) {
  if (auto st = check_names(tenant, key); !st.ok()) return fail(st.error());
  std::string path = api_path({"v1", "tenants", tenant, "keys", key});
  if (dry_run) path += "?dry_run=true";
  auto res = call_coordinator(ctx.global, "DELETE", path);
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  const json& r = *res;
  if (dry_run) {
    std::cout << "would revoke key " << display_text(key) << " of tenant " << tenant
              << "; nothing changed\n";
    return 0;
  }
  std::cout << "revoked key " << display_text(key) << " of tenant " << tenant << ": "
            << (r.value("guest_told", false) ? "refused from now on"
                                             : "refused once the guest's agent reconnects")
            << "\n";
  if (!keys_str(r, "note").empty())
    std::cerr << "note: " << display_text(keys_str(r, "note")) << "\n";
  return 0;
}

}  // namespace

void add_tenant_keys_commands(CLI::App* tenant, Context& ctx) {
  auto* group = tenant->add_subcommand(
      "keys",
      "A model endpoint's named API keys beside its own: each shown once at create, stored as "
      "its SHA-256, with optional limits per minute (docs/model-endpoint.md)");
  group->require_subcommand(1);

  struct Opts {
    std::string tenant, key;
    std::int64_t rpm = 0, tpm = 0;
    bool dry_run = false;
    OutputFormat out = OutputFormat::table;
  };
  auto co = std::make_shared<Opts>();
  auto* c = group->add_subcommand(
      "create", "Make a named key; the key is printed once, on stdout, and kept nowhere");
  c->add_option("NAME", co->tenant, "Tenant name (a tier with an endpoint)")
      ->required()
      ->check(tenant_name_rule());
  c->add_option("--key-name", co->key, "The key's name: [a-z0-9][a-z0-9-]{0,62}")
      ->required()
      ->check(key_name_rule());
  c->add_option("--rpm", co->rpm, "Requests per minute at most (429 with Retry-After past it)")
      ->check(CLI::Range(std::int64_t{1}, tenants::kMaxKeyLimit));
  c->add_option("--tpm", co->tpm,
                "Tokens (prompt + completion) per minute at most (429 with Retry-After past it)")
      ->check(CLI::Range(std::int64_t{1}, tenants::kMaxKeyLimit));
  c->add_flag("--dry-run", co->dry_run, "Check the request; make no key");
  add_output_option(*c, co->out);
  set_examples(*c, {{"factory tenant keys create t5 --key-name ci", "a key for CI; printed once"},
                    {"factory tenant keys create t5 --key-name app --rpm 60 --tpm 20000",
                     "a key with limits per minute"},
                    {"factory tenant keys create t5 --key-name app --dry-run", "nothing made"}});
  c->callback([&ctx, co] {
    ctx.run = [&ctx, co] {
      return keys_create(ctx, co->tenant, co->key, co->rpm, co->tpm, co->dry_run, co->out);
    };
  });

  auto lo = std::make_shared<Opts>();
  auto* l = group->add_subcommand(
      "list", "The endpoint's keys (\"default\" is the tenant's own), limits and usage");
  l->add_option("NAME", lo->tenant, "Tenant name")->required()->check(tenant_name_rule());
  add_output_option(*l, lo->out);
  set_examples(*l, {{"factory tenant keys list t5", "names, limits, requests and tokens"},
                    {"factory tenant keys list t5 -o json", "the same for scripts"}});
  l->callback([&ctx, lo] { ctx.run = [&ctx, lo] { return keys_list(ctx, lo->tenant, lo->out); }; });

  auto ro = std::make_shared<Opts>();
  auto* r = group->add_subcommand(
      "revoke",
      "Revoke a named key: the endpoint refuses it at once when the guest's agent is connected "
      "(the default key is replaced with `tenant credentials --rotate` instead)");
  r->add_option("NAME", ro->tenant, "Tenant name")->required()->check(tenant_name_rule());
  r->add_option("--key-name", ro->key, "The key's name")->required()->check(key_name_rule());
  r->add_flag("--dry-run", ro->dry_run, "Say what would be revoked; change nothing");
  add_output_option(*r, ro->out);
  set_examples(*r, {{"factory tenant keys revoke t5 --key-name ci --dry-run", "nothing changes"},
                    {"factory tenant keys revoke t5 --key-name ci", "refused from now on"}});
  r->callback([&ctx, ro] {
    ctx.run = [&ctx, ro] { return keys_revoke(ctx, ro->tenant, ro->key, ro->dry_run, ro->out); };
  });
}

}  // namespace factory::cli
