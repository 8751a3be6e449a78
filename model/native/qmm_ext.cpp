// An MLX primitive that runs mlxcel's CPU quantized matmul (qmm_kernel.c); registered on
// the CPU kernels' extension module by kernels.cpp.
//
// Why a primitive and not a C call on numpy views: a primitive is a node of MLX's lazy
// graph, run in order on MLX's CPU stream like MLX's own ops, so a forward stays one
// graph and one evaluation. Calling C on views would force an evaluation before every
// matmul: about 170 a decode step at ~0.1 ms each (docs/dependencies.md has the figures).
//
// `quantized_matmul(x, w, scales, biases, group_size, bits)` computes what
// `mx.quantized_matmul(..., transpose=True, mode="affine")` computes, for float32 `x`,
// scales and biases and uint32 packed `w`. Inputs that are not row-contiguous (a
// transposed view, a slice) are copied into a contiguous buffer first.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "pool.h"
#include "qmm_kernel.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Copies a strided array of 4-byte elements into `out`, row-major.
void gather_rows(const mx::array& a, std::vector<uint32_t>& out) {
  const auto* base = static_cast<const uint32_t*>(a.data<void>());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  size_t total = a.size();
  out.resize(total);
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = 0; i < total; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    out[i] = base[offset];
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// The input's data, or a contiguous copy of it kept alive in `keep`.
template <typename T>
const T* contiguous_data(const mx::array& a, std::vector<uint32_t>& keep) {
  if (a.flags().row_contiguous) return a.data<T>();
  gather_rows(a, keep);
  return reinterpret_cast<const T*>(keep.data());
}

class QuantizedMatmul : public mx::UnaryPrimitive {
 public:
  QuantizedMatmul(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    const int64_t k = inputs[0].shape(-1);
    const int64_t m = k > 0 ? static_cast<int64_t>(inputs[0].size()) / k : 0;
    const int64_t n = inputs[1].shape(0);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                      w = mx::array::unsafe_weak_copy(inputs[1]),
                      s = mx::array::unsafe_weak_copy(inputs[2]),
                      b = mx::array::unsafe_weak_copy(inputs[3]),
                      y = mx::array::unsafe_weak_copy(out), m, k, n, group = group_size_,
                      bits = bits_]() mutable {
      std::vector<uint32_t> xs, ws, ss, bs;
      int status = mlxcel_qmm(contiguous_data<float>(x, xs), m, k,
                              contiguous_data<uint32_t>(w, ws), contiguous_data<float>(s, ss),
                              contiguous_data<float>(b, bs), n, bits, group, y.data<float>());
      if (status != 0) {
        // Shapes and parameters were checked when the node was built; keep the output defined.
        std::memset(y.data<float>(), 0, y.nbytes());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel's quantized matmul runs on the CPU only");
  }

  const char* name() const override { return "MlxcelQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

 private:
  int group_size_;
  int bits_;
};

// The pairs qmm_kernel.h documents as supported.
bool supports(int bits, int group_size) {
  bool bits_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  return bits_ok && (group_size == 32 || group_size == 64 || group_size == 128);
}

void check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("quantized_matmul: " + message);
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits) {
  check(supports(bits, group_size),
        "unsupported bits/group_size " + std::to_string(bits) + "/" + std::to_string(group_size));
  check(x.dtype() == mx::float32 && scales.dtype() == mx::float32 &&
            biases.dtype() == mx::float32,
        "x, scales and biases must be float32");
  check(w.dtype() == mx::uint32, "w must be uint32");
  check(x.ndim() >= 1 && w.ndim() == 2 && scales.ndim() == 2 && biases.ndim() == 2,
        "x needs at least one axis; w, scales and biases two");
  const int64_t k = x.shape(-1);
  const int64_t n = w.shape(0);
  check(k % group_size == 0 && static_cast<int64_t>(w.shape(1)) * 32 == k * bits,
        "w's packed width does not match x's last axis");
  check(scales.shape(0) == n && biases.shape(0) == n && scales.shape(1) == k / group_size &&
            biases.shape(1) == k / group_size,
        "scales and biases must be (N, K / group_size)");
  auto stream = mx::default_stream(mx::Device::cpu);
  mx::Shape shape = x.shape();
  shape.back() = static_cast<int32_t>(n);
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<QuantizedMatmul>(stream, group_size, bits),
                   {x, w, scales, biases});
}

}  // namespace

// Registers the quantized matmul's functions on the extension's module (kernels.cpp).
void register_qmm(nb::module_& m) {
  m.def("quantized_matmul", &quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a,
        "x @ dequantize(w, scales, biases).T on MLX's CPU stream (affine, float32).");
  m.def("isa", []() { return std::string(mlxcel_qmm_isa()); },
        "The instruction set the kernels were built for.");
  m.def("supports", [](int bits, int group_size) { return supports(bits, group_size); },
        "bits"_a, "group_size"_a, "Whether the kernel handles this bits/group_size pair.");
  m.def("set_threads", [](int n) { mlxcel_pool_set_threads(n); }, "n"_a,
        "Threads the kernels split their work over (n < 1: the default again).");
  m.def("pool_threads", []() { return mlxcel_pool_threads(); },
        "Threads of the pool the kernels run on, the caller included.");
  m.def("pool_shared", []() { return mlxcel_pool_shared() != 0; },
        "Whether the kernels run on the BLAS shim's pool (one pool in the process).");
}
