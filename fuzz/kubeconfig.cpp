// A kubeconfig file as an admin may hand it over, broken or hostile
// (coordinator/kube/kubeconfig.hpp): any bytes give cluster access or one
// clear error. Certificate and token paths inside it resolve relative to a
// scratch folder that holds nothing but the file itself.
#include "coordinator/kube/kubeconfig.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A scratch folder per process, removed when it exits.
  static const struct Scratch {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("factory-fuzz-kubeconfig-" + std::to_string(::getpid()));
    Scratch() { std::filesystem::create_directories(dir); }
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } scratch;
  const auto file = scratch.dir / "config";
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto access = factory::kube::load_kubeconfig(file);
  if (access) (void)factory::kube::current_token(*access);
  return 0;
}
