// The CPU fast path of mxfp4.numerics.fused_cpu: fake-quantization to an E8M0-scaled block format in one
// pass over the input, the same float32 operations as the PyTorch reference (reference.quantize_blocks),
// element for element, so the results are equal bit for bit:
//   amax -> shared exponent (rule) -> E8M0 scale 2^e and its inverse 2^-e (both from their bytes)
//   -> y = x * 2^-e -> round y onto the element grid (nearest, ties to even, saturating) -> q * 2^e.
// A block with a NaN or infinite element is NaN throughout (the reference's NaN scale times zero).
// Every operation is an exact IEEE float32 one (multiplications by powers of two, one rounding to an
// integer), so the instruction set the compiler picks does not change a bit.
// ATen and the operator registry only, not <torch/extension.h>: the kernel needs no pybind11 or torch C++
// API, and those headers tripled the one-off build (about 50 s of the compile on a 2-core machine).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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

// 2^-e for the scale 2^e of a byte from shared_exponent (e in [-127, 127], so byte and 254 - byte are in
// [0, 254]): exact, the reference's division by the scale as a product.
inline float e8m0_inverse(int byte) { return e8m0_value(254 - byte); }

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

// A finite float32 rounded to bfloat16 and back: outlier fallback's kept element, as the quantizer keeps a
// float32 x's (x.to(torch.bfloat16).to(x.dtype)).
inline float bf16_rounded(float v) { return from_bits(uint32_t(bf16_bits(v)) << 16); }

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
  quantize_block(t, out, ok, n, e8m0_value(byte), e8m0_inverse(byte), f);
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

// One block of y (float32, finite) quantized into v (y itself allowed) as the reference's block path does with an
// extra factor m on the scale: grid(y * 2^-e) * (2^e * m).
inline void block_times(const float* y, float* v, int n, float m, const Format& f) {
  uint32_t a = 0;
  for (int j = 0; j < n; ++j) {
    const uint32_t ab = bits_of(y[j]) & 0x7FFFFFFFu;
    a = ab > a ? ab : a;
  }
  const int byte = shared_exponent(from_bits(a), f) + 127;
  const float scale = e8m0_value(byte), inverse = e8m0_inverse(byte);
  const float eff = scale * m;
  for (int j = 0; j < n; ++j) v[j] = round_to_grid(y[j] * inverse, f.emin, f.mbits, f.max_value) * eff;
}

// Vectors of the compiler's extension (GCC, Clang): the reductions below in vector registers on any target,
// where the auto-vectorizer leaves them scalar (a float64 sum whose order is not the source's, an index search).
typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

template <typename V, typename T>
inline V load_vector(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// Whether macro-block scaling beats plain MX on a group: its error energy against x, summed in float64 element by
// element in order, below plain's (the reference's sequential cumulative sums; plain wins ties). The terms are
// the same float64 values in every order (each difference and square computed alike), non-negative and never
// subnormal (a non-zero difference of float32 values is at least 2^-149), so any order of summing n of them is
// within (n - 1) u / (1 - (n - 1) u) of the exact sum of those terms, relative (u = 2^-53). Partial sums in vector
// lanes decide wherever the two energies differ by more than both summations' error (the margin 2^-40 >
// 4 (n - 1) u for n <= kMaxGroup, with room for the comparison's own rounding); near a tie, the sequential
// sums do.
inline bool macro_beats_plain(const float* x, const float* plain, const float* macro, int n) {
  v4d sp0 = {0, 0, 0, 0}, sp1 = sp0, sm0 = sp0, sm1 = sp0;
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const v4d x0 = __builtin_convertvector(load_vector<v4f>(x + j), v4d);
    const v4d x1 = __builtin_convertvector(load_vector<v4f>(x + j + 4), v4d);
    const v4d p0 = __builtin_convertvector(load_vector<v4f>(plain + j), v4d) - x0;
    const v4d p1 = __builtin_convertvector(load_vector<v4f>(plain + j + 4), v4d) - x1;
    const v4d m0 = __builtin_convertvector(load_vector<v4f>(macro + j), v4d) - x0;
    const v4d m1 = __builtin_convertvector(load_vector<v4f>(macro + j + 4), v4d) - x1;
    sp0 += p0 * p0;
    sp1 += p1 * p1;
    sm0 += m0 * m0;
    sm1 += m1 * m1;
  }
  const v4d sp = sp0 + sp1, sm = sm0 + sm1;
  double e_plain = (sp[0] + sp[1]) + (sp[2] + sp[3]), e_macro = (sm[0] + sm[1]) + (sm[2] + sm[3]);
  for (; j < n; ++j) {
    const double v = double(x[j]), dp = double(plain[j]) - v, dm = double(macro[j]) - v;
    e_plain += dp * dp;
    e_macro += dm * dm;
  }
  constexpr double kMargin = 1.0 + 0x1p-40;
  if (e_macro * kMargin < e_plain) return true;
  if (e_plain * kMargin < e_macro || e_macro == 0.0) return false;  // zero: every term is, in both orders
  double seq_plain = 0.0, seq_macro = 0.0;
  for (j = 0; j < n; ++j) {
    const double v = double(x[j]), dp = double(plain[j]) - v, dm = double(macro[j]) - v;
    seq_plain += dp * dp;
    seq_macro += dm * dm;
  }
  return seq_macro < seq_plain;
}

