#pragma once
// Test doubles for `factory host`: a host filesystem tree laid out the way the
// kernel lays out sysfs, built from a short description (the format of the
// real capture tests/fixtures/real/h200-passthrough-vm/host-facts.txt), plus
// a stand-in for the kernel's side of the driver-binding control files.
//
// Why a kernel stand-in: in sysfs, writing an address to
// /sys/bus/pci/drivers/vfio-pci/bind makes the kernel bind the device and
// create the `driver` link; in a plain directory the write just lands in a
// file. KernelStandIn watches the tree with inotify and, after each write to
// a bind / unbind / drivers_probe / driver_override file, moves the links as
// the kernel would (honouring driver_override), and records every write it
// saw in the same log the command stand-ins (tests/fixtures/host/bin) use.
// `factory` itself writes the files exactly as on a real host and checks the
// links afterwards, so both the writes and their effect are tested.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/test_support.hpp"

namespace factory::testing::hosttree {
namespace fs = std::filesystem;

inline fs::path host_fixtures() {
  return source_dir() / "tests" / "fixtures" / "host";
}

inline void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// One line of host-facts.txt: "/sys/bus/pci/devices/0000:00:06.0 0x10de 0x2335
// 0x030200 drv=nvidia iommu= sub=0x10de:0x18bf", plus optional override=DRV
// (driver_override) and native=DRV (the driver drivers_probe picks when there
// is no override; defaults to drv unless that is vfio-pci).
struct FunctionFact {
  std::string addr, vendor, device, cls, driver, group,
      sub_vendor = "0x0000", sub_device = "0x0000", override_driver, native;
};

struct Facts {
  std::vector<FunctionFact> functions;
  std::vector<std::pair<std::string, std::string>> iommu_units;  // name, address
};

inline Facts parse_facts(const std::string& text) {
  Facts f;
  std::istringstream in(text);
  std::string line;
  const std::string prefix = "/sys/bus/pci/devices/";
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string first;
    if (!(w >> first)) continue;
    if (first == "iommu-unit") {
      std::string name, addr;
      w >> name >> addr;
      f.iommu_units.emplace_back(name, addr);
      continue;
    }
    if (first.rfind(prefix, 0) != 0) continue;
    FunctionFact fn;
    fn.addr = first.substr(prefix.size());
    w >> fn.vendor >> fn.device >> fn.cls;
    std::string kv;
    while (w >> kv) {
      auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "drv")
        fn.driver = v;
      else if (k == "iommu")
        fn.group = v;
      else if (k == "override")
        fn.override_driver = v;
      else if (k == "native")
        fn.native = v;
      else if (k == "sub") {
        auto c = v.find(':');
        fn.sub_vendor = v.substr(0, c);
        fn.sub_device = v.substr(c + 1);
      }
    }
    if (fn.native.empty() && fn.driver != "vfio-pci") fn.native = fn.driver;
    f.functions.push_back(fn);
  }
  return f;
}

// "pci0000:01": the kernel names the root bus directory by domain and bus.
inline std::string root_bus_dir(const std::string& addr) {
  return "pci" + addr.substr(0, 4) + ":" + addr.substr(5, 2);
}

class HostTree {
 public:
  explicit HostTree(const TempDir& dir)
      : root_(dir / "root"), log_(dir / "standin.log"), tools_(dir / "host-tools") {
    // Links to the guest simulator's listed harmless host tools, and guards
    // for the commands that would act on this machine (guestsim.sh): the
    // stand-ins' PATH needs nothing else of it.
    auto tools = run(
        {(source_dir() / "tests/guestsim/guestsim.sh").string(), "host-tools", tools_.string()});
    if (!tools.ok()) setup_failed("guestsim.sh host-tools: " + tools.output);
    tools_path_ = tools.output.substr(0, tools.output.find('\n'));
    fs::create_directories(root_);
    for (const char* f :
         {"sys/bus/pci/drivers_probe", "sys/bus/pci/drivers_autoprobe", "sys/bus/pci/rescan"})
      write_text(root_ / f, "");
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directories(root_ / "sys/bus/pci/drivers");
    fs::create_directories(root_ / "sys/kernel/iommu_groups");
  }

  const fs::path& root() const { return root_; }
  const fs::path& log() const { return log_; }
  fs::path operator/(const std::string& host_path) const {
    return root_ / fs::path(host_path).relative_path();
  }

