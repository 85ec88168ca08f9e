#include "coordinator/tenants/service.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/durations.hpp"
#include "common/net/http_client.hpp"
#include "common/pki.hpp"
#include "common/validation.hpp"
#include "contract/mig_cards.hpp"
#include "contract/pins.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/cloud_init.hpp"
#include "coordinator/tenants/k8s_names.hpp"
#include "coordinator/tenants/record_facts.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

std::string record_namespace(const store::TenantRecord& t, const std::string& fallback) {
  std::string ns = t.spec.ns.value_or("");
  return ns.empty() ? fallback : ns;
}

// status.kube, made when the record has none yet.
store::KubeStatus& kube_of(store::TenantRecord& t) {
  if (!t.status.kube) t.status.kube.emplace();
  return *t.status.kube;
}

// A model endpoint's API key: 40 characters of [a-z0-9], about 206 bits,
// with a prefix that says what it is when one turns up in a paste.
std::string new_api_key() {
  return "fmk-" + pki::random_token_chars(40);
}

std::vector<std::string> refs(const std::vector<VmObject>& objects) {
  std::vector<std::string> out;
  for (const auto& o : objects) out.push_back(o.ref());
  return out;
}

net::HttpResponseOut error_reply(const Error& e) {
  return net::HttpResponseOut::error(http_status_for(e), errc_name(e.code), e.message);
}

// A handler's exception is a bug; it must not take the io thread down.
template <class F>
net::HttpResponseOut guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& ex) {
    spdlog::error("tenants: {} failed with an exception: {}", what, ex.what());
    return net::HttpResponseOut::error(500, "internal",
                                       std::string("internal error in ") + what + ": " + ex.what());
  }
}

}  // namespace

int http_status_for(const Error& e) {
  switch (e.code) {
    case Errc::invalid_argument:
      return 400;
    case Errc::not_found:
      return 404;
    case Errc::already_exists:
    case Errc::conflict:
    case Errc::failed_precondition:
      return 409;
    case Errc::permission_denied:
    case Errc::unauthenticated:
    case Errc::unavailable:
    case Errc::timeout:
    case Errc::protocol:
      return 502;  // the cluster (or its API) failed us, not the admin
    case Errc::io:
    case Errc::internal:
      return 500;
  }
  return 500;
}

TenantService::TenantService(TenantServiceDeps deps, catalog::Catalog catalog,
                             std::unique_ptr<VmProvider> provider, TenantServiceOptions opts,
                             std::unique_ptr<TenantObjects> objects)
    : deps_(deps),
      catalog_(std::move(catalog)),
      provider_(std::move(provider)),
      opts_(std::move(opts)),
      objects_(std::move(objects)) {}

TenantService::~TenantService() {
  stop_maintenance();
}

std::optional<json> TenantService::catalog_plan_for(const store::TenantRecord& t) const {
  if (t.tier.empty()) return std::nullopt;
  const catalog::Tier* tier = catalog_.find(t.tier);
  if (!tier) {
    spdlog::warn("tenants: tenant {} has tier {}, which catalog {} does not offer: no plan sent",
                 t.name, t.tier, catalog_.source);
    return std::nullopt;
  }
  json plan = catalog::plan_for(*tier);
  // --model: the tenant's models replace the tier's ollama_model steps, in
  // the place of the first, each a copy of it; the probe asks the first.
  if (t.spec.models && !t.spec.models->empty()) {
    json steps = json::array();
    bool placed = false;
    for (const auto& step : plan["steps"]) {
      if (step.value("kind", "") != "ollama_model") {
        steps.push_back(step);
        continue;
      }
      if (placed) continue;
      placed = true;
      for (const auto& m : *t.spec.models) {
        json copy = step;
        copy["id"] = "model-" + m;
        copy["params"]["model"] = m;
        steps.push_back(copy);
      }
    }
    plan["steps"] = steps;
    if (plan.contains("health") && plan["health"].contains("probe"))
      plan["health"]["probe"]["model"] = t.spec.models->front();
  }
  // The host's ranges read at create travel to the agent in its rke2 step,
  // which adds the guest's own and picks (or checks the catalog's).
  if (const auto& gr = t.spec.guest_ranges)
    for (auto& step : plan["steps"])
      if (step.value("kind", "") == "rke2")
        step["params"]["ranges"] = {{"avoid", gr->avoid.value_or(json::array())},
                                    {"pool", gr->pool.value_or(json::object())}};
  return json{{"hash", catalog::plan_hash(plan)}, {"plan", plan}};
}

Result<std::optional<store::GuestRanges>> TenantService::guest_ranges_for(
    const catalog::Tier& tier) {
  auto rke2 = std::find_if(tier.steps.begin(), tier.steps.end(),
                           [](const catalog::StepDef& s) { return s.kind == "rke2"; });
  if (rke2 == tier.steps.end()) return std::optional<store::GuestRanges>();
  auto host = provider_->host_ranges();
  if (!host)
    return host.error().with_context("choosing tier " + tier.name +
                                     "'s guest cluster ranges around the host's");
  std::vector<ranges::Fact> facts = *host;
  facts.insert(facts.end(), opts_.guest_ranges_avoid.begin(), opts_.guest_ranges_avoid.end());
  const json config = rke2->params.value("config", json::object());
  bool fixed = config.contains("cluster-cidr");
  ranges::Chosen planned;
  if (fixed) {
    planned = {config.value("cluster-cidr", ""), config.value("service-cidr", ""),
               config.value("cluster-dns", "")};
    if (auto st = ranges::check_fixed(planned, facts); !st.ok())
      return Error(Errc::failed_precondition,
                   "tier " + tier.name + " step '" + rke2->id +
                       "' fixes the guest cluster's ranges: " + st.error().message);
  } else {
    auto c = ranges::choose(facts, opts_.guest_ranges_pool);
    if (!c) return c.error().with_context("tier " + tier.name + "'s guest cluster ranges");
    planned = *c;
  }
  store::GuestRanges gr;
  gr.avoid = ranges::to_json(facts);
  gr.pool = ranges::to_json(opts_.guest_ranges_pool);
  gr.planned = ranges::to_json(planned);
  gr.fixed = fixed;
  return std::optional<store::GuestRanges>(std::move(gr));
}

