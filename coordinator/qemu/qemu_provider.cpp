#include "coordinator/qemu/qemu_provider.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/subprocess.hpp"
#include "coordinator/host/host_root.hpp"
#include "coordinator/qemu/gpus.hpp"
#include "coordinator/qemu/qmp.hpp"

namespace factory::qemu {

namespace fs = std::filesystem;
using nlohmann::json;
using Steady = std::chrono::steady_clock;
using tenants::VmObject;

namespace {

constexpr const char* kRecordFile = "vm.json";
// Beside vm.json: the VM is to stay off (a host drain stopped it); the
// monitor neither starts nor restarts it.
constexpr const char* kHaltedFile = "halted";
// In vms_dir: this host is cordoned (a drain); no new VM is created here.
constexpr const char* kCordonFile = ".cordoned";
constexpr const char* kVmKind = "QemuVm";
constexpr const char* kDiskKind = "QemuDisk";
constexpr const char* kSeedKind = "CloudInitSeed";
// A VM that ran this long without ending has its restart backoff reset.
constexpr auto kHealthyAfter = std::chrono::minutes(5);

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

Result<sockaddr_in> ipv4(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    return Error(Errc::invalid_argument, "not an IPv4 address: " + host);
  return a;
}

// Binds host:port (0: any free one) and returns the port that was bound.
Result<int> try_bind(const std::string& host, int port) {
  auto a = ipv4(host, port);
  if (!a) return a.error();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_error("socket", errno);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*a), sizeof *a) != 0) {
    int e = errno;
    ::close(fd);
    return Error(Errc::already_exists, host + ":" + std::to_string(port) + ": " + std::strerror(e));
  }
  socklen_t len = sizeof *a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&*a), &len);
  ::close(fd);
  return static_cast<int>(ntohs(a->sin_port));
}

std::string tail_lines(const std::string& path, size_t n) {
  auto text = read_file(path);
  if (!text) return "";
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  size_t start = t.size();
  for (size_t i = 0; i < n && start > 0; ++i) {
    size_t nl = t.rfind('\n', start - 1);
    start = nl == std::string::npos ? 0 : nl;
    if (nl == std::string::npos) break;
  }
  std::string out = t.substr(start < t.size() && t[start] == '\n' ? start + 1 : start);
  for (auto& c : out)
    if (c == '\n') c = ' ';
  return out;
}

std::string resolve_tool(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    std::error_code ec;
    return fs::exists(name, ec) ? name : "";
  }
  return which(name);
}

// The tool that writes the seed's ISO 9660 image, and its arguments.
Result<std::vector<std::string>> iso_command(const std::string& out) {
  for (const char* t : {"genisoimage", "mkisofs"})
    if (auto p = which(t); !p.empty())
      return std::vector<std::string>{p,        "-quiet",  "-output", out,         "-volid",
                                      "cidata", "-joliet", "-rock",   "user-data", "meta-data"};
  if (auto p = which("xorrisofs"); !p.empty())
    return std::vector<std::string>{p,        "-quiet", "-o", out,         "-V",
                                    "cidata", "-J",     "-R", "user-data", "meta-data"};
  return Error(Errc::failed_precondition,
               "no ISO 9660 tool for the cloud-init seed: apt-get install genisoimage");
}

Status tools_present(const QemuProviderOptions& o) {
  if (resolve_tool(o.qemu_binary).empty())
    return Error(Errc::failed_precondition,
                 o.qemu_binary +
                     " not found: apt-get install qemu-system-x86 (or set qemu.binary in the "
                     "coordinator's config)");
  if (resolve_tool(o.qemu_img).empty())
    return Error(Errc::failed_precondition,
                 o.qemu_img + " not found: apt-get install qemu-utils (or set qemu.img)");
  if (auto iso = iso_command("x"); !iso) return iso.error();
  return {};
}

// The base image's size as the guest sees it (qemu-img info), so a tenant's
// disk is never made smaller than the filesystem on it.
Result<std::uint64_t> virtual_size(const std::string& img_tool, const BaseImage& b) {
  CommandSpec spec;
  spec.argv = {resolve_tool(img_tool), "info", "--output=json", "-U", "-f", b.format, b.disk};
  spec.timeout = std::chrono::seconds(30);
  auto r = run_checked(spec);
  if (!r) return r.error().with_context("qemu-img info " + b.disk);
  auto j = json::parse(r->output, nullptr, false);
  if (!j.is_object() || !j.contains("virtual-size") || !j["virtual-size"].is_number_unsigned())
    return Error(Errc::protocol, "qemu-img info " + b.disk + ": no virtual-size in its answer");
  return j["virtual-size"].get<std::uint64_t>();
}

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

}  // namespace

