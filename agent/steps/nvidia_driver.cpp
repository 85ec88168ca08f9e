#include "agent/steps/nvidia_driver.hpp"

#include <algorithm>

#include "agent/diagnose/known.hpp"
#include "agent/diagnose/rules.hpp"
#include "agent/guest/facts.hpp"
#include "agent/guest/nvidia_smi.hpp"
#include "agent/steps/step_util.hpp"
#include "common/atomic_file.hpp"

namespace factory::agent::steps {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct DriverParams {
  std::string version;
  std::string package_version;
  std::vector<std::string> packages;
  std::vector<std::string> prerequisites;
  bool kernel_headers{};
  std::string repo_kind;
  std::string repo_url;
  std::string cache_dir;
  bool reboot{};
};

// apt waits for the dpkg lock instead of failing: on a cloud image's first
// boot unattended-upgrades often holds it, and after an agent crash an
// orphaned apt-get may still be finishing.
const std::vector<std::string> kApt = {"apt-get", "-o", "DPkg::Lock::Timeout=600"};
const std::map<std::string, std::string> kAptEnv = {{"DEBIAN_FRONTEND", "noninteractive"}};

// "https://host/path/name_1.0-1_amd64.deb" -> "name_1.0-1_amd64.deb"
std::string url_basename(const std::string& url) {
  auto q = url.find_first_of("?#");
  std::string path = url.substr(0, q);
  return path.substr(path.rfind('/') + 1);
}

// A .deb's file name starts with its package name: "name_version_arch.deb".
std::string deb_package_name(const std::string& file) {
  return file.substr(0, file.find('_'));
}

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

class NvidiaDriver final : public Step {
 public:
  explicit NvidiaDriver(DriverParams p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    auto gpus = nvidia_gpus(ctx.env);
    if (gpus.empty() || !kernel_module_loaded(ctx.env, "nvidia")) return false;
    for (const auto& g : gpus)
      if (g.driver != "nvidia") return false;
    auto smi = query_nvidia_smi({}, time_left(ctx, 60s));
    if (!smi || smi->driver_version != p_.version || smi->gpus.empty()) return false;
    return unheld().empty() && off_pin().empty();
  }