// The index of the first element of the largest magnitude among n (as torch's argmax picks it): the largest
// magnitude's bits, then the least index holding them, each a reduction in vector lanes.
inline int first_max(const float* t, int n) {
  if (n % 8 != 0) {
    uint32_t best = 0;
    int at = 0;
    for (int j = 0; j < n; ++j) {
      const uint32_t ab = bits_of(t[j]) & 0x7FFFFFFFu;
      if (ab > best) best = ab, at = j;
    }
    return at;
  }
  const v8u magnitude = {0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu,
                         0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x7FFFFFFFu};
  v8u most = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < n; j += 8) {
    const v8u a = load_vector<v8u>(t + j) & magnitude;
    most = a > most ? a : most;
  }
  uint32_t best = 0;
  for (int l = 0; l < 8; ++l) best = std::max(best, uint32_t(most[l]));
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  v8i at = lane * 0 + n;
  for (int j = 0; j < n; j += 8) {
    const v8i index = lane + j;
    const v8i hit = (load_vector<v8u>(t + j) & magnitude) == best;
    at = hit && index < at ? index : at;
  }
  int first = n;
  for (int l = 0; l < 8; ++l) first = std::min(first, int(at[l]));
  return first;
}

// The first largest magnitude of t's n elements taken out of t (zeroed, by vector selects: a scalar store into
// what the quantization then loads as vectors would stall the load on each block); its index.
inline int take_max(float* t, int n, float* kept) {
  const int at = first_max(t, n);
  *kept = t[at];
  if (n % 8 != 0) {
    t[at] = 0.0f;
    return at;
  }
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int j = 0; j < n; j += 8) {
    const v8u v = load_vector<v8u>(t + j);
    const v8u rest = lane + j == at ? v8u{0, 0, 0, 0, 0, 0, 0, 0} : v;
    std::memcpy(t + j, &rest, sizeof(rest));
  }
  return at;
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
  for (int b = 0; b < blocks; ++b) block_times(t + b * bs, plain + b * bs, bs, 1.0f, f);
  for (int j = 0; j < total; ++j) y[j] = t[j] / m;
  for (int b = 0; b < blocks; ++b) block_times(y + b * bs, macro + b * bs, bs, m, f);
  const float* pick = macro_beats_plain(t, plain, macro, total) ? macro : plain;
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

// ---- outlier fallback and macro-block scaling in one pass, eight groups a time --------------------------

constexpr int kLanes = 8;
constexpr int kMaxLaneSpan = 256;  // elements of one group on the lane path (macro-block groups of up to 8 blocks)

