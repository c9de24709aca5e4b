// The CPU fast path of mxfp4.numerics.fused_cpu: fake-quantization to an E8M0-scaled block format in one
// pass over the input, the same float32 operations as the PyTorch reference (reference.quantize_blocks),
// element for element, so the results are equal bit for bit:
//   amax -> shared exponent (rule) -> E8M0 scale 2^e and its inverse 2^-e (both from their bytes)
//   -> y = x * 2^-e -> round y onto the element grid (nearest, ties to even, saturating) -> q * 2^e.
// A block with a NaN or infinite element is NaN throughout (the reference's NaN scale times zero).
// Every operation is an exact IEEE float32 one (multiplications by powers of two, one rounding to an
// integer), so the instruction set the compiler picks does not change a bit.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

namespace {

struct Format {
  int emin, emax, mbits;
  float max_value;
  int rule;  // 0 floor, 1 ceil, 2 even, 3 rceil (formats.e8m0_exponent)
};

constexpr int kMaxBlock = 64;
// Scales 2^e quantized on x directly (quantize_block_scaled): within them every non-zero output is a
// normal float32 (2^(emin - mbits + e) >= 2^-109) and the rounding constant 2^(23 + k + e) stays finite
// (its exponent is at most e + emax + 1 + 23 - mbits <= e + 32 for every E8M0 element format here).
constexpr int kScaledMin = -100, kScaledMax = 90;
constexpr int kColumns = 16;  // blocks quantized together when blocks run across the innermost index

inline float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// formats.e8m0_decode of a biased exponent byte in [0, 254]: byte 0 is the subnormal 2^-127.
inline float e8m0_value(int byte) { return byte == 0 ? from_bits(0x00400000u) : from_bits(uint32_t(byte) << 23); }

// formats.e8m0_exponent for a finite amax >= 0.
__attribute__((always_inline)) inline int shared_exponent(float amax, const Format& f) {
  const int32_t b = int32_t(bits_of(amax));
  int e;
  switch (f.rule) {
    case 0: e = ((b >> 23) & 0xFF) - 127 - f.emax; break;
    case 1: e = ((b >> 23) & 0xFF) - 127 + ((b & 0x7FFFFF) != 0) - f.emax; break;
    case 2: e = (((b + (1 << (23 - f.mbits - 1))) >> 23) & 0xFF) - 127 - f.emax; break;
    default: {
      int ex;
      const float m = std::frexp(amax / f.max_value, &ex);
      e = ex - 1 + (m != 0.5f);
    }
  }
  if (!(amax > 0.0f)) e = -127;
  return std::min(127, std::max(-127, e));
}

// formats.round_to_grid of one float32 y, |y| < 2^(emax + 2) (true of every y = x / 2^e of a block):
// the grid step 2^k, k = e - mbits, e = |y|'s exponent floored at emin; |y| rounded to a multiple of 2^k,
// half to even, by adding and subtracting 2^(23 + k) (the sum's unit in the last place is 2^k: the same
// rounding as the reference's round(|y| / 2^k) * 2^k); saturated at max_value. The reference also clamps
// e at emax: a |y| >= 2^(emax + 1) rounds to at least 2^(emax + 1) > max_value either way.
inline float round_to_grid(float y, int emin, int mbits, float max_value) {
  const uint32_t yb = bits_of(y);
  const float a = from_bits(yb & 0x7FFFFFFFu);
  int e = int((yb >> 23) & 0xFF) - 127;
  e = e < emin ? emin : e;
  const float magic = from_bits(uint32_t(e - mbits + 127 + 23) << 23);
  float q = (a + magic) - magic;  // IEEE: not folded without -ffast-math
  q = q < max_value ? q : max_value;
  return from_bits(bits_of(q) | (yb & 0x80000000u));
}

// A finite float32 rounded to bfloat16 bits, nearest, ties to even: c10::BFloat16's conversion (and so
// the reference's .to(torch.bfloat16)) for every value but NaN, in integer lanes that vectorize.
inline uint16_t bf16_bits(float v) {
  const uint32_t u = bits_of(v);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A finite float32 output stored as Out (bfloat16 through the integer-lane rounding above).
template <typename Out>
inline void store_finite(Out* o, float v) {
  if constexpr (std::is_same_v<Out, at::BFloat16>) {
    *reinterpret_cast<uint16_t*>(o) = bf16_bits(v);
  } else {
    *o = Out(v);
  }
}

// One block's outputs: out[j * ok] = Q(t[j] * inverse) * scale, as the reference computes them.
template <typename Out>
__attribute__((always_inline)) inline void quantize_block(const float* t, Out* out, int64_t ok, int64_t n,
                                                          float scale, float inverse, const Format& f) {
  const int emin = f.emin, mbits = f.mbits;
  const float max_value = f.max_value;
  if constexpr (std::is_same_v<Out, float>) {
    if (ok == 1) {
      for (int64_t j = 0; j < n; ++j) out[j] = round_to_grid(t[j] * inverse, emin, mbits, max_value) * scale;
      return;
    }
  }
  if constexpr (std::is_same_v<Out, at::BFloat16>) {
    if (ok == 1) {
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
      for (int64_t j = 0; j < n; ++j)
        o[j] = bf16_bits(round_to_grid(t[j] * inverse, emin, mbits, max_value) * scale);
      return;
    }
  }
  for (int64_t j = 0; j < n; ++j)
    out[j * ok] = Out(round_to_grid(t[j] * inverse, emin, mbits, max_value) * scale);
}

// One block's max magnitude as float32 bits from the bits of its elements (the max of the non-negative
// bit patterns is the bits of the max: integer lanes, which vectorize), and whether one is NaN or infinite.
inline uint32_t amax_bits(const float* t, int64_t n, bool* nonfinite) {
  uint32_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t ab = bits_of(t[j]) & 0x7FFFFFFFu;
    m = ab > m ? ab : m;
  }
  *nonfinite = m >= 0x7F800000u;
  return m;
}

// The same outputs computed on x directly, for a block whose scale 2^e is within kScaledMin/Max:
// multiplying by 2^-e and by 2^e is then exact wherever it matters (a y = x / 2^e below 2^-126 rounds to
// zero either way, and every non-zero output is a normal number), so Q(x / 2^e) * 2^e is |x| rounded to
// a multiple of 2^(k + e), k + e = max(E(x), emin + e) - mbits, by the same 2^23 trick, saturated at
// max_value * 2^e.
// One element of quantize_block_scaled: |x|'s exponent field floored at ``floor_field`` (emin + e, biased)
// gives the rounding constant 2^(field + 23 - mbits); ``max_q`` = max_value * 2^e.
inline float round_scaled(float x, uint32_t floor_field, uint32_t shift, float max_q) {
  const uint32_t xb = bits_of(x), ab = xb & 0x7FFFFFFFu;
  uint32_t field = ab >> 23;
  field = field < floor_field ? floor_field : field;
  const float magic = from_bits((field + shift) << 23);
  float r = (from_bits(ab) + magic) - magic;  // IEEE: not folded without -ffast-math
  r = r < max_q ? r : max_q;
  return from_bits(bits_of(r) | (xb & 0x80000000u));
}

template <typename Out>
__attribute__((always_inline)) inline void quantize_block_scaled(const float* t, Out* out, int64_t ok, int64_t n,
                                                                 int e, const Format& f) {
  const uint32_t floor_field = uint32_t(f.emin + e + 127), shift = uint32_t(23 - f.mbits);
  const float max_q = f.max_value * from_bits(uint32_t(e + 127) << 23);
  auto q = [=](float x) { return round_scaled(x, floor_field, shift, max_q); };
  if constexpr (std::is_same_v<Out, float>) {
    if (ok == 1) {
      for (int64_t j = 0; j < n; ++j) out[j] = q(t[j]);
      return;
    }
  }
  if constexpr (std::is_same_v<Out, at::BFloat16>) {
    if (ok == 1) {
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
      for (int64_t j = 0; j < n; ++j) o[j] = bf16_bits(q(t[j]));
      return;
    }
  }
  for (int64_t j = 0; j < n; ++j) out[j * ok] = Out(q(t[j]));
}

// One block of n elements, already in float32 (t), into out at stride ok.
template <typename Out>
__attribute__((always_inline)) inline void quantize_loaded(const float* t, Out* out, int64_t ok, int64_t n,
                                                           const Format& f) {
  bool nonfinite;
  const float amax = from_bits(amax_bits(t, n, &nonfinite));
  if (nonfinite) {  // the reference's NaN scale times its zeroed grid values
    const float nan = from_bits(0x7FC00000u);
    for (int64_t j = 0; j < n; ++j) out[j * ok] = Out(nan);
    return;
  }
  const int e = shared_exponent(amax, f);
  if (e >= kScaledMin && e <= kScaledMax) {
    quantize_block_scaled(t, out, ok, n, e, f);
    return;
  }
  const int byte = e + 127;
  quantize_block(t, out, ok, n, e8m0_value(byte), e8m0_value(std::min(254, std::max(0, 254 - byte))), f);
}

// One block of n elements at stride sk of x (any input dtype: its float32 value is exact) into out.
template <typename In, typename Out>
inline void block(const In* x, int64_t sk, Out* out, int64_t ok, int64_t n, const Format& f) {
  float t[kMaxBlock];
  for (int64_t j = 0; j < n; ++j) t[j] = float(x[j * sk]);
  quantize_loaded(t, out, ok, n, f);
}

// Whole contiguous blocks of 32 one after another (blocks along a contiguous last axis, the common case):
// loops of a known length with the format's constants hoisted, which the compiler unrolls and vectorizes.
template <typename In, typename Out>
void contiguous_blocks(const In* __restrict x, Out* __restrict out, int64_t blocks, const Format& f) {
  for (int64_t b = 0; b < blocks; ++b, x += 32, out += 32) {
    float t[32];
    for (int j = 0; j < 32; ++j) t[j] = float(x[j]);
    quantize_loaded(t, out, 1, 32, f);
  }
}

// `cols` (<= kColumns) blocks side by side, element j of block c at x[j * sk + c * si] (blocks along a
// non-innermost index), written alike into out: each block gathered, then quantized as one.
template <typename In, typename Out>
void tile(const In* x, int64_t sk, int64_t si, Out* out, int64_t ok, int64_t oi, int64_t n, int64_t cols,
          const Format& f) {
  float t[kColumns][kMaxBlock];
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < cols; ++c) t[c][j] = float(x[j * sk + c * si]);
  for (int64_t c = 0; c < cols; ++c) quantize_loaded(t[c], out + c * oi, ok, n, f);
}

