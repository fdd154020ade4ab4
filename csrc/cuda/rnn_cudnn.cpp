// The cuDNN path of the recurrent stack op (cuDNN 9 v8 API). The CUDA registration, which picks
// this path or the generic one per call, is register.cpp.
//
// Call sequence (see cudnn_adv.h):
//   per call: cudnnSetDropoutDescriptor (p = 0, no state), cudnnSetRNNDescriptor_v8 with the
//     call's algorithm (STANDARD, or a persistent one by preference: backend_choice.h)
//   plan (cached per config/dtype/math/device): cudnnGetRNNWeightSpaceSize, cudnnGetRNNWeightParams
//     for every (pseudo-layer, linLayerID) -> element offsets (checked against the slot shapes)
//   forward: pack Keras weights into the weight space (keras_layout.cpp; inference reuses a kept
//     space while the weights are unchanged), cudnnSetRNNDataDescriptor (sequence-major without a
//     mask, batch-major with right-padded lengths and zero fill with one; io_layout),
//     cudnnGetRNNTempSpaceSizes, cudnnRNNForward (INFERENCE without autograd, else TRAINING)
//   backward: cudnnRNNBackwardData_v8 (first: it rewrites the reserve), then
//     cudnnRNNBackwardWeights_v8 (WGRAD_MODE_ADD into a zeroed buffer), unpack the gradients.
//
// Keras semantics around cuDNN: a right-padded mask becomes lengths (cuDNN fills padded outputs
// with zero, Keras's zero_output_for_mask); Keras's default "carry the last output" on padded
// steps is a gather of the forward direction's last real output; an input dropout mask (one per
// sequence, single layer) multiplies x first. Everything cuDNN cannot express goes elsewhere
// (backend_choice.cpp).
//
// The reserve (opaque bytes to autograd) holds, 256-byte aligned: the packed weight space, cuDNN's
// raw y, hx, cx, and cuDNN's reserve space. Backward clones cuDNN's reserve before use, because
// BackwardData rewrites it and autograd may run backward twice (retain_graph).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <list>

#include <map>
#include <set>
#include <memory>
#include <string>
#include <mutex>
#include <tuple>

#include "cuda/cudnn_descriptors.h"
#include "cuda/rnn_cudnn.h"
#include "cudnn_host/keras_layout.h"

namespace cudnn_rnn {
namespace {

using at::Tensor;

// ------------------------------------------------------------------------------------------
// plan cache
// ------------------------------------------------------------------------------------------
struct PlanKey {
  int device;
  int cell_mode;
  int dir_mode;
  int data_type;
  int math_type;
  int64_t input_size, units, num_layers;
  int algo;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, cell_mode, dir_mode, data_type, math_type, input_size, units, num_layers, algo) <
           std::tie(o.device, o.cell_mode, o.dir_mode, o.data_type, o.math_type, o.input_size, o.units, o.num_layers,
                    o.algo);
  }
};

// What depends only on the configuration: measured once, kept. The descriptors themselves are
// built per call (cheap, host-only), because cuDNN takes them non-const and its thread-safety
// promise covers separate handles, not shared descriptors.
struct Plan {
  size_t weight_bytes = 0;
  WeightOffsetTable offsets;  // elements from the start of the weight space
  bool slots_cover_space = false;  // else the space has gaps, zeroed before packing
};

// The RNN descriptor of a configuration, with its (probability 0, stateless) dropout descriptor.
struct RnnDescriptors {
  cudnn::RnnDescriptor rnn;
  cudnn::DropoutDescriptor dropout;
};

std::mutex& plan_mutex() {
  static std::mutex m;
  return m;
}

std::map<PlanKey, std::shared_ptr<Plan>>& plan_cache() {
  static std::map<PlanKey, std::shared_ptr<Plan>> cache;
  return cache;
}

// How x and y are laid out for cuDNN. Without a mask, sequence-major [T, B, n] (x transposed on
// the way in, y on the way out): on an H200 (cuDNN 9.19) it ran a small LSTM's forward+backward
// 1.4x and fastrnns' forward 1.08x faster than batch-major. With a mask, batch-major [B, T, n]:
// no transposes around a call whose padded steps cuDNN skips. Both are unpacked layouts with
// padded I/O (cuDNN's sequence-major packed layout measured no faster). CUDNN_RNN_CUDNN_LAYOUT
// (batch, seq) overrides the choice, for measurement.
enum class IoLayout { BatchMajor, SeqMajor };

