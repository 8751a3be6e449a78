// MLX primitives for mlxcel's CPU attention and SwiGLU (attn_kernel.c); registered on the
// CPU kernels' extension module by kernels.cpp.
//
// `attention(q, k, v, scale, causal=False, mask=None)` computes what
// `mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=...)` computes for float32
// inputs: q [B, Hq, L, Dk], k [B, Hkv, S, Dk], v [B, Hkv, S, Dv], Hq a multiple of Hkv; the
// mask is "causal" or a boolean (True = attend) or float32 (added) array broadcastable to
// [B, Hq, L, S]. `swiglu(gate, up)` computes silu(gate) * up for two float32 arrays of one shape.
//
// As nodes of MLX's lazy graph they keep a forward one graph and one evaluation (see
// qmm_ext.cpp). Inputs whose last axis is not contiguous are copied first; any other strides
// (a KV cache's slice, a broadcast mask) are read in place.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "attn_kernel.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A float array's data with element strides of its first three axes and a contiguous last
// one: the array itself, or a row-major copy kept in `keep`.
struct View {
  const float* data;
  long strides[3];
};

View view_of(const mx::array& a, std::vector<float>& keep) {
  const auto& st = a.strides();
  if (a.shape(3) <= 1 || st[3] == 1) return {a.data<float>(), {long(st[0]), long(st[1]), long(st[2])}};
  keep.resize(a.size());
  const float* base = a.data<float>();
  size_t n = 0;
  for (int64_t i0 = 0; i0 < a.shape(0); ++i0)
    for (int64_t i1 = 0; i1 < a.shape(1); ++i1)
      for (int64_t i2 = 0; i2 < a.shape(2); ++i2)
        for (int64_t i3 = 0; i3 < a.shape(3); ++i3)
          keep[n++] = base[i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]];
  const long d = a.shape(3), s = a.shape(2) * d;
  return {keep.data(), {long(a.shape(1)) * s, s, d}};
}

class Attention : public mx::UnaryPrimitive {
 public:
  Attention(mx::Stream stream, float scale, int mask_kind)
      : mx::UnaryPrimitive(stream), scale_(scale), mask_kind_(mask_kind) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    std::vector<mx::array> args;
    for (const auto& a : inputs) args.push_back(mx::array::unsafe_weak_copy(a));
    encoder.dispatch([args = std::move(args), y = mx::array::unsafe_weak_copy(out),
                      scale = scale_, kind = mask_kind_]() mutable {
      std::vector<float> kq, kk, kv;
      const View q = view_of(args[0], kq), k = view_of(args[1], kk), v = view_of(args[2], kv);
      mlxcel_attn_args a{};
      a.q = q.data;
      a.k = k.data;
      a.v = v.data;
      for (int i = 0; i < 3; ++i) {
        a.q_strides[i] = q.strides[i];
        a.k_strides[i] = k.strides[i];
        a.v_strides[i] = v.strides[i];
      }
      a.mask_kind = kind;
      if (args.size() > 3) {
        const auto& m = args[3];
        a.mask = m.data<void>();
        for (int i = 0; i < 4; ++i) a.mask_strides[i] = m.strides()[i];
      }
      a.batch = args[0].shape(0);
      a.q_heads = args[0].shape(1);
      a.q_len = args[0].shape(2);
      a.k_dim = args[0].shape(3);
      a.kv_heads = args[1].shape(1);
      a.k_len = args[1].shape(2);
      a.v_dim = args[2].shape(3);
      a.scale = scale;
      a.out = y.data<float>();
      if (mlxcel_attention(&a) != 0) {
        // Shapes were checked when the node was built; keep the output defined.
        std::memset(y.data<float>(), 0, y.nbytes());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel's attention runs on the CPU only");
  }

  const char* name() const override { return "MlxcelAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Attention&>(other);
    return scale_ == o.scale_ && mask_kind_ == o.mask_kind_;
  }

 private:
  float scale_;
  int mask_kind_;
};

class SwiGLU : public mx::UnaryPrimitive {
 public:
  explicit SwiGLU(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    encoder.dispatch([g = mx::array::unsafe_weak_copy(inputs[0]),
                      u = mx::array::unsafe_weak_copy(inputs[1]),
                      y = mx::array::unsafe_weak_copy(out)]() mutable {
      mlxcel_swiglu(g.data<float>(), u.data<float>(), y.data<float>(), long(y.size()));
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel's swiglu runs on the CPU only");
  }

  const char* name() const override { return "MlxcelSwiGLU"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

void check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("attention: " + message);
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    bool causal, const std::optional<mx::array>& mask) {
  check(q.dtype() == mx::float32 && k.dtype() == mx::float32 && v.dtype() == mx::float32,
        "queries, keys and values must be float32");
  check(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "queries, keys and values need 4 axes");
  const int batch = q.shape(0), heads = q.shape(1), q_len = q.shape(2);
  const int kv_heads = k.shape(1), k_len = k.shape(2);
  check(k.shape(0) == batch && v.shape(0) == batch && v.shape(1) == kv_heads,
        "batch and key heads must match");
  check(kv_heads > 0 && heads % kv_heads == 0, "query heads must be a multiple of key heads");
  check(k.shape(3) == q.shape(3) && v.shape(2) == k_len && k_len > 0,
        "keys must match the queries' width and the values' length");
  check(!(causal && mask.has_value()), "a causal mask or a mask array, not both");
  auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {q, k, v};
  int kind = causal ? MLXCEL_MASK_CAUSAL : MLXCEL_MASK_NONE;
  if (mask.has_value()) {
    check(mask->dtype() == mx::bool_ || mask->dtype() == mx::float32,
          "the mask must be boolean or float32");
    kind = mask->dtype() == mx::bool_ ? MLXCEL_MASK_BOOL : MLXCEL_MASK_ADDITIVE;
    inputs.push_back(mx::broadcast_to(*mask, {batch, heads, q_len, k_len}, stream));
  }
  return mx::array({batch, heads, q_len, v.shape(3)}, mx::float32,
                   std::make_shared<Attention>(stream, scale, kind), std::move(inputs));
}

mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape())
    throw std::invalid_argument("swiglu: gate and up must be float32 arrays of one shape");
  auto stream = mx::default_stream(mx::Device::cpu);
  // The kernel reads both as flat arrays: a view (a slice, a transpose) is copied first.
  return mx::array(gate.shape(), mx::float32, std::make_shared<SwiGLU>(stream),
                   {mx::contiguous(gate, false, stream), mx::contiguous(up, false, stream)});
}

}  // namespace

// Registers attention and SwiGLU on the extension's module.
void register_attention(nb::module_& m) {
  m.def("attention", &attention, "queries"_a, "keys"_a, "values"_a, "scale"_a,
        "causal"_a = false, "mask"_a = nb::none(),
        "softmax(scale * q k^T + mask) v on MLX's CPU stream (float32).");
  m.def("swiglu", &swiglu, "gate"_a, "up"_a, "silu(gate) * up on MLX's CPU stream (float32).");
}