// Eight blocks of 32 side by side whose elements are contiguous across blocks (x[j * sk + c], the
// weight-gradient GEMM's operands blocked along their rows): one vector lane per block, so the block
// maxima, the scales and the rounding run across lanes with no reduction inside a vector. Blocks with
// a non-finite element or a scale beyond kScaledMin/Max take the one-block path.
template <typename In, typename Out>
void lanes8(const In* x, int64_t sk, Out* out, int64_t ok, int64_t oi, int64_t n, int64_t cols, const Format& f) {
  float t[32][8];
  if (n == 32 && cols == 8) {
    for (int64_t j = 0; j < 32; ++j)
      for (int c = 0; c < 8; ++c) t[j][c] = float(x[j * sk + c]);
  } else {  // zeros never change a block's max; their outputs are not stored
    for (int64_t j = 0; j < 32; ++j)
      for (int c = 0; c < 8; ++c) t[j][c] = (j < n && c < cols) ? float(x[j * sk + c]) : 0.0f;
  }
  uint32_t m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < 32; ++j)
    for (int c = 0; c < 8; ++c) {
      const uint32_t ab = bits_of(t[j][c]) & 0x7FFFFFFFu;
      m[c] = ab > m[c] ? ab : m[c];
    }
  uint32_t floor_field[8];
  float max_q[8];
  bool lane_ok[8], all_ok = true;
  const uint32_t shift = uint32_t(23 - f.mbits);
  for (int c = 0; c < 8; ++c) {
    const bool finite = m[c] < 0x7F800000u;
    const int e = finite ? shared_exponent(from_bits(m[c]), f) : 0;
    lane_ok[c] = finite && e >= kScaledMin && e <= kScaledMax;
    all_ok = all_ok && (lane_ok[c] || c >= cols);
    floor_field[c] = uint32_t(f.emin + e + 127);
    max_q[c] = f.max_value * from_bits(uint32_t(e + 127) << 23);
  }
  for (int j = 0; j < 32; ++j)
    for (int c = 0; c < 8; ++c) t[j][c] = round_scaled(t[j][c], floor_field[c], shift, max_q[c]);
  for (int64_t c = 0; c < cols; ++c) {
    Out* o = out + c * oi;
    if (!all_ok && !lane_ok[c]) {
      float col[32];
      for (int64_t j = 0; j < n; ++j) col[j] = float(x[j * sk + c]);
      quantize_loaded(col, o, ok, n, f);
      continue;
    }
    if (ok == 1) {
      for (int64_t j = 0; j < n; ++j) store_finite(o + j, t[j][c]);
    } else {
      for (int64_t j = 0; j < n; ++j) store_finite(o + j * ok, t[j][c]);
    }
  }
}