json VmRecord::to_json() const {
  return {{"tenant", tenant},
          {"created_at", created_at},
          {"instance_id", instance_id},
          {"vcpus", vcpus},
          {"memory_mib", memory_mib},
          {"disk_bytes", disk_bytes},
          {"ssh_listen", ssh_listen},
          {"ssh_port", ssh_port},
          {"gpu_resource", gpu_resource},
          {"gpus", gpus},
          {"accel", accel},
          {"accel_reason", accel_reason}};
}

Result<VmRecord> VmRecord::from_json(const json& j) {
  if (!j.is_object()) return Error(Errc::invalid_argument, "vm.json: want an object");
  try {
    VmRecord r;
    r.tenant = j.at("tenant").get<std::string>();
    r.created_at = j.value("created_at", "");
    r.instance_id = j.value("instance_id", "");
    r.vcpus = j.at("vcpus").get<int>();
    r.memory_mib = j.at("memory_mib").get<std::uint64_t>();
    r.disk_bytes = j.value("disk_bytes", std::uint64_t{0});
    r.ssh_listen = j.value("ssh_listen", "127.0.0.1");
    r.ssh_port = j.at("ssh_port").get<int>();
    r.gpu_resource = j.value("gpu_resource", "");
    r.gpus = j.value("gpus", std::vector<std::string>{});
    r.accel = j.value("accel", "tcg");
    r.accel_reason = j.value("accel_reason", "");
    return r;
  } catch (const json::exception& e) {
    return Error(Errc::invalid_argument, std::string("vm.json: ") + e.what());
  }
}

Result<std::unique_ptr<QemuProvider>> QemuProvider::create(QemuProviderOptions opts) {
  if (opts.vms_dir.empty()) return Error(Errc::invalid_argument, "qemu: no vms_dir");
  auto kind = choose_supervisor(opts.supervisor);
  if (!kind) return kind.error();
  if (auto st = ensure_dir(opts.vms_dir, 0700); !st.ok())
    return st.error().with_context("qemu.vms_dir");
  std::unique_ptr<QemuProvider> p(new QemuProvider(std::move(opts)));
  p->supervisor_ = make_supervisor(*kind);
  spdlog::info("qemu: tenants' VMs in {}, supervised by {}", p->opts_.vms_dir,
               *kind == "systemd" ? "systemd (transient units factory-vm-<tenant>)"
                                  : "the coordinator (child processes it restarts)");
  p->monitor_ = std::thread([raw = p.get()] { raw->monitor_loop(); });
  return p;
}

QemuProvider::QemuProvider(QemuProviderOptions opts) : opts_(std::move(opts)) {}

