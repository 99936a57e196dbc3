// The tiled (flash-style) attention kernel for a prompt's rows: Q K^T and P V on tensor cores
// (mma.sync m16n8k16, F16 inputs, F32 accumulators), an online softmax in F32 between them.
// attention.cuh says which rows come here; the per-row kernel in attention.cu takes the rest.
//
// Numerics against the F32 per-row kernel: the query is rounded to F16 once (INT8: after its
// rotation), the probabilities P to F16 before P V (each a relative error of at most 2^-11, or
// 2^-25 absolute below 2^-14), and F32 caches' keys and values to F16 as they are loaded (a
// value beyond F16's range, |x| > 65504, would become an infinity; the keys, values and queries
// of the models we run stay orders of magnitude below it). F16 cache values are used as they are;
// INT8 keys as their codes (exact in F16) with the key's scale applied to the F32 score, INT8
// values as code * scale rounded to F16. The running sum l adds the F32 probabilities, before
// their rounding. cuda_backend_test derives the tolerance this gives (CudaPromptAttentionTest).
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cuda/attention.cuh"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kv_device.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kTiledWarps = 4;
constexpr int kTiledThreads = 32 * kTiledWarps;
constexpr int kKeys = 64;  // keys per KV tile
// Halves of padding after each shared-memory row: the 8 rows an ldmatrix reads then start 16
// bytes apart modulo 128, so its 8 x 16 bytes fall in 32 different banks.
constexpr int kRowPad = 8;
static_assert(kTiledAttentionRows == 16 * kTiledWarps, "each warp owns 16 rows of the tile");

// Shared memory: Q [64][head_dim + 8], K and V [kKeys][head_dim + 8] (F16), the tile's INT8 key
// scales [kKeys] (F32). INT8 reuses the K and V tiles as F32 rows [64][head_dim] to rotate the
// queries in and the outputs out.
size_t TiledSmemBytes(int head_dim) {
  return sizeof(__half) * static_cast<size_t>(kTiledAttentionRows + 2 * kKeys) *
             (head_dim + kRowPad) +
         sizeof(float) * kKeys;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix and mma.sync m16n8k16 need compute capability 8.0; TiledAttentionSupports() keeps
// older devices off the kernel, whose code for them (if ever built) only traps.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PD_TILED_ATTENTION_UNSUPPORTED 1
#endif

// Four 8x8 F16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16 bytes); register j receives matrix j, lane l holding its row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 (with .trans: row and column swapped), the lower column in the
// low half (PTX ISA, ldmatrix).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __half* p) {
#ifdef PD_TILED_ATTENTION_UNSUPPORTED
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
#endif
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __half* p) {
#ifdef PD_TILED_ATTENTION_UNSUPPORTED
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
#endif
}

// d += A B for A 16x16 (row-major fragment a), B 16x8 (column fragment b0, b1), F32 d. With
// g = lane / 4 and c = lane % 4 (PTX ISA, mma.m16n8k16): a[0] holds A[g][2c, 2c+1], a[1]
// A[g+8][2c, 2c+1], a[2] A[g][2c+8, 2c+9], a[3] A[g+8][2c+8, 2c+9]; b0 B[2c, 2c+1][g], b1
// B[2c+8, 2c+9][g]; d[0], d[1] D[g][2c, 2c+1] and d[2], d[3] D[g+8][2c, 2c+1].
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifdef PD_TILED_ATTENTION_UNSUPPORTED
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to F16 (nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// Values d0 .. d0 + 7 of the cache row at `row` as 8 F16 in a uint4: F16 as stored, F32
// rounded, INT8 codes times `scale` rounded (scale 1: the codes, exact).
template <KvType T>
__device__ __forceinline__ uint4 LoadHalf8(const uint8_t* row, int d0, float scale) {
  uint4 r;
  if constexpr (T == KvType::kF16) {
    r = *reinterpret_cast<const uint4*>(row + 2 * d0);
  } else if constexpr (T == KvType::kF32) {
    const float4 x0 = *reinterpret_cast<const float4*>(row + 4 * d0);
    const float4 x1 = *reinterpret_cast<const float4*>(row + 4 * d0 + 16);
    r.x = PackHalf2(x0.x, x0.y);
    r.y = PackHalf2(x0.z, x0.w);
    r.z = PackHalf2(x1.x, x1.y);
    r.w = PackHalf2(x1.z, x1.w);
  } else {
    // 4-byte aligned: an INT8 block is bs * n_kv_heads * (head_dim + 4) bytes, head_dim % 16 == 0.
    const uint32_t w[2] = {*reinterpret_cast<const uint32_t*>(row + d0),
                           *reinterpret_cast<const uint32_t*>(row + d0 + 4)};
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t word = w[i / 2] >> (16 * (i % 2));
      const float c0 = static_cast<float>(static_cast<int8_t>(word & 0xff));
      const float c1 = static_cast<float>(static_cast<int8_t>((word >> 8) & 0xff));
      h[i] = PackHalf2(c0 * scale, c1 * scale);
    }
    r = make_uint4(h[0], h[1], h[2], h[3]);
  }
  return r;
}