template <typename In, typename Out>
void run(const at::Tensor& x, at::Tensor& out, int bs, const Format& f) {
  // x, out: [O, K, I] views; blocks of bs run along K (the last one may be short: the reference's zero
  // padding never changes a block's amax, and the padded outputs are cropped).
  const int64_t O = x.size(0), K = x.size(1), I = x.size(2);
  const int64_t so = x.stride(0), sk = x.stride(1), si = x.stride(2);
  const int64_t oo = out.stride(0), ok = out.stride(1), oi = out.stride(2);
  const In* xp = x.data_ptr<In>();
  Out* op = out.data_ptr<Out>();
  const int64_t nb = (K + bs - 1) / bs;
  if (I == 1 && sk == 1 && ok == 1 && bs == 32) {
    const int64_t full = K / 32;
    at::parallel_for(0, O, std::max<int64_t>(1, 4096 / nb), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        contiguous_blocks(xp + o * so, op + o * oo, full, f);
        if (full < nb) block(xp + o * so + full * 32, 1, op + o * oo + full * 32, 1, K - full * 32, f);
      }
    });
    return;
  }
  if (I == 1) {
    at::parallel_for(0, O, std::max<int64_t>(1, 4096 / nb), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o)
        for (int64_t k0 = 0; k0 < K; k0 += bs)
          block(xp + o * so + k0 * sk, sk, op + o * oo + k0 * ok, ok, std::min<int64_t>(bs, K - k0), f);
    });
    return;
  }
  if (si == 1 && bs == 32) {
    const int64_t nc = (I + 7) / 8;
    at::parallel_for(0, O * nb * nc, 16, [&](int64_t begin, int64_t end) {
      for (int64_t idx = begin; idx < end; ++idx) {
        const int64_t o = idx / (nb * nc), rest = idx % (nb * nc);
        const int64_t k0 = (rest / nc) * bs, i0 = (rest % nc) * 8;
        lanes8(xp + o * so + k0 * sk + i0, sk, op + o * oo + k0 * ok + i0 * oi, ok, oi,
               std::min<int64_t>(bs, K - k0), std::min<int64_t>(8, I - i0), f);
      }
    });
    return;
  }
  const int64_t nc = (I + kColumns - 1) / kColumns;
  at::parallel_for(0, O * nb * nc, 16, [&](int64_t begin, int64_t end) {
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t o = idx / (nb * nc), rest = idx % (nb * nc);
      const int64_t k0 = (rest / nc) * bs, i0 = (rest % nc) * kColumns;
      tile(xp + o * so + k0 * sk + i0 * si, sk, si, op + o * oo + k0 * ok + i0 * oi, ok, oi,
           std::min<int64_t>(bs, K - k0), std::min<int64_t>(kColumns, I - i0), f);
    }
  });
}