IoLayout io_layout(bool uniform_lengths) {
  static const std::string pref = [] {
    const char* v = std::getenv("CUDNN_RNN_CUDNN_LAYOUT");
    return std::string(v ? v : "");
  }();
  if (pref == "batch") return IoLayout::BatchMajor;
  if (pref == "seq") return IoLayout::SeqMajor;
  return uniform_lengths ? IoLayout::SeqMajor : IoLayout::BatchMajor;
}

bool seq_major(IoLayout io) { return io == IoLayout::SeqMajor; }

cudnnRNNDataLayout_t data_layout(IoLayout io) {
  return seq_major(io) ? CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED;
}

cudnnRNNMode_t cell_mode(const RnnConfig& cfg) {
  switch (cfg.cell) {
    case CellKind::LSTM: return CUDNN_LSTM;
    case CellKind::GRU: return CUDNN_GRU;
    default: return cfg.activation == Activation::Relu ? CUDNN_RNN_RELU : CUDNN_RNN_TANH;
  }
}

cudnnMathType_t math_type(at::ScalarType t) {
  if (t == at::kHalf || t == at::kBFloat16) return CUDNN_TENSOR_OP_MATH;
  // TF32 follows torch.backends.cudnn.rnn's setting, as torch.nn's RNNs do.
  if (t == at::kFloat && !at::globalContext().allowTF32CuDNN(at::Float32Op::RNN)) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

void set_descriptors(RnnDescriptors& d, cudnnHandle_t handle, const RnnConfig& cfg, at::ScalarType dtype,
                     cudnnRNNAlgo_t algo) {
  const cudnnDataType_t type = cudnn::data_type(dtype);
  // No dropout between layers (Keras's dropout is per layer input; see backend_choice.cpp):
  // probability 0 needs no RNG state, so this is cheap.
  CUDNN_RNN_CHECK(cudnnSetDropoutDescriptor(d.dropout.get(), handle, 0.0f, nullptr, 0, 0));
  const cudnnDataType_t math_prec = (type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16) ? CUDNN_DATA_FLOAT : type;
  CUDNN_RNN_CHECK(cudnnSetRNNDescriptor_v8(
      d.rnn.get(), algo, cell_mode(cfg), CUDNN_RNN_DOUBLE_BIAS,
      cfg.num_directions == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, type, math_prec,
      math_type(dtype), static_cast<int32_t>(cfg.input_size), static_cast<int32_t>(cfg.units),
      static_cast<int32_t>(cfg.units) /* projSize == hiddenSize: no projection */, static_cast<int32_t>(cfg.num_layers),
      d.dropout.get(), CUDNN_RNN_PADDED_IO_ENABLED));
}

PlanKey plan_key(const RnnConfig& cfg, const Tensor& x, cudnnRNNAlgo_t algo) {
  return PlanKey{x.get_device(), static_cast<int>(cell_mode(cfg)), static_cast<int>(cfg.num_directions),
                 static_cast<int>(cudnn::data_type(x.scalar_type())), static_cast<int>(math_type(x.scalar_type())),
                 cfg.input_size, cfg.units, cfg.num_layers, static_cast<int>(algo)};
}

// Configurations (with their persistent algorithm) cuDNN refused: they run STANDARD from then on.
std::mutex& refused_mutex() {
  static std::mutex m;
  return m;
}
std::set<PlanKey>& refused() {
  static std::set<PlanKey> s;
  return s;
}

cudnnRNNAlgo_t algorithm_for(const RnnConfig& cfg, const Tensor& x, const c10::optional<Tensor>& mask) {
  const auto* props = at::cuda::getCurrentDeviceProperties();
  const auto algo = static_cast<cudnnRNNAlgo_t>(
      choose_algorithm(cfg, x.scalar_type(), !mask.has_value(), props->major));
  if (algo == CUDNN_RNN_ALGO_STANDARD) return algo;
  std::lock_guard<std::mutex> lock(refused_mutex());
  return refused().count(plan_key(cfg, x, algo)) ? CUDNN_RNN_ALGO_STANDARD : algo;
}

void refuse(const RnnConfig& cfg, const Tensor& x, cudnnRNNAlgo_t algo) {
  std::lock_guard<std::mutex> lock(refused_mutex());
  refused().insert(plan_key(cfg, x, algo));
}

std::shared_ptr<Plan> get_plan(cudnnHandle_t handle, const RnnDescriptors& desc, const RnnConfig& cfg,
                               const Tensor& x, cudnnRNNAlgo_t algo) {
  const PlanKey key = plan_key(cfg, x, algo);
  std::lock_guard<std::mutex> lock(plan_mutex());
  auto it = plan_cache().find(key);
  if (it != plan_cache().end()) return it->second;

  auto plan = std::make_shared<Plan>();
  CUDNN_RNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, desc.rnn.get(), &plan->weight_bytes));

  // Offsets of every matrix and bias, measured once on a scratch weight space.
  Tensor scratch = at::empty({static_cast<int64_t>(plan->weight_bytes)}, x.options().dtype(at::kByte));
  const char* base = static_cast<const char*>(scratch.data_ptr());
  cudnn::TensorDescriptor m_desc, b_desc;
  const int64_t per_layer = cudnn_lin_layer_count(cfg.cell);
  const int64_t elem = x.element_size();
  int64_t covered = 0;
  for (int64_t pseudo = 0; pseudo < cfg.num_layers * cfg.num_directions; ++pseudo) {
    for (int64_t id = 0; id < per_layer; ++id) {
      void* m_addr = nullptr;
      void* b_addr = nullptr;
      CUDNN_RNN_CHECK(cudnnGetRNNWeightParams(handle, desc.rnn.get(), static_cast<int32_t>(pseudo),
                                              plan->weight_bytes, scratch.data_ptr(), static_cast<int32_t>(id),
                                              m_desc.get(), &m_addr, b_desc.get(), &b_addr));
      TORCH_CHECK(m_addr && b_addr, "cudnn_rnn: cuDNN reported no matrix or bias for pseudo-layer ", pseudo,
                  ", linLayerID ", id, " under DOUBLE_BIAS");
      // The layout this code packs: a [u, in] matrix and a [u] bias per slot.
      const int64_t in = (pseudo / cfg.num_directions == 0) ? cfg.input_size : cfg.num_directions * cfg.units;
      const int64_t m_elems = cudnn::tensor_elements(m_desc), b_elems = cudnn::tensor_elements(b_desc);
      TORCH_CHECK(m_elems == cfg.units * (cudnn_lin_layer(cfg.cell, id).recurrent ? cfg.units : in) &&
                      b_elems == cfg.units,
                  "cudnn_rnn: cuDNN describes pseudo-layer ", pseudo, ", linLayerID ", id, " as ", m_elems,
                  " + ", b_elems, " elements; expected a [", cfg.units, ", in] matrix and a [", cfg.units, "] bias");
      covered += m_elems + b_elems;
      const int64_t m_off = static_cast<const char*>(m_addr) - base;
      const int64_t b_off = static_cast<const char*>(b_addr) - base;
      TORCH_CHECK(m_off % elem == 0 && b_off % elem == 0, "cudnn_rnn: misaligned weight offsets from cuDNN");
      plan->offsets.push_back({m_off / elem, b_off / elem});
    }
  }
  plan->slots_cover_space = covered * elem == static_cast<int64_t>(plan->weight_bytes);
  plan_cache().emplace(key, plan);
  return plan;
}

