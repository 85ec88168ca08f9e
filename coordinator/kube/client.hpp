#pragma once
// A Kubernetes REST client for the handful of verbs Factory needs, over the
// project's HTTPS client. Objects are plain JSON (nlohmann::json), exactly
// what the API server sends and receives: no generated types to keep in step
// with KubeVirt's API.
//
// Every failure is one line: the API server's Status turned into an Error
// (see status_error.hpp), or "cannot reach the Kubernetes API at ...".
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "coordinator/kube/kubeconfig.hpp"
#include "coordinator/kube/resources.hpp"

namespace factory::kube {

using nlohmann::json;

// The field manager Factory's writes are recorded under (managedFields).
inline constexpr const char* kFieldManager = "factory";

struct ListOptions {
  std::string label_selector;  // "app.kubernetes.io/managed-by=factory"
  std::string field_selector;  // "metadata.name=utho"
};

struct WriteOptions {
  bool dry_run = false;  // the server validates and answers, but stores nothing
};

struct ApplyOptions {
  // Take over fields another manager owns instead of failing with a
  // conflict: Factory's objects are Factory's, and a re-run must converge.
  bool force = true;
  bool dry_run = false;
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED
  json object;
};

// One line of a watch stream ({"type": ..., "object": {...}}), checked for
// that shape: Errc::protocol when it is not (the line is the API server's,
// and a broken proxy in front of it can send anything).
Result<WatchEvent> parse_watch_line(std::string_view line);

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  // Start after this version. Empty: list first, and report what exists as
  // ADDED events (what `kubectl get -w` shows), then follow changes.
  std::string resource_version;
  // How long to follow; watch() returns a timeout error when it passes.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Pause before reconnecting after a dropped stream (grows, capped at 5 s).
  std::chrono::milliseconds retry_delay{std::chrono::milliseconds(200)};
  // The longest one watch request may run before the server ends it and we
  // reconnect from the last version seen (kubectl uses minutes).
  std::chrono::seconds max_request{std::chrono::minutes(5)};
  // Asked at every line of the stream (bookmarks included) and before each
  // reconnection: true ends the watch (ok). How an owner stops a watch from
  // another thread without waiting for the next change.
  std::function<bool()> cancelled;
};

class KubeClient {
 public:
  explicit KubeClient(ClusterAccess access,
                      std::chrono::milliseconds request_timeout = std::chrono::seconds(30));

  const ClusterAccess& access() const { return access_; }

  // GET /version: a cheap "can we reach and authenticate to it" check.
  Result<json> version();

  Result<json> get(const Kind& kind, const std::string& ns, const std::string& name);
  // ns empty: all namespaces (or a cluster-scoped kind). Returns the List.
  Result<json> list(const Kind& kind, const std::string& ns, const ListOptions& opts = {});
  // The object says its kind and namespace (metadata.namespace, else the
  // access's default namespace for namespaced kinds).
  Result<json> create(const json& obj, const WriteOptions& opts = {});
  // PUT: replaces the object; metadata.resourceVersion makes it conditional
  // (conflict when the object changed since it was read).
  Result<json> update(const json& obj, const WriteOptions& opts = {});
  // PUT .../status: replaces the status of an object whose kind has the
  // status subresource (the rest of `obj` is ignored by the server), with
  // metadata.resourceVersion making it conditional as with update. Status
  // writes never bump metadata.generation.
  Result<json> update_status(const json& obj, const WriteOptions& opts = {});
  // Server-side apply (PATCH application/apply-patch+yaml, fieldManager
  // "factory"): creates the object or merges our fields into it.
  Result<json> apply(const json& obj, const ApplyOptions& opts = {});
  // JSON merge patch (RFC 7386). A metadata.resourceVersion inside the patch
  // makes it conditional, as with update.
  Result<json> merge_patch(const Kind& kind, const std::string& ns, const std::string& name,
                           const json& patch, const WriteOptions& opts = {});
  // Deletes with propagationPolicy Background: the object goes now and the
  // garbage collector removes what it owns (a VM's VMI and DataVolumes).
  // not_found when it was already gone.
  Status remove(const Kind& kind, const std::string& ns, const std::string& name);

  // Follows changes to a collection. on_event returns false to stop (then
  // watch returns ok). A dropped stream is resumed from the last
  // resourceVersion seen (bookmarks included); when that version has been
  // compacted away (410 Gone) the collection is listed again and the
  // differences are reported as ADDED / MODIFIED / DELETED, so the caller
  // sees one consistent sequence of changes.
  Status watch(const Kind& kind, const std::string& ns, const WatchOptions& opts,
               const std::function<bool(const WatchEvent&)>& on_event);

 private:
  struct Call;
  Result<json> call(const Call& c);
  std::string namespace_of(const Resource& r, const json& obj) const;

  ClusterAccess access_;
  std::chrono::milliseconds timeout_;
};

// ok() for a not_found error: for deletes and "create if missing" paths.
inline Status ignore_not_found(Status s) {
  if (!s.ok() && s.error().code == Errc::not_found) return {};
  return s;
}

// Connects as the CLI flags and the environment say (resolve_access).
Result<KubeClient> connect(const AccessOptions& opts);

}  // namespace factory::kube