  StepOutcome apply(StepContext& ctx) override {
    if (nvidia_gpus(ctx.env).empty()) return no_gpu(ctx);

    auto kernel = uname_r(ctx);
    if (!kernel)
      return StepOutcome::failure("cannot read the kernel release: " + kernel.error().message);

    // 1. Prerequisites and the running kernel's headers (DKMS builds against them).
    std::vector<std::string> base = p_.prerequisites;
    if (p_.kernel_headers) base.push_back("linux-headers-" + *kernel);
    std::vector<std::string> missing;
    for (const auto& pkg : base)
      if (!dpkg_package(pkg).installed) missing.push_back(pkg);
    if (!missing.empty()) {
      progress(ctx, "installing " + command_line(missing));
      if (auto out = apt(ctx, {"update"}, *kernel); !out.ok()) return out;
      std::vector<std::string> args = {"install", "-y"};
      args.insert(args.end(), missing.begin(), missing.end());
      if (auto out = apt(ctx, args, *kernel); !out.ok()) return out;
    }

    // 2. NVIDIA's repository.
    if (auto out = ensure_repo(ctx, *kernel); !out.ok()) return out;

    // 3. The pinned driver packages.
    std::vector<std::string> need;
    for (const auto& pkg : p_.packages) {
      auto st = dpkg_package(pkg);
      if (!st.installed || st.version != p_.package_version) need.push_back(pkg);
    }
    if (!need.empty()) {
      // The hold is released only here, by a plan whose pin differs from
      // what is installed: nothing else may move the driver.
      std::vector<std::string> held;
      for (const auto& pkg : need)
        if (dpkg_package(pkg).held) held.push_back(pkg);
      if (!held.empty())
        if (auto out = apt_mark(ctx, "unhold", held); !out.ok()) return out;
      progress(ctx,
               "installing the NVIDIA driver " + p_.package_version + " (DKMS builds the module)");
      if (auto out = apt(ctx, {"update"}, *kernel); !out.ok()) return out;
      // --allow-downgrades: a tier upgrade that goes back installs the
      // previous pin over a newer one, which apt otherwise refuses under -y.
      std::vector<std::string> args = {"install", "-y", "--allow-downgrades"};
      for (const auto& pkg : need) args.push_back(pkg + "=" + p_.package_version);
      if (auto out = apt(ctx, args, *kernel); !out.ok()) return out;
    }

    // 3b. Held at the pin, so an unattended upgrade cannot move the driver
    //     under the running module (the packages the catalog names: their
    //     exact-version dependencies keep the rest).
    if (auto h = unheld(); !h.empty())
      if (auto out = apt_mark(ctx, "hold", h); !out.ok()) return out;

    // Remember the boot the driver was installed in: after the reboot a
    // module that still does not load is a diagnosis, not another reboot.
    json state = load_step_state(ctx);
    std::string now = boot_id(ctx.env);
    if (!state.contains("install_boot_id") || !need.empty()) {
      state["install_boot_id"] = now;
      state["kernel"] = *kernel;
      if (auto st = save_step_state(ctx, state); !st)
        return StepOutcome::failure("cannot record the install in the agent's state: " +
                                    st.error().message);
    }

    // 4. Already live (e.g. an earlier boot loaded it): nothing left to do.
    if (auto done = check(ctx); done && *done)
      return StepOutcome::success("driver " + p_.version + " loaded");

    if (!p_.reboot) {
      auto r = run_in_step(ctx, {"modprobe", "nvidia"}, 2min);
      if (!r || !r->ok()) {
        auto obs = observe(ctx);
        auto d = diagnose_gpu_driver(obs);
        return StepOutcome::failure("modprobe nvidia failed", r ? r->tail(15) : r.error().message,
                                    d);
      }
      return StepOutcome::success("driver " + p_.version +
                                  " installed and loaded without a reboot");
    }

    std::string installed_in = state.value("install_boot_id", "");
    if (!installed_in.empty() && !now.empty() && installed_in != now) {
      // The guest has rebooted since the install and the driver still is not
      // live: rebooting again would loop.
      auto obs = observe(ctx);
      auto d = diagnose_gpu_driver(obs);
      std::string msg =
          "the guest rebooted after the driver install and the driver is still not live";
      if (d) msg += ": " + d->summary;
      return StepOutcome::failure(msg, last_lines(obs.kernel_log, 15), d);
    }
    return StepOutcome::reboot(
        "NVIDIA driver " + p_.package_version +
        " installed; the guest reboots to load it (nouveau cannot hand over the "
        "card while running)");
  }

  StepOutcome verify(StepContext& ctx) override {
    auto obs = observe(ctx);
    if (obs.gpus.empty()) return no_gpu(ctx);
    auto smi = query_nvidia_smi({}, time_left(ctx, 60s));
    if (smi) obs.smi_version = smi->driver_version;

    bool bound = std::all_of(obs.gpus.begin(), obs.gpus.end(),
                             [](const PciFunction& f) { return f.driver == "nvidia"; });
    bool listed = smi && smi->gpus.size() >= obs.gpus.size() &&
                  std::all_of(smi->gpus.begin(), smi->gpus.end(), [](const GpuReading& g) {
                    return g.memory_total_mib.value_or(0) > 0;
                  });
    std::vector<std::string> loose = unheld();
    if (obs.module_loaded && bound && listed && obs.smi_version == p_.version && !loose.empty())
      return StepOutcome::failure("driver " + p_.version + " loaded but " + command_line(loose) +
                                  " not held (apt-mark hold): an upgrade could move it");
    if (obs.module_loaded && bound && listed && obs.smi_version == p_.version) {
      std::string what;
      for (const auto& g : smi->gpus)
        what += (what.empty() ? "" : ", ") + g.name + " (" + std::to_string(*g.memory_total_mib) +
                " MiB) at " + g.pci_bus_id;
      return StepOutcome::success("driver " + p_.version +
                                  " loaded, Kernel driver in use: nvidia; " + what + "; " +
                                  command_line(p_.packages) + " held at " + p_.package_version);
    }

    auto d = diagnose_gpu_driver(obs);
    std::string msg;
    if (!obs.module_loaded)
      msg = "the nvidia module is not loaded";
    else if (!bound)
      msg = "the GPU is not bound to the nvidia driver";
    else if (!smi)
      msg = smi.error().message;
    else if (obs.smi_version != p_.version)
      msg = "nvidia-smi reports driver " + obs.smi_version + ", expected " + p_.version;
    else
      msg = "nvidia-smi does not list every GPU with its memory";
    if (d) msg += ": " + d->summary;
    std::string tail = smi ? std::string() : smi.error().message;
    if (!obs.module_loaded) tail = last_lines(obs.kernel_log, 15);
    return StepOutcome::failure(msg, tail, d);
  }

