#include "coordinator/qemu/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"
#include "coordinator/qemu/qmp.hpp"

namespace factory::qemu {

namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

std::string read_small(const std::string& path) {
  auto t = read_file(path);
  return t ? *t : "";
}

// The process's state letter from /proc/<pid>/stat ('Z': a zombie).
char proc_state(int pid) {
  std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return '?';
  return stat[close + 2];
}

}  // namespace

std::int64_t process_started_unix(int pid) {
  const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  // After the command's ")": field 3 (state) onwards; starttime is field 22.
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  unsigned long long start_ticks = 0;
  for (int field = 3; field <= 22 && fields >> f; ++field)
    if (field == 22) start_ticks = std::strtoull(f.c_str(), nullptr, 10);
  if (start_ticks == 0) return 0;
  std::istringstream proc_stat(read_small("/proc/stat"));
  std::string line;
  long long btime = 0;
  while (std::getline(proc_stat, line))
    if (line.rfind("btime ", 0) == 0) btime = std::atoll(line.c_str() + 6);
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (btime == 0 || ticks <= 0) return 0;
  return btime + static_cast<std::int64_t>(start_ticks / static_cast<unsigned long long>(ticks));
}

namespace {

bool cmdline_names(int pid, const std::string& pidfile) {
  std::string cmd = read_small("/proc/" + std::to_string(pid) + "/cmdline");
  // NUL-separated argv: look for the exact argument.
  size_t pos = 0;
  while (pos < cmd.size()) {
    size_t end = cmd.find('\0', pos);
    if (end == std::string::npos) end = cmd.size();
    if (cmd.compare(pos, end - pos, pidfile) == 0) return true;
    pos = end + 1;
  }
  return false;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

// Waits until `gone()` or the deadline; true when gone.
template <class F>
bool wait_until(F&& gone, std::chrono::milliseconds limit) {
  auto end = Steady::now() + limit;
  while (Steady::now() < end) {
    if (gone()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return gone();
}

// QEMU in a session of its own (the coordinator's terminal, process group
// and restarts do not reach it), in the VM's folder, stdin from /dev/null,
// output appended to its log, and no descriptor of the coordinator's (its listening sockets
// would otherwise stay open in every VM).
Result<pid_t> spawn_detached(const std::vector<std::string>& argv, const std::string& log,
                             const std::string& cwd) {
  std::string exe = argv.at(0);
  if (exe.find('/') == std::string::npos) {
    exe = which(exe);
    if (exe.empty()) return Error(Errc::failed_precondition, argv[0] + " is not on PATH");
  }
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (logfd < 0) return errno_error("open " + log, errno);
  int nullfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (nullfd < 0) {
    ::close(logfd);
    return errno_error("open /dev/null", errno);
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(logfd);
    ::close(nullfd);
    return errno_error("fork", e);
  }
  if (pid == 0) {
    ::setsid();
    if (::chdir(cwd.c_str()) != 0) _exit(126);
    ::dup2(nullfd, 0);
    ::dup2(logfd, 1);
    ::dup2(logfd, 2);
    ::syscall(SYS_close_range, 3U, ~0U, 0U);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(exe.c_str(), args.data());
    _exit(127);
  }
  ::close(logfd);
  ::close(nullfd);
  return pid;
}

class ChildSupervisor : public Supervisor {
 public:
  std::string kind() const override { return "child"; }
  bool restarts_itself() const override { return false; }

  Status start(const Launch& l, const std::vector<std::string>& qemu) override {
    auto pid = spawn_detached(qemu, l.process_log(), l.dir);
    if (!pid) return pid.error();
    std::lock_guard g(mu_);
    children_[l.pidfile()] = *pid;
    return {};
  }

  ProcState state(const Launch& l) override {
    ProcState s;
    std::lock_guard g(mu_);
    reap(l.pidfile(), s);
    auto it = children_.find(l.pidfile());
    if (it != children_.end()) {
      // Ours, and not ended: running, also before QEMU wrote its pidfile.
      s.running = true;
      s.pid = it->second;
      return s;
    }
    s.pid = running_qemu_pid(l.pidfile());
    s.running = s.pid != 0;
    return s;
  }

  Status stop(const Launch& l, std::chrono::milliseconds grace) override {
    auto gone = [&] { return !state(l).running; };
    if (gone()) return {};
    const int pid = state(l).pid;
    // A clean exit first: QEMU closes its disks and removes its pidfile.
    (void)qmp_execute(l.qmp_socket(), "quit", nlohmann::json::object(),
                      std::chrono::milliseconds(1500));
    if (wait_until(gone, grace)) return {};
    if (pid > 0) ::kill(pid, SIGTERM);
    if (wait_until(gone, std::chrono::seconds(5))) return {};
    if (pid > 0) ::kill(pid, SIGKILL);
    if (wait_until(gone, std::chrono::seconds(5))) return {};
    return Error(Errc::io, "QEMU of " + l.tenant + " (pid " + std::to_string(pid) +
                               ") did not end after SIGKILL");
  }

 private:
  // Collects an ended child of ours, so it leaves no zombie and its end is known.
  void reap(const std::string& key, ProcState& s) {
    auto it = children_.find(key);
    if (it == children_.end()) {
      auto e = exits_.find(key);
      if (e != exits_.end()) s.last_exit = e->second;
      return;
    }
    int status = 0;
    pid_t r = ::waitpid(it->second, &status, WNOHANG);
    if (r == it->second || (r < 0 && errno == ECHILD)) {
      exits_[key] = r == it->second ? describe_wait_status(status) : "ended";
      children_.erase(it);
    }
    auto e = exits_.find(key);
    if (e != exits_.end()) s.last_exit = e->second;
  }

  std::mutex mu_;
  std::map<std::string, pid_t> children_;  // pidfile -> the QEMU this process started
  std::map<std::string, std::string> exits_;
};

std::map<std::string, std::string> systemctl_show(const std::string& unit) {
  std::map<std::string, std::string> out;
  CommandSpec spec;
  spec.argv = {"systemctl", "show", unit,
               "--property=LoadState,ActiveState,SubState,MainPID,"
               "NRestarts,Result,ExecMainStatus"};
  spec.timeout = std::chrono::seconds(10);
  auto r = run_command(spec);
  if (!r || !r->ok()) return out;
  size_t pos = 0;
  const std::string& t = r->output;
  while (pos < t.size()) {
    size_t nl = t.find('\n', pos);
    std::string line = t.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? t.size() : nl + 1;
    auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

class SystemdSupervisor : public Supervisor {
 public:
  std::string kind() const override { return "systemd"; }
  bool restarts_itself() const override { return true; }

  Status start(const Launch& l, const std::vector<std::string>& qemu) override {
    const std::string unit = vm_unit_name(l.tenant);
    // A unit that failed for good (or was stopped) may linger: clear it.
    (void)run_command({.argv = {"systemctl", "reset-failed", unit + ".service"},
                       .timeout = std::chrono::seconds(10)});
    CommandSpec spec;
    spec.argv = systemd_run_argv("systemd-run", qemu, l);
    spec.timeout = std::chrono::seconds(30);
    auto r = run_checked(spec);
    if (!r) return r.error().with_context("systemd-run --unit " + unit);
    return {};
  }

  ProcState state(const Launch& l) override {
    ProcState s;
    auto p = systemctl_show(vm_unit_name(l.tenant) + ".service");
    s.unit_loaded = p["LoadState"] == "loaded";
    const std::string active = p["ActiveState"];
    int main_pid = std::atoi(p["MainPID"].c_str());
    s.running = (active == "active" || active == "reloading") && main_pid > 0;
    s.pid = s.running ? main_pid : 0;
    s.restarts = std::atoi(p["NRestarts"].c_str());
    if (!s.running && s.unit_loaded)
      s.last_exit = "unit " + active + " (" + p["SubState"] + ", result " + p["Result"] + ")";
    return s;
  }

  Status stop(const Launch& l, std::chrono::milliseconds grace) override {
    const std::string unit = vm_unit_name(l.tenant) + ".service";
    (void)qmp_execute(l.qmp_socket(), "quit", nlohmann::json::object(),
                      std::chrono::milliseconds(1500));
    wait_until([&] { return !state(l).running; }, grace);
    CommandSpec spec;
    spec.argv = {"systemctl", "stop", unit};
    spec.timeout = std::chrono::seconds(60);
    auto r = run_command(spec);
    if (!r) return r.error();
    (void)run_command(
        {.argv = {"systemctl", "reset-failed", unit}, .timeout = std::chrono::seconds(10)});
    if (state(l).running) return Error(Errc::io, "systemctl stop " + unit + ": " + r->tail(3));
    return {};
  }
};

}  // namespace

int running_qemu_pid(const std::string& pidfile) {
  std::string text = read_small(pidfile);
  int pid = std::atoi(text.c_str());
  if (pid <= 1) return 0;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char st = proc_state(pid);
  if (st == 'Z' || st == 'X' || st == '?') return 0;
  return cmdline_names(pid, pidfile) ? pid : 0;
}

Result<std::string> choose_supervisor(const std::string& mode) {
  std::error_code ec;
  const bool systemd_runs = fs::is_directory("/run/systemd/system", ec);
  const bool has_run = !which("systemd-run").empty();
  if (mode == "child") return std::string("child");
  if (mode == "systemd") {
    if (!systemd_runs)
      return Error(Errc::failed_precondition,
                   "qemu.supervisor is systemd, but systemd is not this host's init system "
                   "(/run/systemd/system is missing): use auto or child");
    if (!has_run)
      return Error(Errc::failed_precondition,
                   "qemu.supervisor is systemd, but systemd-run is not on PATH");
    return std::string("systemd");
  }
  return std::string(systemd_runs && has_run ? "systemd" : "child");
}

std::unique_ptr<Supervisor> make_supervisor(const std::string& kind) {
  if (kind == "systemd") return std::make_unique<SystemdSupervisor>();
  return std::make_unique<ChildSupervisor>();
}

}  // namespace factory::qemu