QemuProvider::~QemuProvider() {
  {
    std::lock_guard g(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

std::string QemuProvider::vm_dir(const std::string& tenant) const {
  return (fs::path(opts_.vms_dir) / tenant).string();
}

Result<VmRecord> QemuProvider::read_record(const std::string& tenant) const {
  fs::path p = fs::path(vm_dir(tenant)) / kRecordFile;
  if (!present(p)) return Error(Errc::not_found, "no VM for tenant " + tenant);
  auto text = read_file(p);
  if (!text) return text.error();
  auto j = json::parse(*text, nullptr, false);
  auto r = VmRecord::from_json(j);
  if (!r) return r.error().with_context(p.string());
  return r;
}

Result<Launch> QemuProvider::launch_for(const VmRecord& r) const {
  Launch l;
  l.tenant = r.tenant;
  l.dir = vm_dir(r.tenant);
  l.vcpus = r.vcpus;
  l.memory_mib = r.memory_mib;
  l.accel = r.accel;
  l.ssh_listen = r.ssh_listen;
  l.ssh_port = r.ssh_port;
  l.gpus = r.gpus;
  auto img = load_base_image(opts_.base_image);
  if (!img) return img.error();
  l.image = *img;
  return l;
}

std::map<std::string, std::string> QemuProvider::held_gpus() const {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(opts_.vms_dir, ec)) {
    auto r = read_record(d.path().filename().string());
    if (!r) continue;
    for (const auto& a : r->gpus) out[a] = r->tenant;
  }
  return out;
}

std::map<int, std::string> QemuProvider::held_ports() const {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(opts_.vms_dir, ec)) {
    auto r = read_record(d.path().filename().string());
    if (r) out[r->ssh_port] = r->tenant;
  }
  return out;
}

const Accelerator& QemuProvider::accelerator(const BaseImage& image, int vcpus) {
  std::call_once(accel_once_, [&] {
    AcceleratorProbe probe;
    probe.mode = opts_.accel;
    probe.qemu_binary = resolve_tool(opts_.qemu_binary);
    probe.work_dir = opts_.vms_dir;
    // The kernel tenants boot when the image names it; else the host's, as
    // near as this host gets to a cloud image's own.
    probe.kernel = image.direct_kernel() ? image.kernel : host_kernel();
    probe.vcpus = std::max(1, vcpus);
    accel_ = choose_accelerator(probe);
    if (accel_.name == "kvm")
      spdlog::info("qemu: tenants' VMs run under KVM");
    else
      spdlog::warn("qemu: tenants' VMs run under TCG (emulated CPU, slow): {}", accel_.reason);
  });
  return accel_;
}

namespace {
Error no_endpoints(const tenants::VmSpec& spec) {
  return Error(Errc::failed_precondition,
               "tier " + spec.tier +
                   " serves a model endpoint, which the QEMU provider cannot expose yet (no "
                   "forwarded endpoint port, no key store): run it with provider: kubevirt");
}
}  // namespace

Result<std::string> QemuProvider::api_key(const tenants::VmSpec& spec) {
  return no_endpoints(spec);
}

Status QemuProvider::put_api_key(const tenants::VmSpec& spec, const std::string&,
                                 std::vector<tenants::VmObject>&) {
  return no_endpoints(spec);
}

Status QemuProvider::preflight(tenants::VmSpec& spec) {
  if (spec.endpoint_port != 0) return no_endpoints(spec);
  if (auto st = tools_present(opts_); !st.ok()) return st;
  auto img = load_base_image(opts_.base_image);
  if (!img) return img.error();
  if (auto v = vcpus_from_quantity(spec.cpu); !v) return v.error();
  if (auto m = bytes_from_quantity(spec.memory); !m) return m.error().with_context("memory");
  if (auto d = bytes_from_quantity(spec.disk); !d) return d.error().with_context("disk");
  if (present(fs::path(opts_.vms_dir) / kCordonFile))
    return Error(Errc::failed_precondition,
                 "host " + host_name() +
                     " is drained for maintenance: no new VM starts here until `factory host "
                     "undrain " +
                     host_name() + "`");

  std::lock_guard g(mu_);
  auto mine = read_record(spec.name);
  if (spec.ssh_node_port != 0) {
    auto ports = held_ports();
    auto it = ports.find(spec.ssh_node_port);
    if (it != ports.end() && it->second != spec.name)
      return Error(Errc::invalid_argument,
                   "SSH port " + std::to_string(spec.ssh_node_port) + " is tenant " + it->second +
                       "'s: pick another --ssh-node-port, or leave it out and a free one is "
                       "picked");
    if (!(mine && mine->ssh_port == spec.ssh_node_port))
      if (auto b = try_bind(opts_.ssh_listen, spec.ssh_node_port); !b)
        return Error(Errc::invalid_argument,
                     "SSH port " + std::to_string(spec.ssh_node_port) + " on " + opts_.ssh_listen +
                         " is taken (" + b.error().message +
                         "): pick another --ssh-node-port, or leave it out");
  }
  if (spec.gpus > 0) {
    if (mine && static_cast<int>(mine->gpus.size()) == spec.gpus) {
      if (spec.gpu_resource.empty()) spec.gpu_resource = mine->gpu_resource;
      return {};
    }
    auto cards = host_cards(host::HostRoot(opts_.host_root));
    if (!cards) return cards.error();
    if (spec.needs_mig) {
      auto mig = mig_capable(*cards, spec.tier);
      if (!mig) return mig.error();
      cards = std::move(mig);
    }
    auto pick = pick_gpus(*cards, spec.gpu_resource, spec.gpus, spec.name, held_gpus());
    if (!pick) return pick.error();
    if (spec.gpu_resource.empty()) spec.gpu_resource = pick->resource;
  }
  return {};
}

Result<bool> QemuProvider::has_user_data(const tenants::VmSpec& spec) {
  std::lock_guard g(mu_);
  fs::path d = vm_dir(spec.name);
  return present(d / "user-data") && present(d / "seed.iso");
}

Status QemuProvider::provision(const tenants::VmSpec& spec, const std::string& userdata,
                               std::vector<VmObject>& created) {
  std::lock_guard g(mu_);
  const fs::path dir = vm_dir(spec.name);
  auto img = load_base_image(opts_.base_image);
  if (!img) return img.error();
  if (auto st = ensure_dir(dir, 0700); !st.ok()) return st;

  // The record first (in memory): the seed's instance-id and the cards come from it.
  auto existing = read_record(spec.name);
  if (!existing && existing.error().code != Errc::not_found) return existing.error();
  const bool new_record = !existing;
  VmRecord rec;
  if (existing) {
    rec = *existing;
  } else {
    rec.tenant = spec.name;
    rec.created_at = format_rfc3339(Clock::now());
    rec.instance_id = "factory-" + spec.name + "-" + std::to_string(unix_seconds(Clock::now()));
    auto v = vcpus_from_quantity(spec.cpu);
    if (!v) return v.error();
    auto m = bytes_from_quantity(spec.memory);
    if (!m) return m.error().with_context("memory");
    auto d = bytes_from_quantity(spec.disk);
    if (!d) return d.error().with_context("disk");
    rec.vcpus = *v;
    rec.memory_mib = (*m + (1 << 20) - 1) >> 20;
    rec.disk_bytes = *d;
    rec.ssh_listen = opts_.ssh_listen;
    auto ports = held_ports();
    if (spec.ssh_node_port != 0) {
      rec.ssh_port = spec.ssh_node_port;
    } else {
      // A free port now, that no other VM's record holds (one that is
      // stopped for a moment keeps its port).
      for (int i = 0; i < 20 && rec.ssh_port == 0; ++i) {
        auto p = try_bind(opts_.ssh_listen, 0);
        if (!p) return p.error().with_context("picking an SSH port");
        if (!ports.count(*p)) rec.ssh_port = *p;
      }
      if (rec.ssh_port == 0)
        return Error(Errc::unavailable, "could not find a free SSH port on " + opts_.ssh_listen);
    }
    if (spec.gpus > 0) {
      auto cards = host_cards(host::HostRoot(opts_.host_root));
      if (!cards) return cards.error();
      auto pick = pick_gpus(*cards, spec.gpu_resource, spec.gpus, spec.name, held_gpus());
      if (!pick) return pick.error();
      rec.gpu_resource = pick->resource;
      rec.gpus = pick->addresses;
    }
    const Accelerator& a = accelerator(*img, rec.vcpus);
    rec.accel = a.name;
    rec.accel_reason = a.reason;
  }

  if (!userdata.empty()) {
    const std::string meta =
        "instance-id: " + rec.instance_id + "\nlocal-hostname: " + spec.name + "\n";
    if (auto st = write_file_atomic(dir / "user-data", userdata, 0600); !st.ok()) return st;
    if (auto st = write_file_atomic(dir / "meta-data", meta, 0600); !st.ok()) return st;
    const fs::path tmp = dir / "seed.iso.tmp";
    auto cmd = iso_command(tmp.string());
    if (!cmd) return cmd.error();
    CommandSpec iso;
    iso.argv = *cmd;
    iso.cwd = dir.string();
    iso.timeout = std::chrono::seconds(60);
    if (auto r = run_checked(iso); !r) return r.error().with_context("making the cloud-init seed");
    std::error_code ec;
    fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write, ec);
    fs::rename(tmp, dir / "seed.iso", ec);
    if (ec) return Error(Errc::io, "seed.iso: " + ec.message());
    created.push_back({kSeedKind, "", spec.name});
  }

  const fs::path disk = dir / "disk.qcow2";
  if (!present(disk)) {
    auto base_size = virtual_size(opts_.qemu_img, *img);
    if (!base_size) return base_size.error();
    CommandSpec c;
    c.argv = {resolve_tool(opts_.qemu_img),
              "create",
              "-q",
              "-f",
              "qcow2",
              "-F",
              img->format,
              "-b",
              img->disk,
              disk.string()};
    // Never smaller than the base: the guest's filesystem fills it.
    if (rec.disk_bytes > *base_size) c.argv.push_back(std::to_string(rec.disk_bytes));
    c.timeout = std::chrono::seconds(60);
    if (auto r = run_checked(c); !r)
      return r.error().with_context("qemu-img create " + disk.string());
    std::error_code ec;
    fs::permissions(disk, fs::perms::owner_read | fs::perms::owner_write, ec);
    created.push_back({kDiskKind, "", spec.name});
  }

  if (new_record) {
    if (auto st = write_file_atomic(dir / kRecordFile, rec.to_json().dump(2) + "\n", 0600);
        !st.ok())
      return st;
    created.push_back({kVmKind, "", vm_unit_name(spec.name)});
  }
  auto l = launch_for(rec);
  if (!l) return l.error();
  if (supervisor_->state(*l).running) return {};
  Runtime& rt = runtime_[spec.name];
  rt = Runtime{};
  rt.announced = true;
  auto started = start_vm(rec, rt);
  // The caller rolls back what this call made: the monitor must not start
  // the VM again meanwhile.
  if (!started.ok()) rt.next_start = Steady::now() + std::chrono::seconds(30);
  return started;
}