Result<CreateOutcome> TenantService::create(const TenantRequest& req) {
  std::lock_guard changes(changes_mu_);
  auto& store = deps_.store;
  auto resolved = resolve_vm_spec(catalog_, req, opts_.default_namespace);
  if (!resolved) return resolved.error();
  VmSpec vm = *resolved;
  TenantRequest effective = req;

  auto existing = store.get_tenant(req.name);
  if (existing) {
    if (!has_vm(*existing))
      return Error(Errc::already_exists,
                   "tenant " + req.name +
                       " exists without a VM (made by `factory token create`): choose another "
                       "name, or `factory tenant delete " +
                       req.name + "` first");
    if (existing->phase == "deleting")
      return Error(Errc::failed_precondition,
                   "tenant " + req.name + " is half-deleted: finish with `factory tenant delete " +
                       req.name + "`, then create it again");
    if (auto st = same_request(existing->spec, req); !st.ok()) return st.error();
    if (kube_state(*existing) == "created") {
      CreateOutcome out;
      out.note =
          "tenant " + req.name + " exists already (phase " + existing->phase + "); nothing changed";
      return out;
    }
    // Finishing an interrupted or failed create: exactly what it asked for.
    vm = stored_vm(*existing);
    if (effective.ssh_authorized_keys.empty())
      effective.ssh_authorized_keys =
          existing->spec.ssh_authorized_keys.value_or(std::vector<std::string>{});
  }

  // Everything that can be checked without acting is checked before the
  // record exists: bad input and an unreachable cluster leave nothing behind.
  const catalog::Tier* tier_def = catalog_.find(vm.tier);
  const bool login = tier_def == nullptr || tier_def->access.login;
  if (!login && !req.password.empty())
    return Error(Errc::invalid_argument, "tier " + vm.tier +
                                             " has no login: it takes no password (--ssh-key "
                                             "gives the admin key-only login)");
  // The binary's hash as the file is now (looked at again at most every 10 s).
  if (deps_.agent_binary) deps_.agent_binary->refresh_if_due();
  CloudInitParams params = user_data_params(req.name, effective.ssh_authorized_keys, login);
  if (login && !req.password.empty()) params.password = req.password;
  if (params.agent_sha256.empty())
    return Error(Errc::failed_precondition,
                 "the coordinator has no agent binary to serve (" + opts_.agent_binary_path +
                     " is not readable): set agents.binary in its config, or guests could never "
                     "install the agent");
  if (auto st = validate_cloud_init_params(params); !st.ok()) return st.error();
  if (!existing)
    if (const catalog::Tier* tier = catalog_.find(vm.tier)) vm.needs_mig = tier_needs_mig(*tier);
  if (auto st = provider_->preflight(vm); !st.ok()) return st.error();
  // The project's quota, checked here, under the changes lock that every
  // create holds until its record is stored: two creates at once cannot
  // both take the last card.
  {
    const std::string project = existing
                                    ? existing->spec.project.value_or("default")
                                    : (req.project.empty() ? std::string("default") : req.project);
    if (auto st = check_gpu_quota(store.list_tenants(), req.name, project, vm.gpu_resource, vm.gpus,
                                  opts_.project_gpu_quotas);
        !st.ok())
      return st.error();
  }
  // An interrupted create keeps what it read: its agent may hold the plan.
  std::optional<store::GuestRanges> guest_ranges;
  if (existing && existing->spec.guest_ranges) {
    guest_ranges = existing->spec.guest_ranges;
  } else if (const catalog::Tier* tier = catalog_.find(vm.tier)) {
    auto gr = guest_ranges_for(*tier);
    if (!gr) return gr.error();
    guest_ranges = *gr;
  }

  const bool record_is_new = !existing;
  store::TenantRecord rec = existing.value_or(store::TenantRecord{});
  if (record_is_new) {
    rec.name = req.name;
    rec.created_at = now_str();
  }
  rec.tier = vm.tier;
  rec.phase = "creating";
  {
    // What a newer coordinator kept in the spec stays with it.
    nlohmann::json kept = std::move(rec.spec.extra);
    rec.spec = stored_spec(vm, effective);
    rec.spec.extra = std::move(kept);
  }
  if (guest_ranges) rec.spec.guest_ranges = guest_ranges;
  {
    store::KubeStatus& ks = kube_of(rec);
    ks.state = "creating";
    ks.ns = vm.ns;
    ks.started_at = now_str();
    ks.error.reset();
  }
  if (auto st = store.put_tenant(rec); !st.ok())
    return st.error().with_context("recording tenant " + req.name);
  spdlog::info("tenants: creating tenant {} (tier {}, {} x {}, namespace {}){}", vm.name, vm.tier,
               vm.gpus, vm.gpu_resource.empty() ? "-" : vm.gpu_resource, vm.ns,
               record_is_new ? "" : ": finishing an earlier attempt");

  CreateOutcome out;
  std::string token_id;
  std::string userdata;
  auto has = provider_->has_user_data(vm);
  if (!has) {
    auto st = rollback(rec, record_is_new, token_id, out.objects, has.error());
    return st.error();
  }
  if (!*has) {
    // Any token of an earlier attempt went with its Secret: void it.
    if (auto r = deps_.tokens.revoke_tenant(req.name); !r)
      return rollback(rec, record_is_new, token_id, out.objects, r.error()).error();
    auto token = deps_.tokens.issue(req.name, opts_.token_ttl);
    if (!token) return rollback(rec, record_is_new, token_id, out.objects, token.error()).error();
    token_id = token->id;
    if (req.password.empty() && login) {
      auto pw = generate_password();
      if (!pw) return rollback(rec, record_is_new, token_id, out.objects, pw.error()).error();
      params.password = *pw;
    }
    params.bootstrap_token = token->token;
    auto rendered = render_user_data(params);
    if (!rendered)
      return rollback(rec, record_is_new, token_id, out.objects, rendered.error()).error();
    userdata = std::move(rendered->text);
  } else {
    out.note =
        "the user-data (and the ubuntu password) of an earlier attempt is kept: read it "
        "from " +
        provider_->user_data_location(vm);
  }

  // The endpoint's key hash is recorded before the VM exists: its agent is
  // told it as soon as it connects. The key itself goes into its Secret once
  // the namespace is there (after provision). One kept from an earlier
  // attempt stays.
  std::string new_key;
  if (vm.endpoint_port != 0) {
    auto have = provider_->api_key(vm);
    if (!have) return rollback(rec, record_is_new, token_id, out.objects, have.error()).error();
    std::string key = *have;
    if (key.empty()) new_key = key = new_api_key();
    // A fresh state (a URL comes once the Service has its port), keeping
    // the time of the key's last rotation and what a newer coordinator kept.
    store::EndpointState e;
    e.key_sha256 = pki::sha256_hex(key);
    e.port = vm.endpoint_port;
    e.host = opts_.endpoint_host;
    e.rotated_at = rec.endpoint && rec.endpoint->rotated_at ? *rec.endpoint->rotated_at : now_str();
    if (rec.endpoint) e.extra = rec.endpoint->extra;
    rec.endpoint = std::move(e);
    if (auto st = store.put_tenant(rec); !st.ok())
      return rollback(rec, record_is_new, token_id, out.objects, st.error()).error();
  }

  if (auto st = provider_->provision(vm, userdata, out.objects); !st.ok())
    return rollback(rec, record_is_new, token_id, out.objects, st.error()).error();
  if (!new_key.empty()) {
    if (auto st = provider_->put_api_key(vm, new_key, out.objects); !st.ok())
      return rollback(rec, record_is_new, token_id, out.objects, st.error()).error();
    out.api_key = new_key;
  }

  auto now = store.get_tenant(req.name).value_or(rec);
  if (now.phase == "creating" || now.phase == "failed") {
    if (now.agent.agent_id.value_or("").empty())
      now.phase = "pending";
    else
      now.phase = now.status.plan ? "provisioning" : "enrolled";
  }
  {
    store::KubeStatus& ks = kube_of(now);
    ks.state = "created";
    ks.gpu_resource = vm.gpu_resource;
    ks.created_at = now_str();
    std::vector<std::string> objects = ks.objects.value_or(std::vector<std::string>{});
    for (const auto& r : refs(out.objects))
      if (std::find(objects.begin(), objects.end(), r) == objects.end()) objects.push_back(r);
    ks.objects = objects;
    if (!token_id.empty()) ks.bootstrap_token_id = token_id;
    ks.error.reset();
  }
  now.tier = vm.tier;
  now.spec = rec.spec;
  if (vm.endpoint_port != 0) {
    now.endpoint = rec.endpoint;
    if (!now.endpoint) now.endpoint.emplace();
    // The URL needs the node port Kubernetes picked for the Service.
    if (auto obs = provider_->observe(vm.name, vm.ns); obs && obs->endpoint_node_port != 0)
      now.endpoint->url = endpoint_url(obs->endpoint_node_port);
  }
  if (auto st = store.put_tenant(now); !st.ok())
    return st.error().with_context("recording tenant " + req.name +
                                   " (its objects exist: run "
                                   "create again to record it)");
  out.created = true;
  if (!userdata.empty()) out.password = params.password;
  std::string made;
  for (const auto& r : refs(out.objects)) made += (made.empty() ? "" : ", ") + r;
  spdlog::info("tenants: tenant {} created (new: {}; bootstrap token {})", vm.name,
               made.empty() ? "nothing" : made, token_id.empty() ? "kept" : token_id);
  return out;
}

