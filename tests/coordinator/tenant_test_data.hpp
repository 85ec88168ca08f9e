#pragma once
// Data and checks shared by objects_test and cloud_init_test: the runbook's
// manifests (tests/fixtures/runbook, copied verbatim from the seed), sample
// public keys and a CA certificate (public halves only; the private keys were
// thrown away), and the real validators those tests run:
//   - Kubernetes objects: tests/fakes/k8s_schema.py, the fake API server's
//     validator (the real KubeVirt and CDI OpenAPI documents, python3-kubernetes'
//     models for core kinds, unknown fields rejected);
//   - user-data: Debian's `cloud-init schema --config-file`.
// A missing validator fails the test with the reason; it never passes quietly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/yaml_json.hpp"
#include "coordinator/tenants/cloud_init.hpp"
#include "coordinator/tenants/vm_spec.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {

inline constexpr const char* kTestCaPem =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBizCCATGgAwIBAgIUepuUaYRzSx8/fGh6HqrZz+RvzqowCgYIKoZIzj0EAwIw\n"
    "GjEYMBYGA1UEAwwPZmFjdG9yeSB0ZXN0IENBMCAXDTI2MTEzMDA5MTQ1OFoYDzIx\n"
    "MjYxMTA2MDkxNDU4WjAaMRgwFgYDVQQDDA9mYWN0b3J5IHRlc3QgQ0EwWTATBgcq\n"
    "hkjOPQIBBggqhkjOPQMBBwNCAARAUX0gA/8DC6itENXlAHv9mmk9MPRn1Sszshk0\n"
    "Rfxun478DmGjXh+CLwDR03o6Ddu5WTfRJEda6lCjG7hAioqfo1MwUTAdBgNVHQ4E\n"
    "FgQUiaYu+WHYshsQUKzvIUXOv7N+zRYwHwYDVR0jBBgwFoAUiaYu+WHYshsQUKzv\n"
    "IUXOv7N+zRYwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAmWo3\n"
    "vN3JTG35nQYAbTy8i9Xd3rYcthdlT4zLWfWsTYcCIFvWd+AhQZCOT7vyxT823w5Y\n"
    "YLlaBzKIm15U5YBCl1CN\n"
    "-----END CERTIFICATE-----\n";

inline constexpr const char* kTestEd25519Key =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO14ft57AwJ1bSSdPAzi0GWnV/zXd92cS5y23pURB4HQ "
    "admin@example";
inline constexpr const char* kTestRsaKey =
    "ssh-rsa "
    "AAAAB3NzaC1yc2EAAAADAQABAAABAQCudwa/2CsIGQo99T60hPkjuP7e95qEp3PAnVCACbzyirc/hMJq1C7/"
    "cE1On/pBcIv0UHpcUaZjOY3A4INScdEfkUY0x8/VctLKlM/O/ccCHdxCpedweA2MMme9t0R67Fx0sJc3RYOi+Q/"
    "E7XPUl1Y/eoQv+Bn9F2jRCsFI1ct77p4g0H2uSBsbNli9qodPIBPHXDZxchTUMZ8R5JuKWJBYgxwRxwpvY6ndu3ZHl"
    "Q8vpjUVM0k2VEkFAk03GE7Xq4f6IoCUHlEFrH1JqhBn31pIxcO+ymS5PEnklMSbXklj5WdlV7OZs9cLkzMK2+"
    "rIZyLXTb2qNgMxM0jQvlE+0FaL ops key";

inline constexpr const char* kRunbookImage =
    "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img";
inline constexpr const char* kL4Resource = "nvidia.com/AD104GL_L4";

// tenant-1 as the runbook's step 4 creates it.
inline tenants::VmSpec runbook_vm_spec(const std::string& name = "tenant-1",
                                       int node_port = 30022) {
  tenants::VmSpec s;
  s.name = name;
  s.image_url = kRunbookImage;
  s.gpu_resource = kL4Resource;
  s.gpus = 1;
  s.ssh_node_port = node_port;
  s.tier = "gpu-vm";
  return s;
}

inline tenants::CloudInitParams sample_cloud_init_params(const std::string& tenant = "tenant-1") {
  tenants::CloudInitParams p;
  p.tenant = tenant;
  p.hostname = tenant;
  p.ssh_authorized_keys = {kTestEd25519Key, kTestRsaKey};
  p.password = "Xq7mR2pLk9vT4wZs8nHc";
  p.coordinator_url = "wss://factory.example:8443";
  p.agent_binary_url = "https://factory.example:8443/v1/agent/binary";
  p.ca_pem = kTestCaPem;
  p.bootstrap_token = "fbt_2k4J9xQ0mZr7Lw3Vt8Yc5Ns1Hd6Gf0Pa";
  p.agent_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
  return p;
}

inline std::filesystem::path runbook_fixture(const std::string& file) {
  return source_dir() / "tests" / "fixtures" / "runbook" / file;
}

inline nlohmann::json load_runbook_fixture(const std::string& file) {
  auto j = load_yaml_file(runbook_fixture(file).string());
  if (!j) {
    ADD_FAILURE() << "cannot load runbook fixture: " << j.error().message;
    return nullptr;
  }
  return *j;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << "cannot write " << p;
}

inline const std::string& debian_python() {
  static const std::string p = "/usr/bin/python3";
  return p;
}

// The fake API server's schema validator; FAILS the test if it is missing.
inline std::string k8s_validator_script() {
  auto script = source_dir() / "tests" / "fakes" / "k8s_schema.py";
  if (std::filesystem::exists(script)) return script.string();
  ADD_FAILURE() << "the Kubernetes schema validator " << script << " is missing";
  return {};
}

// Runs the schema validator on YAML files (one object each).
inline CommandResult validate_k8s_files(const std::vector<std::string>& files) {
  EXPECT_TRUE(std::filesystem::exists(debian_python()))
      << debian_python() << " (Debian's python3 with python3-jsonschema) is missing";
  auto script = k8s_validator_script();
  if (script.empty()) return {};
  std::vector<std::string> argv = {debian_python(), script, "validate"};
  argv.insert(argv.end(), files.begin(), files.end());
  return run(argv);
}

// Runs Debian's `cloud-init schema --config-file FILE`; FAILS if cloud-init is absent.
inline CommandResult cloud_init_schema(const std::filesystem::path& file) {
  std::string ci = which("cloud-init");
  if (ci.empty()) {
    ADD_FAILURE() << "cloud-init is not installed (apt-get install cloud-init): the user-data "
                     "cannot be checked against its schema";
    return {};
  }
  return run({ci, "schema", "--config-file", file.string()});
}

}  // namespace factory::testing