Status QemuProvider::start_vm(const VmRecord& r, Runtime& rt) {
  auto l = launch_for(r);
  if (!l) return l.error();
  // A socket left over from a killed run would make QEMU's bind fail.
  remove_quietly(l->qmp_socket());
  auto argv = qemu_argv(resolve_tool(opts_.qemu_binary), *l);
  rt.started = Steady::now();
  rt.backoff = rt.backoff.count() == 0 ? std::chrono::seconds(1)
                                       : std::min(rt.backoff * 2, opts_.max_backoff);
  rt.next_start = rt.started + rt.backoff;
  if (auto st = supervisor_->start(*l, argv); !st.ok()) return st;
  // Up once QEMU answers on QMP; a bad device or a locked disk ends it at once.
  const auto deadline = Steady::now() + std::chrono::seconds(15);
  while (Steady::now() < deadline) {
    auto s = supervisor_->state(*l);
    if (!s.running && !(supervisor_->restarts_itself() && s.unit_loaded)) {
      std::string why = tail_lines(l->process_log(), 2);
      return Error(Errc::failed_precondition, "QEMU of tenant " + r.tenant + " ended at once (" +
                                                  (s.last_exit.empty() ? "ended" : s.last_exit) +
                                                  ")" + (why.empty() ? "" : ": " + why));
    }
    if (auto q = qmp_execute(l->qmp_socket(), "query-status", json::object(),
                             std::chrono::milliseconds(500));
        q)
      return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Error(Errc::timeout, "QEMU of tenant " + r.tenant +
                                  " did not answer on its QMP socket within 15 s: see " +
                                  l->process_log());
}

Status QemuProvider::stop_vm(const std::string& tenant) {
  Launch l;
  l.tenant = tenant;
  l.dir = vm_dir(tenant);
  auto st = supervisor_->stop(l, std::chrono::seconds(10));
  if (st.ok()) remove_quietly(l.pidfile());
  return st;
}

std::vector<std::pair<VmObject, Error>> QemuProvider::remove(const std::vector<VmObject>& objects) {
  std::lock_guard g(mu_);
  std::vector<std::pair<VmObject, Error>> failed;
  std::set<std::string> touched;
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) {
    const VmObject& o = *it;
    std::string tenant = o.name;
    if (o.kind == kVmKind && tenant.rfind("factory-vm-", 0) == 0) tenant = tenant.substr(11);
    const fs::path dir = vm_dir(tenant);
    if (o.kind == kVmKind) {
      if (auto st = stop_vm(tenant); !st.ok()) {
        failed.emplace_back(o, st.error());
        continue;
      }
      remove_quietly(dir / kRecordFile);
      runtime_.erase(tenant);
    } else if (o.kind == kDiskKind) {
      remove_quietly(dir / "disk.qcow2");
    } else if (o.kind == kSeedKind) {
      for (const char* f : {"seed.iso", "user-data", "meta-data"}) remove_quietly(dir / f);
    } else {
      continue;
    }
    touched.insert(tenant);
  }
  // A folder with nothing of a VM left in it goes too.
  for (const auto& t : touched) {
    const fs::path dir = vm_dir(t);
    if (!present(dir / kRecordFile) && !present(dir / "disk.qcow2") && !present(dir / "seed.iso")) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  }
  return failed;
}

