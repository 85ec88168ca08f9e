#pragma once
// Runs a command without a shell (argv, resolved through PATH), with a
// deadline, captured output and an optional line callback for progress.
// Steps and host actions use it so that tests can put stand-ins first on PATH.
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory {

struct CommandSpec {
  std::vector<std::string> argv;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  std::optional<std::string> stdin_data;
  std::map<std::string, std::string> env;  // added to / overriding the inherited environment
  std::string cwd;
  size_t max_output = 1 << 20;                           // keep the last max_output bytes
  std::function<void(const std::string& line)> on_line;  // stdout and stderr lines as they come
  // The command that asks for this process's own stop (`systemctl restart`
  // of its own unit): systemd's SIGTERM can reach the process before the
  // command has returned, and a CommandStop must not end the very request
  // that caused it. Such a command is still not started once a stop is in
  // force (a stop asked for by someone else wins).
  bool survives_stop = false;
};

struct CommandResult {
  int exit_code = -1;  // -1 if killed by a signal or by the deadline
  bool timed_out = false;
  bool stopped = false;  // ended by a CommandStop: the process is stopping
  int signal = 0;
  std::string output;  // stdout and stderr interleaved, tail-capped
  bool ok() const { return exit_code == 0 && !timed_out && !stopped; }
  std::string tail(size_t lines = 20) const;
  // "exited 2", "killed by signal 9", "timed out after 30s"
  std::string describe() const;
};

// Errors only when the command could not be started (not on PATH, not
// executable, or a CommandStop is in force: Errc::unavailable).
Result<CommandResult> run_command(const CommandSpec& spec);

// For a process that is stopping (factory-agent on SIGTERM, as systemd stops
// it for a reboot or a `systemctl stop`): while a CommandStop lives, every
// command run_command is running, on any thread, gets SIGTERM to its process
// group, so an installer can end cleanly, and SIGKILL to whatever of the
// group is left after `grace`; their run_command calls return with
// `stopped`, and commands asked for meanwhile are not started. Made by the
// one that then waits for the threads running commands to end; once it is
// gone commands run again (the agent exits by then; an in-process test goes
// on). One at a time.
class CommandStop {
 public:
  explicit CommandStop(std::chrono::milliseconds grace);
  ~CommandStop();
  CommandStop(const CommandStop&) = delete;
  CommandStop& operator=(const CommandStop&) = delete;
};
bool commands_stopping();

// Convenience: run and turn a non-zero exit into an Error carrying the output tail.
Result<CommandResult> run_checked(const CommandSpec& spec);

// Explicitly asks for a shell. Use only for admin-provided `script` steps.
CommandSpec shell_command(const std::string& script);

// Looks up an executable on PATH (as execvp would); empty if absent.
std::string which(const std::string& name);

}  // namespace factory