template <typename In>
void run_in(const at::Tensor& x, at::Tensor& out, int bs, const Format& f) {
  switch (out.scalar_type()) {
    case at::kFloat: run<In, float>(x, out, bs, f); break;
    case at::kBFloat16: run<In, at::BFloat16>(x, out, bs, f); break;
    case at::kHalf: run<In, at::Half>(x, out, bs, f); break;
    default: TORCH_CHECK(false, "fused_cpu: unsupported output dtype ", out.scalar_type());
  }
}

// ---- corrections: macro-block scaling and outlier fallback, fused ------------------------------------------

constexpr int kMaxGroup = 1024;  // elements of one macro-block group (blocks * block size)

// macro_block's candidate scale of a group with max magnitude `amax`: the BF16 value >= the significand of
// max(amax / max_value, 2^-126) (in [1, 2): the group's largest block lands on the top grid point).
inline float macro_candidate(float amax, float max_value) {
  float ratio = amax / max_value;
  const float tiny = from_bits(0x00800000u);
  ratio = ratio < tiny ? tiny : ratio;
  const float mant = from_bits((bits_of(ratio) & 0x007FFFFFu) | 0x3F800000u);
  const uint16_t b = bf16_bits(mant);
  const float down = from_bits(uint32_t(b) << 16);
  return down >= mant ? down : from_bits(uint32_t(b + 1) << 16);
}