// ------------------------------------------------------------------------------------------
// weight spaces kept across calls
// ------------------------------------------------------------------------------------------
// A packed weight space, kept while the caller's weight tensors are unchanged: the same tensors
// (held weakly, so a freed one is never mistaken for a new one at its address), data pointers and
// version counters (an optimizer step or any in-place write bumps them), on the same stream.
// Inference reads a kept space directly; training copies it into the reserve in one copy instead
// of packing slot by slot. Never used while a CUDA graph is captured: a replay would read the
// kept space after the weights changed in place. Writes the version counters do not see (through
// `.data`, DLPack or another library) are not noticed: cudnn_rnn.empty_cache() drops every kept
// space. CUDNN_RNN_CUDA_WEIGHT_CACHE=0 turns it off.
struct KeptSpace {
  const Plan* plan;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> tensors;
  std::vector<const c10::TensorImpl*> impls;
  std::vector<uint32_t> versions;
  std::vector<const void*> data;
  cudaStream_t stream;
  Tensor space;
};

constexpr size_t kKeptSpaces = 64;  // a model's recurrent layers; the CPU's weight cache keeps 256 forms

std::mutex& kept_mutex() {
  static std::mutex m;
  return m;
}

std::list<KeptSpace>& kept_spaces() {  // most recently used first
  static auto* l = new std::list<KeptSpace>();  // never destroyed: no teardown order against the allocator
  return *l;
}

}  // namespace

