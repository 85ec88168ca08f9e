#include "agent/steps/rke2.hpp"

#include <algorithm>
#include <regex>
#include <thread>

#include "agent/diagnose/k8s.hpp"
#include "agent/guest/cluster.hpp"
#include "agent/guest/dns.hpp"
#include "agent/guest/network.hpp"
#include "agent/steps/step_util.hpp"
#include "common/atomic_file.hpp"
#include "common/yaml_json.hpp"
#include "contract/cluster_ranges.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr const char* kConfigPath = "/etc/rancher/rke2/config.yaml";
const char* const kRangeKeys[] = {"cluster-cidr", "service-cidr", "cluster-dns"};
constexpr const char* kConfigHeader = "# Written by factory-agent (plan step rke2).";

struct Rke2Params {
  std::string version;
  std::string install_url;
  std::string service;
  std::string kubeconfig;
  std::string bin_dir;
  json config;
  ClusterRanges ranges;             // fixed, or chosen (empty until then)
  bool fixed = false;               // the plan fixes them: checked, never moved
  std::vector<ranges::Fact> avoid;  // the host's, as the coordinator read them
  ranges::Pool pool;
};

// Interfaces the guest cluster's own network makes once RKE2 runs (canal's
// cni0 and flannel.1, calico's, cilium's, kube-proxy's IPVS dummy): their
// routes are the guest cluster's ranges themselves, not something to avoid.
bool cluster_interface(const std::string& source) {
  static const char* const own[] = {"cni",   "flannel", "cali", "vxlan.calico", "tunl",
                                    "kube-", "cilium",  "veth", "nodelocaldns"};
  const std::string prefix = "guest route on ";
  if (source.rfind(prefix, 0) != 0) return false;
  std::string iface = source.substr(prefix.size());
  for (const char* o : own)
    if (iface.rfind(o, 0) == 0) return true;
  return false;
}

// What the ranges must avoid: the host's (from the plan) and what the guest
// sees of its own networks now.
std::vector<ranges::Fact> facts_now(const GuestEnv& env, const std::vector<ranges::Fact>& host) {
  std::vector<ranges::Fact> all = host;
  for (auto& f : guest_network_facts(env))
    if (!cluster_interface(f.source)) all.push_back(std::move(f));
  // DHCP's DNS server is the host cluster's DNS Service under KubeVirt: the
  // range around it is the host's service range, whether or not the
  // coordinator could read it (the rule diagnose_cidr_plan applies).
  for (const auto& dns : guest_dns_servers(env)) {
    std::string around = assumed_host_service_range(dns);
    if (around.ends_with("/16"))
      all.push_back(
          {around, "the host cluster's service range, assumed around guest DNS server " + dns});
  }
  return all;
}

json ranges_report(const ClusterRanges& r, const std::vector<ranges::Fact>& around) {
  json a = ranges::to_json(around);
  return {{"cluster-cidr", r.cluster_cidr},
          {"service-cidr", r.service_cidr},
          {"cluster-dns", r.cluster_dns},
          {"around", a}};
}