// block_times on eight groups side by side, one lane each: rows j0 .. j0 + n of y quantized into v (y itself
// allowed), lane c with the factor m[c] (1: plain MX, exactly, since 2^e * 1 is 2^e).
__attribute__((always_inline)) inline void lane_block_times(const float (*y)[kLanes], float (*v)[kLanes], int j0,
                                                            int n, const float* m, const Format& f) {
  uint32_t a[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = j0; j < j0 + n; ++j)
    for (int c = 0; c < kLanes; ++c) {
      const uint32_t ab = bits_of(y[j][c]) & 0x7FFFFFFFu;
      a[c] = ab > a[c] ? ab : a[c];
    }
  float eff[kLanes], inverse[kLanes];
  for (int c = 0; c < kLanes; ++c) {
    const int byte = shared_exponent(from_bits(a[c]), f) + 127;
    eff[c] = e8m0_value(byte) * m[c];
    inverse[c] = e8m0_inverse(byte);
  }
  for (int j = j0; j < j0 + n; ++j)
    for (int c = 0; c < kLanes; ++c)
      v[j][c] = round_to_grid(y[j][c] * inverse[c], f.emin, f.mbits, f.max_value) * eff[c];
}

// Eight groups of `span` elements side by side, one vector lane a group (element j of group c at
// lane[c][j * sk]), quantized as the torch path of the quantizer composes the corrections: with `split`,
// each 32-block's largest magnitude (the first of equal ones) is kept and zeroed in the rest; the rest is
// quantized plain (blocks == 0) or with macro-block scaling (the group's candidate m against m = 1, their
// error energies summed in float64 element by element in order, the rule of corrections.macro_block; plain
// wins ties); the kept elements are written rounded to bfloat16. Per lane, the work the one-group path
// does, but each loop runs across the eight lanes, so the float64 sums are eight independent sequential
// sums in vector registers. Lanes c >= cols are zeros and not stored; n real elements per group (the rest
// of the span is the zero padding of the torch path's groups). False where an element is not finite.
template <bool kSplit, bool kMacro>
bool corrected_lanes(const float* const* lane, int64_t sk, float* const* olane, int64_t ok, int n, int span,
                     int bs, int cols, const Format& f) {
  alignas(32) float t[kMaxLaneSpan][kLanes], plain[kMaxLaneSpan][kLanes];
  alignas(32) float macro[kMacro ? kMaxLaneSpan : 1][kLanes];
  // eight adjacent columns in and out (blocks along a non-last axis of a contiguous tensor): one vector a row
  bool packed = cols == kLanes;
  for (int c = 1; c < kLanes && packed; ++c) packed = lane[c] == lane[0] + c && olane[c] == olane[0] + c;
  if (packed) {
    for (int j = 0; j < n; ++j) {
      std::memcpy(t[j], lane[0] + j * sk, sizeof(t[j]));
      __builtin_prefetch(lane[0] + j * sk + 4 * kLanes);  // the row's next lane sets: too many streams to detect
    }
    for (int j = n; j < span; ++j)
      for (int c = 0; c < kLanes; ++c) t[j][c] = 0.0f;
  } else {
    for (int j = 0; j < span; ++j)
      for (int c = 0; c < kLanes; ++c) t[j][c] = (j < n && c < cols) ? lane[c][j * sk] : 0.0f;
  }
  uint32_t nonfinite = 0;
  for (int j = 0; j < n; ++j)
    for (int c = 0; c < kLanes; ++c) nonfinite |= uint32_t((bits_of(t[j][c]) & 0x7FFFFFFFu) >= 0x7F800000u);
  if (nonfinite) return false;
  const int nb = span / bs;
  int top[kSplit ? kMaxLaneSpan : 1][kLanes];
  float kept[kSplit ? kMaxLaneSpan : 1][kLanes];
  if constexpr (kSplit) {  // each block's largest magnitude (strictly greater: the first of equal ones)
    for (int b = 0; b < nb; ++b) {
      int32_t best[kLanes], at[kLanes];  // magnitudes' bits are below 2^31: signed lanes compare them alike
      for (int c = 0; c < kLanes; ++c) best[c] = 0, at[c] = b * bs;
      for (int j = b * bs; j < (b + 1) * bs; ++j)
        for (int c = 0; c < kLanes; ++c) {
          const int32_t ab = int32_t(bits_of(t[j][c]) & 0x7FFFFFFFu);
          const bool more = ab > best[c];
          best[c] = more ? ab : best[c];
          at[c] = more ? j : at[c];
        }
      for (int c = 0; c < kLanes; ++c) top[b][c] = at[c];
      for (int c = 0; c < kLanes; ++c) kept[b][c] = t[top[b][c]][c];
      // the torch path's rest: zeros_like(x) where the mask is set (by vector selects, row by row: a scalar
      // store into the rows the quantization then loads as vectors would stall those loads)
      const v8i where = load_vector<v8i>(at);
      for (int j = b * bs; j < (b + 1) * bs; ++j) {
        const v8f row = where == j ? v8f{0, 0, 0, 0, 0, 0, 0, 0} : load_vector<v8f>(t[j]);
        std::memcpy(t[j], &row, sizeof(row));
      }
    }
  }
  // plain MX of the rest, block by block: grid(y * 2^-e) * 2^e as the reference computes it
  const float one[kLanes] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (int b = 0; b < nb; ++b) lane_block_times(t, plain, b * bs, bs, one, f);
  bool use_macro[kLanes] = {false, false, false, false, false, false, false, false};
  if constexpr (kMacro) {
    uint32_t g[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < span; ++j)
      for (int c = 0; c < kLanes; ++c) {
        const uint32_t ab = bits_of(t[j][c]) & 0x7FFFFFFFu;
        g[c] = ab > g[c] ? ab : g[c];
      }
    float m[kLanes];
    for (int c = 0; c < kLanes; ++c) m[c] = macro_candidate(from_bits(g[c]), f.max_value);
    for (int b = 0; b < nb; ++b) {
      for (int j = b * bs; j < (b + 1) * bs; ++j)
        for (int c = 0; c < kLanes; ++c) macro[j][c] = t[j][c] / m[c];  // y = x / m, as the torch path divides
      lane_block_times(macro, macro, b * bs, bs, m, f);
    }
    double e_plain[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0}, e_macro[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < span; ++j)
      for (int c = 0; c < kLanes; ++c) {
        const double x = double(t[j][c]), dp = double(plain[j][c]) - x, dm = double(macro[j][c]) - x;
        e_plain[c] += dp * dp;
        e_macro[c] += dm * dm;
      }
    for (int c = 0; c < kLanes; ++c) use_macro[c] = e_macro[c] < e_plain[c];
  }
  if (packed) {  // each row's eight outputs (plain or macro per lane) in one vector store, the kept ones after
    v8i pick = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < kLanes; ++c) pick[c] = use_macro[c] ? -1 : 0;
    for (int j = 0; j < n; ++j) {
      v8f v = load_vector<v8f>(plain[j]);
      if constexpr (kMacro) v = pick != 0 ? load_vector<v8f>(macro[j]) : v;
      std::memcpy(olane[0] + j * ok, &v, sizeof(v));
    }
    if constexpr (kSplit) {
      for (int b = 0; b < nb; ++b)
        for (int c = 0; c < kLanes; ++c)
          if (top[b][c] < n) olane[c][top[b][c] * ok] = bf16_rounded(kept[b][c]);
    }
    return true;
  }
  for (int c = 0; c < cols; ++c) {
    float* o = olane[c];
    const bool pick_macro = kMacro && use_macro[c];
    if constexpr (kSplit) {
      for (int b = 0; b < nb; ++b) {  // the kept elements, rounded to bfloat16 (finite: no NaN case)
        float* src = pick_macro ? &macro[0][0] : &plain[0][0];
        src[top[b][c] * kLanes + c] = bf16_rounded(kept[b][c]);
      }
    }
    const float* src = pick_macro ? &macro[0][c] : &plain[0][c];
    if (ok == 1) {
      for (int j = 0; j < n; ++j) o[j] = src[j * kLanes];
    } else {
      for (int j = 0; j < n; ++j) o[j * ok] = src[j * kLanes];
    }
  }
  return true;
}