void empty_cuda_weight_cache() {
  std::lock_guard<std::mutex> lock(kept_mutex());
  kept_spaces().clear();
}

namespace {

bool can_keep(at::TensorList weights) {
  static const bool on = [] {
    const char* v = std::getenv("CUDNN_RNN_CUDA_WEIGHT_CACHE");
    return !(v && std::string(v) == "0");
  }();
  if (!on || c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return false;
  for (const auto& w : weights) {
    if (w.is_inference() || !w.has_storage()) return false;  // no version counter to watch
  }
  return true;
}

bool matches(const KeptSpace& k, const Plan* plan, at::TensorList weights, cudaStream_t stream) {
  if (k.plan != plan || k.stream != stream || k.impls.size() != weights.size()) return false;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (k.impls[i] != weights[i].unsafeGetTensorImpl() || k.tensors[i].expired() ||
        k.versions[i] != weights[i]._version() || k.data[i] != weights[i].data_ptr()) {
      return false;
    }
  }
  return true;
}

// The kept space for these weights, or an undefined tensor. Drops entries whose tensors are gone.
Tensor find_kept_space(const Plan* plan, at::TensorList weights) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  std::lock_guard<std::mutex> lock(kept_mutex());
  auto& l = kept_spaces();
  for (auto it = l.begin(); it != l.end();) {
    if (matches(*it, plan, weights, stream)) {
      l.splice(l.begin(), l, it);
      return l.front().space;
    }
    bool gone = false;
    for (const auto& t : it->tensors) gone = gone || t.expired();
    it = gone ? l.erase(it) : std::next(it);
  }
  return Tensor();
}

// The key of a space about to be packed from `weights`: their versions and data pointers are read
// before packing, so a write racing the packing makes the entry stale, never a newer key over
// older data.
KeptSpace kept_key(const Plan* plan, at::TensorList weights) {
  KeptSpace k;
  k.plan = plan;
  k.stream = c10::cuda::getCurrentCUDAStream().stream();
  for (const auto& w : weights) {
    k.tensors.emplace_back(w.getIntrusivePtr());
    k.impls.push_back(w.unsafeGetTensorImpl());
    k.versions.push_back(w._version());
    k.data.push_back(w.data_ptr());
  }
  return k;
}

void keep_space(KeptSpace k, const Tensor& space) {
  k.space = space;
  const Plan* plan = k.plan;
  std::lock_guard<std::mutex> lock(kept_mutex());
  auto& l = kept_spaces();
  for (auto it = l.begin(); it != l.end();) {  // an older space of the same tensors is stale now
    bool same = it->plan == plan && it->impls == k.impls;
    it = same ? l.erase(it) : std::next(it);
  }
  l.push_front(std::move(k));
  while (l.size() > kKeptSpaces) l.pop_back();
}

// ------------------------------------------------------------------------------------------
// per-call state
// ------------------------------------------------------------------------------------------
int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

struct Call {
  cudnnRNNAlgo_t algo;
  IoLayout io;
  cudnnHandle_t handle;
  RnnDescriptors desc;
  std::shared_ptr<Plan> plan;
  cudnnDataType_t type;
  std::vector<int32_t> lengths;
  cudnn::RnnDataDescriptor x_desc, y_desc;
  cudnn::TensorDescriptor h_desc, c_desc;
  Tensor dev_lengths;  // int32 on the device
};