// One block of y (float32, finite) quantized as the reference's block path does with an extra factor m on
// the scale: grid(y * 2^-e) * (2^e * m); its squared error against x (the group's unscaled elements),
// added in order to `err` in float64.
inline void block_times(const float* y, const float* x, float* v, int n, float m, const Format& f, double* err) {
  uint32_t a = 0;
  for (int j = 0; j < n; ++j) {
    const uint32_t ab = bits_of(y[j]) & 0x7FFFFFFFu;
    a = ab > a ? ab : a;
  }
  const int byte = shared_exponent(from_bits(a), f) + 127;
  const float scale = e8m0_value(byte), inverse = e8m0_value(std::min(254, std::max(0, 254 - byte)));
  const float eff = scale * m;
  double e = *err;
  for (int j = 0; j < n; ++j) {
    v[j] = round_to_grid(y[j] * inverse, f.emin, f.mbits, f.max_value) * eff;
    const double d = double(v[j]) - double(x[j]);
    e += d * d;
  }
  *err = e;
}

// One macro-block group of `blocks` blocks of bs (n real elements at stride sk of x, zero-padded) into out
// at stride ok: plain MX (m = 1) or MX with the group's candidate m, whichever has the smaller error energy
// (float64, summed element by element in order; plain wins ties). False where an element is not finite.
bool macro_group(const float* x, int64_t sk, float* out, int64_t ok, int n, int bs, int blocks, const Format& f) {
  float t[kMaxGroup], y[kMaxGroup], plain[kMaxGroup], macro[kMaxGroup];
  const int total = bs * blocks;
  uint32_t a = 0;
  for (int j = 0; j < total; ++j) {
    t[j] = j < n ? x[j * sk] : 0.0f;
    const uint32_t ab = bits_of(t[j]) & 0x7FFFFFFFu;
    a = ab > a ? ab : a;
  }
  if (a >= 0x7F800000u) return false;
  const float m = macro_candidate(from_bits(a), f.max_value);
  double e_plain = 0.0, e_macro = 0.0;
  for (int b = 0; b < blocks; ++b) block_times(t + b * bs, t + b * bs, plain + b * bs, bs, 1.0f, f, &e_plain);
  for (int j = 0; j < total; ++j) y[j] = t[j] / m;
  for (int b = 0; b < blocks; ++b) block_times(y + b * bs, t + b * bs, macro + b * bs, bs, m, f, &e_macro);
  const float* pick = e_macro < e_plain ? macro : plain;
  for (int j = 0; j < n; ++j) out[j * ok] = pick[j];
  return true;
}

// One block of x (n elements at stride sk): its largest magnitude (the first of equal ones, as torch's argmax
// picks it) marked in mask and zeroed in rest (both at stride ok); false where an element is not finite.
template <typename T>
bool split_max_block(const T* x, int64_t sk, bool* mask, int64_t mk, T* rest, int64_t ok, int64_t n) {
  int64_t top = 0;
  float best = -1.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float a = std::fabs(float(x[j * sk]));
    if (!(a <= 3.4028234663852886e38f)) return false;  // NaN or infinite
    if (a > best) best = a, top = j;
  }
  for (int64_t j = 0; j < n; ++j) {
    mask[j * mk] = j == top;
    rest[j * ok] = j == top ? T(0.0f) : x[j * sk];
  }
  return true;
}

// ---- error components (decompose.error_components), fused -------------------------------------------------