CloudInitParams TenantService::user_data_params(const std::string& name,
                                                const std::vector<std::string>& ssh_keys,
                                                bool login) const {
  CloudInitParams params;
  params.tenant = name;
  params.hostname = name;
  params.ssh_authorized_keys = ssh_keys;
  params.login = login;
  params.password = login ? std::string(kPasswordPlaceholder) : std::string();
  params.coordinator_url = opts_.coordinator_url;
  params.agent_binary_url = opts_.agent_binary_url;
  params.ca_pem = opts_.ca_pem;
  params.bootstrap_token = kBootstrapTokenPlaceholder;
  params.agent_sha256 = agent_binary_sha256();
  return params;
}

Result<std::vector<std::string>> TenantService::drift(const std::string& name) {
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  // Only a tenant whose create finished has objects that should all be there.
  if (!has_vm(*rec) || kube_state(*rec) != "created" || rec->phase == "deleting")
    return std::vector<std::string>{};
  return provider_->drift(stored_vm(*rec));
}

Result<json> TenantService::repair(const std::string& name) {
  std::vector<std::string> repaired;
  bool key_missing = false;
  {
    std::lock_guard changes(changes_mu_);
    auto rec = deps_.store.get_tenant(name);
    if (!rec) return Error(Errc::not_found, "no tenant named " + name);
    if (!has_vm(*rec) || kube_state(*rec) != "created" || rec->phase == "deleting")
      return Error(Errc::failed_precondition,
                   "tenant " + name + " is not a created tenant (phase " + rec->phase +
                       "): run the create again or delete it, there is nothing to repair");
    VmSpec vm = stored_vm(*rec);
    auto has = provider_->has_user_data(vm);
    if (!has) return has.error().with_context("repairing tenant " + name);
    std::string userdata;
    std::string token_id;
    if (!*has) {
      // The Secret went: the VM's next boot would find no user-data. A new
      // one with a new one-time token (the old one's Secret is gone) and a
      // new password nobody is shown: the running guest keeps its own, the
      // admin reads the new one from the Secret if it ever boots afresh.
      const catalog::Tier* tier_def = catalog_.find(vm.tier);
      const bool login = tier_def == nullptr || tier_def->access.login;
      CloudInitParams params = user_data_params(
          name, rec->spec.ssh_authorized_keys.value_or(std::vector<std::string>{}), login);
      if (login) {
        auto pw = generate_password();
        if (!pw) return pw.error();
        params.password = *pw;
      }
      if (auto r = deps_.tokens.revoke_tenant(name); !r) return r.error();
      auto token = deps_.tokens.issue(name, opts_.token_ttl);
      if (!token) return token.error();
      token_id = token->id;
      params.bootstrap_token = token->token;
      auto rendered = render_user_data(params);
      if (!rendered) return rendered.error();
      userdata = std::move(rendered->text);
    }
    std::vector<VmObject> created;
    if (auto st = provider_->provision(vm, userdata, created); !st.ok())
      return st.error().with_context("repairing tenant " + name);
    for (const auto& o : created) repaired.push_back(o.ref());
    if (!token_id.empty()) {
      auto now = deps_.store.get_tenant(name).value_or(*rec);
      kube_of(now).bootstrap_token_id = token_id;
      if (auto st = deps_.store.put_tenant(now); !st.ok())
        return st.error().with_context("recording tenant " + name + "'s new bootstrap token");
    }
    if (vm.endpoint_port != 0) {
      auto key = provider_->api_key(vm);
      if (!key) return key.error().with_context("repairing tenant " + name);
      key_missing = key->empty();
    }
  }
  // A model endpoint's key Secret went: a new key, as a rotation makes it
  // (recorded, the agent told), since the old key is nowhere to be read.
  if (key_missing) {
    auto r = credentials(name, true);
    if (!r) return r.error().with_context("repairing tenant " + name + "'s API key");
    repaired.push_back("the endpoint's API key (rotated: its Secret was gone)");
  }
  spdlog::info("tenants: repaired tenant {} (made again: {})", name,
               repaired.empty() ? "nothing; fields put back" : validation::join(repaired, ", "));
  return json{{"tenant", name}, {"made_again", repaired}};
}