// A value as the config file compares it: strings as they are, other
// scalars in their JSON spelling ("true", "10").
std::string scalar_text(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// Go's YAML (RKE2 reads config.yaml with it) still takes YAML 1.1's words
// for booleans: such a string must be quoted.
bool yaml_plain_safe(const std::string& s) {
  static const std::regex safe(R"(^[A-Za-z0-9][A-Za-z0-9./:_+-]*$)");
  if (!std::regex_match(s, safe)) return false;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  for (const char* w : {"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
    if (lower == w) return false;
  auto back = parse_yaml("k: " + s, "config value");
  return back && back->is_object() && (*back)["k"].is_string() &&
         (*back)["k"].get<std::string>() == s;
}

std::string render_entry(const std::string& key, const json& v) {
  if (v.is_string() && yaml_plain_safe(v.get<std::string>()))
    return key + ": " + v.get<std::string>() + "\n";
  return to_yaml(json{{key, v}});
}

struct Readiness {
  bool ready = false;
  std::optional<KubeNode> node;  // the last node seen (the first not Ready one)
  std::string api_error;         // the last reason the API gave none
};

class Rke2 final : public Step {
 public:
  explicit Rke2(Rke2Params p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    if (!ranges_known(ctx)) return false;
    if (!config_matches(ctx.env)) return false;
    if (installed_version(ctx) != p_.version) return false;
    if (!service_active(ctx)) return false;
    return poll_ready(ctx).ready;
  }

  StepOutcome apply(StepContext& ctx) override {
    // Nothing is touched before the ranges are known to be safe.
    auto dns = guest_dns_servers(ctx.env);
    if (p_.fixed) {
      if (auto v = validate_ranges(p_.ranges); !v)
        return StepOutcome::failure("params.config: " + v.error().message);
      if (auto d = diagnose_cidr_plan(p_.ranges, dns))
        return StepOutcome::failure(d->summary, {}, d);
    }
    if (auto picked = pick_ranges(ctx); !picked.ok()) return picked;

    bool changed = false;
    if (!config_matches(ctx.env)) {
      emit_progress(ctx,
                    {{"state", "progress"}, {"message", std::string("writing ") + kConfigPath}});
      if (auto s = ensure_dir(ctx.env.path("/etc/rancher/rke2"), 0755); !s)
        return StepOutcome::failure(s.error().message);
      // 0600: RKE2's config may hold a join token once admins add one.
      if (auto s =
              write_file_atomic(ctx.env.path(kConfigPath), render_rke2_config(p_.config), 0600);
          !s)
        return StepOutcome::failure("cannot write " + std::string(kConfigPath) + ": " +
                                    s.error().message);
      changed = true;
    }

    // The installer is re-run unless it finished for this version here: one
    // killed half way can leave a binary that answers --version without the
    // units beside it. (It is idempotent; a running server keeps running.)
    std::string installed = installed_version(ctx);
    if (installed != p_.version || load_step_state(ctx).value("installed", "") != p_.version) {
      emit_progress(ctx, {{"state", "progress"}, {"message", "installing RKE2 " + p_.version}});
      auto out = run_install_script(ctx, "RKE2 install script", p_.install_url, "sh",
                                    {{"INSTALL_RKE2_VERSION", p_.version}}, 15min);
      if (!out.ok()) return out;
      installed = installed_version(ctx);
      if (installed != p_.version)
        return StepOutcome::failure(
            "the RKE2 install script finished but `rke2 --version` reports '" + installed +
            "', not " + p_.version);
      json state = load_step_state(ctx);
      state["installed"] = p_.version;
      if (auto s = save_step_state(ctx, state); !s)
        return StepOutcome::failure("cannot record the install: " + s.error().message);
      changed = true;
    }

    bool was_active = service_active(ctx);
    emit_progress(ctx, {{"state", "progress"}, {"message", "starting " + p_.service}});
    // A server that starts blocks `systemctl start` until it is up (Type=notify).
    auto r = run_in_step(ctx, {"systemctl", "enable", "--now", p_.service}, 10min);
    if (!r) return StepOutcome::failure("systemctl: " + r.error().message);
    if (!r->ok())
      return StepOutcome::failure("systemctl enable --now " + p_.service + " " + r->describe(),
                                  r->tail(20));
    if (changed && was_active) {
      // A running server reads config.yaml and its binary only at start.
      auto rr = run_in_step(ctx, {"systemctl", "restart", p_.service}, 10min);
      if (!rr) return StepOutcome::failure("systemctl: " + rr.error().message);
      if (!rr->ok())
        return StepOutcome::failure("systemctl restart " + p_.service + " " + rr->describe(),
                                    rr->tail(20));
    }

    auto ready = wait_ready(ctx, ctx.deadline);
    if (!ready.ready) return not_ready(ctx, ready, dns);
    return StepOutcome::success("RKE2 " + p_.version + " running, node " + ready.node->name +
                                " Ready");
  }

  StepOutcome verify(StepContext& ctx) override {
    if (!ranges_known(ctx))
      return StepOutcome::failure("the guest cluster's ranges were never chosen (no step state)");
    auto give_up = std::min(ctx.deadline, std::chrono::steady_clock::now() + 2min);
    auto ready = wait_ready(ctx, give_up);
    if (!ready.ready) return not_ready(ctx, ready, guest_dns_servers(ctx.env));
    if (!config_matches(ctx.env))
      return StepOutcome::failure(std::string(kConfigPath) +
                                  " does not hold the planned cluster-cidr / service-cidr / "
                                  "cluster-dns");
    return StepOutcome::success("node " + ready.node->name + " Ready (" +
                                ready.node->kubelet_version + "), cluster-cidr " +
                                p_.ranges.cluster_cidr + ", service-cidr " +
                                p_.ranges.service_cidr + ", cluster-dns " + p_.ranges.cluster_dns);
  }

 private:
  // Chosen ranges are kept in the step state: once RKE2 runs, the guest's
  // routes hold its own pod network, and a second look must not move them.
  // Without the step state (a check from another state directory, a lost
  // one), the config.yaml this step wrote says what was chosen.
  bool ranges_known(const StepContext& ctx) {
    if (p_.fixed) return true;
    json st = load_step_state(ctx).value("ranges", json());
    if (!st.is_object()) {
      auto text = read_file(ctx.env.path(kConfigPath));
      if (!text || text->rfind(kConfigHeader, 0) != 0) return false;
      auto j = parse_yaml(*text, kConfigPath);
      if (!j || !j->is_object()) return false;
      for (const char* k : kRangeKeys)
        if (!j->contains(k) || !(*j)[k].is_string()) return false;
      st = *j;
      ranges::Chosen c{st["cluster-cidr"].get<std::string>(), st["service-cidr"].get<std::string>(),
                       st["cluster-dns"].get<std::string>()};
      if (!ranges::check_fixed(c, p_.avoid).ok()) return false;
    }
    set_ranges(
        {st.value("cluster-cidr", ""), st.value("service-cidr", ""), st.value("cluster-dns", "")});
    return true;
  }

  void set_ranges(const ClusterRanges& r) {
    p_.ranges = r;
    p_.config["cluster-cidr"] = r.cluster_cidr;
    p_.config["service-cidr"] = r.service_cidr;
    p_.config["cluster-dns"] = r.cluster_dns;
  }

  // The ranges checked (fixed) or chosen (else) against the host's and the
  // guest's networks, and reported with what they were picked around.
  StepOutcome pick_ranges(StepContext& ctx) {
    auto facts = facts_now(ctx.env, p_.avoid);
    auto clash = [&](const std::string& why) {
      Diagnosis d;
      d.code = "guest_cidr_clash";
      d.summary = "the guest cluster's ranges clash with a network that exists: " + why;
      d.fix = p_.fixed ? "change cluster-cidr / service-cidr / cluster-dns in the catalog, or "
                         "leave them out so they are chosen, then `factory tenant retry`"
                       : "add a free block to guest_ranges.pool in the coordinator's config, "
                         "then `factory tenant retry`";
      d.details = {{"around", ranges::to_json(facts)}};
      return StepOutcome::failure(d.summary, {}, d);
    };
    if (p_.fixed) {
      ranges::Chosen c{p_.ranges.cluster_cidr, p_.ranges.service_cidr, p_.ranges.cluster_dns};
      if (auto s = ranges::check_fixed(c, facts); !s.ok()) return clash(s.error().message);
    } else if (ranges_known(ctx)) {
      // Chosen before (a retry, a reboot): kept unless the host's own ranges
      // moved onto them since.
      ranges::Chosen c{p_.ranges.cluster_cidr, p_.ranges.service_cidr, p_.ranges.cluster_dns};
      if (auto s = ranges::check_fixed(c, p_.avoid); !s.ok()) return clash(s.error().message);
    } else {
      auto c = ranges::choose(facts, p_.pool);
      if (!c) return clash(c.error().message);
      set_ranges({c->cluster_cidr, c->service_cidr, c->cluster_dns});
      json state = load_step_state(ctx);
      state["ranges"] = ranges::to_json(*c);
      if (auto s = save_step_state(ctx, state); !s)
        return StepOutcome::failure("cannot record the chosen ranges: " + s.error().message);
    }
    emit_progress(ctx, {{"state", "progress"},
                        {"message", "guest cluster ranges: pods " + p_.ranges.cluster_cidr +
                                        ", services " + p_.ranges.service_cidr + ", DNS " +
                                        p_.ranges.cluster_dns + (p_.fixed ? " (fixed)" : "")},
                        {"ranges", ranges_report(p_.ranges, facts)}});
    return StepOutcome::success();
  }

  bool config_matches(const GuestEnv& env) const {
    auto text = read_file(env.path(kConfigPath));
    if (!text) return false;
    auto j = parse_yaml(*text, kConfigPath);
    if (!j || !j->is_object()) return false;
    for (auto& [k, v] : p_.config.items())
      if (!j->contains(k) || scalar_text((*j)[k]) != scalar_text(v)) return false;
    return true;
  }

  std::string installed_version(const StepContext& ctx) const {
    auto r = run_in_step(ctx, {"rke2", "--version"}, 30s);
    if (!r || !r->ok()) return "";
    return parse_rke2_version(r->output);
  }

  bool service_active(const StepContext& ctx) const {
    auto r = run_in_step(ctx, {"systemctl", "is-active", p_.service}, 30s);
    return r && r->ok() && r->output.rfind("active", 0) == 0;
  }

  // One look at the nodes: ready when there is at least one and all are.
  Readiness poll_ready(const StepContext& ctx) const {
    Readiness out;
    auto k = Kubectl::find(ctx.env, p_.kubeconfig, p_.bin_dir);
    if (!k) {
      out.api_error = k.error().message;
      return out;
    }
    auto nodes = k->nodes(time_left(ctx, 30s));
    if (!nodes) {
      out.api_error = nodes.error().message;
      return out;
    }
    if (nodes->empty()) {
      out.api_error = "the API lists no node yet";
      return out;
    }
    out.ready = true;
    out.node = nodes->front();
    for (const auto& n : *nodes)
      if (!n.ready) {
        out.ready = false;
        out.node = n;
        break;
      }
    return out;
  }

  // What one look at the nodes is given at least, near the deadline.
  static constexpr auto kLookAllowance = 2s;

  Readiness wait_ready(const StepContext& ctx,
                       std::chrono::steady_clock::time_point give_up) const {
    ProgressLimiter limiter(15s);
    std::string last_state;
    while (true) {
      auto r = poll_ready(ctx);
      if (r.ready) return r;
      std::string state =
          r.node ? "node " + r.node->name + " NotReady" +
                       (r.node->ready_reason.empty() ? "" : " (" + r.node->ready_reason + ")")
                 : "API not answering: " + r.api_error;
      if (state != last_state || limiter.due()) {
        emit_progress(ctx,
                      {{"state", "progress"},
                       {"message", "waiting for the guest cluster's node to be Ready: " + state}});
        last_state = state;
      }
      // The next look must have time to answer: one started in the last
      // moments before give_up is killed at once, and "kubectl timed out"
      // would hide what every earlier look said ("refused"). Found on a
      // machine where a look takes ~0.4 s: the last one began 0.1 s
      // before the deadline.
      if (std::chrono::steady_clock::now() + 1s + kLookAllowance >= give_up) return r;
      std::this_thread::sleep_for(1s);
    }
  }

  StepOutcome not_ready(const StepContext& ctx, const Readiness& r,
                        const std::vector<std::string>& dns) const {
    NodeNotReadyObservations o;
    o.node = r.node;
    o.api_error = r.api_error;
    o.dns_servers = dns;
    o.running_service_cidr = rke2_running_service_cidr(ctx.env);
    o.planned = p_.ranges;
    o.service = p_.service;
    std::string tail;
    if (auto k = Kubectl::find(ctx.env, p_.kubeconfig, p_.bin_dir)) {
      // Past the deadline already: a short, fixed allowance for the look.
      if (auto pods = k->pods(15s, "kube-system")) {
        o.system_pods = *pods;
        for (const auto& p : *pods)
          if (!p.running() && p.status != "Completed")
            tail += p.ns + "/" + p.name + " " + p.status +
                    (p.message.empty() ? "" : ": " + p.message) + "\n";
      }
    }
    if (!r.node) {
      CommandSpec spec;
      spec.argv = {"systemctl", "status", "--no-pager", p_.service};
      spec.timeout = 10s;
      if (auto s = run_command(spec)) tail = s->tail(15) + tail;
    }
    auto d = diagnose_node_not_ready(o);
    return StepOutcome::failure(d.summary, tail, d);
  }

  Rke2Params p_;
};

}  // namespace

std::string render_rke2_config(const json& config) {
  std::string out =
      "# Written by factory-agent (plan step rke2). The guest cluster's own ranges: they must\n"
      "# not clash with the host cluster's, whose DNS server the guest got from DHCP.\n";
  for (const char* k : kRangeKeys)
    if (config.contains(k)) out += render_entry(k, config[k]);
  for (auto& [k, v] : config.items())
    if (std::find(std::begin(kRangeKeys), std::end(kRangeKeys), k) == std::end(kRangeKeys))
      out += render_entry(k, v);
  return out;
}

std::string parse_rke2_version(const std::string& output) {
  static const std::regex re(R"(rke2 version (v[0-9][^\s]*))");
  std::smatch m;
  if (std::regex_search(output, m, re)) return m[1];
  return "";
}

Result<std::unique_ptr<Step>> make_rke2(const StepSpec& spec) {
  auto j = normalized_params("rke2", spec);
  if (!j) return j.error();
  Rke2Params p;
  p.version = (*j)["version"].get<std::string>();
  p.install_url = (*j)["install_url"].get<std::string>();
  p.service = (*j)["service"].get<std::string>();
  p.kubeconfig = (*j)["kubeconfig"].get<std::string>();
  p.bin_dir = (*j)["bin_dir"].get<std::string>();
  p.config = (*j)["config"];
  p.fixed = p.config.contains("cluster-cidr");
  if (p.fixed)
    p.ranges = {p.config["cluster-cidr"].get<std::string>(),
                p.config["service-cidr"].get<std::string>(),
                p.config["cluster-dns"].get<std::string>()};
  if (j->contains("ranges")) {
    const json& r = (*j)["ranges"];
    if (r.contains("avoid")) {
      auto f = ranges::facts_from_json(r["avoid"], "params.ranges.avoid");
      if (!f) return f.error();
      p.avoid = *f;
    }
    if (r.contains("pool")) {
      auto pl = ranges::pool_from_json(r["pool"], "params.ranges.pool");
      if (!pl) return pl.error();
      p.pool = *pl;
    }
  }
  return std::unique_ptr<Step>(new Rke2(std::move(p)));
}

}  // namespace factory::agent::steps
