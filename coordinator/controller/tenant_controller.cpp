#include "coordinator/controller/tenant_controller.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/durations.hpp"
#include "common/pki.hpp"
#include "coordinator/controller/tenant_status.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/tenant_resource.hpp"

namespace factory::controller {

using tenants::kube_state;

using nlohmann::json;

namespace {

std::string meta(const json& obj, const char* key) {
  const json md = obj.value("metadata", json::object());
  return md.contains(key) && md[key].is_string() ? md[key].get<std::string>() : "";
}

std::int64_t generation_of(const json& obj) {
  const json md = obj.value("metadata", json::object());
  return md.contains("generation") && md["generation"].is_number_integer()
             ? md["generation"].get<std::int64_t>()
             : 0;
}

bool has_finalizer(const json& obj) {
  const json f = obj.value("/metadata/finalizers"_json_pointer, json::array());
  return f.is_array() && std::find(f.begin(), f.end(), json(kTenantFinalizer)) != f.end();
}

}  // namespace

TenantController::TenantController(kube::KubeClient client, tenants::TenantService& service,
                                   const store::Store& store, const feed::TenantView& view,
                                   Announce announce, TenantControllerOptions opts)
    : client_(std::move(client)),
      service_(service),
      store_(store),
      view_(view),
      announce_(std::move(announce)),
      opts_(std::move(opts)) {}

TenantController::~TenantController() {
  stop();
}

void TenantController::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void TenantController::set_active(bool active) {
  {
    std::lock_guard l(mu_);
    active_ = active;
  }
  cv_.notify_all();
  spdlog::info("controller: Tenants {} reconciled by this coordinator",
               active ? "are" : "are no longer");
}

void TenantController::stop() {
  {
    std::lock_guard l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

TenantControllerStats TenantController::stats() const {
  std::lock_guard l(stats_mu_);
  return stats_;
}

void TenantController::wait_for(std::chrono::milliseconds d) {
  std::unique_lock l(mu_);
  cv_.wait_for(l, d, [&] { return stopping_.load(); });
}

void TenantController::run() {
  auto backoff = opts_.retry_min;
  while (!stopping_) {
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return stopping_ || active_; });
    }
    if (stopping_) break;
    const std::string rv = resync();
    if (rv.empty()) {
      wait_for(backoff);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(30));
      continue;
    }
    backoff = opts_.retry_min;
    // Changes as they come, until the next resync.
    kube::WatchOptions w;
    w.resource_version = rv;
    w.timeout = opts_.resync;
    w.max_request = opts_.resync;
    w.cancelled = [this] { return !should_run(); };
    auto st = client_.watch(kube::kTenant, opts_.ns, w, [&](const kube::WatchEvent& ev) {
      if (ev.type != "DELETED") reconcile(ev.object);
      return should_run();
    });
    if (!st.ok() && st.error().code != Errc::timeout) {
      spdlog::warn("controller: watching Tenants: {}", st.error().message);
      wait_for(backoff);
    }
  }
}

std::string TenantController::resync() {
  {
    std::lock_guard l(stats_mu_);
    ++stats_.passes;
  }
  auto list = client_.list(kube::kTenant, opts_.ns);
  if (!list) {
    spdlog::warn("controller: listing Tenants: {}", list.error().message);
    return "";
  }
  for (auto item : list->value("items", json::array())) {
    if (!should_run()) break;
    // List items come without their kind.
    item["apiVersion"] = tenants::kTenantApiVersion;
    item["kind"] = tenants::kTenantKind;
    reconcile(std::move(item));
  }
  std::string rv = meta(*list, "resourceVersion");
  return rv.empty() ? "0" : rv;
}

void TenantController::announce(const std::string& tenant, const std::string& action,
                                const std::string& state, json extra) {
  extra["action"] = action;
  extra["state"] = state;
  extra["by"] = "Tenant " + tenant;
  if (announce_) announce_(tenant, extra);
}