Result<std::vector<VmObject>> QemuProvider::destroy(const std::string& tenant,
                                                    const std::string& /*ns*/) {
  std::lock_guard g(mu_);
  std::vector<VmObject> deleted;
  const fs::path dir = vm_dir(tenant);
  Launch l;
  l.tenant = tenant;
  l.dir = dir.string();
  auto s = supervisor_->state(l);
  if (s.running || s.unit_loaded || present(dir / kRecordFile)) {
    if (auto st = stop_vm(tenant); !st.ok())
      return st.error().with_context("stopping the VM of " + tenant);
    deleted.push_back({kVmKind, "", vm_unit_name(tenant)});
  }
  runtime_.erase(tenant);
  if (present(dir / "disk.qcow2")) deleted.push_back({kDiskKind, "", tenant});
  if (present(dir / "seed.iso") || present(dir / "user-data"))
    deleted.push_back({kSeedKind, "", tenant});
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return Error(Errc::io, "removing " + dir.string() + ": " + ec.message());
  return deleted;
}

json QemuDetails::to_json() const {
  json j = {{"restarts", restarts}};
  if (!ssh_host.empty()) j["ssh_host"] = ssh_host;
  if (!accelerator.empty()) j["accelerator"] = accelerator;
  if (!accelerator_reason.empty()) j["accelerator_reason"] = accelerator_reason;
  if (!supervisor.empty()) j["supervisor"] = supervisor;
  if (pid != 0) j["pid"] = pid;
  return j;
}

