// CudaBackend::capture_graph and CudaGraph (cuda_backend.h): what a capture must hold on to
// and refuse, so that a replay computes what the captured step computed.
//
// - Memory: the capture runs inside an allocator pool (cuda_allocator.h), which the graph
//   holds: the blocks its replays write are handed to nobody else while it lives.
// - Staging: the captured H2D copies read the pinned staging buffers at replay time. The
//   graph holds those buffers (a regrowth cannot free them under it), replay() refuses once
//   they were regrown or the batch prepared last has another layout, and records the staging
//   events after the launch, so the next prepare_batch / gather_rows waits for the replay's
//   copies before rewriting the buffers.
// - Strictness: cudaStreamCaptureModeThreadLocal, so a call on this thread that cannot be
//   captured fails the capture instead of running once. ThreadLocal rather than Global: in
//   a tensor-parallel group each rank's thread drives its own device, and Global would make
//   one rank's capture fail another rank's legal calls meanwhile.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"

namespace attnres {

struct CudaGraph::Impl {
  CudaBackend::Impl* backend = nullptr;  // its stream and staging state
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::shared_ptr<cuda::CachingAllocator::GraphPool> pool;
  // The staging the captured copies read, and the layout of what was staged.
  std::shared_ptr<void> meta_host, rows_host;
  bool staged_meta = false, staged_rows = false;
  int num_tokens = 0, num_seqs = 0, max_blocks = 0;
  int64_t rows_staged = 0;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    cuda::ScopedDevice on_device(device);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    // Then `pool` goes: its free blocks join the general cache. Whatever is queued from now
    // on runs after the graph's last replay, on the one stream.
  }
};

CudaGraph::CudaGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaGraph::~CudaGraph() = default;

bool CudaGraph::stale() const {
  const Impl& g = *impl_;
  return (g.staged_meta && g.backend->meta_host != g.meta_host) ||
         (g.staged_rows && g.backend->rows_host != g.rows_host);
}

void CudaGraph::replay() {
  Impl& g = *impl_;
  CudaBackend::Impl& im = *g.backend;
  im.use_device();
  if (g.staged_meta) {
    ATTNRES_CHECK(im.meta_host == g.meta_host,
                  "CudaGraph::replay: a larger batch regrew the metadata staging buffer after "
                  "the capture, and the graph's copy would read the retired one: capture again");
    ATTNRES_CHECK(
        im.num_tokens == g.num_tokens && im.num_seqs == g.num_seqs && im.max_blocks == g.max_blocks,
        "CudaGraph::replay: the batch prepared last (" + std::to_string(im.num_tokens) +
            " tokens, " + std::to_string(im.num_seqs) + " sequences, " +
            std::to_string(im.max_blocks) +
            " blocks per table) is not laid out like the captured "
            "one (" +
            std::to_string(g.num_tokens) + ", " + std::to_string(g.num_seqs) + ", " +
            std::to_string(g.max_blocks) +
            "): prepare one of the captured shape, or capture again");
  }
  if (g.staged_rows) {
    ATTNRES_CHECK(im.rows_host == g.rows_host && im.rows_staged == g.rows_staged,
                  "CudaGraph::replay: gather_rows regrew or restaged its row staging buffer with "
                  "another count after the capture: capture again");
  }
  CUDA_CHECK(cudaGraphLaunch(g.exec, im.stream));
  // The replay's copies read the staging buffers when they run: the next host rewrite waits.
  CUDA_CHECK(cudaEventRecord(im.meta_copied, im.stream));
  CUDA_CHECK(cudaEventRecord(im.rows_copied, im.stream));
}

std::unique_ptr<CudaGraph> CudaBackend::capture_graph(const std::function<void()>& record) {
  Impl& im = on_device();
  ATTNRES_CHECK(!im.capturing(), "capture_graph: the backend's stream is already being captured");
  // While capturing, prepare_batch / gather_rows rewrite the staging buffers without waiting
  // (a wait is illegal then): let the eager copies still reading them finish first.
  CUDA_CHECK(cudaEventSynchronize(im.meta_copied));
  CUDA_CHECK(cudaEventSynchronize(im.rows_copied));

  auto g = std::make_unique<CudaGraph::Impl>();
  g->backend = &im;
  g->device = im.device;
  g->pool = im.allocator->begin_capture();
  im.meta_staged_in_capture = im.rows_staged_in_capture = false;
  // Ops after the capture must not trust the prepared batch: its device copy is only in
  // the graph (it happens at replay), so the next eager op prepares again.
  auto finish = [&im] {
    im.allocator->end_capture();
    im.prepared = nullptr;
  };
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamBeginCapture(im.stream, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    try {
      record();
    } catch (...) {
      cudaStreamEndCapture(im.stream, &graph);  // invalidated or not: discard it
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      finish();
      throw;
    }
    err = cudaStreamEndCapture(im.stream, &graph);
  }
  finish();
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    throw Error(std::string("capture_graph: ") + cudaGetErrorName(err) + " (" +
                cudaGetErrorString(err) +
                "): a call that cannot be captured ran during the capture, or the capture was "
                "invalidated");
  }
  g->graph = graph;
  g->meta_host = im.meta_host;
  g->rows_host = im.rows_host;
  g->staged_meta = im.meta_staged_in_capture;
  g->staged_rows = im.rows_staged_in_capture;
  g->num_tokens = im.num_tokens;
  g->num_seqs = im.num_seqs;
  g->max_blocks = im.max_blocks;
  g->rows_staged = im.rows_staged;
  CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));  // on a throw ~Impl cleans up
  return std::make_unique<CudaGraph>(std::move(g));
}

std::unique_ptr<StepGraph> CudaBackend::capture_step_graph(const std::function<void()>& record) {
  return capture_graph(record);
}

}  // namespace attnres