// One group of `span` contiguous elements (n real, the rest zero padding) into contiguous out: what
// corrected_lanes computes for one lane, with the elements along the vector (no transposition): the plain
// blocks through quantize_loaded (the plain kernel's path, equal to the reference), the two float64 error sums
// sequential in the group's order. False where an element is not finite.
template <bool kSplit, bool kMacro>
bool corrected_row(const float* x, float* out, int n, int span, int bs, const Format& f) {
  alignas(32) float t[kMaxLaneSpan], plain[kMaxLaneSpan];
  alignas(32) float macro[kMacro ? kMaxLaneSpan : 1];
  uint32_t any = 0;
  for (int j = 0; j < n; ++j) {
    t[j] = x[j];
    any = std::max(any, bits_of(t[j]) & 0x7FFFFFFFu);
  }
  if (any >= 0x7F800000u) return false;
  for (int j = n; j < span; ++j) t[j] = 0.0f;
  const int nb = span / bs;
  int top[kSplit ? kMaxLaneSpan : 1];
  float kept[kSplit ? kMaxLaneSpan : 1];
  if constexpr (kSplit) {
    for (int b = 0; b < nb; ++b) top[b] = b * bs + take_max(t + b * bs, bs, kept + b);
  }
  for (int b = 0; b < nb; ++b) quantize_loaded(t + b * bs, plain + b * bs, 1, bs, f);
  const float* pick = plain;
  if constexpr (kMacro) {
    uint32_t g = 0;
    for (int j = 0; j < span; ++j) g = std::max(g, bits_of(t[j]) & 0x7FFFFFFFu);
    const float m = macro_candidate(from_bits(g), f.max_value);
    for (int j = 0; j < span; ++j) macro[j] = t[j] / m;
    for (int b = 0; b < nb; ++b) block_times(macro + b * bs, macro + b * bs, bs, m, f);
    if (macro_beats_plain(t, plain, macro, span)) pick = macro;
  }
  for (int j = 0; j < n; ++j) out[j] = pick[j];
  if constexpr (kSplit) {
    for (int b = 0; b < nb; ++b)
      if (top[b] < n) out[top[b]] = bf16_rounded(kept[b]);
  }
  return true;
}