Result<tenants::VmObservation> QemuProvider::observe(const std::string& tenant,
                                                     const std::string& /*ns*/) {
  auto o = observe_qemu(tenant);
  if (!o) return o.error();
  o->vm.details = o->qemu.to_json();
  return std::move(o->vm);
}

Result<QemuObservation> QemuProvider::observe_qemu(const std::string& tenant) {
  std::lock_guard g(mu_);
  QemuObservation out;
  tenants::VmObservation& o = out.vm;
  QemuDetails& d = out.qemu;
  o.provider = "qemu";
  d.supervisor = supervisor_->kind();
  auto rec = read_record(tenant);
  if (!rec) {
    if (rec.error().code == Errc::not_found) return out;
    return rec.error();
  }
  o.exists = true;
  o.node = host_name();
  d.ssh_host = rec->ssh_listen;
  o.ssh_node_port = rec->ssh_port;
  d.accelerator = rec->accel;
  d.accelerator_reason = rec->accel_reason;
  o.gpus = rec->gpus;
  Launch l;
  l.tenant = tenant;
  l.dir = vm_dir(tenant);
  auto s = supervisor_->state(l);
  auto rt = runtime_.find(tenant);
  d.restarts = s.restarts + (rt == runtime_.end() ? 0 : rt->second.restarts);
  if (s.running) {
    d.pid = s.pid;
    o.instance = "pid:" + std::to_string(s.pid);
    if (const std::int64_t t = process_started_unix(s.pid); t > 0)
      o.running_since = format_rfc3339(Clock::from_time_t(t));
    auto q = qmp_execute(l.qmp_socket(), "query-status", json::object(),
                         std::chrono::milliseconds(1500));
    if (q && q->is_object()) {
      o.phase = q->value("status", "");
      o.status = o.phase == "running" ? "Running" : "Paused";
      if (o.phase != "running") o.reason = "QEMU reports the guest " + o.phase;
    } else {
      o.status = "Starting";
    }
  } else {
    o.status = "Stopped";
    std::string why = s.last_exit;
    if (why.empty() && rt != runtime_.end()) why = rt->second.last_exit;
    std::string log = tail_lines(l.process_log(), 1);
    o.reason = "QEMU is not running" + (why.empty() ? std::string() : " (" + why + ")") +
               "; the supervisor starts it again" + (log.empty() ? "" : "; qemu.log: " + log);
  }
  return out;
}