void TenantController::reconcile(json obj) {
  if (!should_run()) return;
  {
    std::lock_guard l(stats_mu_);
    ++stats_.reconciled;
  }
  const std::string name = meta(obj, "name");
  const std::string ns = meta(obj, "namespace");
  if (name.empty()) return;

  if (!meta(obj, "deletionTimestamp").empty()) {
    if (has_finalizer(obj)) finalize(obj);
    return;
  }
  if (!has_finalizer(obj)) {
    json f = obj.value("/metadata/finalizers"_json_pointer, json::array());
    if (!f.is_array()) f = json::array();
    f.push_back(kTenantFinalizer);
    auto put = put_finalizers(obj, f);
    // A conflict or a failure: the next event or resync brings it again.
    if (!put) return;
    obj = *put;
  }

  TenantFacts facts;
  facts.generation = generation_of(obj);
  auto resource = tenants::tenant_from_object(obj);
  if (resource) {
    if (!resource->ssh_key_refs.empty()) {
      auto keys = referenced_keys(ns, resource->ssh_key_refs);
      if (!keys)
        resource = keys.error();
      else
        for (auto& k : *keys) resource->request.ssh_authorized_keys.push_back(std::move(k));
    }
  }
  // What the CLI's flags would be told, said of the Tenant's fields: a tier
  // with a login needs a key (the CLI asks for --ssh-key).
  if (resource && resource->request.ssh_authorized_keys.empty()) {
    const catalog::Tier* tier = service_.catalog().find(resource->request.tier);
    if (tier != nullptr && tier->access.login)
      resource = Error(Errc::invalid_argument,
                       "Tenant spec.sshKeys: tier " + resource->request.tier +
                           " has a login, and the guest's ubuntu user needs at least one "
                           "public key (publicKey, or secretKeyRef to a Secret holding them)");
  }
  if (!resource) {
    facts.invalid_spec = resource.error().message;
    facts.record = store_.get_tenant(name);
    write_status(obj,
                 tenant_status(facts, obj.value("status", json()), format_rfc3339(Clock::now())));
    return;
  }
  const tenants::TenantRequest& req = resource->request;

  auto rec = store_.get_tenant(name);
  if (!rec || kube_state(*rec) != "created") {
    // Nothing yet, or a create cut off or failed: create (idempotent),
    // unless one failed a moment ago for this same spec.
    auto failed = create_failures_.find(name);
    const bool wait = failed != create_failures_.end() &&
                      failed->second.generation == facts.generation &&
                      std::chrono::steady_clock::now() < failed->second.next_try;
    if (!wait) {
      announce(name, "create", "started", {{"tier", req.tier}});
      auto made = service_.create(req);
      {
        std::lock_guard l(stats_mu_);
        ++stats_.creates;
      }
      if (made) {
        create_failures_.erase(name);
        announce(name, "create", "done", {{"created", made->created}});
        // The Tenant read before the create may have been deleted while the
        // create waited for the service (`factory tenant delete` holds it
        // through its whole removal): a tenant made for a Tenant that is gone,
        // or going, is removed again rather than left behind.
        auto now = client_.get(kube::kTenant, ns, name);
        const bool gone = !now && now.error().code == Errc::not_found;
        if (gone || (now && (!meta(*now, "deletionTimestamp").empty() ||
                             meta(*now, "uid") != meta(obj, "uid")))) {
          spdlog::warn("controller: Tenant {}/{} went while its tenant was made; removing it", ns,
                       name);
          announce(name, "delete", "started", {{"reason", "its Tenant went meanwhile"}});
          auto removed = service_.remove(name, ns);
          announce(name, "delete", removed ? "done" : "failed");
          return;  // what is there now comes with its own event
        }
      } else {
        CreateFailure& f = create_failures_[name];
        if (f.generation != facts.generation) f.attempts = 0;
        f.error = made.error().message;
        f.generation = facts.generation;
        ++f.attempts;
        const auto pause = std::min<std::chrono::seconds>(
            std::chrono::seconds(10) * (1 << std::min(f.attempts - 1, 5)), std::chrono::minutes(5));
        f.next_try = std::chrono::steady_clock::now() + pause;
        announce(name, "create", "failed", {{"error", made.error().message}});
        spdlog::warn(
            "controller: creating tenant {} from its Tenant (attempt {}; next in {} s): {}", name,
            f.attempts, pause.count(), made.error().message);
      }
      rec = store_.get_tenant(name);
    }
  } else {
    facts.not_applied = tenants::request_differences(rec->spec, req);
    auto drift = service_.drift(name);
    if (drift && !drift->empty()) {
      facts.drift = *drift;
      announce(name, "repair", "started", {{"drift", *drift}});
      auto fixed = service_.repair(name);
      {
        std::lock_guard l(stats_mu_);
        ++stats_.repairs;
      }
      if (fixed) {
        announce(name, "repair", "done", {{"made_again", (*fixed)["made_again"]}});
        spdlog::warn("controller: tenant {} was changed by hand ({}); put back", name,
                     drift->front());
      } else {
        facts.repair_error = fixed.error().message;
        announce(name, "repair", "failed", {{"error", fixed.error().message}});
      }
      rec = store_.get_tenant(name);
    } else if (!drift) {
      spdlog::warn("controller: checking tenant {} for drift: {}", name, drift.error().message);
    }
  }
  if (auto e = create_failures_.find(name); e != create_failures_.end())
    facts.create_error = e->second.error;

  facts.record = rec;
  if (rec) {
    const json view = view_.tenant(*rec);
    const json agent = view.value("agent", json::object());
    facts.agent_connected = agent.value("connected", false);
    facts.agent_state = agent.value("state", std::string());
    facts.active_diagnoses = view.value("active_diagnoses", json::array());
    if (rec->status.kube && rec->status.kube->gpu_resource)
      facts.gpu = *rec->status.kube->gpu_resource;
    else if (rec->spec.gpu_resource)
      facts.gpu = *rec->spec.gpu_resource;
    if (rec->endpoint && rec->endpoint->url) facts.endpoint_url = *rec->endpoint->url;
  }
  write_status(obj,
               tenant_status(facts, obj.value("status", json()), format_rfc3339(Clock::now())));
}

