// A hand-written kernel for the CPU execution layer's own test
// (host-layer.test): warp shuffles (xor, down, up, indexed), __syncthreads
// with shared memory, a 2-D grid and a partial last warp.
__global__ void probe(float *out) {
  __shared__ float s[96];
  const int t = threadIdx.x, b = blockIdx.y * gridDim.x + blockIdx.x;
  const float v = static_cast<float>(b * 1000 + t);
  float sum = v;
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float down = __shfl_down_sync(0xffffffffu, v, 1);
  const float up = __shfl_up_sync(0xffffffffu, v, 2);
  const float lane3 = __shfl_sync(0xffffffffu, v, 3);
  s[t] = v;
  __syncthreads();
  const float mirrored = s[blockDim.x - 1 - t];
  float *o = out + (b * 96 + t) * 5;
  o[0] = sum;
  o[1] = down;
  o[2] = up;
  o[3] = lane3;
  o[4] = mirrored;
}

#ifdef MOE_HOST_EMULATION
#include <cstdio>
void probeHost(const unsigned long long *args) { probe(reinterpret_cast<float *>(args[0])); }
int main() {
  // Blocks of 96 threads (three full warps), grid 2 x 3.
  std::vector<float> out(6 * 96 * 5, -1.0f);
  const unsigned long long args[] = {reinterpret_cast<unsigned long long>(out.data())};
  moe_host_launch(probeHost, 2, 3, 1, 96, 1, 1, args);
  int bad = 0;
  for (int b = 0; b < 6; ++b)
    for (int t = 0; t < 96; ++t) {
      const int lane = t % 32, warp0 = t - lane;
      auto val = [&](int thread) { return static_cast<float>(b * 1000 + thread); };
      float sum = 0;
      for (int l = 0; l < 32; ++l)
        sum += val(warp0 + l);
      const float want[5] = {sum, val(lane + 1 < 32 ? t + 1 : t), val(lane >= 2 ? t - 2 : t),
                             val(warp0 + 3), val(95 - t)};
      for (int i = 0; i < 5; ++i)
        if (out[(b * 96 + t) * 5 + i] != want[i]) {
          if (bad++ < 5)
            std::printf("block %d thread %d value %d: %g, expected %g\n", b, t, i,
                        out[(b * 96 + t) * 5 + i], want[i]);
        }
    }
  std::printf("host layer: %d mismatches\n", bad);
  return bad ? 1 : 0;
}
#endif
