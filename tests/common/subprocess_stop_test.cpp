// CommandStop: how a stopping agent ends the commands its steps run. SIGTERM
// to each command's process group first, so an installer can end cleanly;
// SIGKILL to what ignores it once the grace is over; nothing new started
// meanwhile. It is process-wide, so each case runs in a child process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "common/subprocess.hpp"

using namespace factory;
using namespace std::chrono_literals;

namespace {

// Runs fn in a forked child; its exit status is fn's number of failed checks.
int in_child(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

int check(bool ok, const std::string& what) {
  if (!ok) std::cerr << "FAILED: " << what << "\n";
  return ok ? 0 : 1;
}

struct Timed {
  Result<CommandResult> result = Error(Errc::internal, "not run");
  std::chrono::milliseconds took{};
};

Timed run_timed(const std::string& script) {
  Timed t;
  auto t0 = std::chrono::steady_clock::now();
  auto spec = shell_command(script);
  spec.timeout = 60s;
  t.result = run_command(spec);
  t.took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return t;
}

}  // namespace

TEST(CommandStop, TermFirstThenKillAfterTheGraceThenNothingNew) {
  int failures = in_child([] {
    Timed polite, stubborn;
    // Ends on SIGTERM, as apt-get and dpkg do, through its trap.
    std::thread a(
        [&] { polite = run_timed("trap 'echo got-term; exit 7' TERM; sleep 30 & wait"); });
    // Ignores SIGTERM (and so do the sleeps it starts): only SIGKILL ends it.
    std::thread b(
        [&] { stubborn = run_timed("trap '' TERM; echo ignoring; while :; do sleep 0.1; done"); });
    std::this_thread::sleep_for(500ms);
    auto t0 = std::chrono::steady_clock::now();
    int f = 0;
    {
      CommandStop stop(1500ms);
      a.join();
      b.join();
      auto all = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
      f += check(polite.result.ok() && stubborn.result.ok(), "both ran");
      if (f) return f;
      f += check(polite.result->stopped, "the polite one is marked stopped");
      f += check(polite.result->exit_code == 7,
                 "its trap ran (exit 7), got " + std::to_string(polite.result->exit_code));
      f += check(polite.result->output.find("got-term") != std::string::npos,
                 "its trap printed: " + polite.result->output);
      f += check(!polite.result->ok(), "a stopped command is not a success");
      f += check(stubborn.result->stopped, "the stubborn one is marked stopped");
      f += check(stubborn.result->signal == SIGKILL,
                 "it was killed by SIGKILL, got signal " + std::to_string(stubborn.result->signal));
      f += check(all >= 1400ms && all < 5s, "SIGKILL came at the end of the grace, after " +
                                                std::to_string(all.count()) + " ms");
      f += check(polite.result->describe() == "stopped (the agent is stopping)",
                 polite.result->describe());
      auto during = run_timed("echo never");
      f += check(!during.result.ok() && during.result.error().code == Errc::unavailable,
                 "nothing starts while stopping");
      f += check(commands_stopping(), "stopping");
    }
    // The stopper has waited for its threads and gone: commands run again.
    auto after = run_timed("echo again");
    f += check(after.result.ok() && after.result->ok() && !after.result->stopped,
               "commands run again once the stop is over");
    f += check(after.took < 1s, "and are not stopped at once");
    return f;
  });
  EXPECT_EQ(failures, 0) << "see the FAILED lines above";
}

TEST(CommandStop, WithoutAStopCommandsRunAsBefore) {
  int failures = in_child([] {
    auto r = run_timed("echo fine");
    int f = check(r.result.ok() && r.result->ok() && !r.result->stopped, "ran normally");
    f += check(!commands_stopping(), "no stop was asked for");
    return f;
  });
  EXPECT_EQ(failures, 0);
}
