#include "common/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>

extern char** environ;

namespace factory {

std::string which(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = ::getenv("PATH");
  std::string p = path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  std::stringstream ss(p);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) dir = ".";
    std::string full = dir + "/" + name;
    struct stat st {};
    if (::stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(full.c_str(), X_OK) == 0)
      return full;
  }
  return "";
}

std::string CommandResult::tail(size_t lines) const {
  size_t pos = output.size();
  if (pos && output.back() == '\n') --pos;
  size_t count = 0;
  while (pos > 0) {
    if (output[pos - 1] == '\n' && ++count == lines) break;
    --pos;
  }
  return output.substr(pos);
}

namespace {

// One eventfd for the whole process: while a CommandStop lives it is
// readable, so every run_command polling it wakes at once (now or whenever
// it next polls), without a timer of its own.
struct StopSignal {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::atomic<bool> requested{false};
  std::atomic<long long> grace_ms{0};
};

StopSignal& stop_signal() {
  static StopSignal s;
  return s;
}

}  // namespace

CommandStop::CommandStop(std::chrono::milliseconds grace) {
  auto& s = stop_signal();
  s.grace_ms = grace.count();
  s.requested = true;
  uint64_t one = 1;
  if (s.fd >= 0) (void)!::write(s.fd, &one, sizeof one);
}

CommandStop::~CommandStop() {
  auto& s = stop_signal();
  uint64_t n = 0;
  if (s.fd >= 0) (void)!::read(s.fd, &n, sizeof n);  // readable no more
  s.requested = false;
}

bool commands_stopping() {
  return stop_signal().requested.load();
}

std::string CommandResult::describe() const {
  if (stopped) return "stopped (the agent is stopping)";
  if (timed_out) return "timed out";
  if (signal) return "killed by signal " + std::to_string(signal);
  return "exited " + std::to_string(exit_code);
}

CommandSpec shell_command(const std::string& script) {
  CommandSpec s;
  s.argv = {"/bin/sh", "-c", script};
  return s;
}

Result<CommandResult> run_command(const CommandSpec& spec) {
  if (spec.argv.empty()) return Error(Errc::invalid_argument, "empty command");
  if (commands_stopping())
    return Error(Errc::unavailable, spec.argv[0] + ": not started: the process is stopping");
  std::string exe = which(spec.argv[0]);
  if (exe.empty()) return Error(Errc::not_found, spec.argv[0] + ": command not found on PATH");

  int out_pipe[2], in_pipe[2] = {-1, -1};
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return errno_error("pipe", errno);
  if (spec.stdin_data && ::pipe2(in_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return errno_error("pipe", errno);
  }

  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos && spec.env.count(kv.substr(0, eq))) continue;
    envs.push_back(std::move(kv));
  }
  for (auto& [k, v] : spec.env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) return errno_error("fork", errno);
  if (pid == 0) {
    // Child: own process group so a deadline kills the whole tree.
    ::setpgid(0, 0);
    if (spec.stdin_data)
      ::dup2(in_pipe[0], 0);
    else {
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
    }
    ::dup2(out_pipe[1], 1);
    ::dup2(out_pipe[1], 2);
    if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0) _exit(126);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(exe.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  ::close(out_pipe[1]);
  if (spec.stdin_data) {
    ::close(in_pipe[0]);
    // Small inputs only (configs, manifests): write then close so the child sees EOF.
    const std::string& d = *spec.stdin_data;
    size_t off = 0;
    signal(SIGPIPE, SIG_IGN);
    while (off < d.size()) {
      ssize_t n = ::write(in_pipe[1], d.data() + off, d.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      off += static_cast<size_t>(n);
    }
    ::close(in_pipe[1]);
  }

  CommandResult res;
  using steady = std::chrono::steady_clock;
  auto deadline = steady::now() + spec.timeout;
  const int stop_fd = stop_signal().fd;
  bool terminating = false;  // SIGTERM sent; SIGKILL at deadline
  std::string partial;
  char buf[8192];
  bool open = true;
  while (open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0) {
      // The command's own deadline, or the end of the grace after SIGTERM.
      (terminating ? res.stopped : res.timed_out) = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd pfds[2] = {{out_pipe[0], POLLIN, 0}, {stop_fd, POLLIN, 0}};
    // Once the stop is handled the eventfd (still readable) is not polled again.
    nfds_t nfds = (!terminating && stop_fd >= 0 && !spec.survives_stop) ? 2 : 1;
    int pr = ::poll(pfds, nfds, static_cast<int>(std::min<long>(left.count(), 1000)));
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    if (nfds == 2 && (pfds[1].revents & POLLIN)) {
      terminating = true;
      ::kill(-pid, SIGTERM);
      auto grace = std::chrono::milliseconds(stop_signal().grace_ms.load());
      deadline = std::min(deadline, steady::now() + grace);
    }
    if (!(pfds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t n = ::read(out_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      open = false;
      break;
    }
    res.output.append(buf, static_cast<size_t>(n));
    if (res.output.size() > spec.max_output)
      res.output.erase(0, res.output.size() - spec.max_output);
    if (spec.on_line) {
      partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = partial.find_first_of("\n\r")) != std::string::npos) {
        std::string line = partial.substr(0, nl);
        partial.erase(0, nl + 1);
        if (!line.empty()) spec.on_line(line);
      }
    }
  }
  if (spec.on_line && !partial.empty()) spec.on_line(partial);
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Reap anything the command left in its group once it is gone.
  if (res.timed_out || res.stopped) ::kill(-pid, SIGKILL);
  // Ended by the stop even if it exited on the SIGTERM in time: its result is
  // not the command's own verdict.
  if (terminating) res.stopped = true;
  if (WIFEXITED(status))
    res.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    res.signal = WTERMSIG(status);
  if (res.exit_code == 127 && res.output.empty())
    return Error(Errc::not_found, spec.argv[0] + ": could not be executed");
  return res;
}

Result<CommandResult> run_checked(const CommandSpec& spec) {
  auto r = run_command(spec);
  if (!r) return r;
  if (!r->ok()) {
    std::string tail = r->tail(5);
    for (auto& c : tail)
      if (c == '\n') c = ' ';
    return Error(r->timed_out ? Errc::timeout
                 : r->stopped ? Errc::unavailable
                              : Errc::failed_precondition,
                 spec.argv[0] + " " + r->describe() + (tail.empty() ? "" : ": " + tail));
  }
  return r;
}

}  // namespace factory