void prepare(Call& call, const RnnConfig& cfg, const Tensor& x, const c10::optional<Tensor>& mask,
             std::vector<int32_t> lengths, cudnnRNNAlgo_t algo) {
  TORCH_CHECK(cfg.batch <= INT32_MAX && cfg.time <= INT32_MAX && cfg.input_size <= INT32_MAX &&
                  cfg.num_directions * cfg.units <= INT32_MAX,
              "cudnn_rnn: sizes beyond cuDNN's int32 range");
  call.algo = algo;
  call.io = io_layout(!mask.has_value());
  call.handle = at::native::getCudnnHandle();
  set_descriptors(call.desc, call.handle, cfg, x.scalar_type(), algo);
  call.plan = get_plan(call.handle, call.desc, cfg, x, algo);
  call.type = cudnn::data_type(x.scalar_type());
  call.lengths = std::move(lengths);
  const int B = static_cast<int>(cfg.batch), T = static_cast<int>(cfg.time);
  const cudnnRNNDataLayout_t layout = data_layout(call.io);
  cudnn::set_rnn_data(call.x_desc, call.type, layout, T, B, static_cast<int>(cfg.input_size), call.lengths);
  cudnn::set_rnn_data(call.y_desc, call.type, layout, T, B, static_cast<int>(cfg.num_directions * cfg.units),
                      call.lengths);
  const int LD = static_cast<int>(cfg.num_layers * cfg.num_directions), u = static_cast<int>(cfg.units);
  cudnn::set_tensor_3d(call.h_desc, call.type, LD, B, u);
  cudnn::set_tensor_3d(call.c_desc, call.type, LD, B, u);
  // The device copy of the lengths is computed on the device: no host-to-device copy, so a call
  // without a mask is CUDA-graph capturable (a mask needs its lengths on the host anyway).
  call.dev_lengths = mask.has_value() ? mask->sum(1, /*keepdim=*/false, at::kInt)
                                      : at::full({cfg.batch}, cfg.time, x.options().dtype(at::kInt));
}

struct ReserveLayout {
  int64_t weights, y, hx, cx, cudnn, total;
};

// The reserve's size says which algorithm wrote it: layout.total (a multiple of 4) plus the
// algorithm's number (0-3). Backward reads it from there, so it runs the forward's algorithm even
// when the preference changed or a persistent algorithm was refused in between.
int64_t reserve_bytes(int64_t layout_total, cudnnRNNAlgo_t algo) { return layout_total + static_cast<int64_t>(algo); }

cudnnRNNAlgo_t reserve_algorithm(const Tensor& reserve) {
  const int64_t code = reserve.numel() % 4;
  TORCH_CHECK_VALUE(reserve.numel() >= 4 && code != CUDNN_RNN_ALGO_PERSIST_DYNAMIC,
                    "reserve must be the uint8 tensor a training-mode rnn_forward returned; got ", reserve.numel(),
                    " bytes");
  return static_cast<cudnnRNNAlgo_t>(code);
}

ReserveLayout reserve_layout(const RnnConfig& cfg, const Tensor& x, size_t weight_bytes, size_t cudnn_bytes) {
  const int64_t elem = x.element_size();
  const int64_t state = cfg.num_layers * cfg.num_directions * cfg.batch * cfg.units * elem;
  ReserveLayout r{};
  r.weights = 0;
  r.y = align256(static_cast<int64_t>(weight_bytes));
  r.hx = r.y + align256(cfg.batch * cfg.time * cfg.num_directions * cfg.units * elem);
  r.cx = r.hx + align256(state);
  r.cudnn = r.cx + (cfg.has_cell_state() ? align256(state) : 0);
  r.total = r.cudnn + static_cast<int64_t>(cudnn_bytes);
  r.total = (r.total + 3) / 4 * 4 + 4;  // room for the algorithm's code (reserve_bytes)
  return r;
}

Tensor bytes_as(const Tensor& bytes, int64_t offset, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  const int64_t elem = c10::elementSize(dtype);
  return bytes.narrow(0, offset, n * elem).view(dtype).view(shape);
}

// Keras's "carry the previous output" on a right-padded row: position t >= length reads the
// last real output. Index [B, T, u] into the forward direction's columns.
Tensor carry_index(const RnnConfig& cfg, const Call& call, const Tensor& x) {
  Tensor t = at::arange(cfg.time, x.options().dtype(at::kLong)).unsqueeze(0);
  Tensor last = call.dev_lengths.to(at::kLong).unsqueeze(1) - 1;
  return at::minimum(t, last).unsqueeze(2).expand({cfg.batch, cfg.time, cfg.units});
}

// What cuDNN reads as x: the input times its (per-sequence) dropout mask, and time-reversed for
// go_backwards (one layer, no mask: backend_choice), whose outputs Keras returns in processing
// order, which is then cuDNN's time order.
Tensor cudnn_input(const RnnConfig& cfg, const Call& call, const Tensor& x, at::TensorList dropout_masks) {
  Tensor in = x;
  if (!dropout_masks.empty()) in = in * dropout_masks[0][0].unsqueeze(1);
  if (cfg.go_backwards) in = in.flip(1);
  if (seq_major(call.io)) in = in.transpose(0, 1);
  return in.contiguous();
}

