// `factory catalog list|show|validate`: the products on offer, as the
// coordinator will build them (every ${...} resolved, the plan hash shown so
// an admin can match it with what an agent reports).
#include <iostream>
#include <memory>

#include "contract/catalog.hpp"
#include "coordinator/catalog/source.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"

namespace factory::cli {

namespace {

struct CatalogOptions {
  std::string file;
  OutputFormat list_out = OutputFormat::table;
  OutputFormat show_out = OutputFormat::yaml;
  std::string tier;
  bool plan = false;
  std::string validate_file;
};

std::string versions_text(const nlohmann::json& versions) {
  std::string out;
  for (auto& [k, v] : versions.items()) {
    if (!out.empty()) out += ", ";
    std::string val;
    if (v.is_array()) {
      for (auto& e : v) val += (val.empty() ? "" : "+") + e.get<std::string>();
    } else {
      val = v.is_string() ? v.get<std::string>() : v.dump();
    }
    out += k + " " + val;
  }
  return out.empty() ? "-" : out;
}

int list(const Context& ctx, const CatalogOptions& o) {
  auto cat = catalog::load_configured(o.file, ctx.global.config_path);
  if (!cat) return fail(cat.error());
  nlohmann::json doc = {{"source", cat->source}, {"tiers", nlohmann::json::array()}};
  for (auto& t : cat->tiers) doc["tiers"].push_back(t.to_json());
  if (print_document(std::cout, o.list_out, doc)) return 0;
  std::vector<std::vector<std::string>> rows;
  for (auto& t : cat->tiers)
    rows.push_back(
        {t.name,
         std::to_string(t.vm.gpus) + (t.vm.gpu_resource.empty() ? "" : " " + t.vm.gpu_resource),
         t.vm.cpu, t.vm.memory, t.vm.disk, std::to_string(t.steps.size()),
         versions_text(t.versions)});
  print_table(std::cout, {"tier", "gpus", "cpu", "memory", "disk", "steps", "pins"}, rows);
  return 0;
}

int show(const Context& ctx, const CatalogOptions& o) {
  auto cat = catalog::load_configured(o.file, ctx.global.config_path);
  if (!cat) return fail(cat.error());
  auto tier = cat->tier(o.tier);
  if (!tier) return fail(tier.error());
  nlohmann::json doc;
  if (o.plan) {
    nlohmann::json plan = (*tier)->plan();
    doc = {{"tier", (*tier)->name}, {"plan_hash", catalog::plan_hash(plan)}, {"plan", plan}};
  } else {
    doc = (*tier)->to_json();
  }
  print_document(std::cout, o.show_out, doc);
  return 0;
}

int validate(const CatalogOptions& o) {
  auto cat = catalog::load_file(o.validate_file);
  if (!cat) return fail(cat.error());
  std::cout << "catalog " << o.validate_file << ": valid, " << cat->tiers.size()
            << (cat->tiers.size() == 1 ? " tier: " : " tiers: ");
  auto names = cat->names();
  for (size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << names[i];
  std::cout << "\n";
  return 0;
}

}  // namespace

void add_catalog_commands(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<CatalogOptions>();
  auto* group = app.add_subcommand("catalog", "The products (tiers) Factory offers");
  group->require_subcommand(1);
  group->add_option("--catalog", opts->file,
                    "Catalog file to use instead of the built-in one (default: the config's "
                    "'catalog' key, else built-in)");

  auto* l = group->add_subcommand("list", "List the tiers with their VM shape and pinned versions");
  add_output_option(*l, opts->list_out);
  set_examples(*l, {{"factory catalog list", "the built-in tiers (or the config's catalog)"},
                    {"factory catalog --catalog my.yaml list", "the tiers of a file of yours"}});
  l->callback([&ctx, opts] { ctx.run = [&ctx, opts] { return list(ctx, *opts); }; });

  auto* s =
      group->add_subcommand("show", "Show one tier: VM shape, versions and its resolved steps");
  s->add_option("TIER", opts->tier, "Tier name, e.g. gpu-vm")->required();
  s->add_flag("--plan", opts->plan, "Print the plan the guest agent receives and its hash instead");
  add_output_option(*s, opts->show_out, /*allow_table=*/false);
  set_examples(*s, {{"factory catalog show gpu-vm", "the tier with its steps"},
                    {"factory catalog show gpu-vm --plan -o json", "the plan an agent receives"}});
  s->callback([&ctx, opts] { ctx.run = [&ctx, opts] { return show(ctx, *opts); }; });

  auto* v = group->add_subcommand("validate", "Check a catalog file without using it");
  v->add_option("FILE", opts->validate_file, "Catalog YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  set_examples(*v, {{"factory catalog validate my.yaml", "every error with where it is"}});
  v->callback([&ctx, opts] { ctx.run = [opts] { return validate(*opts); }; });
}

}  // namespace factory::cli
