#include "coordinator/kube/url_encode.hpp"

#include "common/net/url.hpp"

namespace factory::kube {

std::string url_encode(const std::string& s) {
  return net::percent_encode(s);
}

}  // namespace factory::kube