// One block per (tile, KV head, chunk of the KV head's query heads); 4 warps.
//
// A tile is up to TiledAttentionTokens(group) batch rows t0 .. t0 + n_tok - 1 of one sequence at
// positions p0 .. p0 + n_tok - 1. Its 64 query rows are (token i, head j) pairs, row
// r = i * heads + j with heads = min(group, 64) query heads of the KV head (h0 + j), so that
// every K and V row the block reads serves all of them (GQA folded into M); rows past the tile's
// tokens or heads are padding: a zero query given the last token's position, never written.
// Warp w owns rows 16 w .. 16 w + 15.
//
// The block walks the keys its rows see, [lo(p0), p0 + n_tok - 1] (lo: the window's first
// position), kKeys at a time: each tile's K and V rows are looked up through the block table
// and stored in shared memory as F16 (keys past the range as zeros), then every warp computes
// its 16 x kKeys scores S = Q K^T (mma, A = Q from shared memory by ldmatrix, B = K rows by
// ldmatrix), scales them (INT8: times the key's scale first), applies the softcap and masks
// per (row position, key position) to -inf; keeps per row a running max m, rescales its
// accumulators by exp(m_old - m_new), and adds P = exp(S - m) rounded to F16 times V (the S
// accumulators of two adjacent 8-key tiles are exactly the A fragment of a 16-key step; V by
// ldmatrix.trans). m is the same in the four lanes that share a row (a max over the quad), so l
// stays a per-lane partial sum until the end. A row that has seen no visible key yet has
// m = -inf and takes 0 as its reference, which keeps its exponentials at exp(-inf) = 0.
//
// Per tile of keys and block: 4 * 64 * kKeys * head_dim flops on tensor cores, 64 * kKeys expf,
// 2 * kKeys * head_dim cache values read (INT8: plus 2 * kKeys scales) through L2, where the
// other tiles of the sequence read them too. INT8 queries are rotated into the stored basis
// before rounding (kv_rotation.h) and the outputs rotated out, in shared memory over the K and V
// tiles.
template <int kMaxD, KvType T>
__global__ void __launch_bounds__(kTiledThreads) TiledAttentionKernel(AttentionArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int hd = a.head_dim;
  const int ld = hd + kRowPad;
  __half* qs = reinterpret_cast<__half*>(smem_raw);           // [64][ld]
  __half* ks = qs + kTiledAttentionRows * ld;                 // [kKeys][ld]
  __half* vs = ks + kKeys * ld;                               // [kKeys][ld]
  float* kscale = reinterpret_cast<float*>(vs + kKeys * ld);  // [kKeys], INT8
  float* fbuf = reinterpret_cast<float*>(ks);                 // INT8: [64][hd] F32, over K and V

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int group = a.n_heads / a.n_kv_heads;
  const int heads = min(group, kTiledAttentionRows);
  const int n_chunks = (group + heads - 1) / heads;
  const int kvh = blockIdx.y / n_chunks;
  const int h0 = kvh * group + static_cast<int>(blockIdx.y % n_chunks) * heads;
  const int h_end = (kvh + 1) * group;
  const int t0 = a.tiles[2 * blockIdx.x], n_tok = a.tiles[2 * blockIdx.x + 1];
  const int p0 = a.batch.pos[t0];
  const int32_t* table = a.batch.tables + a.batch.table_offsets[a.batch.seq[t0]];
  const int bs = a.batch.block_size;
  const int lo_tile = a.window > 0 ? max(0, p0 - a.window + 1) : 0;
  const int hi_tile = p0 + n_tok - 1;
  // Row r's query (token i, head j), or nullptr for padding.
  auto q_row = [&](int r) -> const float* {
    const int i = r / heads, j = r % heads;
    if (i >= n_tok || h0 + j >= h_end) return nullptr;
    return a.q + (static_cast<int64_t>(t0 + i) * a.n_heads + h0 + j) * hd;
  };

  // The queries, as F16 (INT8: rotated into the stored basis in F32 first).
  if constexpr (T == KvType::kI8) {
    for (int e = tid; e < kTiledAttentionRows * hd; e += kTiledThreads) {
      const float* q = q_row(e / hd);
      fbuf[e] = q != nullptr ? q[e % hd] : 0.f;
    }
    __syncthreads();
    BlockRotateKvRows(fbuf, kTiledAttentionRows, hd, hd, 1.f);
    for (int e = tid; e < kTiledAttentionRows * hd; e += kTiledThreads) {
      qs[(e / hd) * ld + e % hd] = __float2half_rn(fbuf[e]);
    }
    __syncthreads();  // fbuf is the K and V tiles, which the first load overwrites
  } else {
    for (int e = tid; e < kTiledAttentionRows * hd; e += kTiledThreads) {
      const float* q = q_row(e / hd);
      qs[(e / hd) * ld + e % hd] = __float2half_rn(q != nullptr ? q[e % hd] : 0.f);
    }
  }

  // This lane's two rows: g and g + 8 of the warp's 16 (fragment rows, see Mma16816).
  const int g = lane / 4, c = lane % 4;
  int qpos[2], qlo[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int r = warp * 16 + g + 8 * k;
    qpos[k] = p0 + min(r / heads, n_tok - 1);
    qlo[k] = a.window > 0 ? max(0, qpos[k] - a.window + 1) : 0;
  }
  constexpr int kDTiles = kMaxD / 8;  // 8-column tiles of the output
  const int d_tiles = hd / 8;
  float o[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const uint8_t* kdata = static_cast<const uint8_t*>(a.k.data);
  const uint8_t* vdata = static_cast<const uint8_t*>(a.v.data);
  const int row_chunks = hd / 8;  // 8 values per load
  for (int kv0 = lo_tile; kv0 <= hi_tile; kv0 += kKeys) {
    // K and V rows kv0 .. kv0 + kKeys - 1 into shared memory; K and V share the layout, so one
    // offset addresses both rows.
    for (int e = tid; e < kKeys * row_chunks; e += kTiledThreads) {
      const int key = e / row_chunks, d0 = (e % row_chunks) * 8;
      const int p = kv0 + key;
      uint4 kh = make_uint4(0, 0, 0, 0), vh = make_uint4(0, 0, 0, 0);
      float k_scale = 0.f;
      if (p <= hi_tile) {
        const int block = table[p / bs], off = p % bs;
        const size_t row = KvValueOffset<T>(a.k, block, off, kvh);
        float v_scale = 1.f;
        if constexpr (T == KvType::kI8) {
          k_scale = LoadKvScale(a.k, block, off, kvh);
          v_scale = LoadKvScale(a.v, block, off, kvh);
        }
        kh = LoadHalf8<T>(kdata + row, d0, 1.f);
        vh = LoadHalf8<T>(vdata + row, d0, v_scale);
      }
      *reinterpret_cast<uint4*>(ks + key * ld + d0) = kh;
      *reinterpret_cast<uint4*>(vs + key * ld + d0) = vh;
      if (T == KvType::kI8 && d0 == 0) kscale[key] = k_scale;
    }
    __syncthreads();

    // S = Q K^T for the warp's 16 rows: s[nt] is keys 8 nt .. 8 nt + 7.
    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kMaxD / 16; ++kk) {
      if (kk < hd / 16) {
        uint32_t qa[4];  // rows 16 warp + (0..15), columns 16 kk + (0..15)
        LdMatrixX4(qa, qs + (warp * 16 + lane % 16) * ld + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; nt += 2) {
          // Matrices: keys 8 nt + (0..7) at columns +0 and +8, then keys 8 nt + 8 + (0..7).
          uint32_t kb[4];
          LdMatrixX4(
              kb, ks + (nt * 8 + (lane / 16) * 8 + lane % 8) * ld + kk * 16 + ((lane / 8) % 2) * 8);
          Mma16816(s[nt], qa, kb[0], kb[1]);
          Mma16816(s[nt + 1], qa, kb[2], kb[3]);
        }
      }
    }

    // Scores, mask, and the online softmax's new max per row (k = 0: row g, 1: row g + 8).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = nt * 8 + 2 * c + i % 2, k = i / 2;
        const int p = kv0 + key;
        float x = s[nt][i];
        if constexpr (T == KvType::kI8) x *= kscale[key];
        x = a.softcap > 0.f ? a.softcap * tanhf(x * a.scale / a.softcap) : x * a.scale;
        if (p < qlo[k] || p > qpos[k]) x = -INFINITY;
        s[nt][i] = x;
        mx[k] = fmaxf(mx[k], x);
      }
    }
    float ref[2], corr[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(kFullMask, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(kFullMask, mx[k], 2));
      const float m_new = fmaxf(m[k], mx[k]);
      ref[k] = m_new == -INFINITY ? 0.f : m_new;
      corr[k] = expf(m[k] - ref[k]);  // 0 while m = -inf, else in (0, 1]
      m[k] = m_new;
      l[k] *= corr[k];
    }
    // P = exp(S - ref) as the A fragments of P V: pa[kk] covers keys 16 kk .. 16 kk + 15.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      const float e0 = expf(s[nt][0] - ref[0]), e1 = expf(s[nt][1] - ref[0]);
      const float e2 = expf(s[nt][2] - ref[1]), e3 = expf(s[nt][3] - ref[1]);
      l[0] += e0 + e1;
      l[1] += e2 + e3;
      pa[nt / 2][2 * (nt % 2)] = PackHalf2(e0, e1);
      pa[nt / 2][2 * (nt % 2) + 1] = PackHalf2(e2, e3);
    }
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }
    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; dt += 2) {
        if (dt < d_tiles) {
          // Matrices (transposed): keys 16 kk + (0..7) and + (8..15) at columns 8 dt, then the
          // same keys at columns 8 dt + 8.
          uint32_t vb[4];
          LdMatrixX4Trans(
              vb, vs + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ld + dt * 8 + (lane / 16) * 8);
          Mma16816(o[dt], pa[kk], vb[0], vb[1]);
          Mma16816(o[dt + 1], pa[kk], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // before the next tile's loads overwrite K, V and the scales
  }

  // O / l. Every real row saw its own position, so l >= 1; padding rows are never written.
  float inv[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(kFullMask, l[k], 1);
    l[k] += __shfl_xor_sync(kFullMask, l[k], 2);
    inv[k] = 1.f / l[k];
  }
  if constexpr (T == KvType::kI8) {
    // Out of the stored basis: through fbuf (the loop ended with a barrier).
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float* row = fbuf + (warp * 16 + g + 8 * k) * hd;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        if (dt < d_tiles) {
          row[dt * 8 + 2 * c] = o[dt][2 * k] * inv[k];
          row[dt * 8 + 2 * c + 1] = o[dt][2 * k + 1] * inv[k];
        }
      }
    }
    __syncthreads();
    BlockRotateKvRows(fbuf, kTiledAttentionRows, hd, hd, 1.f);
    for (int e = tid; e < kTiledAttentionRows * hd; e += kTiledThreads) {
      const float* q = q_row(e / hd);  // only to tell real rows; out may alias q
      if (q != nullptr) a.out[(q - a.q) + e % hd] = fbuf[e];
    }
  } else {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float* q = q_row(warp * 16 + g + 8 * k);
      if (q == nullptr) continue;
      float* out = a.out + (q - a.q);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        if (dt < d_tiles) {
          out[dt * 8 + 2 * c] = o[dt][2 * k] * inv[k];
          out[dt * 8 + 2 * c + 1] = o[dt][2 * k + 1] * inv[k];
        }
      }
    }
  }
}