 private:
  StepOutcome no_gpu(StepContext& ctx) {
    json seen = json::array();
    for (const auto& f : scan_pci_bus(ctx.env)) seen.push_back(f.to_json());
    auto d = diagnoses::gpu_not_on_pci_bus(seen);
    return StepOutcome::failure(d.summary, {}, d);
  }

  void progress(StepContext& ctx, const std::string& message) {
    emit_progress(ctx, {{"state", "progress"}, {"message", message}});
  }

  Result<std::string> uname_r(StepContext& ctx) {
    auto r = run_in_step(ctx, {"uname", "-r"}, 30s);
    if (!r) return r.error();
    if (!r->ok()) return Error(Errc::failed_precondition, "uname -r " + r->describe());
    return one_line(r->output);
  }

  // The pinned packages dpkg has installed but not held. (A driver that
  // came some other way, as with the H200 image's, has nothing to hold.)
  std::vector<std::string> unheld() const {
    std::vector<std::string> out;
    for (const auto& pkg : p_.packages) {
      auto st = dpkg_package(pkg);
      if (st.installed && !st.held) out.push_back(pkg);
    }
    return out;
  }

  // The pinned packages dpkg knows at another version, or not fully
  // installed (a failed upgrade's half-configured packages): the module
  // still loaded from before says nothing about what the next boot loads.
  std::vector<std::string> off_pin() const {
    std::vector<std::string> out;
    for (const auto& pkg : p_.packages) {
      auto st = dpkg_package(pkg);
      if (!st.version.empty() && (st.version != p_.package_version || !st.installed))
        out.push_back(pkg);
    }
    return out;
  }

  StepOutcome apt_mark(StepContext& ctx, const std::string& verb,
                       const std::vector<std::string>& pkgs) {
    std::vector<std::string> argv = {"apt-mark", verb};
    argv.insert(argv.end(), pkgs.begin(), pkgs.end());
    auto r = run_in_step(ctx, argv, 2min, kAptEnv);
    if (!r) return StepOutcome::failure("apt-mark: " + r.error().message);
    if (!r->ok())
      return StepOutcome::failure(command_line(argv) + " " + r->describe(), r->tail(20));
    return StepOutcome::success();
  }

  StepOutcome apt(StepContext& ctx, const std::vector<std::string>& args,
                  const std::string& kernel) {
    std::vector<std::string> argv = kApt;
    argv.insert(argv.end(), args.begin(), args.end());
    std::string cmd = "apt-get " + command_line(args);
    auto r = run_in_step(ctx, argv, 40min, kAptEnv);
    if (!r) {
      auto d = diagnoses::apt_failed(cmd, r.error().message);
      return StepOutcome::failure(cmd + ": " + r.error().message, {}, d);
    }
    if (r->ok()) return StepOutcome::success();
    auto d = diagnose_package_failure(cmd, r->output, kernel);
    return StepOutcome::failure(cmd + " " + r->describe() + ": " + d.summary, r->tail(20), d);
  }