  // Copies a directory of plain files (cpuinfo, modules.dep, ...) into the tree.
  void overlay(const fs::path& dir) {
    fs::copy(dir, root_, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }

  void add_driver(const std::string& name) {
    fs::path d = root_ / "sys/bus/pci/drivers" / name;
    if (fs::exists(d)) return;
    fs::create_directories(d);
    for (const char* f : {"bind", "unbind", "new_id", "remove_id"}) write_text(d / f, "");
  }

  void add(const Facts& facts) {
    for (const auto& fn : facts.functions) add_function(fn);
    for (const auto& [name, addr] : facts.iommu_units) {
      fs::path unit = root_ / "sys/devices" / root_bus_dir(addr) / addr / "iommu" / name;
      fs::create_directories(unit);
      fs::create_directories(root_ / "sys/class/iommu");
      fs::create_symlink(fs::relative(unit, root_ / "sys/class/iommu"),
                         root_ / "sys/class/iommu" / name);
    }
  }

  void add_function(const FunctionFact& fn) {
    fs::path dev = device_dir(fn.addr);
    fs::create_directories(dev);
    write_text(dev / "vendor", fn.vendor + "\n");
    write_text(dev / "device", fn.device + "\n");
    write_text(dev / "class", fn.cls + "\n");
    write_text(dev / "subsystem_vendor", fn.sub_vendor + "\n");
    write_text(dev / "subsystem_device", fn.sub_device + "\n");
    write_text(dev / "driver_override",
               (fn.override_driver.empty() ? "(null)" : fn.override_driver) + "\n");
    fs::create_symlink(fs::relative(dev, root_ / "sys/bus/pci/devices"),
                       root_ / "sys/bus/pci/devices" / fn.addr);
    if (!fn.driver.empty()) {
      add_driver(fn.driver);
      link_driver(fn.addr, fn.driver);
    }
    if (!fn.group.empty()) {
      fs::path g = root_ / "sys/kernel/iommu_groups" / fn.group;
      fs::create_directories(g / "devices");
      fs::create_symlink(fs::relative(dev, g / "devices"), g / "devices" / fn.addr);
      fs::create_symlink(fs::relative(g, dev), dev / "iommu_group");
    }
    if (!fn.native.empty()) native_[fn.addr] = fn.native;
  }

  // What the kernel does on a successful bind: the driver's directory gets a
  // link to the device, the device a `driver` link (made last: it is what
  // factory waits for).
  void link_driver(const std::string& addr, const std::string& driver) {
    fs::path dev = device_dir(addr);
    fs::path drv = root_ / "sys/bus/pci/drivers" / driver;
    fs::create_symlink(fs::relative(dev, drv), drv / addr);
    fs::create_symlink(fs::relative(drv, dev), dev / "driver");
  }
  void unlink_driver(const std::string& addr) {
    fs::path dev = device_dir(addr);
    std::string drv = driver(addr);
    fs::remove(dev / "driver");
    if (!drv.empty()) fs::remove(root_ / "sys/bus/pci/drivers" / drv / addr);
  }

  fs::path device_dir(const std::string& addr) const {
    return root_ / "sys/devices" / root_bus_dir(addr) / addr;
  }
  std::string driver(const std::string& addr) const {
    std::error_code ec;
    auto t = fs::read_symlink(device_dir(addr) / "driver", ec);
    return ec ? "" : t.filename().string();
  }
  std::string driver_override(const std::string& addr) const {
    return trim(read_text(device_dir(addr) / "driver_override"));
  }
  std::string native(const std::string& addr) const {
    auto it = native_.find(addr);
    return it == native_.end() ? "" : it->second;
  }

  // A process as /proc shows it: comm (15 characters at most) and open files.
  void add_process(int pid, const std::string& comm, const std::vector<std::string>& open_files) {
    fs::path p = root_ / "proc" / std::to_string(pid);
    write_text(p / "comm", comm.substr(0, 15) + "\n");
    fs::create_directories(p / "fd");
    int fd = 3;
    for (const auto& f : open_files) fs::create_symlink(f, p / "fd" / std::to_string(fd++));
  }

  ~HostTree() {
    const std::string calls = read_text(tools_ / "log/guarded.log");
    if (!calls.empty())
      ADD_FAILURE() << "`factory host` ran commands no stand-in answers (they hit the guard):\n"
                    << calls;
  }
  HostTree(const HostTree&) = delete;
  HostTree& operator=(const HostTree&) = delete;

  // Environment for `factory`: the command stand-ins on PATH, then only the
  // listed host tools and the guards; and where the stand-ins keep their state
  // and log.
  std::map<std::string, std::string> env() const {
    return {{"PATH", (host_fixtures() / "bin").string() + ":" + tools_path_},
            {"STANDIN_ROOT", root_.string()},
            {"STANDIN_LOG", log_.string()}};
  }

  std::vector<std::string> log_lines() const {
    std::vector<std::string> out;
    std::istringstream in(read_text(log_));
    std::string l;
    while (std::getline(in, l)) out.push_back(l);
    return out;
  }

 private:
  fs::path root_;
  fs::path log_;
  fs::path tools_;
  std::string tools_path_;
  std::map<std::string, std::string> native_;
};

// ---- the scenarios ----

inline Facts facts_file(const std::string& name) {
  return parse_facts(read_text(host_fixtures() / name / "pci.facts"));
}

// The runbook's host: two L4s on nvidia, each in its own IOMMU group, vfio not
// loaded yet, pci.ids from Debian 12 (which has the L4) in /usr/share/misc.
inline void build_l4_runbook(HostTree& t) {
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.overlay(host_fixtures() / "l4-runbook" / "root");
  t.add(facts_file("l4-runbook"));
  fs::create_directories(t / "/usr/share/misc");
  fs::copy_file(host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia",
                t / "/usr/share/misc/pci.ids");
}

// The real H200 guest, straight from its capture: every PCI function with its
// IDs, class, driver and (empty) IOMMU group, /dev/kvm present, no pci.ids.
// /proc/cpuinfo and /proc/cmdline were not captured, so the tree has none.
inline void build_h200_guest(HostTree& t) {
  const std::string capture = read_text(fixtures_dir() / "h200-passthrough-vm" / "host-facts.txt");
  t.add(parse_facts(capture));
  std::istringstream in(capture);
  std::string line;
  while (std::getline(in, line)) {
    if (line == "/dev/kvm") write_text(t / "/dev/kvm", "");
    if (line.rfind("Linux vm ", 0) == 0) {
      std::istringstream w(line.substr(9));
      std::string rel;
      w >> rel;
      write_text(t / "/proc/sys/kernel/osrelease", rel + "\n");
    }
  }
}

// ---- the kernel's side of bind / unbind / drivers_probe / driver_override ----

class KernelStandIn {
 public:
  explicit KernelStandIn(HostTree& tree) : tree_(tree) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) {
      ADD_FAILURE() << "inotify_init1 failed";
      return;
    }
    watch(tree_ / "/sys/bus/pci", Kind::bus, "");
    watch(tree_ / "/sys/bus/pci/drivers", Kind::drivers, "");
    for (const auto& e : fs::directory_iterator(tree_ / "/sys/bus/pci/drivers"))
      watch(e.path(), Kind::driver, e.path().filename().string());
    for (const auto& e : fs::directory_iterator(tree_ / "/sys/bus/pci/devices"))
      watch(fs::canonical(e.path()), Kind::device, e.path().filename().string());
    thread_ = std::thread([this] { loop(); });
  }
  ~KernelStandIn() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  KernelStandIn(const KernelStandIn&) = delete;
  KernelStandIn& operator=(const KernelStandIn&) = delete;

  // The kernel refusing to bind a device to a driver (its probe failing): the
  // write is seen, no link appears.
  void refuse_bind(const std::string& addr, const std::string& driver) {
    std::lock_guard<std::mutex> l(mu_);
    refused_.insert(addr + " " + driver);
  }

 private:
  enum class Kind { bus, drivers, driver, device };
  struct Watch {
    Kind kind;
    std::string name;  // driver name or device address
    std::string host_dir;
  };

  int watch(const fs::path& dir, Kind kind, const std::string& name) {
    uint32_t mask = kind == Kind::drivers ? IN_CREATE : IN_CLOSE_WRITE;
    int wd = ::inotify_add_watch(fd_, dir.c_str(), mask);
    if (wd < 0) return wd;
    std::string host_dir = kind == Kind::device ? "/sys/bus/pci/devices/" + name
                                                : "/" + fs::relative(dir, tree_.root()).string();
    watches_[wd] = {kind, name, host_dir};
    return wd;
  }

  void loop() {
    alignas(inotify_event) char buf[16384];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      ssize_t n = ::read(fd_, buf, sizeof buf);
      for (ssize_t off = 0; off < n;) {
        auto* ev = reinterpret_cast<inotify_event*>(buf + off);
        off += sizeof(inotify_event) + ev->len;
        auto it = watches_.find(ev->wd);
        if (it == watches_.end() || ev->len == 0) continue;
        handle(it->second, ev->name, ev->mask);
      }
    }
  }

  void log(const std::string& line) { std::ofstream(tree_.log(), std::ios::app) << line << "\n"; }

  void handle(const Watch w, const std::string& file, uint32_t mask) {
    if (w.kind == Kind::drivers) {
      if (!(mask & IN_ISDIR)) return;
      fs::path d = tree_ / ("/sys/bus/pci/drivers/" + file);
      int wd = watch(d, Kind::driver, file);
      // A write that raced the new watch is still in the file: act on it.
      if (wd >= 0)
        for (const char* f : {"unbind", "bind"})
          if (!trim(read_text(d / f)).empty()) handle(watches_[wd], f, IN_CLOSE_WRITE);
      return;
    }
    const fs::path path = tree_ / (w.host_dir + "/" + file);
    std::error_code ec;
    if (fs::is_directory(path, ec)) return;
    const std::string value = trim(read_text(path));
    if (w.kind == Kind::device) {
      if (file != "driver_override" || value == "(null)") return;
      log("write " + w.host_dir + "/" + file + " " + value);
      // An empty write clears the override; sysfs then reads "(null)". Written
      // aside and renamed over, so factory never reads half of it.
      if (value.empty()) {
        write_text(path.string() + ".standin", "(null)\n");
        fs::rename(path.string() + ".standin", path);
      }
      return;
    }
    if (value.empty()) return;
    log("write " + w.host_dir + "/" + file + " " + value);
    const std::string addr = value;
    if (addr.size() != 12 || !fs::exists(tree_.device_dir(addr))) return;  // the kernel: -ENODEV
    const std::string current = tree_.driver(addr);
    if (w.kind == Kind::driver && file == "unbind") {
      if (current == w.name) tree_.unlink_driver(addr);
      return;
    }
    std::string target;
    if (w.kind == Kind::driver && file == "bind")
      target = w.name;
    else if (w.kind == Kind::bus && file == "drivers_probe") {
      std::string ov = tree_.driver_override(addr);
      target = (ov.empty() || ov == "(null)") ? tree_.native(addr) : ov;
    } else {
      return;
    }
    if (!current.empty() || target.empty()) return;
    std::string ov = tree_.driver_override(addr);
    if (!ov.empty() && ov != "(null)" && ov != target) return;  // driver_override forbids it
    if (!fs::exists(tree_ / ("/sys/bus/pci/drivers/" + target))) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (refused_.count(addr + " " + target)) return;
    }
    tree_.link_driver(addr, target);
  }

  HostTree& tree_;
  int fd_ = -1;
  std::map<int, Watch> watches_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::set<std::string> refused_;
};