// One block's quantization q (as fake_quantize), its ideal-scale grid projection x_grid = G(x * max / amax) *
// amax / max (decompose._block_components: the ideal grid is 0 throughout an all-zero block), in the
// reference's order of float32 operations; false where an element is not finite.
inline bool block_grids(const float* t, int n, const Format& f, float* q, float* ideal, float* x_grid) {
  bool nonfinite;
  const float amax = from_bits(amax_bits(t, n, &nonfinite));
  if (nonfinite) return false;
  quantize_loaded(t, q, 1, n, f);
  const bool nonzero = amax > 0.0f;
  const float safe = nonzero ? amax : 1.0f;
  for (int j = 0; j < n; ++j) {
    ideal[j] = nonzero ? round_to_grid(t[j] * f.max_value / safe, f.emin, f.mbits, f.max_value) : 0.0f;
    x_grid[j] = ideal[j] * amax / f.max_value;
  }
  return true;
}

// The blocks and outputs of the component kernels: contiguous float32 [N, bs <= kMaxBlock], all one shape.
void check_blocks(const at::Tensor& x, std::initializer_list<at::Tensor> outputs) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(1) <= kMaxBlock,
              "fused_cpu: components take contiguous float32 blocks [N, bs <= ", kMaxBlock, "]");
  for (const auto& o : outputs)
    TORCH_CHECK(o.sizes() == x.sizes() && o.is_contiguous() && o.scalar_type() == at::kFloat,
                "fused_cpu: each component output must be a contiguous float32 tensor of the blocks' shape");
}

// Every block of x [N, n] (contiguous) quantized into q with its ideal grid and x_grid (block_grids), then
// body(offset of the block, x, q, ideal, x_grid, n), blocks in parallel; false where an element is not finite.
template <typename Body>
bool for_each_block(const at::Tensor& x, at::Tensor& q, const Format& f, Body body) {
  const int64_t N = x.size(0);
  const int n = int(x.size(1));
  const float* xp = x.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    float ideal[kMaxBlock], x_grid[kMaxBlock];
    for (int64_t b = begin; b < end && finite; ++b) {
      if (!block_grids(xp + b * n, n, f, qp + b * n, ideal, x_grid)) {
        finite = false;
        break;
      }
      body(b * n, xp + b * n, qp + b * n, ideal, x_grid, n);
    }
  });
  return finite;
}

}  // namespace

// The canonical form's components of float32 blocks x [N, bs] (contiguous), into contiguous q, e_scale,
// e_dead, e_grid: deadzone where the ideal grid is 0, grid noise x_grid - x elsewhere, scale bias q - x_grid.
// False (outputs unspecified) where x holds a non-finite element.
bool canonical_components_into(const at::Tensor& x, at::Tensor q, at::Tensor e_scale, at::Tensor e_dead,
                               at::Tensor e_grid, int64_t emin, int64_t emax, int64_t mbits, double max_value,
                               int64_t rule) {
  check_blocks(x, {q, e_scale, e_dead, e_grid});
  float *sp = e_scale.data_ptr<float>(), *dp = e_dead.data_ptr<float>(), *gp = e_grid.data_ptr<float>();
  return for_each_block(x, q, {int(emin), int(emax), int(mbits), float(max_value), int(rule)},
                        [&](int64_t at, const float* t, const float* qb, const float* ideal, const float* x_grid, int n) {
                          for (int j = 0; j < n; ++j) {
                            const bool dead = ideal[j] == 0.0f;
                            dp[at + j] = dead ? -t[j] : 0.0f;
                            gp[at + j] = dead ? 0.0f : x_grid[j] - t[j];
                            sp[at + j] = qb[j] - x_grid[j];
                          }
                        });
}

// The gain form's first pass over float32 blocks x [N, bs] (contiguous): q, and the two products whose sums
// over each block the reference takes with torch (left to torch, so that they are summed in its order):
// kept^2 and (scale-induced error) * kept, kept = x where the stored grid is non-zero (0 elsewhere).
bool gain_products_into(const at::Tensor& x, at::Tensor q, at::Tensor kept_sq, at::Tensor cross, int64_t emin,
                        int64_t emax, int64_t mbits, double max_value, int64_t rule) {
  check_blocks(x, {q, kept_sq, cross});
  float *kp = kept_sq.data_ptr<float>(), *cp = cross.data_ptr<float>();
  return for_each_block(x, q, {int(emin), int(emax), int(mbits), float(max_value), int(rule)},
                        [&](int64_t at, const float* t, const float* qb, const float*, const float* x_grid, int n) {
                          for (int j = 0; j < n; ++j) {
                            // the stored grid value is 0 exactly where q is (scales are >= 2^-127)
                            const bool dead = qb[j] == 0.0f;
                            const float kept = dead ? 0.0f : t[j];
                            const float induced = dead ? 0.0f : qb[j] - x_grid[j];
                            kp[at + j] = kept * kept;
                            cp[at + j] = induced * kept;
                          }
                        });
}

