#include "agent/cli/upgrade_guard_command.hpp"

#include <spdlog/spdlog.h>

#include <memory>

#include "agent/upgrade/guard.hpp"
#include "common/cli/app.hpp"
#include "common/log.hpp"

namespace factory::agent {

void add_upgrade_guard_command(CLI::App& app, LocalCommand& chosen) {
  struct Opts {
    std::string action;
    std::string state;
    std::string root = "/";
  };
  auto o = std::make_shared<Opts>();
  auto* guard = app.add_subcommand(
      "upgrade-guard",
      "Run by systemd around the agent's unit while an upgrade is on trial: counts the new "
      "binary's starts, records its exits, and puts the previous binary back when it keeps "
      "failing or never reports health (docs/agent-upgrades.md)");
  guard->add_option("action", o->action, "pre-start, post-stop or deadline")
      ->required()
      ->check(CLI::IsMember({"pre-start", "post-stop", "deadline"}));
  guard->add_option("--state", o->state, "The upgrade's state file")->required();
  guard->add_option("--root", o->root, "Filesystem root of the guest (tests: a simulated guest)");
  cli::set_examples(*guard, {{"factory-agent upgrade-guard pre-start --state "
                              "/var/lib/factory-agent/upgrade/state.json",
                              "what the unit's ExecStartPre runs during a trial"}});
  guard->callback([&chosen, o] {
    chosen.run = [o] {
      // Its lines go to the unit's journal: what it did is worth reading there.
      setup_logging("factory-agent", "info");
      auto action = parse_guard_action(o->action);
      if (!action) {
        spdlog::error("{}", action.error().message);
        return 2;
      }
      GuardContext ctx;
      ctx.env.root = o->root;
      const GuardOutcome done = run_upgrade_guard(*action, o->state, ctx);
      spdlog::debug("upgrade guard {}: {}", o->action, guard_outcome_name(done));
      return 0;
    };
  });
}

}  // namespace factory::agent