void TenantController::finalize(const json& obj) {
  const std::string name = meta(obj, "name");
  const std::string ns = meta(obj, "namespace");
  const bool known = store_.get_tenant(name).has_value();
  if (known) announce(name, "delete", "started");
  auto removed = service_.remove(name, ns);
  {
    std::lock_guard l(stats_mu_);
    ++stats_.removes;
  }
  if (!removed) {
    if (known) announce(name, "delete", "failed", {{"error", removed.error().message}});
    spdlog::warn("controller: deleting tenant {} for its Tenant: {}", name,
                 removed.error().message);
    TenantFacts facts;
    facts.generation = generation_of(obj);
    facts.record = store_.get_tenant(name);
    facts.create_error = "delete failed: " + removed.error().message;
    write_status(obj,
                 tenant_status(facts, obj.value("status", json()), format_rfc3339(Clock::now())));
    return;
  }
  create_failures_.erase(name);
  if (known) announce(name, "delete", "done", {{"deleted", (*removed)["deleted"]}});
  json f = json::array();
  for (const auto& x : obj.value("/metadata/finalizers"_json_pointer, json::array()))
    if (x != json(kTenantFinalizer)) f.push_back(x);
  (void)put_finalizers(obj, f);
}

Result<json> TenantController::put_finalizers(const json& obj, const json& finalizers) {
  // Conditional on the version read: a Tenant edited meanwhile is read
  // again (the watch brings it) rather than overwritten.
  json patch = {{"metadata",
                 {{"finalizers", finalizers}, {"resourceVersion", meta(obj, "resourceVersion")}}}};
  auto r = client_.merge_patch(kube::kTenant, meta(obj, "namespace"), meta(obj, "name"), patch);
  if (r) {
    std::lock_guard l(stats_mu_);
    ++stats_.writes;
  } else if (r.error().code != Errc::not_found && r.error().code != Errc::conflict &&
             r.error().code != Errc::already_exists) {
    spdlog::warn("controller: Tenant {}/{}: finalizers: {}", meta(obj, "namespace"),
                 meta(obj, "name"), r.error().message);
  }
  return r;
}

void TenantController::write_status(const json& obj, const json& status) {
  if (obj.value("status", json()) == status) return;  // nothing new: no write
  json o = obj;
  o["status"] = status;
  auto r = client_.update_status(o);
  if (r) {
    std::lock_guard l(stats_mu_);
    ++stats_.writes;
  } else if (r.error().code != Errc::not_found) {
    // A conflict is a newer object on its way through the watch.
    spdlog::debug("controller: Tenant {}/{} status: {}", meta(obj, "namespace"), meta(obj, "name"),
                  r.error().message);
  }
}

Result<std::vector<std::string>> TenantController::referenced_keys(
    const std::string& ns, const std::vector<tenants::SecretKeyRef>& refs) {
  std::vector<std::string> keys;
  for (const auto& ref : refs) {
    const std::string field = "spec.sshKeys: Secret " + ns + "/" + ref.name + " key " + ref.key;
    auto secret = client_.get(kube::kSecret, ns, ref.name);
    if (!secret) return Error(secret.error().code, field + ": " + secret.error().message);
    const json data = secret->value("data", json::object());
    if (!data.contains(ref.key) || !data[ref.key].is_string())
      return Error(Errc::invalid_argument, field + ": no such key in the Secret");
    auto text = pki::base64_decode(data[ref.key].get<std::string>());
    if (!text) return Error(Errc::invalid_argument, field + ": " + text.error().message);
    std::size_t start = 0;
    while (start <= text->size()) {
      std::size_t nl = text->find('\n', start);
      std::string line =
          text->substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
    if (keys.size() > tenants::kMaxTenantSshKeys)
      return Error(Errc::invalid_argument,
                   field + ": more than " + std::to_string(tenants::kMaxTenantSshKeys) + " keys");
  }
  return keys;
}

}  // namespace factory::controller
