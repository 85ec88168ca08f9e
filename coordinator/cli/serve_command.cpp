// `factory serve`: the coordinator itself (server/coordinator.hpp).
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "common/log.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/serve_guard.hpp"
#include "coordinator/server/coordinator.hpp"

namespace factory::cli {

namespace {
// Every agent is a connection and every connection a descriptor: the soft
// limit (1024 by default) would cap the fleet long before the server's own
// limits do, so the coordinator takes what the hard limit allows.
void raise_open_files_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max) return;
  rlim_t was = r.rlim_cur;
  r.rlim_cur = r.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &r) == 0)
    spdlog::debug("open files limit raised from {} to {}", was, r.rlim_cur);
}

// A write past a file-size limit (RLIMIT_FSIZE, a quota) would kill the
// coordinator with SIGXFSZ; ignored, it fails with EFBIG and is handled like
// a full disk: the write is refused, nothing is acknowledged, the
// coordinator stays up for everything that does not write.
void writes_past_a_size_limit_fail() {
  std::signal(SIGXFSZ, SIG_IGN);
}
}  // namespace

void add_serve_command(CLI::App& app, Context& ctx) {
  auto* cmd =
      app.add_subcommand("serve", "Run the coordinator: agents endpoint, admin API, status feed");
  set_examples(*cmd, {{"factory serve", "with /etc/factory/coordinator.yaml, or defaults"},
                      {"factory --config ./coordinator.yaml serve --log-level debug",
                       "a config of your own, and every detail in the log"}});
  cmd->callback([&ctx] {
    ctx.run = [&ctx]() -> int {
      auto cfg = load_config(ctx.global);
      if (!cfg) return fail(cfg.error());
      // The server logs at the config's level unless --log-level says otherwise;
      // the CLI's default (warn) is for commands.
      if (ctx.global.log_level.empty()) setup_logging("factory", cfg->log_level);
      // In this order, so that a refusal creates nothing: a coordinator
      // already running on this state is named first (its lock file exists),
      // then a listener that cannot bind stops us before the state directory,
      // CA or database exist; only then is anything made.
      auto lock = StateDirLock::take_existing(cfg->state_dir);
      if (!lock) return fail(lock.error());
      if (auto st = check_can_listen(cfg->agents_listen, "agents.listen"); !st.ok())
        return fail(st.error());
      if (auto st = check_can_listen(cfg->api_listen, "api.listen"); !st.ok())
        return fail(st.error());
      if (!lock->held()) {
        lock = StateDirLock::take(cfg->state_dir);
        if (!lock) return fail(lock.error());
      }
      raise_open_files_limit();
      writes_past_a_size_limit_fail();
      auto c = coordinator::Coordinator::open(*cfg);
      if (!c) return fail(c.error());
      if (auto st = (*c)->start(); !st.ok()) return fail(st.error());
      (*c)->run();
      // run() returned with the store closed (its queue and the latest
      // health written), so nothing is left to flush but the log. Exit here
      // rather than tear down live sessions inside the io_context's
      // destructor, where their sockets would outlive the reactor.
      spdlog::info("stopped");
      spdlog::shutdown();
      std::fflush(nullptr);
      std::_Exit(0);
    };
  });
}

}  // namespace factory::cli
