// A kubeconfig file as an admin may hand it over, broken or hostile
// (coordinator/kube/kubeconfig.hpp): any bytes give cluster access or one
// clear error. Certificate and token paths inside it resolve relative to a
// scratch folder that holds nothing but the file itself.
#include "coordinator/kube/kubeconfig.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/scratch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const factory::fuzz::ScratchDir scratch("kubeconfig");
  const auto file = scratch.path() / "config";
  factory::fuzz::write_bytes(file, std::string_view(reinterpret_cast<const char*>(data), size));
  auto access = factory::kube::load_kubeconfig(file);
  if (access) (void)factory::kube::current_token(*access);
  return 0;
}
