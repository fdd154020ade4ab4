// The CPU backend's own time loop (cpu/rnn_cpu.cpp): what it splits across threads; and its
// weight-gradient GEMM.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cudnn_rnn {
namespace cpu {

// The units of a direction split into blocks, one per task of the time loop: each task runs the
// recurrent GEMM of its block's gate columns and then the cell update of those units for every
// row, so one step costs one fork-join. Blocks start at multiples of 16 units (a panel of the
// packed GEMM, packed_gemm.h) and get at least 2^15 multiply-adds of the step GEMM each (below
// that a fork-join costs more than it saves: in-process A/B, the B=1, H=128 LSTM of the latency
// benchmark ran 5-7 % faster in two blocks of 2^15, the GRU's single block of 3 * 2^14 was
// already as fast as two; the Keras-typical B=32, H=64 LSTM splits in two on two threads).
// At most the user's thread count (at::get_num_threads()) of blocks.
struct UnitBlocks {
  int64_t n;
  std::vector<int64_t> start;  // n + 1 bounds

  UnitBlocks(int64_t batch, int64_t units, int64_t gates);
  // One block of every unit (the row split's).
  explicit UnitBlocks(int64_t units) : n(1), start{0, units} {}
  int64_t width(int64_t k) const { return start[k + 1] - start[k]; }
};

// The rows of a step that are real (not masked), in increasing order. Only they enter the
// recurrent GEMMs: with padded batches (Keras masks) the GEMMs shrink with the active batch.
struct ActiveRows {
  std::vector<int64_t> rows;
  int64_t n = 0;

  explicit ActiveRows(int64_t batch) : rows(batch) {}
  void collect(const bool* mask, int64_t batch, int64_t time, int64_t t) { collect(mask, 0, batch, time, t); }
  // The active rows among [b0, b1).
  void collect(const bool* mask, int64_t b0, int64_t b1, int64_t time, int64_t t) {
    n = 0;
    for (int64_t b = b0; b < b1; ++b) {
      if (mask == nullptr || mask[b * time + t]) rows[n++] = b;
    }
  }
  // The row list a kernel that picks rows reads: null when every row of the batch is active.
  const int64_t* list(int64_t batch) const { return n < batch ? rows.data() : nullptr; }
  // dst[i] = src row rows[i] (width values each), i < n.
  template <typename E>
  void gather(const E* src, int64_t ld, int64_t width, E* dst) const {
    for (int64_t i = 0; i < n; ++i) std::copy(src + rows[i] * ld, src + rows[i] * ld + width, dst + i * width);
  }
  // The rows of one row group of the row split (n > 0) as one matrix: in place in `src` (rows ld
  // apart) where they follow one another, else gathered into `scratch`'s rows from the group's
  // first row on (width apart). Those scratch rows lie inside the group (the rows are increasing
  // and distinct), so threads may take their groups at once.
  template <typename E>
  struct Block {
    const E* data;
    int64_t ld;
    bool in_place;
  };
  template <typename E>
  Block<E> group_block(const E* src, int64_t ld, int64_t width, E* scratch) const {
    if (rows[n - 1] - rows[0] == n - 1) return {src + rows[0] * ld, ld, true};
    E* dst = scratch + rows[0] * width;
    gather(src, ld, width, dst);
    return {dst, width, false};
  }
};

// How a direction's time loop splits across threads:
//   units  each step's unit blocks across the threads (UnitBlocks), one fork-join a step: the
//          recurrent kernel is read once a step between the threads
//   rows   the batch rows in groups, one per thread, each group running every step on its own
//          (no barrier between steps): every thread reads the whole recurrent kernel
// CUDNN_RNN_CPU_SPLIT=units|rows|auto (read once) forces one; auto is choose_split's.
enum class Split { Units, Rows };
// The split of a direction with `batch` rows and `units` units of `gates` gates on `threads`
// threads, where the plan can run rows apart (plan_rows); Units where it cannot.
Split choose_split(int64_t batch, int64_t units, int64_t gates, int64_t threads, bool plan_rows);
// The rows a thread needs for the row split once the recurrent kernel outgrows L2: 4, or 12 on
// cores whose AVX-512 multiply-adds outrun streaming the kernel from L3 (full_width_avx512).
int64_t rows_to_cover_kernel();
const char* split_name(Split s);
// Tests only: "units", "rows", or "" for the choice again.
void override_split(const std::string& name);

// Runs each step's unit blocks (body(k0, k1): blocks [k0, k1)) across threads, one fork-join a
// step, unless the threads fall out of step. When one task ends far behind the others twice
// running (its core shared with another busy process: then every step waits for that thread's
// next time slice, and a fastrnns GRU forward ran 5-7x slower than on an idle machine), the
// calling thread runs the blocks of the next `stretch` steps alone (BLAS held to one thread),
// then tries the threads again, doubling the stretch while they keep lagging. Unloaded, the
// tasks end together and the steps run as before.
class StepScheduler {
 public:
  explicit StepScheduler(int64_t blocks) : n_(blocks), end_(blocks) {}