Status TenantService::rollback(store::TenantRecord& rec, bool record_is_new,
                               const std::string& token_id, const std::vector<VmObject>& created,
                               const Error& cause) {
  auto& store = deps_.store;
  // The shared Namespace stays: other tenants may live in it.
  std::vector<VmObject> mine;
  for (const auto& o : created)
    if (o.kind != "Namespace") mine.push_back(o);
  auto failures = provider_->remove(mine);
  std::string left;
  for (const auto& [o, e] : failures)
    left += (left.empty() ? "" : "; ") + o.ref() + ": " + e.message;

  if (failures.empty() && record_is_new) {
    if (!token_id.empty())
      if (auto r = deps_.tokens.revoke_tenant(rec.name); !r)
        spdlog::warn("tenants: could not revoke the token of {}: {}", rec.name, r.error().message);
    if (auto st = store.delete_tenant(rec.name); !st.ok())
      spdlog::warn("tenants: could not drop the record of {}: {}", rec.name, st.error().message);
    spdlog::warn("tenants: create of {} failed and was rolled back ({}): {}", rec.name,
                 mine.empty() ? "nothing had been created" : "removed what it created",
                 cause.message);
    return cause;
  }
  auto now = store.get_tenant(rec.name).value_or(rec);
  now.phase = "failed";
  store::KubeStatus& ks = kube_of(now);
  ks.state = "failed";
  ks.error = cause.message + (left.empty() ? "" : "; could not remove " + left);
  std::vector<std::string> objects = ks.objects.value_or(std::vector<std::string>{});
  for (const auto& o : created) {
    bool gone = std::none_of(failures.begin(), failures.end(),
                             [&](const auto& f) { return f.first.ref() == o.ref(); });
    if (!gone || o.kind == "Namespace") objects.push_back(o.ref());
  }
  ks.objects = objects;
  const std::string error = *ks.error;
  if (auto st = store.put_tenant(now); !st.ok())
    spdlog::error("tenants: could not record the failure of {}: {}", rec.name, st.error().message);
  spdlog::warn("tenants: create of {} failed; left in phase failed: {}", rec.name, error);
  return Error(cause.code, cause.message + (left.empty() ? "" : "; could not remove " + left) +
                               "; tenant " + rec.name +
                               " is left in phase failed: run the same create again to finish it, "
                               "or `factory tenant delete " +
                               rec.name + "`");
}

Result<json> TenantService::remove(const std::string& name, const std::string& ns_hint) {
  std::lock_guard changes(changes_mu_);
  if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st.error();
  if (!ns_hint.empty())
    if (auto st = validate_namespace_name(ns_hint); !st.ok()) return st.error();
  auto& store = deps_.store;
  auto rec = store.get_tenant(name);
  const std::string ns =
      rec ? record_namespace(*rec, ns_hint.empty() ? opts_.default_namespace : ns_hint)
          : (ns_hint.empty() ? opts_.default_namespace : ns_hint);
  if (rec) {
    rec->phase = "deleting";
    if (auto st = store.put_tenant(*rec); !st.ok())
      return st.error().with_context("tenant " + name);
  }
  // The agent's identity goes first: from here on nothing can enroll or
  // connect as this tenant, whatever happens to the cluster calls.
  if (auto st = deps_.agents.revoke(name); !st.ok())
    return st.error().with_context("revoking the agent identity of " + name);

  std::vector<VmObject> deleted;
  if (!rec || has_vm(*rec)) {
    auto d = provider_->destroy(name, ns);
    if (!d) {
      if (rec) {
        auto now = store.get_tenant(name).value_or(*rec);
        kube_of(now).error = d.error().message;
        (void)store.put_tenant(now);
      }
      return Error(d.error().code, d.error().message + "; tenant " + name +
                                       " is left in phase deleting: run delete again");
    }
    deleted = std::move(*d);
  }
  // Its GPU time closed now that its VM is gone; the store archives it
  // with the record's delete (store::Store::archived_usage).
  if (rec)
    if (auto st = usage_meter_.close_for_delete(name, unix_seconds(Clock::now())); !st.ok())
      return Error(st.error().code, st.error().message + "; tenant " + name +
                                        " is left in phase deleting: run delete again");
  if (rec)
    if (auto st = store.delete_tenant(name); !st.ok())
      return st.error().with_context("tenant " + name);
  if (rec || !deleted.empty())
    spdlog::info("tenants: deleted tenant {} ({} object(s); agent identity and tokens revoked)",
                 name, deleted.size());
  else
    spdlog::info("tenants: delete of tenant {}: no record and no objects (unused tokens revoked)",
                 name);
  return json{{"tenant", name},
              {"namespace", ns},
              {"found", rec.has_value() || !deleted.empty()},
              {"record_removed", rec.has_value()},
              {"deleted", refs(deleted)},
              {"revoked", true}};
}

Result<CreateOutcome> TenantService::create_with_object(const TenantRequest& req) {
  if (!objects_) return create(req);
  std::lock_guard changes(changes_mu_);
  // Bad input is refused before the Tenant is written: a Tenant that create
  // refuses is one the controller would fail on at every pass.
  auto vm = resolve_vm_spec(catalog_, req, opts_.default_namespace);
  if (!vm) return vm.error();
  // A tenant that exists already: a create it refuses (another spec, a
  // token-only tenant, a half-deleted one) is refused before a Tenant is
  // written for it; one it would finish keeps its namespace.
  auto existing = deps_.store.get_tenant(req.name);
  if (existing && (!has_vm(*existing) || existing->phase == "deleting")) return create(req);
  const std::string ns = existing ? record_namespace(*existing, vm->ns) : vm->ns;
  const json tenant = api_tenant_object(req, ns);
  if (existing && !same_request(existing->spec, req).ok()) {
    // Another spec than the tenant's. Where it has its Tenant (the
    // controller made it from one), the Tenant is what to change, and the
    // refusal says how with kubectl; else the record's refusal.
    auto have = objects_->get(ns, req.name);
    if (have && *have)
      if (auto put = create_or_confirm(*objects_, tenant); !put) return put.error();
    return create(req);
  }
  auto put = create_or_confirm(*objects_, tenant);
  if (!put) return put.error();
  auto out = create(req);
  if (out && *put == TenantObjectPut::created) out->tenant_object = ns + "/" + req.name;
  if (out || *put != TenantObjectPut::created || deps_.store.get_tenant(req.name)) return out;
  // The create was refused or rolled back whole: its Tenant goes with it
  // (with the finalizer the controller may have put on it meanwhile), or
  // the controller would make the tenant the admin was told was refused.
  const std::string what = "Tenant " + ns + "/" + req.name;
  auto gone = objects_->remove(ns, req.name);
  if (gone) gone = objects_->release(ns, req.name);
  if (!gone)
    return Error(out.error().code, out.error().message + "; its " + what +
                                       " could not be deleted (" + gone.error().message +
                                       "): `kubectl delete tenant " + req.name + " -n " + ns + "`");
  spdlog::info("tenants: create of {} failed: its {} is deleted", req.name, what);
  return out;
}