// [B, T, n] <-> [T, B, n] (a view) where cuDNN's layout is sequence-major; else `t` itself.
Tensor swap_time_batch(const Call& call, const Tensor& t) { return seq_major(call.io) ? t.transpose(0, 1) : t; }

// The shape cuDNN's y has: [B, T, n] or [T, B, n].
std::vector<int64_t> io_shape(const RnnConfig& cfg, const Call& call, int64_t n) {
  if (seq_major(call.io)) return {cfg.time, cfg.batch, n};
  return {cfg.batch, cfg.time, n};
}

bool needs_carry(const RnnConfig& cfg, const c10::optional<Tensor>& mask) {
  return mask.has_value() && !cfg.zero_output_for_mask;
}

// ------------------------------------------------------------------------------------------
// forward / backward
// ------------------------------------------------------------------------------------------
ForwardResult cudnn_forward_with(cudnnRNNAlgo_t algo, const RnnConfig& cfg, const BackendChoice& choice,
                                 const ForwardCall& c) {
  const Tensor& x_in = c.in.x;
  const auto& weights = c.in.weights;
  const auto& mask = c.in.mask;
  const auto& h0 = c.h0;
  const auto& c0 = c.c0;
  const auto& dropout_masks = c.in.dropout_masks;
  const bool need_grad = c.need_grad;
  Call call;
  prepare(call, cfg, x_in, mask, choice.lengths, algo);
  Tensor x = cudnn_input(cfg, call, x_in, dropout_masks);

  const cudnnForwardMode_t mode = need_grad ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
  size_t work_bytes = 0, cudnn_reserve_bytes = 0;
  CUDNN_RNN_CHECK(cudnnGetRNNTempSpaceSizes(call.handle, call.desc.rnn.get(), mode, call.x_desc.get(), &work_bytes,
                                            &cudnn_reserve_bytes));
  const ReserveLayout layout = reserve_layout(cfg, x, call.plan->weight_bytes, need_grad ? cudnn_reserve_bytes : 0);
  // Inference keeps nothing for backward: an empty reserve, and the weight space on its own.
  Tensor reserve = at::empty({need_grad ? reserve_bytes(layout.total, algo) : 0}, x.options().dtype(at::kByte));
  const bool keep = can_keep(weights);
  const Tensor kept = keep ? find_kept_space(call.plan.get(), weights) : Tensor();
  Tensor space;
  if (kept.defined() && !need_grad) {
    space = kept;
  } else {
    Tensor space_bytes = need_grad ? reserve.narrow(0, 0, static_cast<int64_t>(call.plan->weight_bytes))
                                   : at::empty({static_cast<int64_t>(call.plan->weight_bytes)}, x.options().dtype(at::kByte));
    space = space_bytes.view(x.scalar_type());
    if (kept.defined()) {
      space.copy_(kept);
    } else {
      // Inference keeps what it packed; training packs into the reserve and keeps nothing (its
      // weights change every step).
      KeptSpace key = keep && !need_grad ? kept_key(call.plan.get(), weights) : KeptSpace{};
      if (!call.plan->slots_cover_space) space.zero_();
      pack_keras_weights(cfg, weights, call.plan->offsets, space);
      if (keep && !need_grad) keep_space(std::move(key), space);
    }
  }

  const int64_t B = cfg.batch, u = cfg.units, LD = cfg.num_layers * cfg.num_directions;
  const std::vector<int64_t> y_shape = io_shape(cfg, call, cfg.num_directions * u);
  Tensor y_raw = need_grad ? bytes_as(reserve, layout.y, y_shape, x.scalar_type()) : at::empty(y_shape, x.options());
  // hx / cx: kept in the reserve when backward will need them; otherwise the caller's (or NULL,
  // which cuDNN reads as zeros).
  Tensor h0c = h0.has_value() ? h0->contiguous() : Tensor();
  Tensor c0c = c0.has_value() ? c0->contiguous() : Tensor();
  Tensor hx = h0c, cx = c0c;
  if (need_grad) {
    hx = bytes_as(reserve, layout.hx, {LD, B, u}, x.scalar_type());
    if (h0c.defined()) hx.copy_(h0c); else hx.zero_();
    if (cfg.has_cell_state()) {
      cx = bytes_as(reserve, layout.cx, {LD, B, u}, x.scalar_type());
      if (c0c.defined()) cx.copy_(c0c); else cx.zero_();
    }
  }
  const void* hx_ptr = hx.defined() ? hx.data_ptr() : nullptr;
  const void* cx_ptr = cx.defined() ? cx.data_ptr() : nullptr;
  Tensor h_n = at::empty({LD, B, u}, x.options());
  Tensor c_n = cfg.has_cell_state() ? at::empty({LD, B, u}, x.options()) : at::empty({0}, x.options());
  Tensor work = at::empty({static_cast<int64_t>(work_bytes)}, x.options().dtype(at::kByte));
  void* cudnn_reserve = need_grad ? reserve.narrow(0, layout.cudnn, static_cast<int64_t>(cudnn_reserve_bytes)).data_ptr()
                                  : nullptr;
  CUDNN_RNN_CHECK(cudnnRNNForward(call.handle, call.desc.rnn.get(), mode, call.dev_lengths.data_ptr<int32_t>(),
                                  call.x_desc.get(), x.data_ptr(), call.y_desc.get(), y_raw.data_ptr(),
                                  call.h_desc.get(), hx_ptr, h_n.data_ptr(), call.c_desc.get(), cx_ptr,
                                  cfg.has_cell_state() ? c_n.data_ptr() : nullptr, call.plan->weight_bytes,
                                  space.data_ptr(), work_bytes, work.data_ptr(),
                                  need_grad ? cudnn_reserve_bytes : 0, cudnn_reserve));
  const Tensor y_bt = swap_time_batch(call, y_raw);  // [B, T, D * u]
  Tensor y;
  if (needs_carry(cfg, mask)) {
    y = y_bt.clone(at::MemoryFormat::Contiguous);
    y.narrow(2, 0, u).copy_(y_bt.narrow(2, 0, u).gather(1, carry_index(cfg, call, x)));
  } else if (need_grad) {
    y = y_bt.clone(at::MemoryFormat::Contiguous);  // y_raw lives in the reserve, which backward needs unchanged
  } else {
    y = y_bt.contiguous();
  }
  return {y, h_n, c_n, reserve};
}

}  // namespace