// Outlier fallback (one element a block) and/or macro-block scaling (rows 1, candidates max: `blocks` > 0)
// of a float32 [O, K, I] view x into out, blocks of block_size along K: the torch path's composition
// (Quantizer._quantize) in one pass. False (out unspecified) where x holds a non-finite element.
bool corrected_into(const at::Tensor& x, at::Tensor out, int64_t block_size, bool split, int64_t blocks,
                    int64_t emin, int64_t emax, int64_t mbits, double max_value, int64_t rule) {
  TORCH_CHECK(x.dim() == 3 && out.sizes() == x.sizes(), "fused_cpu: x and out must be [O, K, I] views of one shape");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "fused_cpu: the corrected kernel takes float32");
  const int64_t per_group = blocks > 0 ? blocks : 1;
  TORCH_CHECK(block_size >= 1 && block_size <= kMaxBlock && block_size * per_group <= kMaxLaneSpan,
              "fused_cpu: a group on the lane path holds at most ", kMaxLaneSpan, " elements");
  TORCH_CHECK(split || blocks > 0, "fused_cpu: the corrected kernel needs the split, macro-block groups or both");
  const Format f{int(emin), int(emax), int(mbits), float(max_value), int(rule)};
  const int64_t O = x.size(0), K = x.size(1), I = x.size(2);
  const int64_t so = x.stride(0), sk = x.stride(1), si = x.stride(2);
  const int64_t oo = out.stride(0), ok = out.stride(1), oi = out.stride(2);
  const int bs = int(block_size), span = int(block_size * per_group);
  const int64_t groups = (K + span - 1) / span;
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  auto kernel = split ? (blocks > 0 ? &corrected_lanes<true, true> : &corrected_lanes<true, false>)
                      : &corrected_lanes<false, true>;
  auto row = split ? (blocks > 0 ? &corrected_row<true, true> : &corrected_row<true, false>)
                   : &corrected_row<false, true>;
  const bool contiguous = I == 1 && sk == 1 && ok == 1;
  std::atomic<bool> finite{true};
  // lanes: eight columns i of one (o, group) where I > 1; else eight groups of the flattened (o, group) list
  const int64_t lane_sets = I > 1 ? O * groups * ((I + kLanes - 1) / kLanes) : (O * groups + kLanes - 1) / kLanes;
  at::parallel_for(0, lane_sets, 8, [&](int64_t begin, int64_t end) {
    for (int64_t idx = begin; idx < end && finite; ++idx) {
      if (I > 1) {
        const float* in[kLanes];
        float* dst[kLanes];
        const int64_t per = (I + kLanes - 1) / kLanes, o = idx / (groups * per), rest = idx % (groups * per);
        const int64_t k0 = (rest / per) * span, i0 = (rest % per) * kLanes;
        const int cols = int(std::min<int64_t>(kLanes, I - i0)), n = int(std::min<int64_t>(span, K - k0));
        for (int c = 0; c < cols; ++c) {
          in[c] = xp + o * so + k0 * sk + (i0 + c) * si;
          dst[c] = op + o * oo + k0 * ok + (i0 + c) * oi;
        }
        if (!kernel(in, sk, dst, ok, n, span, bs, cols, f)) finite = false;
        continue;
      }
      // I == 1: eight groups of the flattened (o, group) list: one after another along a contiguous axis,
      // else gathered into lanes (a short group, the row's last, alone with its own n)
      const int64_t g0 = idx * kLanes, g1 = std::min<int64_t>(g0 + kLanes, O * groups);
      const float* in[kLanes];
      float* dst[kLanes];
      int cols = 0;
      for (int64_t gi = g0; gi < g1; ++gi) {
        const int64_t o = gi / groups, k0 = (gi % groups) * span;
        const int gn = int(std::min<int64_t>(span, K - k0));
        if (contiguous) {
          if (!row(xp + o * so + k0, op + o * oo + k0, gn, span, bs, f)) finite = false;
        } else if (gn < span) {
          const float* one[kLanes] = {xp + o * so + k0 * sk};
          float* out1[kLanes] = {op + o * oo + k0 * ok};
          if (!kernel(one, sk, out1, ok, gn, span, bs, 1, f)) finite = false;
        } else {
          in[cols] = xp + o * so + k0 * sk;
          dst[cols++] = op + o * oo + k0 * ok;
        }
      }
      if (cols && !kernel(in, sk, dst, ok, span, span, bs, cols, f)) finite = false;
    }
  });
  return finite;
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

