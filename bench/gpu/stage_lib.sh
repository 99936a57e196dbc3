# Sourced by stage.sh and stage_cluster.sh (on the build machine).
#
# stage_binary BIN DIR LIBDIR: copies BIN into DIR without its debug info (most of a
# RelWithDebInfo binary; the device tool carries 64 MiB), and every shared library it links
# outside glibc, libstdc++ and the CUDA toolkit into LIBDIR (the GPU machine has its own CUDA and
# C/C++ runtimes, and none of our other dependencies).
stage_binary() {
  local bin="$1" dir="$2" libdir="$3"
  objcopy --strip-debug "$bin" "$dir/$(basename "$bin")"
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' \
    | grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|/cuda' \
    | while read -r lib; do cp -L "$lib" "$libdir/"; done
}