  template <typename Body>
  void run(const Body& body) {
    if (n_ == 1) {
      at::parallel_for(0, 1, 1, body);
      return;
    }
    if (serial_left_ > 0 || forced_serial().load(std::memory_order_relaxed)) {
      if (serial_left_ > 0) --serial_left_;
      const int previous = set_blas_threads(1);
      body(int64_t(0), n_);
      set_blas_threads(previous);
      return;
    }
    const auto start = Clock::now();
    at::parallel_for(0, n_, 1, [&](int64_t k0, int64_t k1) {
      body(k0, k1);
      std::fill(end_.begin() + k0, end_.begin() + k1, Clock::now());
    });
    const auto [first, last] = std::minmax_element(end_.begin(), end_.end());
    const double fast = seconds(*first - start), slow = seconds(*last - start);
    if (slow <= 2.0 * fast + kSlack) {
      lagging_ = 0;
      stretch_ = kStretch;
    } else if (++lagging_ >= 2) {
      serial_left_ = stretch_;
      stretch_ = std::min<int64_t>(2 * stretch_, kMaxStretch);
      lagging_ = 1;  // a probe that lags again goes back at once
      ++serial_stretches_;
    }
  }

  // How many times the threads were given up for a stretch (tests).
  int64_t serial_stretches() const { return serial_stretches_; }
  // Tests: every step on the calling thread (true) or as above (false).
  static void force_serial(bool on) { forced_serial().store(on); }

 private:
  static std::atomic<bool>& forced_serial() {
    static std::atomic<bool> on{false};
    return on;
  }
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  // MKL's thread count for GEMMs the calling thread issues (MKL's local setting; 0 restores the
  // global one); a no-op without MKL.
  static int set_blas_threads(int n);

  static constexpr double kSlack = 200e-6;  // timer and wake-up jitter, seconds
  static constexpr int64_t kStretch = 16, kMaxStretch = 256;
  int64_t n_;
  std::vector<Clock::time_point> end_;
  int lagging_ = 0;
  int64_t serial_left_ = 0, stretch_ = kStretch, serial_stretches_ = 0;
};

// The weight gradients [A_1 | A_2 | ... (| 1)]^T · D in float32 (D: [R, N]; each part an A of
// R rows, or of any rows with an int64 list of R row indices) on the packed kernel, or an
// undefined tensor where BLAS or another engine serves the shape (cpu/gemm_engine.h) or the
// kernel does not run. Returns [sum of widths (+ 1), N], the column sums of D last with ones
// (driver::stacked_weight_grad's product).
at::Tensor packed_weight_grad(const std::vector<std::pair<at::Tensor, at::Tensor>>& parts, const at::Tensor& D,
                              bool ones);
// From this many multiply-adds (R x sum of widths x N) the packed kernel serves them.
constexpr double kPackedWeightGradFloor = double(int64_t(1) << 20);

}  // namespace cpu
}  // namespace cudnn_rnn
