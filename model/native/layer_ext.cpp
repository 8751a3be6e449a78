// MLX primitives for a transformer layer's head and tail (layer_kernel.c); registered on the
// CPU kernels' extension module by kernels.cpp.
//
// `layer_head(h, positions, norm, weights, biases, bias_mask, qk_norms, bits, groups, ...)`
// returns q [T, Hq, D], k and v [T, Hkv, D] after the input norm, the three projections and
// RoPE; `layer_tail(h, attn, norm, weights, biases, bias_mask, bits, groups, eps)` returns the
// layer's output [T, dim]. `weights` holds (packed w, scales, biases) per linear map in order
// (q, k, v; or o, gate, up, down); bit i of `bias_mask` says linear i has an additive bias,
// given in `biases` in the same order. One node each instead of ~20 (see layer_kernel.h);
// the weights are inputs of the node, read where they are.

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "layer_kernel.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace {

void check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("fused layer: " + message);
}

// Where each linear map's arrays sit among the node's inputs, and its parameters.
struct LinearSlots {
  int first;  // index of the packed weights; scales and biases follow
  int bias;   // index of the additive bias, or -1
  int bits, group;
};

// The linear maps' slots: `count` maps whose arrays start at input `first`, biases after them.
std::vector<LinearSlots> slots_of(int first, int count, int bias_mask, const std::vector<int>& bits,
                                  const std::vector<int>& groups) {
  std::vector<LinearSlots> out;
  int next_bias = first + 3 * count;
  for (int i = 0; i < count; ++i) {
    const bool has = (bias_mask >> i) & 1;
    out.push_back({first + 3 * i, has ? next_bias++ : -1, bits[i], groups[i]});
  }
  return out;
}

mlxcel_qlinear linear_of(const std::vector<mx::array>& in, const LinearSlots& s) {
  const auto& w = in[s.first];
  return {w.data<uint32_t>(), in[s.first + 1].data<float>(), in[s.first + 2].data<float>(),
          s.bias < 0 ? nullptr : in[s.bias].data<float>(), long(w.shape(0)),
          long(w.shape(1)) * 32 / s.bits, s.bits, s.group};
}

// Weak copies of the inputs and outputs, for the encoder's task.
std::vector<mx::array> weak(const std::vector<mx::array>& arrays) {
  std::vector<mx::array> out;
  out.reserve(arrays.size());
  for (const auto& a : arrays) out.push_back(mx::array::unsafe_weak_copy(a));
  return out;
}

void start(mx::Stream stream, const std::vector<mx::array>& inputs,
           std::vector<mx::array>& outputs) {
  for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& o : outputs) encoder.set_output_array(o);
}

// A 4-byte array's elements in row-major order: the array's own data, or a copy in `keep`
// (the inputs are contiguous in a forward; a view passed by another caller is copied here,
// not by an extra node).
template <typename T>
const T* dense(const mx::array& a, std::vector<uint32_t>& keep) {
  if (a.flags().row_contiguous) return a.data<T>();
  const auto* base = static_cast<const uint32_t*>(a.data<void>());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  keep.resize(a.size());
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = 0; i < keep.size(); ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    keep[i] = base[offset];
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return reinterpret_cast<const T*>(keep.data());
}

void zero_on_failure(int status, std::vector<mx::array>& outputs) {
  // Shapes were checked when the node was built; keep the outputs defined all the same.
  if (status != 0)
    for (auto& o : outputs) std::memset(o.data<void>(), 0, o.nbytes());
}

struct HeadParams {
  int q_heads, kv_heads, head_dim, rope_dims, traditional;
  float eps, qk_eps, rope_base, rope_scale;
  bool qk_norm;
};