// The element grid of stochastic rounding: the low mantissa bits below a binade's step, the step and its inverse
// below emin, the largest value, emin and the mantissa bits (by value: nothing the loop below stores aliases them).
struct StochasticGrid {
  uint32_t low_bits;
  float sub_step, sub_inverse, top;
  int e_min, m_bits;
};

// One block's stochastic rounding (the reference's fake_quantize_stochastic): y = x / scale; |y| between its grid
// neighbours lo and hi; hi where the draw u < (|y| - lo) / (hi - lo), else lo; the sign put back, times the scale.
// The reference's divisions are all by powers of two (the scale, the grid step, hi - lo = step), so each is the
// product with the exact inverse, rounded once alike; both sides of its branch on the grid's binade are computed
// and selected, so the loop vectorizes.
inline void stochastic_block(const float* __restrict t, const float* __restrict u, float* __restrict r, int n,
                             float scale, float inverse, const StochasticGrid g) {
  int j = 0;
  // eight elements a time as explicit vector selects (the compiler keeps the scalar loop's selects as branches),
  // the same operations lane by lane (a vector cast reinterprets the bits; a truncating conversion is floor for
  // the non-negative values below 2^24 it sees)
  const v8u sign = v8u{} + 0x80000000u, low = v8u{} + g.low_bits;
  const v8i zero_i = v8i{};
  for (; j + 8 <= n; j += 8) {
    const v8f y = load_vector<v8f>(t + j) * inverse;
    const v8u yb = ((v8u)(y));
    v8f a = ((v8f)(yb & ~sign));
    const v8f top = v8f{} + g.top;
    a = a < top ? a : top;
    const v8u ab = ((v8u)(a));
    const v8i e = ((v8i)(ab >> 23)) - 127;
    const v8i on = e >= g.e_min;
    v8f scaled = a * g.sub_inverse;
    const v8f most = v8f{} + 0x1p24f;
    scaled = scaled < most ? scaled : most;
    const v8f lo_sub = __builtin_convertvector(__builtin_convertvector(scaled, v8i), v8f) * g.sub_step;
    const v8u ab_low = ab & ~low;
    const v8f lo = on != zero_i ? ((v8f)(ab_low)) : lo_sub;
    const v8i step_field = e - g.m_bits + 127, inverse_field = g.m_bits - e + 127;
    const v8u step_bits = ((v8u)(step_field < 1 ? v8i{} + 1 : step_field)) << 23;
    const v8u inverse_bits = ((v8u)(inverse_field > 254 ? v8i{} + 254 : inverse_field)) << 23;
    const v8f step = on != zero_i ? ((v8f)(step_bits)) : v8f{} + g.sub_step;
    const v8f step_inverse = on != zero_i ? ((v8f)(inverse_bits)) : v8f{} + g.sub_inverse;
    const v8f hi = lo < top ? lo + step : lo;
    const v8f p = hi > lo ? (a - lo) * step_inverse : v8f{};
    const v8f q = load_vector<v8f>(u + j) < p ? hi : lo;
    const v8u qb = ((v8u)(q)) | (yb & sign);
    const v8f out = ((v8f)(qb)) * scale;
    std::memcpy(r + j, &out, sizeof(out));
  }
  for (; j < n; ++j) {
    const float y = t[j] * inverse;
    const float a = std::min(std::fabs(y), g.top);
    const int e = int((bits_of(a) >> 23) & 0xFF) - 127;
    const bool on_grid_binade = e >= g.e_min;
    const float lo = on_grid_binade ? from_bits(bits_of(a) & ~g.low_bits) : std::floor(a * g.sub_inverse) * g.sub_step;
    const float step = on_grid_binade ? from_bits(uint32_t(std::max(e - g.m_bits + 127, 1)) << 23) : g.sub_step;
    const float step_inverse = on_grid_binade ? from_bits(uint32_t(std::min(g.m_bits - e + 127, 254)) << 23)
                                              : g.sub_inverse;
    const float hi = lo < g.top ? lo + step : lo;
    const float p = hi > lo ? (a - lo) * step_inverse : 0.0f;
    const float q = u[j] < p ? hi : lo;
    r[j] = std::copysign(q, y) * scale;
  }
}