// ---- whole-tree comparison, for "nothing changed" ----

using Snapshot = std::map<std::string, std::string>;

inline Snapshot snapshot(const fs::path& root) {
  Snapshot s;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const auto& p = it->path();
    std::string rel = fs::relative(p, root).string();
    auto st = it->symlink_status();
    if (fs::is_symlink(st))
      s[rel] = "link " + fs::read_symlink(p).string();
    else if (fs::is_directory(st))
      s[rel] = "dir";
    else
      s[rel] =
          "file " + std::to_string(static_cast<unsigned>(st.permissions())) + " " + read_text(p);
  }
  return s;
}

inline std::vector<std::string> snapshot_diff(const Snapshot& a, const Snapshot& b) {
  std::vector<std::string> d;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end())
      d.push_back("removed " + k);
    else if (it->second != v)
      d.push_back("changed " + k);
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) d.push_back("added " + k);
  return d;
}

// Runs `factory host --host-root <tree> <args...>` with the stand-ins on PATH.
inline CommandResult factory_host(const HostTree& t, const std::vector<std::string>& args,
                                  std::map<std::string, std::string> extra_env = {}) {
  std::vector<std::string> argv = {factory_bin(), "host", "--host-root", t.root().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto env = t.env();
  for (auto& [k, v] : extra_env) env[k] = v;
  return run(argv, std::chrono::seconds(60), env);
}

// The output's lines that are not empty.
inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l))
    if (!l.empty()) out.push_back(l);
  return out;
}

}  // namespace factory::testing::hosttree