  StepOutcome ensure_repo(StepContext& ctx, const std::string& kernel) {
    const std::string file = url_basename(p_.repo_url);
    const std::string repo_pkg = deb_package_name(file);
    if (!dpkg_package(repo_pkg).installed) {
      fs::path deb = ctx.env.path(p_.cache_dir) / file;
      std::error_code ec;
      if (!fs::exists(deb, ec)) {
        if (auto st = ensure_dir(deb.parent_path()); !st)
          return StepOutcome::failure("cannot create " + deb.parent_path().string() + ": " +
                                      st.error().message);
        progress(ctx, "downloading " + file);
        // Into a .part file renamed when complete: a crash mid-download never
        // leaves a truncated .deb that looks finished.
        fs::path part = deb;
        part += ".part";
        auto r = run_in_step(
            ctx, {"curl", "-fsSL", "--retry", "3", "-o", part.string(), p_.repo_url}, 30min);
        if (!r || !r->ok()) {
          fs::remove(part, ec);
          std::string tail = r ? r->tail(10) : r.error().message;
          auto d = diagnoses::download_failed(p_.repo_url, tail);
          return StepOutcome::failure("downloading " + p_.repo_url + " failed", tail, d);
        }
        fs::rename(part, deb, ec);
        if (ec) return StepOutcome::failure("cannot move the download into place: " + ec.message());
      }
      progress(ctx, "installing the repository package " + file);
      auto r = run_in_step(ctx, {"dpkg", "-i", deb.string()}, 10min, kAptEnv);
      if (!r || !r->ok()) {
        std::string out = r ? r->output : r.error().message;
        auto d = diagnose_package_failure("dpkg -i " + file, out, kernel);
        // A .deb dpkg cannot read is a bad download: drop it so a retry fetches it again.
        if (out.find("not a Debian format archive") != std::string::npos) fs::remove(deb, ec);
        return StepOutcome::failure("dpkg -i " + file + " failed", r ? r->tail(20) : out, d);
      }
    }
    if (p_.repo_kind == "local") {
      // NVIDIA's local repository package unpacks the repository and its
      // signing key under /var/<package>/; apt trusts the key only from
      // /usr/share/keyrings (NVIDIA's install instructions copy it there).
      fs::path repo_dir = ctx.env.path("/var/" + repo_pkg);
      fs::path keyrings = ctx.env.path("/usr/share/keyrings");
      std::error_code ec;
      for (fs::directory_iterator it(repo_dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string name = it->path().filename().string();
        if (name.size() < 12 || name.compare(name.size() - 12, 12, "-keyring.gpg") != 0) continue;
        fs::path dest = keyrings / name;
        std::error_code cec;
        if (fs::exists(dest, cec)) continue;
        fs::create_directories(keyrings, cec);
        auto data = read_file(it->path());
        if (!data)
          return StepOutcome::failure("cannot read " + it->path().string() + ": " +
                                      data.error().message);
        if (auto st = write_file_atomic(dest, *data, 0644); !st)
          return StepOutcome::failure("cannot install the repository key: " + st.error().message);
      }
    }
    return StepOutcome::success();
  }

  GpuDriverObservations observe(StepContext& ctx) {
    GpuDriverObservations o;
    o.gpus = nvidia_gpus(ctx.env);
    o.module_loaded = kernel_module_loaded(ctx.env, "nvidia");
    o.driver_package = p_.packages.front();
    o.package = dpkg_package(o.driver_package);
    json state = load_step_state(ctx);
    std::string installed_in = state.value("install_boot_id", "");
    std::string now = boot_id(ctx.env);
    if (!installed_in.empty() && !now.empty()) o.rebooted_since_install = installed_in != now;
    o.kernel_log = kernel_log(ctx.env);
    o.expected_version = p_.version;
    return o;
  }

  DriverParams p_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_nvidia_driver(const StepSpec& spec) {
  auto j = normalized_params("nvidia_driver", spec);
  if (!j) return j.error();
  const json& repo = (*j)["repo"];
  DriverParams p;
  p.version = (*j)["version"].get<std::string>();
  p.package_version = (*j)["package_version"].get<std::string>();
  p.packages = (*j)["packages"].get<std::vector<std::string>>();
  p.prerequisites = (*j)["prerequisites"].get<std::vector<std::string>>();
  p.kernel_headers = (*j)["kernel_headers"].get<bool>();
  p.reboot = (*j)["reboot"].get<bool>();
  p.repo_kind = repo["kind"].get<std::string>();
  p.repo_url = repo["url"].get<std::string>();
  p.cache_dir = repo["cache_dir"].get<std::string>();
  return std::unique_ptr<Step>(new NvidiaDriver(std::move(p)));
}

}  // namespace factory::agent::steps