// Stochastic rounding (reference.fake_quantize_stochastic) of a float32 [O, K, I] view x into out, blocks of
// block_size along K, with the reference's uniform draws u: contiguous [O, I, blocks along K, block_size], its
// blocks' layout. Per block: the E8M0 scale 2^e of its max, y = x / 2^e (the product with the exact 2^-e: the
// reference's division, rounded alike), |y| clamped at max_value between the grid values lo <= |y| < hi (lo: |y|
// with the mantissa bits below the element's cleared, or a multiple of the subnormal step; hi = lo + step, lo at
// max_value), up with probability (|y| - lo) / (hi - lo) when u is below it, the sign of y kept, times 2^e. False
// (out unspecified) where x holds a non-finite element (stochastic_block: one block).
bool stochastic_into(const at::Tensor& x, const at::Tensor& u, at::Tensor out, int64_t block_size, int64_t emin,
                     int64_t emax, int64_t mbits, double max_value, int64_t rule) {
  TORCH_CHECK(x.dim() == 3 && out.sizes() == x.sizes(), "fused_cpu: x and out must be [O, K, I] views of one shape");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat && u.scalar_type() == at::kFloat &&
                  u.is_contiguous(), "fused_cpu: stochastic rounding takes float32 x, out and contiguous draws");
  TORCH_CHECK(block_size >= 1 && block_size <= kMaxBlock, "fused_cpu: block size must be in [1, ", kMaxBlock, "]");
  const Format f{int(emin), int(emax), int(mbits), float(max_value), int(rule)};
  const int64_t O = x.size(0), K = x.size(1), I = x.size(2), bs = block_size, nb = (K + bs - 1) / bs;
  TORCH_CHECK(u.numel() == O * I * nb * bs, "fused_cpu: the draws must hold one value per padded block element");
  const int64_t so = x.stride(0), sk = x.stride(1), si = x.stride(2);
  const int64_t oo = out.stride(0), ok = out.stride(1), oi = out.stride(2);
  const float* xp = x.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const StochasticGrid grid{(1u << (23 - f.mbits)) - 1, from_bits(uint32_t(f.emin - f.mbits + 127) << 23),
                            from_bits(uint32_t(f.mbits - f.emin + 127) << 23), f.max_value, f.emin, f.mbits};
  std::atomic<bool> finite{true};
  at::parallel_for(0, O * I * nb, 64, [&](int64_t begin, int64_t end) {
    alignas(32) float t[kMaxBlock], r[kMaxBlock];
    for (int64_t idx = begin; idx < end && finite; ++idx) {
      const int64_t o = idx / (I * nb), i = (idx / nb) % I, kb = idx % nb, k0 = kb * bs;
      const int n = int(std::min<int64_t>(bs, K - k0));
      const float* xb = xp + o * so + k0 * sk + i * si;
      for (int j = 0; j < n; ++j) t[j] = xb[j * sk];
      bool nonfinite;
      const float amax = from_bits(amax_bits(t, n, &nonfinite));
      if (nonfinite) {
        finite = false;
        break;
      }
      const int byte = shared_exponent(amax, f) + 127;
      const float scale = e8m0_value(byte), inverse = e8m0_inverse(byte);
      stochastic_block(t, up + idx * bs, r, n, scale, inverse, grid);
      float* ob = op + o * oo + k0 * ok + i * oi;
      for (int j = 0; j < n; ++j) ob[j * ok] = r[j];
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

// macro_beats_plain on one group given as contiguous float32 vectors (the rule the kernels decide by, exposed to
// be checked against the reference's sequential sums on constructed near-ties).
bool macro_rule(const at::Tensor& x, const at::Tensor& plain, const at::Tensor& macro) {
  TORCH_CHECK(x.dim() == 1 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(0) <= kMaxGroup,
              "fused_cpu: the energy rule takes one contiguous float32 group of at most ", kMaxGroup, " elements");
  TORCH_CHECK(plain.sizes() == x.sizes() && macro.sizes() == x.sizes() && plain.is_contiguous() &&
                  macro.is_contiguous() && plain.scalar_type() == at::kFloat && macro.scalar_type() == at::kFloat,
              "fused_cpu: the candidates must be contiguous float32 vectors of the group's size");
  return macro_beats_plain(x.data_ptr<float>(), plain.data_ptr<float>(), macro.data_ptr<float>(), int(x.size(0)));
}

// Registered as torch.ops.mxfp4_fused_cpu.<name> (schemas inferred from the signatures).
TORCH_LIBRARY(mxfp4_fused_cpu, m) {
  m.def("fake_quantize_into", &fake_quantize_into);
  m.def("macro_block_into", &macro_block_into);
  m.def("canonical_components_into", &canonical_components_into);
  m.def("gain_products_into", &gain_products_into);
  m.def("gain_components_into", &gain_components_into);
  m.def("corrected_into", &corrected_into);
  m.def("stochastic_into", &stochastic_into);
  m.def("split_max_into", &split_max_into);
  m.def("macro_beats_plain", &macro_rule);
}
