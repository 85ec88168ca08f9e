#include "coordinator/kube/pod_log.hpp"

#include "common/net/http_client.hpp"
#include "coordinator/kube/status_error.hpp"
#include "coordinator/kube/url_encode.hpp"

namespace factory::kube {

Result<std::string> pod_log(const ClusterAccess& access, const std::string& ns,
                            const std::string& pod, const LogOptions& opts) {
  std::string path = "/api/v1/namespaces/" + url_encode(ns) + "/pods/" + url_encode(pod) +
                     "/log?limitBytes=" + std::to_string(opts.limit_bytes);
  if (!opts.container.empty()) path += "&container=" + url_encode(opts.container);
  if (opts.previous) path += "&previous=true";
  if (opts.tail_lines > 0) path += "&tailLines=" + std::to_string(opts.tail_lines);
  net::HttpRequest req;
  req.method = "GET";
  req.url = access.server + path;
  req.timeout = opts.timeout;
  req.headers["Accept"] = "text/plain";
  auto token = current_token(access);
  if (!token) return token.error();
  if (!token->empty()) req.headers["Authorization"] = "Bearer " + *token;
  auto resp = net::HttpClient(access.tls).request(req);
  if (!resp)
    return Error(resp.error().code, "cannot read the log of pod " + ns + "/" + pod + " from " +
                                        access.server + ": " + resp.error().message);
  if (resp->status < 200 || resp->status >= 300)
    return status_error(
        resp->status, resp->body,
        {"get", Resource{"", "v1", "Pod", "pods/log", true}, ns, pod, access.server});
  return std::move(resp->body);
}

}  // namespace factory::kube