Result<json> TenantService::remove_with_object(const std::string& name,
                                               const std::string& ns_hint) {
  if (!objects_) return remove(name, ns_hint);
  std::lock_guard changes(changes_mu_);
  if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st.error();
  if (!ns_hint.empty())
    if (auto st = validate_namespace_name(ns_hint); !st.ok()) return st.error();
  const std::string fallback = ns_hint.empty() ? opts_.default_namespace : ns_hint;
  auto rec = deps_.store.get_tenant(name);
  const std::string ns = rec ? record_namespace(*rec, fallback) : fallback;
  const std::string what = "Tenant " + ns + "/" + name;
  // The Tenant's deletion is asked before anything else changes: were the
  // tenant removed first and the Tenant then not deleted, the controller
  // would make the tenant again from it.
  auto asked = objects_->remove(ns, name);
  if (!asked)
    return asked.error().with_context("deleting tenant " + name + "'s " + what +
                                      " (nothing was changed)");
  auto out = remove(name, ns_hint);
  // A Tenant held by the controller's finalizer stays marked for deletion:
  // the controller, or this delete run again, finishes it.
  if (!out) return out.error();
  auto released = objects_->release(ns, name);
  if (!released)
    return released.error().with_context("tenant " + name + " is deleted, but its " + what +
                                         " still holds finalizer " + kTenantFinalizer +
                                         ": run the delete again");
  if (*asked) spdlog::info("tenants: deleted {} with its tenant", what);
  (*out)["found"] = (*out)["found"].get<bool>() || *asked;
  (*out)["tenant_object"] = {{"ref", what}, {"found", *asked}, {"finalizer_removed", *released}};
  return out;
}

json TenantService::plan_steps(const store::TenantRecord& t) const {
  json out = json::array();
  static const std::map<std::string, store::PlanStep> kNone;
  const auto& reported = t.status.plan && t.status.plan->steps ? *t.status.plan->steps : kNone;
  std::vector<std::string> seen;
  auto entry = [&](const std::string& id, const std::string& kind) {
    json s = {{"id", id}, {"kind", kind}, {"state", "pending"}};
    // The API's view of the step: what its agent reported over the defaults.
    if (auto it = reported.find(id); it != reported.end()) {
      const json step = it->second.to_json();
      for (auto& [k, v] : step.items()) s[k] = v;
    }
    seen.push_back(id);
    return s;
  };
  // The steps of the plan the tenant runs (or, during a tier upgrade, the
  // plan it moves to), in its order.
  auto plan = t.status.tier_upgrade && t.status.tier_upgrade->to_plan &&
                      t.status.tier_upgrade->state.value_or("") != "rolled_back" &&
                      t.status.tier_upgrade->state.value_or("") != "refused"
                  ? std::optional<json>(json{{"plan", *t.status.tier_upgrade->to_plan}})
                  : running_plan(t);
  if (!plan) plan = catalog_plan_for(t);
  if (plan)
    for (const auto& s : (*plan)["plan"].value("steps", json::array()))
      out.push_back(entry(s.value("id", ""), s.value("kind", "")));
  // Steps an agent reported that the catalog no longer has (it changed).
  for (const auto& [id, v] : reported)
    if (std::find(seen.begin(), seen.end(), id) == seen.end()) out.push_back(entry(id, ""));
  return out;
}

Result<json> TenantService::show(const std::string& name) {
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  json j = deps_.view.tenant(*rec);
  json events = json::array();
  for (auto& e : deps_.store.recent_events(rec->name, 50))
    events.push_back({{"id", e.id},
                      {"received_at", e.received_at},
                      {"event", json::parse(e.json, nullptr, /*allow_exceptions=*/false)}});
  j["recent_events"] = events;
  j["plan_steps"] = plan_steps(*rec);
  if (const catalog::Tier* tier = catalog_.find(rec->tier))
    j["pins"] = catalog::pins_json(catalog::tier_pins(*tier));
  // What the tenant runs, and how the catalog's plan differs (tier_upgrade.cpp).
  if (!rec->tier.empty()) j["tier_pins"] = tier_pins_view(*rec);
  if (has_vm(*rec)) {
    auto obs = provider_->observe(name, record_namespace(*rec, opts_.default_namespace));
    // The record stands on its own: a cluster that does not answer is shown, not fatal.
    j["vm"] = obs ? obs->to_json() : json{{"error", obs.error().message}};
    if (obs)
      if (json offer = restart_offer(*rec, *obs); !offer.is_null()) j["restart_offer"] = offer;
    if (rec->endpoint) j["endpoint"] = endpoint_view(*rec, obs ? &*obs : nullptr);
  }
  return j;
}

std::string TenantService::endpoint_url(int node_port) const {
  if (node_port == 0 || opts_.endpoint_host.empty()) return "";
  const bool v6 = opts_.endpoint_host.find(':') != std::string::npos;
  return "https://" + (v6 ? "[" + opts_.endpoint_host + "]" : opts_.endpoint_host) + ":" +
         std::to_string(node_port);
}

json TenantService::endpoint_view(const store::TenantRecord& t, const VmObservation* obs) {
  const store::EndpointState e = t.endpoint.value_or(store::EndpointState{});
  json v = {
      {"url", e.url.value_or("")}, {"rotated_at", e.rotated_at.value_or("")}, {"answers", false}};
  if (obs && obs->endpoint_node_port != 0) v["url"] = endpoint_url(obs->endpoint_node_port);
  const std::string url = v["url"].get<std::string>();
  if (url.empty()) {
    v["error"] = "no URL yet: the endpoint Service has no node port";
    return v;
  }
  auto key = provider_->api_key(stored_vm(t));
  if (!key || key->empty()) {
    v["error"] = key ? "no API key stored" : key.error().message;
    return v;
  }
  // What a caller with the key sees: the whole path, TLS to the guest's
  // proxy included. Bounded: show must not hang on a guest that is away.
  net::TlsClientOptions tls;
  tls.ca_pem = opts_.endpoint_ca_pem;
  net::HttpClient client(tls);
  net::HttpRequest r;
  r.url = url + "/v1/models";
  r.headers["Authorization"] = "Bearer " + *key;
  r.timeout = std::chrono::seconds(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto resp = client.request(r);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!resp) {
    v["error"] = resp.error().message;
    return v;
  }
  v["status"] = resp->status;
  v["latency_ms"] = static_cast<int64_t>(ms + 0.5);
  v["answers"] = resp->status == 200;
  if (resp->status != 200) v["error"] = "GET /v1/models answered " + std::to_string(resp->status);
  return v;
}