template <int kMaxD, KvType T>
cudaError_t LaunchTiled(const AttentionArgs& a, cudaStream_t stream) {
  const int group = a.n_heads / a.n_kv_heads;
  const int heads = group < kTiledAttentionRows ? group : kTiledAttentionRows;
  const dim3 grid(static_cast<unsigned>(a.n_tiles),
                  static_cast<unsigned>(a.n_kv_heads * ((group + heads - 1) / heads)));
  const size_t smem = TiledSmemBytes(a.head_dim);
  // Past the default 48 KiB a kernel must ask for its dynamic shared memory (per device: set on
  // every launch, a cheap attribute write).
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(TiledAttentionKernel<kMaxD, T>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  TiledAttentionKernel<kMaxD, T><<<grid, kTiledThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int kMaxD>
cudaError_t LaunchTiledD(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.k.type) {
    case KvType::kF32:
      return LaunchTiled<kMaxD, KvType::kF32>(a, stream);
    case KvType::kF16:
      return LaunchTiled<kMaxD, KvType::kF16>(a, stream);
    case KvType::kI8:
      return LaunchTiled<kMaxD, KvType::kI8>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchTiledAttention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return cudaSuccess;
  if (a.tiles == nullptr || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 ||
      a.head_dim <= 0 || a.head_dim % 16 != 0 || a.head_dim > kMaxTiledAttentionHeadDim ||
      a.k.type != a.v.type) {
    return cudaErrorInvalidValue;
  }
  // The head dims between two buckets run in the larger one's kernel with the unused column
  // tiles skipped (16 .. 48 in the 64 one, 80 .. 112 in the 128 one): 9 kernels instead of 48.
  if (a.head_dim <= 64) return LaunchTiledD<64>(a, stream);
  if (a.head_dim <= 128) return LaunchTiledD<128>(a, stream);
  return LaunchTiledD<256>(a, stream);
}

}  // namespace pd::engine::cuda
