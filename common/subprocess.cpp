#include "common/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

std::string CommandResult::describe() const {
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
  std::string exe = which(spec.argv[0]);
  if (exe.empty())
    return Error(Errc::not_found, spec.argv[0] + ": command not found on PATH");

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
    if (spec.stdin_data) ::dup2(in_pipe[0], 0);
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
  auto deadline = std::chrono::steady_clock::now() + spec.timeout;
  std::string partial;
  char buf[8192];
  bool open = true;
  while (open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      res.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd pfd{out_pipe[0], POLLIN, 0};
    int pr = ::poll(&pfd, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
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
  if (res.timed_out) ::kill(-pid, SIGKILL);
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
  if (res.exit_code == 127 && res.output.empty())
    return Error(Errc::not_found, spec.argv[0] + ": could not be executed");
  return res;
}

Result<CommandResult> run_checked(const CommandSpec& spec) {
  auto r = run_command(spec);
  if (!r) return r;
  if (!r->ok()) {
    std::string tail = r->tail(5);
    for (auto& c : tail) if (c == '\n') c = ' ';
    return Error(r->timed_out ? Errc::timeout : Errc::failed_precondition,
                 spec.argv[0] + " " + r->describe() + (tail.empty() ? "" : ": " + tail));
  }
  return r;
}

}  // namespace factory