Result<json> TenantService::credentials(const std::string& name, bool rotate) {
  std::lock_guard changes(changes_mu_);
  if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st.error();
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  if (!rec->endpoint)
    return Error(Errc::failed_precondition, "tenant " + name + " (tier " +
                                                (rec->tier.empty() ? "none" : rec->tier) +
                                                ") serves no model endpoint: it has no API key");
  VmSpec vm = stored_vm(*rec);
  auto key = provider_->api_key(vm);
  if (!key) return key.error().with_context("reading tenant " + name + "'s API key");
  if (key->empty() && !rotate)
    return Error(Errc::failed_precondition, "tenant " + name + " has no API key stored (" +
                                                provider_->api_key_location(vm) +
                                                " is missing): run `factory tenant credentials " +
                                                name + " --rotate` to make one");
  json out = {{"tenant", name}, {"rotated", false}};
  if (rotate) {
    std::string fresh = new_api_key();
    std::vector<VmObject> created;
    if (auto st = provider_->put_api_key(vm, fresh, created); !st.ok())
      return st.error().with_context("rotating tenant " + name + "'s API key");
    auto now = deps_.store.get_tenant(name).value_or(*rec);
    if (!now.endpoint) now.endpoint.emplace();
    now.endpoint->key_sha256 = pki::sha256_hex(fresh);
    now.endpoint->rotated_at = now_str();
    if (auto st = deps_.store.put_tenant(now); !st.ok())
      return st.error().with_context("recording the new key of tenant " + name +
                                     " (the Secret has it already: rotate again)");
    *rec = now;
    *key = fresh;
    const bool told = deps_.agents.push_endpoint(name);
    out["rotated"] = true;
    out["guest_told"] = told;
    if (!told)
      out["note"] =
          "the guest's agent is not connected: its proxy still takes the old key until the agent "
          "reconnects, which applies the new one at once";
    spdlog::info("tenants: rotated the API key of {} (guest {})", name,
                 told ? "told" : "not connected; told when it reconnects");
  }
  std::string url = rec->endpoint->url.value_or("");
  if (auto obs = provider_->observe(name, vm.ns); obs && obs->endpoint_node_port != 0)
    url = endpoint_url(obs->endpoint_node_port);
  out["url"] = url;
  out["api_key"] = *key;
  out["ca"] = opts_.endpoint_ca_pem;
  out["rotated_at"] = rec->endpoint->rotated_at.value_or("");
  return out;
}

Result<json> TenantService::retry(const std::string& name, const std::string& step) {
  std::lock_guard changes(changes_mu_);
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  if (!step.empty()) {
    std::vector<std::string> ids;
    for (const auto& s : plan_steps(*rec)) ids.push_back(s.value("id", ""));
    if (std::find(ids.begin(), ids.end(), step) == ids.end()) {
      std::string known;
      for (const auto& i : ids) known += (known.empty() ? "" : ", ") + i;
      return Error(Errc::invalid_argument, "tenant " + name + "'s plan has no step '" + step +
                                               "' (steps: " + (known.empty() ? "none" : known) +
                                               ")");
    }
  }
  json cmd = {{"action", "retry"}};
  if (!step.empty()) cmd["step"] = step;
  if (!deps_.agents.send_command(name, cmd))
    return Error(Errc::failed_precondition,
                 "the agent of tenant " + name + " is not connected (phase " + rec->phase +
                     "): it cannot be asked to retry now; try again once it is");
  spdlog::info("tenants: asked the agent of {} to retry its plan{}", name,
               step.empty() ? "" : " from step " + step);
  return json{{"tenant", name}, {"sent", true}, {"command", cmd}};
}

VmSpec TenantService::stored_vm(const store::TenantRecord& t) const {
  bool needs_mig_stored = false;
  VmSpec vm = vm_spec_from_stored(t.spec, t.name, &needs_mig_stored);
  if (vm.ns.empty()) vm.ns = opts_.default_namespace;
  vm.halted = held_off_by_maintenance(t);
  if (!needs_mig_stored)
    if (const catalog::Tier* tier = catalog_.find(vm.tier)) vm.needs_mig = tier_needs_mig(*tier);
  return vm;
}

// ---- restart ----

namespace {

// A card fault recorded on the tenant (status.gpu_faults) since its last
// restart finished, or ever when it was never restarted.
bool card_fault_since_start(const store::TenantRecord& t) {
  const std::string since =
      t.status.restart ? t.status.restart->finished_at.value_or("") : std::string();
  if (!t.status.gpu_faults) return false;
  for (const auto& [key, f] : *t.status.gpu_faults)
    if (f.first_seen.value_or("") > since) return true;
  return false;
}

}  // namespace

RestartRequest TenantService::restart_request(const store::TenantRecord& t,
                                              const VmObservation& obs) const {
  RestartRequest req;
  req.from_instance = obs.instance;
  if (card_fault_since_start(t)) req.avoid_gpus = obs.gpus;
  return req;
}

