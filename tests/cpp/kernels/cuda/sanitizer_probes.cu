// Probes of what compute-sanitizer's racecheck sees, run under it by the GPU lease's
// racecheck_probe step (kernels/cuda/gpu_lease_steps.sh). Not a test: two of the kernels race
// on purpose. `attnres_cuda_sanitizer_probes KERNEL` launches one kernel and exits 0:
//   block_race    a shared-memory read-after-write between two warps of one block with no
//                 barrier between: racecheck must report it (the control: the tool works);
//   cluster_race  a cluster of 2 blocks, block 0 reading block 1's shared memory through
//                 distributed shared memory (cluster.map_shared_rank, ld.shared::cluster) while
//                 block 1 writes it, no cluster barrier between: reported only if racecheck
//                 tracks distributed shared memory across the blocks of a cluster;
//   cluster_sync  the same with cluster.sync() (barrier.cluster) between the write and the
//                 read: a correct exchange, as cuda_gemv_rope.cu and cuda_sampling.cu do it,
//                 that racecheck must not report.
// Each kernel writes what it read to global memory, so the accesses are not optimized away.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace cg = cooperative_groups;

namespace {

__global__ void block_race_kernel(int* out) {
  __shared__ int cell[32];
  if (threadIdx.x == 0) cell[0] = 42;       // warp 0 writes
  if (threadIdx.x == 32) out[0] = cell[0];  // warp 1 reads, no __syncthreads between
}

__global__ void __cluster_dims__(2, 1, 1) cluster_race_kernel(int* out) {
  __shared__ int cell[32];
  const cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x < 32) cell[threadIdx.x] = 0;
  cluster.sync();  // both blocks running, their cells zero
  if (cluster.block_rank() == 1 && threadIdx.x == 0) cell[0] = 42;
  if (cluster.block_rank() == 0 && threadIdx.x == 0) out[0] = cluster.map_shared_rank(cell, 1)[0];
  cluster.sync();  // no block exits while the other may still read its shared memory
}

__global__ void __cluster_dims__(2, 1, 1) cluster_sync_kernel(int* out) {
  __shared__ int cell[32];
  const cg::cluster_group cluster = cg::this_cluster();
  if (cluster.block_rank() == 1 && threadIdx.x == 0) cell[0] = 42;
  cluster.sync();  // the write released, then acquired by the reader
  if (cluster.block_rank() == 0 && threadIdx.x == 0) out[0] = cluster.map_shared_rank(cell, 1)[0];
  cluster.sync();
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s block_race | cluster_race | cluster_sync\n", argv[0]);
    return 2;
  }
  int* out = nullptr;
  if (!ok(cudaMalloc(&out, sizeof(int)), "cudaMalloc") ||
      !ok(cudaMemset(out, 0, sizeof(int)), "cudaMemset"))
    return 1;
  if (std::strcmp(argv[1], "block_race") == 0) {
    block_race_kernel<<<1, 64>>>(out);
  } else if (std::strcmp(argv[1], "cluster_race") == 0) {
    cluster_race_kernel<<<2, 64>>>(out);
  } else if (std::strcmp(argv[1], "cluster_sync") == 0) {
    cluster_sync_kernel<<<2, 64>>>(out);
  } else {
    std::fprintf(stderr, "unknown kernel %s\n", argv[1]);
    return 2;
  }
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "kernel")) return 1;
  int value = 0;
  if (!ok(cudaMemcpy(&value, out, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
  std::printf("%s read %d\n", argv[1], value);
  return ok(cudaFree(out), "cudaFree") ? 0 : 1;
}