Result<tenants::RestartOutcome> QemuProvider::restart(const tenants::VmSpec& spec,
                                                      const tenants::RestartRequest& req) {
  std::lock_guard g(mu_);
  auto rec = read_record(spec.name);
  if (!rec) {
    if (rec.error().code == Errc::not_found)
      return Error(Errc::failed_precondition,
                   "tenant " + spec.name + " has no VM on this host (no " + vm_dir(spec.name) +
                       "/" + std::string(kRecordFile) +
                       "): run the same `factory tenant create` again to make it");
    return rec.error();
  }
  tenants::RestartOutcome out;
  out.gpus_before = rec->gpus;
  Launch l;
  l.tenant = spec.name;
  l.dir = vm_dir(spec.name);
  const auto s = supervisor_->state(l);
  const std::string now = s.running ? "pid:" + std::to_string(s.pid) : "";
  auto avoided = [&](const std::string& a) {
    return std::find(req.avoid_gpus.begin(), req.avoid_gpus.end(), a) != req.avoid_gpus.end();
  };
  std::vector<HostCard> cards;
  if (!rec->gpus.empty()) {
    auto hc = host_cards(host::HostRoot(opts_.host_root));
    if (!hc) return hc.error();
    cards = std::move(*hc);
  }
  auto still_good = [&](const std::string& a) {
    if (avoided(a)) return false;
    for (const auto& c : cards)
      if (c.address == a) return !c.quarantined;
    return true;  // not seen on the host now: QEMU says so at start
  };
  const bool on_good_cards = std::all_of(rec->gpus.begin(), rec->gpus.end(), still_good);
  if (!req.from_instance.empty() && now != req.from_instance && on_good_cards) {
    out.gpus_after = rec->gpus;
    out.note = now.empty()
                   ? "QEMU is not running: the monitor starts it on the same cards"
                   : "QEMU was restarted already (" + req.from_instance + " -> " + now + ")";
    return out;
  }

  // The cards again: the good ones it holds first, then free ones.
  std::vector<std::string> picked = rec->gpus;
  if (!rec->gpus.empty() && !on_good_cards) {
    for (auto& c : cards)
      if (avoided(c.address)) {
        c.passthrough = false;  // out of this pick, as a quarantined card is
        c.why_not = c.address + " has a card fault recorded since its tenant last started";
      }
    std::vector<HostCard> ordered;
    for (const auto& a : rec->gpus)
      for (const auto& c : cards)
        if (c.address == a) ordered.push_back(c);
    for (const auto& c : cards)
      if (std::find(rec->gpus.begin(), rec->gpus.end(), c.address) == rec->gpus.end())
        ordered.push_back(c);
    if (spec.needs_mig) {
      auto mig = mig_capable(ordered, spec.tier);
      if (!mig) return mig.error();
      ordered = std::move(*mig);
    }
    auto pick = pick_gpus(ordered, rec->gpu_resource, static_cast<int>(rec->gpus.size()), spec.name,
                          held_gpus());
    if (!pick)
      return pick.error().with_context("no healthy card for tenant " + spec.name +
                                       " to move to; it keeps running where it is");
    picked = pick->addresses;
  }
  out.gpus_after = picked;
  auto list = [](const std::vector<std::string>& v) {
    std::string o;
    for (const auto& a : v) o += (o.empty() ? "" : ", ") + a;
    return o.empty() ? std::string("none") : o;
  };
  out.note = std::string(now.empty() ? "start" : "stop and start") + " QEMU of tenant " +
             spec.name +
             (picked == rec->gpus ? " on the same cards (" + list(picked) + ")"
                                  : ", moving from " + list(rec->gpus) + " to " + list(picked));
  if (req.dry_run) return out;

  if (auto st = stop_vm(spec.name); !st.ok())
    return st.error().with_context("stopping the VM of " + spec.name);
  if (picked != rec->gpus) {
    rec->gpus = picked;
    if (auto st = write_file_atomic(fs::path(vm_dir(spec.name)) / kRecordFile,
                                    rec->to_json().dump(2) + "\n", 0600);
        !st.ok())
      return st.error().with_context("recording the cards of " + spec.name +
                                     " (QEMU is stopped; the monitor starts it on the old ones)");
  }
  Runtime& rt = runtime_[spec.name];
  rt = Runtime{};
  rt.announced = true;
  if (auto st = start_vm(*rec, rt); !st.ok()) {
    // The monitor tries again, with its backoff, on the recorded cards.
    rt.next_start = Steady::now() + std::chrono::seconds(5);
    return st.error().with_context("starting the VM of " + spec.name + " again");
  }
  out.restarted = true;
  return out;
}

void QemuProvider::check_vms() {
  std::lock_guard g(mu_);
  std::error_code ec;
  std::vector<std::string> tenants;
  for (const auto& d : fs::directory_iterator(opts_.vms_dir, ec))
    if (d.is_directory() && present(d.path() / kRecordFile))
      tenants.push_back(d.path().filename().string());
  for (const auto& t : tenants) {
    auto rec = read_record(t);
    if (!rec) {
      spdlog::error("qemu: {}", rec.error().message);
      continue;
    }
    if (present(fs::path(vm_dir(t)) / kHaltedFile)) continue;  // drained: stays off
    Launch l;
    l.tenant = t;
    l.dir = vm_dir(t);
    auto s = supervisor_->state(l);
    Runtime& rt = runtime_[t];
    const auto now = Steady::now();
    if (s.running) {
      if (!rt.announced)
        spdlog::info("qemu: found the VM of tenant {} running (pid {}): not starting it again", t,
                     s.pid);
      rt.announced = true;
      if (rt.started != Steady::time_point{} && now - rt.started > kHealthyAfter)
        rt.backoff = std::chrono::milliseconds(0);
      continue;
    }
    // systemd restarts its unit itself; only a unit that is gone (the host
    // rebooted) is ours to start.
    if (supervisor_->restarts_itself() && s.unit_loaded) continue;
    if (now < rt.next_start) continue;
    if (!s.last_exit.empty()) rt.last_exit = s.last_exit;
    if (!rt.announced) {
      spdlog::info("qemu: the VM of tenant {} is not running: starting it", t);
    } else {
      ++rt.restarts;
      spdlog::warn("qemu: the VM of tenant {} ended ({}): starting it again (restart {})", t,
                   rt.last_exit.empty() ? "unknown" : rt.last_exit, rt.restarts);
    }
    rt.announced = true;
    if (auto st = start_vm(*rec, rt); !st.ok()) {
      rt.last_exit = st.error().message;
      spdlog::error("qemu: {}; trying again in {} s", st.error().message,
                    std::chrono::duration_cast<std::chrono::seconds>(rt.backoff).count());
    }
  }
}