Result<json> TenantService::restart(const std::string& name, bool dry_run) {
  std::lock_guard changes(changes_mu_);
  if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st.error();
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  if (!has_vm(*rec))
    return Error(
        Errc::failed_precondition,
        "tenant " + name + " has no VM (made by `factory token create`): nothing to restart");
  const std::string kube_now = kube_state(*rec);
  if (rec->phase == "deleting" || kube_now != "created")
    return Error(Errc::failed_precondition,
                 "tenant " + name + " is " +
                     (rec->phase == "deleting"
                          ? "half-deleted: finish with `factory tenant delete " + name + "`"
                          : "not fully created (" + (kube_now.empty() ? "no VM yet" : kube_now) +
                                "): run the same `factory tenant create` "
                                "again first"));
  if (const std::string m = maintenance_state(*rec);
      m == "stopping" || m == "drained" || m == "starting")
    return Error(Errc::failed_precondition, "tenant " + name + " is " + m + " for maintenance of " +
                                                rec->status.maintenance->node.value_or("its host") +
                                                ": `factory host undrain` brings it back");
  VmSpec vm = stored_vm(*rec);
  auto obs = provider_->observe(name, vm.ns);
  if (!obs) return obs.error().with_context("looking at the VM of " + name);
  if (!obs->exists)
    return Error(Errc::failed_precondition, "tenant " + name +
                                                " has no VM where its record says: run the same "
                                                "`factory tenant create` again to make it");
  RestartRequest req = restart_request(*rec, *obs);
  if (dry_run) {
    req.dry_run = true;
    auto o = provider_->restart(vm, req);
    if (!o) return o.error();
    return json{{"tenant", name},
                {"dry_run", true},
                {"would", o->note},
                {"gpus_before", o->gpus_before},
                {"gpus_after", o->gpus_after},
                {"avoid_gpus", req.avoid_gpus}};
  }
  // Journaled first: a coordinator killed from here on finishes it at start.
  // On the store's writer, so an agent's event stored meanwhile loses nothing.
  store::RestartJournal journal;
  journal.state = "restarting";
  journal.requested_at = now_str();
  journal.from_instance = req.from_instance;
  journal.avoid_gpus = req.avoid_gpus;
  journal.gpus_before = obs->gpus;
  auto journaled = deps_.store.update_tenant(name, [&](store::TenantRecord& r) {
    r.status.restart = journal;
    return Status{};
  });
  if (!journaled)
    return journaled.error().with_context("journaling the restart of " + name +
                                          " (nothing was done)");
  return run_restart(std::move(*journaled), vm);
}

Result<json> TenantService::run_restart(store::TenantRecord rec, const VmSpec& vm) {
  const std::string name = rec.name;
  const store::RestartJournal journal = rec.status.restart.value_or(store::RestartJournal{});
  RestartRequest req;
  req.from_instance = journal.from_instance.value_or("");
  req.avoid_gpus = journal.avoid_gpus.value_or(std::vector<std::string>{});
  auto announce = [&](const std::string& state, json extra) {
    if (!deps_.announce) return;
    extra["action"] = "restart";
    extra["state"] = state;
    deps_.announce(name, extra);
  };
  announce("started",
           {{"requested_at", journal.requested_at.value_or("")},
            {"gpus_before", journal.gpus_before ? json(*journal.gpus_before) : json::array()},
            {"avoid_gpus", req.avoid_gpus}});
  spdlog::info("tenants: restarting the VM of {}{}", name,
               req.avoid_gpus.empty() ? "" : " off its faulted card(s)");
  auto o = provider_->restart(vm, req);
  store::RestartJournal ended = journal;
  ended.finished_at = now_str();
  if (o) {
    ended.state = "done";
    ended.note = o->note;
    ended.gpus_after = o->gpus_after;
  } else {
    ended.state = "failed";
    ended.error = o.error().message;
  }
  auto recorded = deps_.store.update_tenant(name, [&](store::TenantRecord& r) {
    r.status.restart = ended;
    return Status{};
  });
  if (!recorded)
    spdlog::warn(
        "tenants: the end of {}'s restart could not be recorded ({}): it is finished "
        "again at the next start, and does nothing twice",
        name, recorded.error().message);
  if (!o) {
    announce("failed", {{"error", o.error().message}});
    spdlog::warn("tenants: restart of {} failed: {}", name, o.error().message);
    return o.error().with_context("restarting tenant " + name);
  }
  announce("done", {{"note", o->note}, {"gpus_after", o->gpus_after}});
  spdlog::info("tenants: restart of {}: {}", name, o->note);
  return json{{"tenant", name},
              {"restarted", o->restarted},
              {"note", o->note},
              {"gpus_before", o->gpus_before},
              {"gpus_after", o->gpus_after},
              {"avoid_gpus", req.avoid_gpus}};
}

void TenantService::resume_actions() {
  std::lock_guard changes(changes_mu_);
  for (const auto& t : deps_.store.list_tenants()) {
    if (!t.status.restart || t.status.restart->state != "restarting") continue;
    VmSpec vm = stored_vm(t);
    spdlog::info("tenants: finishing the restart of {} that a stop cut short", t.name);
    auto r = run_restart(t, vm);
    if (!r) spdlog::error("tenants: {}", r.error().message);
  }
}

json TenantService::restart_offer(const store::TenantRecord& t, const VmObservation& obs) {
  if (!card_fault_since_start(t) || !obs.exists) return nullptr;
  VmSpec vm = stored_vm(t);
  RestartRequest req = restart_request(t, obs);
  req.dry_run = true;
  auto o = provider_->restart(vm, req);
  if (!o) return json{{"command", ""}, {"why_not", o.error().message}};
  return json{{"command", "factory tenant restart " + t.name},
              {"would", o->note},
              {"gpus_after", o->gpus_after}};
}

