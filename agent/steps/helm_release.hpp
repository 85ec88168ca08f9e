#pragma once
// Step kind `helm_release`: a chart installed in the guest cluster at a
// pinned version with the catalog's values (runbook step 6: the NVIDIA GPU
// Operator, guest/02-gpu-operator.sh, and HAMi, guest/03-hami.sh).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   release, chart, repo_name, repo_url, version, namespace   (required)
//   create_namespace: true         (default) --create-namespace
//   wait_timeout:     20m          (default 5m, Helm's) --wait --timeout, at most what is
//                                  left of the step's deadline
//   kubeconfig:       /etc/rancher/rke2/rke2.yaml (default)
//   helm_version:     v3.19.0 (default) the Helm the guest must run
//   helm_sha256:      {amd64: ..., arm64: ...} (default: v3.19.0's published sums) the
//                     release tarball's sha256 for each architecture
//   helm_archive_url: https://get.helm.sh/helm-{version}-linux-{arch}.tar.gz (default)
//   values:           {...}        written as YAML to <state_dir>/helm/<release>.values.yaml (0600)
//   driver_version:   "580.126.20" (optional) the NVIDIA driver the chart's driver container
//                     must run (the GPU Operator's values driver.version): verify waits (up to
//                     10 minutes) for nvidia-smi under /run/nvidia/driver to report it
//
// check:  helm runs at helm_version, `helm status` says deployed at the
//         pinned chart version, and `helm get values -o json` equals
//         `values` (the cluster itself is the record: nothing to drift from).
// apply:  when `helm version` is not helm_version: downloads the tarball,
//         checks its sha256 before unpacking, puts linux-<arch>/helm in
//         /usr/local/bin atomically. Then `helm repo add --force-update` and
//         `helm repo update`; a release left pending-install /
//         pending-upgrade by an interrupted helm is waited for while a helm
//         process runs in the guest and could still be that one (its own
//         --timeout), then uninstalled / rolled back (and left alone if that
//         helm finished the job); then `helm upgrade --install NAME
//         REPO/CHART --version V --namespace NS [--create-namespace]
//         -f VALUES --wait --timeout T`.
// verify: the same as check, with the release's status in the message.
// Diagnoses: helm_release_failed (with the namespace's pods that are not
//   ready), helm_operation_in_progress, download_failed and
//   checksum_mismatch (the Helm tarball).
#include <memory>
#include <string>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_helm_release(const StepSpec& spec);

// Chart versions compare without a leading "v" (NVIDIA tags v26.3.2, HAMi 2.10.0).
bool same_chart_version(const std::string& a, const std::string& b);

}  // namespace factory::agent::steps