void QemuProvider::monitor_loop() {
  while (true) {
    try {
      check_vms();
    } catch (const std::exception& e) {
      spdlog::error("qemu: monitor: {}", e.what());
    }
    std::unique_lock lk(stop_mu_);
    if (stop_cv_.wait_for(lk, opts_.monitor_every, [this] { return stopping_; })) return;
  }
}

}  // namespace factory::qemu

// ---- host maintenance ----

namespace factory::qemu {

Status QemuProvider::set_node_schedulable(const std::string& node, bool schedulable) {
  if (node != host_name())
    return Error(Errc::not_found,
                 "this QEMU host is " + host_name() + ", not " + node + ": its VMs run here only");
  const fs::path f = fs::path(opts_.vms_dir) / kCordonFile;
  if (schedulable) {
    remove_quietly(f);
    return {};
  }
  if (auto st = ensure_dir(opts_.vms_dir, 0700); !st.ok()) return st;
  return write_file_atomic(f, format_rfc3339(std::chrono::system_clock::now()) + "\n", 0600);
}

Result<tenants::Mobility> QemuProvider::mobility(const tenants::VmSpec&) {
  return tenants::Mobility{
      .can_move = false,
      .why_not = "a QEMU host runs its VMs on itself: there is no other node to move to"};
}

Result<tenants::StopOutcome> QemuProvider::stop(const tenants::VmSpec& spec) {
  const fs::path dir = vm_dir(spec.name);
  Launch l;
  {
    std::lock_guard g(mu_);
    auto rec = read_record(spec.name);
    if (!rec) return rec.error().with_context("the VM of " + spec.name);
    // First the mark: from here the monitor leaves the VM off.
    if (auto st = write_file_atomic(dir / kHaltedFile,
                                    format_rfc3339(std::chrono::system_clock::now()) + "\n", 0600);
        !st.ok())
      return st.error().with_context("marking the VM of " + spec.name + " halted");
    l.tenant = spec.name;
    l.dir = dir.string();
  }
  tenants::StopOutcome out;
  if (!supervisor_->state(l).running) {
    (void)supervisor_->stop(l, std::chrono::seconds(1));  // a systemd unit restarting it
    out.note = "QEMU of tenant " + spec.name + " was not running";
    return out;
  }
  // ACPI power button: the guest's OS shuts down and QEMU exits.
  auto asked =
      qmp_execute(l.qmp_socket(), "system_powerdown", json::object(), std::chrono::seconds(2));
  const auto deadline = Steady::now() + opts_.shutdown_grace;
  while (asked && Steady::now() < deadline && supervisor_->state(l).running)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const bool clean = asked && !supervisor_->state(l).running;
  // In every case: a systemd unit (Restart=always) would start it again.
  std::lock_guard g(mu_);
  if (auto st = supervisor_->stop(l, std::chrono::seconds(10)); !st.ok())
    return st.error().with_context("stopping QEMU of tenant " + spec.name);
  remove_quietly(l.pidfile());
  out.stopped = true;
  const auto grace_s = std::chrono::duration_cast<std::chrono::seconds>(opts_.shutdown_grace);
  out.note = clean
                 ? "the guest of tenant " + spec.name + " shut down (ACPI power button)"
                 : "the guest of tenant " + spec.name + " did not shut down within " +
                       std::to_string(grace_s.count()) + " s of the ACPI power button" +
                       (asked ? "" : " (QMP: " + asked.error().message + ")") + ": QEMU was ended";
  return out;
}

Status QemuProvider::start(const tenants::VmSpec& spec) {
  std::lock_guard g(mu_);
  auto rec = read_record(spec.name);
  if (!rec) return rec.error().with_context("the VM of " + spec.name);
  remove_quietly(fs::path(vm_dir(spec.name)) / kHaltedFile);
  Launch l;
  l.tenant = spec.name;
  l.dir = vm_dir(spec.name);
  if (supervisor_->state(l).running) return {};
  Runtime& rt = runtime_[spec.name];
  rt = Runtime{};
  rt.announced = true;
  if (auto st = start_vm(*rec, rt); !st.ok()) {
    rt.next_start = Steady::now() + std::chrono::seconds(5);  // the monitor tries again
    return st.error().with_context("starting the VM of " + spec.name);
  }
  return {};
}

}  // namespace factory::qemu
