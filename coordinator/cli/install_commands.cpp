// `factory install crds`: the custom resource definitions Factory serves
// (the Tenant, coordinator/tenants/tenant_resource.hpp), printed for
// `kubectl apply -f -` or for a GitOps repository. It prints and contacts
// nothing, so there is no --dry-run: applying is kubectl's.
#include <iostream>
#include <memory>

#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/tenants/tenant_resource.hpp"

namespace factory::cli {

void add_install_commands(CLI::App& app, Context& ctx) {
  auto* install = app.add_subcommand(
      "install", "What Factory adds to a cluster, printed for kubectl or a GitOps repository");
  install->require_subcommand(1);
  auto out = std::make_shared<OutputFormat>(OutputFormat::yaml);
  auto* crds = install->add_subcommand(
      "crds",
      "Print the CustomResourceDefinitions (Tenant, factory.dev/v1alpha1): its schema holds "
      "the rules `factory tenant create` checks; contacts nothing");
  add_output_option(*crds, *out, /*allow_table=*/false);
  set_examples(*crds, {{"factory install crds | kubectl apply -f -", "install or update the CRD"},
                       {"factory install crds > deploy/tenant-crd.yaml", "keep it in Git"},
                       {"factory install crds -o json", "the same as JSON"}});
  crds->callback([&ctx, out] {
    ctx.run = [out] {
      print_document(std::cout, *out, tenants::tenant_crd());
      return 0;
    };
  });
}

}  // namespace factory::cli