// Forward with the call's algorithm; a persistent algorithm cuDNN refuses (NOT_SUPPORTED
// anywhere before the forward kernel ran) falls back to STANDARD, remembered for the
// configuration, so its backward uses STANDARD too.
ForwardResult cudnn_forward(const RnnConfig& cfg, const BackendChoice& choice, const ForwardCall& call) {
  const cudnnRNNAlgo_t algo = algorithm_for(cfg, call.in.x, call.in.mask);
  if (algo == CUDNN_RNN_ALGO_STANDARD) return cudnn_forward_with(algo, cfg, choice, call);
  try {
    return cudnn_forward_with(algo, cfg, choice, call);
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("CUDNN_STATUS_NOT_SUPPORTED") == std::string::npos) throw;
    refuse(cfg, call.in.x, algo);
    return cudnn_forward_with(CUDNN_RNN_ALGO_STANDARD, cfg, choice, call);
  }
}

BackwardResult cudnn_backward(const RnnConfig& cfg, const BackendChoice& choice, const BackwardCall& c) {
  const Tensor& x_in = c.in.x;
  const auto& mask = c.in.mask;
  const auto& dropout_masks = c.in.dropout_masks;
  const Tensor& reserve = c.reserve;
  Call call;
  prepare(call, cfg, x_in, mask, choice.lengths, reserve_algorithm(reserve));
  Tensor x = cudnn_input(cfg, call, x_in, dropout_masks);
  size_t work_bytes = 0, cudnn_reserve_bytes = 0;
  CUDNN_RNN_CHECK(cudnnGetRNNTempSpaceSizes(call.handle, call.desc.rnn.get(), CUDNN_FWD_MODE_TRAINING,
                                            call.x_desc.get(), &work_bytes, &cudnn_reserve_bytes));
  const ReserveLayout layout = reserve_layout(cfg, x, call.plan->weight_bytes, cudnn_reserve_bytes);
  TORCH_CHECK_VALUE(reserve.scalar_type() == at::kByte && reserve.numel() == reserve_bytes(layout.total, call.algo),
                    "reserve must be the ", reserve_bytes(layout.total, call.algo), "-byte uint8 tensor a training-mode rnn_forward returned on "
                    "this configuration; got ", reserve.scalar_type(), " of ", reserve.numel(), " elements (was the "
                    "forward run without autograd?)");
  const int64_t B = cfg.batch, T = cfg.time, u = cfg.units, LD = cfg.num_layers * cfg.num_directions;
  const at::ScalarType st = x.scalar_type();
  Tensor space = reserve.narrow(0, 0, static_cast<int64_t>(call.plan->weight_bytes)).view(st);
  Tensor y_raw = bytes_as(reserve, layout.y, io_shape(cfg, call, cfg.num_directions * u), st);
  Tensor hx = bytes_as(reserve, layout.hx, {LD, B, u}, st);
  Tensor cx = cfg.has_cell_state() ? bytes_as(reserve, layout.cx, {LD, B, u}, st) : Tensor();
  // BackwardData rewrites cuDNN's reserve space: work on a copy so backward can run again.
  Tensor cudnn_reserve = reserve.narrow(0, layout.cudnn, static_cast<int64_t>(cudnn_reserve_bytes)).clone();

  Tensor dy = c.grad_y.contiguous();
  if (needs_carry(cfg, mask)) {
    // The adjoint of the carry gather: padded positions' gradients go to the last real output.
    Tensor fwd = at::zeros({B, T, u}, dy.options());
    fwd.scatter_add_(1, carry_index(cfg, call, x), dy.narrow(2, 0, u));
    dy = dy.clone();
    dy.narrow(2, 0, u).copy_(fwd);
  }
  // Padded positions' outputs are constants (zeros, or the carried output handled above): no
  // gradient enters cuDNN there, and none leaves for x.
  Tensor padded = mask.has_value() ? mask->logical_not().unsqueeze(2) : Tensor();
  if (padded.defined()) dy = dy.masked_fill(padded, 0);
  dy = swap_time_batch(call, dy).contiguous();
  Tensor dhy = c.grad_h_n.contiguous();
  Tensor dcy = cfg.has_cell_state() ? c.grad_c_n.contiguous() : Tensor();
  Tensor dx = at::zeros_like(x);
  Tensor dhx = at::empty({LD, B, u}, x.options());
  Tensor dcx = cfg.has_cell_state() ? at::empty({LD, B, u}, x.options()) : at::empty({0}, x.options());
  Tensor work = at::empty({static_cast<int64_t>(work_bytes)}, x.options().dtype(at::kByte));

  CUDNN_RNN_CHECK(cudnnRNNBackwardData_v8(
      call.handle, call.desc.rnn.get(), call.dev_lengths.data_ptr<int32_t>(), call.y_desc.get(), y_raw.data_ptr(),
      dy.data_ptr(), call.x_desc.get(), dx.data_ptr(), call.h_desc.get(), hx.data_ptr(), dhy.data_ptr(),
      dhx.data_ptr(), call.c_desc.get(), cx.defined() ? cx.data_ptr() : nullptr,
      dcy.defined() ? dcy.data_ptr() : nullptr, cfg.has_cell_state() ? dcx.data_ptr() : nullptr,
      call.plan->weight_bytes, space.data_ptr(), work_bytes, work.data_ptr(), cudnn_reserve_bytes,
      cudnn_reserve.data_ptr()));
  Tensor dspace = at::zeros({static_cast<int64_t>(call.plan->weight_bytes)}, x.options().dtype(at::kByte))
                      .view(x.scalar_type());
  CUDNN_RNN_CHECK(cudnnRNNBackwardWeights_v8(
      call.handle, call.desc.rnn.get(), CUDNN_WGRAD_MODE_ADD, call.dev_lengths.data_ptr<int32_t>(),
      call.x_desc.get(), x.data_ptr(), call.h_desc.get(), hx.data_ptr(), call.y_desc.get(), y_raw.data_ptr(),
      call.plan->weight_bytes, dspace.data_ptr(), work_bytes, work.data_ptr(), cudnn_reserve_bytes,
      cudnn_reserve.data_ptr()));
  std::vector<Tensor> grad_weights = unpack_keras_gradients(cfg, c.in.weights, call.plan->offsets, dspace);
  dx = swap_time_batch(call, dx);
  if (cfg.go_backwards) dx = dx.flip(1);
  if (!dropout_masks.empty()) dx = dx * dropout_masks[0][0].unsqueeze(1);
  if (padded.defined()) dx.masked_fill_(padded, 0);
  return {dx.contiguous(), grad_weights, dhx, dcx};
}

}  // namespace cudnn_rnn