class LayerHead : public mx::Primitive {
 public:
  LayerHead(mx::Stream stream, HeadParams p, std::vector<LinearSlots> slots)
      : mx::Primitive(stream), p_(p), slots_(std::move(slots)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    start(stream(), inputs, outputs);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([in = weak(inputs), out = weak(outputs), p = p_, slots = slots_]() mutable {
      const auto& h = in[0];
      mlxcel_head_args a{};
      a.tokens = long(h.shape(0));
      a.dim = long(h.shape(1));
      a.q_heads = p.q_heads, a.kv_heads = p.kv_heads, a.head_dim = p.head_dim;
      a.norm = in[2].data<float>(), a.eps = p.eps;
      a.q = linear_of(in, slots[0]), a.k = linear_of(in, slots[1]), a.v = linear_of(in, slots[2]);
      const size_t last = in.size();
      a.q_norm = p.qk_norm ? in[last - 2].data<float>() : nullptr;
      a.k_norm = p.qk_norm ? in[last - 1].data<float>() : nullptr;
      std::vector<uint32_t> hs, ps;
      a.qk_eps = p.qk_eps, a.positions = dense<int32_t>(in[1], ps);
      a.rope_dims = p.rope_dims, a.rope_base = p.rope_base, a.rope_scale = p.rope_scale;
      a.rope_traditional = p.traditional;
      int status = mlxcel_layer_head(&a, dense<float>(h, hs), out[0].data<float>(),
                                     out[1].data<float>(), out[2].data<float>());
      zero_on_failure(status, out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxcel's fused layer runs on the CPU only");
  }

  const char* name() const override { return "MlxcelLayerHead"; }

  bool is_equivalent(const mx::Primitive&) const override { return false; }

 private:
  HeadParams p_;
  std::vector<LinearSlots> slots_;
};

class LayerTail : public mx::UnaryPrimitive {
 public:
  LayerTail(mx::Stream stream, float eps, std::vector<LinearSlots> slots)
      : mx::UnaryPrimitive(stream), eps_(eps), slots_(std::move(slots)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& output) override {
    std::vector<mx::array> outputs = {output};
    start(stream(), inputs, outputs);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([in = weak(inputs), out = weak(outputs), eps = eps_, slots = slots_]() mutable {
      const auto& h = in[0];
      mlxcel_tail_args a{};
      a.tokens = long(h.shape(0));
      a.dim = long(h.shape(1));
      a.o = linear_of(in, slots[0]), a.gate = linear_of(in, slots[1]);
      a.up = linear_of(in, slots[2]), a.down = linear_of(in, slots[3]);
      a.inter = a.gate.n;
      a.norm = in[2].data<float>(), a.eps = eps;
      std::vector<uint32_t> hs, as;
      int status = mlxcel_layer_tail(&a, dense<float>(h, hs), dense<float>(in[1], as),
                                     out[0].data<float>());
      zero_on_failure(status, out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel's fused layer runs on the CPU only");
  }

  const char* name() const override { return "MlxcelLayerTail"; }

  bool is_equivalent(const mx::Primitive&) const override { return false; }

 private:
  float eps_;
  std::vector<LinearSlots> slots_;
};

bool supported(int bits, int group) {
  bool bits_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  return bits_ok && (group == 32 || group == 64 || group == 128);
}

// Checks the linear maps' arrays and returns their slots; `widths[i]` is map i's input width
// and `outs[i]` its output width.
std::vector<LinearSlots> check_linears(const std::vector<mx::array>& weights,
                                       const std::vector<mx::array>& biases, int bias_mask,
                                       const std::vector<int>& bits, const std::vector<int>& groups,
                                       const std::vector<long>& widths,
                                       const std::vector<long>& outs, int first) {
  const int count = int(widths.size());
  check(int(weights.size()) == 3 * count && int(bits.size()) == count &&
            int(groups.size()) == count, "one (w, scales, biases), bits and group per map");
  check(int(biases.size()) == __builtin_popcount(unsigned(bias_mask)) && bias_mask >= 0 &&
            bias_mask < (1 << count), "one bias per bit of bias_mask");
  int b = 0;
  for (int i = 0; i < count; ++i) {
    const auto &w = weights[3 * i], &s = weights[3 * i + 1], &z = weights[3 * i + 2];
    check(supported(bits[i], groups[i]), "unsupported bits/group_size");
    check(w.dtype() == mx::uint32 && s.dtype() == mx::float32 && z.dtype() == mx::float32,
          "packed weights are uint32, scales and biases float32");
    check(w.ndim() == 2 && w.shape(0) == outs[i] && long(w.shape(1)) * 32 == widths[i] * bits[i] &&
              widths[i] % groups[i] == 0, "a packed weight's shape does not match");
    check(s.shape() == z.shape() && s.ndim() == 2 && s.shape(0) == outs[i] &&
              s.shape(1) == widths[i] / groups[i], "scales and biases must be (N, K / group)");
    if ((bias_mask >> i) & 1) {
      const auto& bias = biases[b++];
      check(bias.dtype() == mx::float32 && bias.ndim() == 1 && bias.shape(0) == outs[i],
            "an additive bias must be float32 (N,)");
    }
  }
  return slots_of(first, count, bias_mask, bits, groups);
}

void check_vector(const mx::array& a, long n, const char* what) {
  check(a.dtype() == mx::float32 && a.ndim() == 1 && a.shape(0) == n,
        std::string(what) + " must be float32 of the right width");
}

std::vector<mx::array> layer_head(const mx::array& h, const mx::array& positions,
                                  const mx::array& norm, const std::vector<mx::array>& weights,
                                  const std::vector<mx::array>& biases, int bias_mask,
                                  const std::vector<mx::array>& qk_norms,
                                  const std::vector<int>& bits, const std::vector<int>& groups,
                                  int q_heads, int kv_heads, int head_dim, float eps,
                                  float qk_eps, int rope_dims, float rope_base, float rope_scale,
                                  bool rope_traditional) {
  check(h.dtype() == mx::float32 && h.ndim() == 2 && h.shape(0) >= 1, "h must be float32 [T, dim]");
  const long t = h.shape(0), dim = h.shape(1);
  check(positions.dtype() == mx::int32 && positions.ndim() == 1 && positions.shape(0) == t,
        "positions must be int32 [T]");
  check(q_heads > 0 && kv_heads > 0 && head_dim > 0, "heads and head_dim must be positive");
  check(rope_dims >= 2 && rope_dims % 2 == 0 && rope_dims <= head_dim, "unsupported RoPE dims");
  check(qk_norms.empty() || qk_norms.size() == 2, "qk_norms: none or (q_norm, k_norm)");
  check_vector(norm, dim, "norm");
  for (const auto& w : qk_norms) check_vector(w, head_dim, "q_norm and k_norm");
  const long qw = long(q_heads) * head_dim, kw = long(kv_heads) * head_dim;
  auto slots = check_linears(weights, biases, bias_mask, bits, groups, {dim, dim, dim},
                             {qw, kw, kw}, 3);
  auto stream = mx::default_stream(mx::Device::cpu);
  HeadParams p{q_heads, kv_heads, head_dim, rope_dims, rope_traditional ? 1 : 0,
               eps, qk_eps, rope_base, rope_scale, !qk_norms.empty()};
  std::vector<mx::array> inputs = {h, positions, norm};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  inputs.insert(inputs.end(), qk_norms.begin(), qk_norms.end());
  const int T = int(t);
  return mx::array::make_arrays({{T, q_heads, head_dim}, {T, kv_heads, head_dim},
                                 {T, kv_heads, head_dim}},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<LayerHead>(stream, p, std::move(slots)),
                                std::move(inputs));
}

mx::array layer_tail(const mx::array& h, const mx::array& attn, const mx::array& norm,
                     const std::vector<mx::array>& weights, const std::vector<mx::array>& biases,
                     int bias_mask, const std::vector<int>& bits, const std::vector<int>& groups,
                     float eps) {
  check(h.dtype() == mx::float32 && attn.dtype() == mx::float32 && h.ndim() == 2 &&
            attn.ndim() == 2 && h.shape(0) >= 1 && attn.shape(0) == h.shape(0),
        "h and attn must be float32 [T, dim] and [T, width]");
  check(weights.size() == 12, "four linear maps: o, gate, up, down");
  const long dim = h.shape(1), width = attn.shape(1), inter = weights[3].shape(0);
  check_vector(norm, dim, "norm");
  auto slots = check_linears(weights, biases, bias_mask, bits, groups,
                             {width, dim, dim, inter}, {dim, inter, inter, dim}, 3);
  auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {h, attn, norm};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  return mx::array(h.shape(), mx::float32,
                   std::make_shared<LayerTail>(stream, eps, std::move(slots)), std::move(inputs));
}

}  // namespace

// Registers the fused layer's head and tail on the extension's module.
void register_layer(nb::module_& m) {
  m.def("layer_head", &layer_head, "h"_a, "positions"_a, "norm"_a, "weights"_a, "biases"_a,
        "bias_mask"_a, "qk_norms"_a, "bits"_a, "groups"_a, "q_heads"_a, "kv_heads"_a,
        "head_dim"_a, "eps"_a, "qk_eps"_a, "rope_dims"_a, "rope_base"_a, "rope_scale"_a,
        "rope_traditional"_a,
        "A layer's input norm, QKV projections (+ biases, + q/k norms) and RoPE: [q, k, v].");
  m.def("layer_tail", &layer_tail, "h"_a, "attn"_a, "norm"_a, "weights"_a, "biases"_a,
        "bias_mask"_a, "bits"_a, "groups"_a, "eps"_a,
        "A layer's output projection, residual, norm, SwiGLU MLP and residual: [T, dim].");
}