// The gain form's second pass: from x, q and each block's sums (norm = sum kept^2, cross = sum induced * kept,
// [N] contiguous) the gain g = cross / max(norm, tiny) (0 where norm is 0), e_scale = g * kept, e_dead = -x
// where the stored grid is 0, e_grid = (q - x) - e_scale where it is not.
void gain_components_into(const at::Tensor& x, const at::Tensor& q, const at::Tensor& norm, const at::Tensor& cross,
                          at::Tensor e_scale, at::Tensor e_dead, at::Tensor e_grid) {
  check_blocks(x, {q, e_scale, e_dead, e_grid});
  TORCH_CHECK(norm.is_contiguous() && cross.is_contiguous() && norm.scalar_type() == at::kFloat &&
                  cross.scalar_type() == at::kFloat && norm.numel() == x.size(0) && cross.numel() == x.size(0),
              "fused_cpu: the gain form's sums must be contiguous float32 [N], one per block");
  const int64_t N = x.size(0);
  const int n = int(x.size(1));
  const float *xp = x.data_ptr<float>(), *qp = q.data_ptr<float>(), *np = norm.data_ptr<float>(),
              *cp = cross.data_ptr<float>();
  float *sp = e_scale.data_ptr<float>(), *dp = e_dead.data_ptr<float>(), *gp = e_grid.data_ptr<float>();
  const float tiny = from_bits(0x00800000u);  // torch.finfo(torch.float32).tiny
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float nb = np[b];
      const float projection = cp[b] / (nb < tiny ? tiny : nb);
      const float gain = nb > 0.0f ? projection : 0.0f;
      for (int j = 0; j < n; ++j) {
        const float t = xp[b * n + j], qv = qp[b * n + j];
        const bool dead = qv == 0.0f;
        const float kept = dead ? 0.0f : t;
        const float es = gain * kept;
        sp[b * n + j] = es;
        dp[b * n + j] = dead ? -t : 0.0f;
        gp[b * n + j] = dead ? 0.0f : (qv - t) - es;
      }
    }
  });
}

// Macro-block scaling (rows 1, candidates max) of a float32 [O, K, I] view into out, groups of `blocks`
// blocks along K; false (out unspecified) where x holds a non-finite element.
bool macro_block_into(const at::Tensor& x, at::Tensor out, int64_t block_size, int64_t blocks, int64_t emin,
                      int64_t emax, int64_t mbits, double max_value, int64_t rule) {
  TORCH_CHECK(x.dim() == 3 && out.sizes() == x.sizes(), "fused_cpu: x and out must be [O, K, I] views of one shape");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "fused_cpu: macro_block takes float32");
  TORCH_CHECK(block_size >= 1 && blocks >= 1 && block_size * blocks <= kMaxGroup,
              "fused_cpu: a macro-block group holds at most ", kMaxGroup, " elements");
  const Format f{int(emin), int(emax), int(mbits), float(max_value), int(rule)};
  const int64_t O = x.size(0), K = x.size(1), I = x.size(2);
  const int64_t so = x.stride(0), sk = x.stride(1), si = x.stride(2);
  const int64_t oo = out.stride(0), ok = out.stride(1), oi = out.stride(2);
  const int64_t span = block_size * blocks, groups = (K + span - 1) / span;
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, O * groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t idx = begin; idx < end && finite; ++idx) {
      const int64_t o = idx / groups, k0 = (idx % groups) * span;
      const int n = int(std::min<int64_t>(span, K - k0));
      for (int64_t i = 0; i < I; ++i)
        if (!macro_group(xp + o * so + k0 * sk + i * si, sk, op + o * oo + k0 * ok + i * oi, ok, n, int(block_size),
                         int(blocks), f)) {
          finite = false;
          break;
        }
    }
  });
  return finite;
}