void TenantService::install_routes(coordinator::ApiRouter& r) {
  // Every tenant route talks to the cluster: on the workers, never an io thread.
  const coordinator::RouteOptions kBlocking{.blocking = true};
  r.add(
      "POST", "/v1/tenants",
      [this](const net::HttpRequestIn& req, auto&) {
        return guarded("POST /v1/tenants", [&] {
          auto body = json::parse(req.body, nullptr, false);
          if (body.is_discarded())
            return net::HttpResponseOut::error(400, "bad_request", "the body is not JSON");
          auto tr = TenantRequest::from_json(body);
          if (!tr) return error_reply(tr.error());
          auto out = create_with_object(*tr);
          if (!out) return error_reply(out.error());
          json j = {{"created", out->created}, {"objects", refs(out->objects)}};
          if (!out->password.empty()) {
            j["password"] = out->password;
            if (auto vm = resolve_vm_spec(catalog_, *tr, opts_.default_namespace))
              j["password_kept_in"] = provider_->user_data_location(*vm);
          }
          if (!out->note.empty()) j["note"] = out->note;
          if (!out->api_key.empty()) j["api_key"] = out->api_key;
          if (!out->tenant_object.empty()) j["tenant_object"] = out->tenant_object;
          if (auto shown = show(tr->name)) j["tenant"] = *shown;
          return coordinator::json_response(j, out->created ? 201 : 200);
        });
      },
      kBlocking);
  // GPU time and endpoint use per tenant (usage_report.hpp): reads the
  // store's archive from the disk, so on a worker; read-only tokens may.
  r.add(
      "GET", "/v1/usage",
      [this](const net::HttpRequestIn& req, auto&) {
        return guarded("GET /v1/usage", [&] {
          auto arg = [&](const char* k) {
            auto it = req.query.find(k);
            return it == req.query.end() ? std::string() : it->second;
          };
          auto q = usage_query(arg("since"), arg("until"), arg("tenant"), arg("project"),
                               unix_seconds(Clock::now()));
          if (!q) return error_reply(q.error());
          auto j = usage_report(*q);
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      coordinator::RouteOptions{.blocking = true, .read_only = true});
  r.add(
      "GET", "/v1/tenants/{name}",
      [this](auto&, const coordinator::PathParams& p) {
        return guarded("GET /v1/tenants/{name}", [&] {
          auto j = show(p.at("name"));
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      kBlocking);
  r.add(
      "DELETE", "/v1/tenants/{name}",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("DELETE /v1/tenants/{name}", [&] {
          auto it = req.query.find("namespace");
          auto j = remove_with_object(p.at("name"), it == req.query.end() ? "" : it->second);
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      kBlocking);
  // Admin only (no read_only): the answer holds the key.
  r.add(
      "GET", "/v1/tenants/{name}/credentials",
      [this](auto&, const coordinator::PathParams& p) {
        return guarded("GET /v1/tenants/{name}/credentials", [&] {
          auto j = credentials(p.at("name"), false);
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      kBlocking);
  r.add(
      "POST", "/v1/tenants/{name}/credentials/rotate",
      [this](auto&, const coordinator::PathParams& p) {
        return guarded("POST /v1/tenants/{name}/credentials/rotate", [&] {
          auto j = credentials(p.at("name"), true);
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      kBlocking);
  r.add(
      "POST", "/v1/tenants/{name}/restart",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("POST /v1/tenants/{name}/restart", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() ||
              (body.contains("dry_run") && !body["dry_run"].is_boolean()))
            return net::HttpResponseOut::error(400, "bad_request",
                                               "want {\"dry_run\": true|false} or {}");
          auto j = restart(p.at("name"), body.value("dry_run", false));
          return j ? coordinator::json_response(*j) : error_reply(j.error());
        });
      },
      kBlocking);
  r.add(
      "POST", "/v1/tenants/{name}/retry",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("POST /v1/tenants/{name}/retry", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() ||
              (body.contains("step") && !body["step"].is_string() && !body["step"].is_null()))
            return net::HttpResponseOut::error(400, "bad_request", "want {\"step\": ID} or {}");
          std::string step = body.contains("step") && body["step"].is_string()
                                 ? body["step"].get<std::string>()
                                 : "";
          auto j = retry(p.at("name"), step);
          return j ? coordinator::json_response(*j, 202) : error_reply(j.error());
        });
      },
      kBlocking);
  r.add(
      "POST", "/v1/tenants/{name}/tier-upgrade",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("POST /v1/tenants/{name}/tier-upgrade", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() || body.size() > 1 ||
              (body.size() == 1 && !(body.contains("dry_run") && body["dry_run"].is_boolean())))
            return net::HttpResponseOut::error(400, "bad_request",
                                               "want {\"dry_run\": true|false} or {}");
          const bool dry = body.value("dry_run", false);
          auto j = tier_upgrade(p.at("name"), dry);
          return j ? coordinator::json_response(*j, dry || !j->value("upgraded", false) ? 200 : 202)
                   : error_reply(j.error());
        });
      },
      kBlocking);
  // Host maintenance (maintenance.hpp).
  r.add(
      "POST", "/v1/hosts/{node}/drain",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("POST /v1/hosts/{node}/drain", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          const char* want =
              "want {\"notice_seconds\": N, \"move\": bool, \"message\": text, \"dry_run\": "
              "bool}, each optional";
          if (body.is_discarded() || !body.is_object())
            return net::HttpResponseOut::error(400, "bad_request", want);
          DrainRequest d;
          d.node = p.at("node");
          for (const auto& [k, v] : body.items()) {
            if (k == "notice_seconds" && v.is_number_integer() && v.get<long long>() >= 0 &&
                v.get<long long>() <= 7 * 24 * 3600)
              d.notice = std::chrono::seconds(v.get<long long>());
            else if (k == "move" && v.is_boolean())
              d.move = v.get<bool>();
            else if (k == "dry_run" && v.is_boolean())
              d.dry_run = v.get<bool>();
            else if (k == "message" && v.is_string())
              d.message = v.get<std::string>();
            else
              return net::HttpResponseOut::error(400, "bad_request",
                                                 std::string(want) + "; not " + k);
          }
          auto m = drain(d);
          return m ? coordinator::json_response(m->to_json(), d.dry_run ? 200 : 202)
                   : error_reply(m.error());
        });
      },
      kBlocking);
  r.add(
      "POST", "/v1/hosts/{node}/undrain",
      [this](const net::HttpRequestIn& req, const coordinator::PathParams& p) {
        return guarded("POST /v1/hosts/{node}/undrain", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() || body.size() > 1 ||
              (body.size() == 1 && !(body.contains("dry_run") && body["dry_run"].is_boolean())))
            return net::HttpResponseOut::error(400, "bad_request",
                                               "want {\"dry_run\": true|false} or {}");
          UndrainRequest u;
          u.node = p.at("node");
          u.dry_run = body.value("dry_run", false);
          auto m = undrain(u);
          return m ? coordinator::json_response(m->to_json(), u.dry_run ? 200 : 202)
                   : error_reply(m.error());
        });
      },
      kBlocking);
  r.add(
      "GET", "/v1/hosts/{node}/maintenance",
      [this](const net::HttpRequestIn&, const coordinator::PathParams& p) {
        return guarded("GET /v1/hosts/{node}/maintenance", [&] {
          auto m = maintenance(p.at("node"));
          return m ? coordinator::json_response(m->to_json()) : error_reply(m.error());
        });
      },
      coordinator::RouteOptions{.blocking = true, .read_only = true});
  // Agent self-update (agent_rollout.hpp). Blocking: the binary is read
  // again from the disk, the journals written to the store.
  r.add(
      "POST", "/v1/agents/upgrade",
      [this](const net::HttpRequestIn& req, auto&) {
        return guarded("POST /v1/agents/upgrade", [&] {
          auto body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
          if (body.is_discarded())
            return net::HttpResponseOut::error(400, "bad_request", "the body is not JSON");
          auto u = UpgradeRequest::from_json(body);
          if (!u) return error_reply(u.error());
          auto m = upgrade_agents(*u);
          return m ? coordinator::json_response(m->to_json(), u->dry_run ? 200 : 202)
                   : error_reply(m.error());
        });
      },
      kBlocking);
  r.add(
      "GET", "/v1/agents/upgrade",
      [this](const net::HttpRequestIn&, auto&) {
        return guarded("GET /v1/agents/upgrade", [&] {
          auto m = agent_rollout();
          return m ? coordinator::json_response(m->to_json()) : error_reply(m.error());
        });
      },
      coordinator::RouteOptions{.blocking = true, .read_only = true});
}

}  // namespace factory::tenants
