// mlxcel's CPU kernels as one Python extension of MLX primitives: the quantized matmul
// (qmm_ext.cpp over qmm_kernel.c), attention and SwiGLU (attn_ext.cpp over attn_kernel.c), a
// layer's head and tail around attention (layer_ext.cpp over layer_kernel.c).
// One extension, so the kernels share one build and one load (and run on the process's one
// thread pool, pool.c).

#include <nanobind/nanobind.h>

namespace nb = nanobind;

void register_qmm(nb::module_& m);
void register_attention(nb::module_& m);
void register_layer(nb::module_& m);

NB_MODULE(mlxcel_kernels, m) {
  m.doc() = "mlxcel's CPU kernels (quantized matmul, attention, SwiGLU, a layer's head and tail) as MLX primitives";
  register_qmm(m);
  register_attention(m);
  register_layer(m);
}
