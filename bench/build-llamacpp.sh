#!/bin/sh
# bench/build-llamacpp.sh -- build the peer we benchmark against: llama.cpp's
# llama-bench, llama-server and llama-cli, from the llama.cpp sources carried
# in the PyPI source distribution of llama-cpp-python.  Nothing of llama.cpp is
# committed; everything lands in .cache/llamacpp/ (scratch).
#
# usage: bench/build-llamacpp.sh [portable|native]   (default: portable)
#   portable: GGML_NATIVE=OFF with AVX2/FMA/F16C and AVX-512 (+VNNI/BF16) on
#   native:   GGML_NATIVE=ON (tuned to this CPU)
# Prints the folder holding the binaries.
set -eu
flavour=${1:-portable}
top=$(cd "$(dirname "$0")/.." && pwd)
cache="$top/.cache/llamacpp"
mkdir -p "$cache"
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake g++ >&2
fi
if [ ! -d "$cache/src" ]; then
    python3 -m pip download --no-deps --no-binary :all: -q -d "$cache/sdist" llama-cpp-python >&2
    tarball=$(ls "$cache"/sdist/llama_cpp_python-*.tar.gz | head -n 1)
    mkdir -p "$cache/unpack"
    tar -xzf "$tarball" -C "$cache/unpack"
    mv "$cache"/unpack/llama_cpp_python-*/vendor/llama.cpp "$cache/src"
    rm -rf "$cache/unpack"
fi
case $flavour in
    portable) flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON" ;;
    native)   flags="-DGGML_NATIVE=ON" ;;
    *) echo "usage: $0 [portable|native]" >&2; exit 2 ;;
esac
build="$cache/build-$flavour"
if [ ! -x "$build/bin/llama-bench" ]; then
    cmake -S "$cache/src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
          -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF $flags >&2
    cmake --build "$build" -j"$(nproc)" --target llama-bench llama-server llama-cli llama-quantize >&2
fi
echo "$build/bin"