// Outlier fallback's split (one element a block) of an [O, K, I] view x (float32 or bfloat16) into mask and
// rest ([O, K, I] views, any strides), blocks along K; false (outputs unspecified) where x is not all finite.
bool split_max_into(const at::Tensor& x, at::Tensor mask, at::Tensor rest, int64_t block_size) {
  TORCH_CHECK(x.dim() == 3 && mask.sizes() == x.sizes() && rest.sizes() == x.sizes() &&
                  rest.scalar_type() == x.scalar_type() && mask.scalar_type() == at::kBool,
              "fused_cpu: x, mask (bool) and rest (x's dtype) must be [O, K, I] views of one shape");
  TORCH_CHECK(block_size >= 1, "fused_cpu: block size must be positive");
  const int64_t O = x.size(0), K = x.size(1), I = x.size(2);
  const int64_t so = x.stride(0), sk = x.stride(1), si = x.stride(2);
  const int64_t mo = mask.stride(0), mk = mask.stride(1), mi = mask.stride(2);
  const int64_t oo = rest.stride(0), ok = rest.stride(1), oi = rest.stride(2);
  const int64_t nb = (K + block_size - 1) / block_size;
  bool* mp = mask.data_ptr<bool>();
  std::atomic<bool> finite{true};
  auto run = [&](auto* xp, auto* rp) {
    at::parallel_for(0, O * nb, 64, [&](int64_t begin, int64_t end) {
      for (int64_t idx = begin; idx < end && finite; ++idx) {
        const int64_t o = idx / nb, k0 = (idx % nb) * block_size, n = std::min<int64_t>(block_size, K - k0);
        for (int64_t i = 0; i < I; ++i) {
          if (!split_max_block(xp + o * so + k0 * sk + i * si, sk, mp + o * mo + k0 * mk + i * mi, mk,
                               rp + o * oo + k0 * ok + i * oi, ok, n)) {
            finite = false;
            break;
          }
        }
      }
    });
  };
  switch (x.scalar_type()) {
    case at::kFloat: run(x.data_ptr<float>(), rest.data_ptr<float>()); break;
    case at::kBFloat16: run(x.data_ptr<at::BFloat16>(), rest.data_ptr<at::BFloat16>()); break;
    default: TORCH_CHECK(false, "fused_cpu: split_max takes float32 or bfloat16, got ", x.scalar_type());
  }
  return finite;
}

// Writes the fake-quantized x into out (both [O, K, I] CPU views, any strides, blocks along K).
void fake_quantize_into(const at::Tensor& x, at::Tensor out, int64_t block_size, int64_t emin, int64_t emax,
                        int64_t mbits, double max_value, int64_t rule) {
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "fused_cpu: CPU tensors only");
  TORCH_CHECK(x.dim() == 3 && out.sizes() == x.sizes(), "fused_cpu: x and out must be [O, K, I] views of one shape");
  TORCH_CHECK(block_size >= 1 && block_size <= kMaxBlock, "fused_cpu: block size must be in [1, ", kMaxBlock, "]");
  TORCH_CHECK(rule >= 0 && rule <= 3, "fused_cpu: rule must be 0 (floor), 1 (ceil), 2 (even) or 3 (rceil)");
  const Format f{int(emin), int(emax), int(mbits), float(max_value), int(rule)};
  const int bs = int(block_size);
  switch (x.scalar_type()) {
    case at::kFloat: run_in<float>(x, out, bs, f); break;
    case at::kBFloat16: run_in<at::BFloat16>(x, out, bs, f); break;
    case at::kHalf: run_in<at::Half>(x, out, bs, f); break;
    default: TORCH_CHECK(false, "fused_cpu: unsupported input dtype ", x.scalar_type());
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fake_quantize_into", &fake_quantize_into, "fake-quantize an [O, K, I] view into out, blocks along K");
  m.def("macro_block_into", &macro_block_into, "macro-block scaling (rows 1, candidates max) of an [O, K, I] view");
  m.def("canonical_components_into", &canonical_components_into, "the canonical form's error components of blocks");
  m.def("gain_products_into", &gain_products_into, "the gain form's first pass: q and the products to sum per block");
  m.def("gain_components_into", &gain_components_into, "the gain form's second pass: the components from the sums");
  m.def("split_max_into", &split_max_into, "each block's largest element of an [O, K, I] view: its mask, and x without it");
}
