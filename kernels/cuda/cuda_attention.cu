// store_kv and causal GQA attention over the paged KV cache.
//
// Cache layout (per layer): K, V [num_blocks, block_size, Hkv, hd] f32. Position p of
// sequence s lives in physical block block_table[s][p / block_size] at offset
// p % block_size, i.e. cache row slot = block * block_size + offset, of Hkv * hd floats.
// The block table arrives from prepare_batch as a padded [num_seqs, max_blocks] matrix;
// seq_of_token[t] says which row token t reads.
//
// store_kv: one block per token copying its K and V rows to row slot_mapping[t].
//
// attention (the simple correct kernel; flash-style tiling with shared-memory K/V tiles
// and split-K over long contexts is the later optimisation): one warp per (token, query
// head), 4 warps per block = 4 consecutive heads of one token (which mostly share a KV head,
// so their K/V reads hit L1). Lane j holds q[j + 32 i] for i < kPerLane = ceil(hd / 32) in
// registers (compile-time indices only), walks positions 0..positions[t] in order, and for
// each: score = warp_sum(q . k) * scale, then the online-softmax update
//   m' = max(m, score);  c = e^(m - m');  w = e^(score - m');  l = l c + w;  acc = acc c + w v
// and finally out = acc / l. All in f32 with expf (not __expf) to track the CPU's exact
// two-pass softmax to ~1e-6 relative.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kStoreThreads = 256;
constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(kStoreThreads, 1)
    store_kv_kernel(const float* __restrict__ k, const float* __restrict__ v,
                    const int32_t* __restrict__ slots, int64_t row_elems,
                    float* __restrict__ k_cache, float* __restrict__ v_cache) {
  const int64_t t = blockIdx.x;
  const int64_t dst = static_cast<int64_t>(slots[t]) * row_elems;
  const int64_t src = t * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    k_cache[dst + i] = k[src + i];
    v_cache[dst + i] = v[src + i];
  }
}

template <int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    paged_attention_kernel(const PagedAttentionArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.y * kWarpsPerBlock + warp;
  if (head >= a.hq) return;  // the whole warp leaves; the kernel has no block barriers
  const int64_t t = blockIdx.x;
  const int hd = a.head_dim;
  const int kv_head = head / (a.hq / a.hkv);

  const float* qh = a.q + (t * a.hq + head) * hd;
  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int idx = lane + 32 * i;
    qv[i] = idx < hd ? qh[idx] : 0.0f;
    acc[i] = 0.0f;
  }

  const int context = a.positions[t] + 1;  // causal: positions 0..positions[t]
  const int32_t* table = a.block_table + static_cast<int64_t>(a.seq_of_token[t]) * a.max_blocks;
  const int64_t row = static_cast<int64_t>(a.hkv) * hd;
  float m = -INFINITY, l = 0.0f;
  for (int p = 0; p < context; ++p) {
    const int64_t slot =
        static_cast<int64_t>(table[p / a.block_size]) * a.block_size + p % a.block_size;
    const float* kp = a.k_cache + slot * row + static_cast<int64_t>(kv_head) * hd;
    const float* vp = a.v_cache + slot * row + static_cast<int64_t>(kv_head) * hd;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int idx = lane + 32 * i;
      if (idx < hd) dot += qv[i] * kp[idx];
    }
    const float score = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float w = expf(score - m_new);
    l = l * correction + w;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int idx = lane + 32 * i;
      const float vv = idx < hd ? vp[idx] : 0.0f;
      acc[i] = acc[i] * correction + w * vv;
    }
    m = m_new;
  }

  float* oh = a.out + (t * a.hq + head) * hd;
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int idx = lane + 32 * i;
    if (idx < hd) oh[idx] = acc[i] * inv_l;
  }
}

template <int kPerLane>
void launch_attention_for(const PagedAttentionArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>((args.hq + kWarpsPerBlock - 1) / kWarpsPerBlock));
  paged_attention_kernel<kPerLane><<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
}

}  // namespace

void launch_store_kv(const float* k, const float* v, const int32_t* slots, int64_t num_tokens,
                     int64_t row_elems, float* k_cache, float* v_cache, cudaStream_t stream) {
  if (num_tokens == 0 || row_elems == 0) return;
  store_kv_kernel<<<static_cast<unsigned>(num_tokens), row_block_threads(row_elems, kStoreThreads),
                    0, stream>>>(k, v, slots, row_elems, k_cache, v_cache);
  CUDA_CHECK_LAUNCH();
}

void launch_paged_attention(const PagedAttentionArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0 || args.hq == 0) return;
  ATTNRES_CHECK(args.head_dim > 0 && args.head_dim <= kMaxAttentionHeadDim,
                "attention head_dim " + std::to_string(args.head_dim));
  ATTNRES_CHECK(args.hkv > 0 && args.hq % args.hkv == 0 && args.block_size > 0,
                "attention: bad head / block configuration");
  switch ((args.head_dim + 31) / 32) {
    case 1:
      launch_attention_for<1>(args, stream);
      break;
    case 2:
      launch_attention_for<2>(args, stream);
      break;
    case 3:
      launch_attention_for<3>(args, stream);
      break;
    case 4:
      launch_attention_for<4>(args, stream);
      break;
    case 5:
      launch_attention_for<5>(args, stream);
      break;
    case 6:
      launch_attention_for<6>(args, stream);
      break;
    case 7:
      launch_attention_for<7>(args, stream);
      break;
    default:
      launch_attention_for<8>(args, stream);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
