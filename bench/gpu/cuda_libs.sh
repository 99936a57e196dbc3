# Sourced by run_staged.sh and run_cluster.sh on the GPU machine: sets CUDA_LIBS to
# ":dir[:dir...]", the folders holding that machine's cuBLAS 13 and CUDA runtime (the toolkit's,
# else the pip wheels PyTorch ships), or exits 2 when there is none.
CUDA_LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia,os;print(" ".join(os.path.join(p,"cu13","lib") for p in nvidia.__path__))' 2>/dev/null); do
  [[ -e "$d/libcublas.so.13" ]] && CUDA_LIBS="$CUDA_LIBS:$d"
done
[[ -n "$CUDA_LIBS" ]] || { echo "no libcublas.so.13 on this machine"; exit 2; }
echo "CUDA libraries from:${CUDA_LIBS//:/ }"
