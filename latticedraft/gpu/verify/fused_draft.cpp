// The self-draft's whole forward as one call: every layer's norms, rotary embedding, cache write,
// attention over the verifier's cache and activations written out as plain loops, with torch's
// weight-only int4 / int8 kernels (or a float product, for a fallback projection) in between.
// Built and loaded by fused_draft.py (g++ -O3 -march=native, torch's headers and libraries);
// the Python side is the documentation: shapes, layouts and what each argument holds.
//
// One token per row: h float32[b, H] (the embedded tokens) -> logits float32[b, V]. The cache is
// the verifier's store float32[L, 2, B, hk, C, d]; each layer writes its key and value at slot
// end - 1 and attends to slots [0, end) (mask bool[b, end], True = attend; none: all).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using Bf16 = c10::BFloat16;

enum Kind : int64_t { INT4 = 4, INT8 = 8, FLOAT = 32 };
enum Act : int64_t { SILU = 0, GELU_TANH = 1, GELU = 2 };

struct Proj {  // y [m, N] = x [m, K] W^T (+ bias): packed weights, scales, kind, group, bias
  Tensor packed, scales;
  int64_t kind = INT4, group = 32;
  std::vector<float> bias;  // [N] or empty

  // x bfloat16[m, K] -> bfloat16[m, N] (the bias not added)
  Tensor operator()(const Tensor& x) const {
    if (kind == INT4) return at::_weight_int4pack_mm_for_cpu(x, packed, group, scales);
    if (kind == INT8) return at::_weight_int8pack_mm(x, packed, scales);
    return at::matmul(x.to(at::kFloat), packed.t()).to(at::kBFloat16);
  }
};

struct Norm {
  Tensor w, b;  // float32[H]; b undefined for an RMS norm
};

struct Layer {
  Norm n1, n2;
  Proj qkv, o, up, down;
};

std::vector<float> floats(const Tensor& t) {  // a 0-element tensor: none
  if (!t.numel()) return {};
  Tensor f = t.to(at::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

inline float at_or_0(const std::vector<float>& v, int64_t i) { return v.empty() ? 0.f : v[i]; }

// e^x to about 2e-7 relative, 0 below -87 (so e^-inf = 0): arithmetic and bit operations only, so
// that it vectorizes inside a simd loop (libm's expf does not without -ffast-math).
inline float fast_exp(float x) {
  const float c = std::min(std::max(x, -87.f), 88.f) * 1.44269504089f;
  const float n = std::floor(c), f = c - n;
  const float p = 1.f + f * (0.693147181f + f * (0.240226507f + f * (0.0555041087f + f * (0.00961812911f +
                  f * (0.00133335581f + f * 0.000154035304f)))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.f ? 0.f : p * scale;
}

// One job of the attention: query heads q .. q + G d (one kv head's group) over slots t0 .. t0 + n
// of keys K and values V [C, d]; writes per query head (weighted values [d], max, sum) at
// out + g * stride.
struct Chunk {
  const float *K, *V, *q;
  const bool* mask;  // [slots] or null
  int64_t t0, n, G;
  float scale;
  float* scores;  // [G, n] scratch
  float* out;
  int64_t stride;
};

template <int D>
void chunk_attention(const Chunk& c, int64_t dyn = D) {
  const int64_t d = D ? D : dyn;
  constexpr float NEG = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < c.n; ++t) {
    const float* __restrict k = c.K + (c.t0 + t) * d;
    const bool off = c.mask && !c.mask[c.t0 + t];
    for (int64_t g = 0; g < c.G; ++g) {
      const float* __restrict q = c.q + g * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
      c.scores[g * c.n + t] = off ? NEG : dot * c.scale;
    }
  }
  for (int64_t g = 0; g < c.G; ++g) {
    float* __restrict sp = c.scores + g * c.n;
    float top = NEG, sum = 0.f;
#pragma omp simd reduction(max : top)
    for (int64_t t = 0; t < c.n; ++t) top = std::max(top, sp[t]);
    const float shift = top == NEG ? 0.f : top;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < c.n; ++t) {
      sp[t] = fast_exp(sp[t] - shift);
      sum += sp[t];
    }
    float acc[D ? D : 512] = {};
    for (int64_t t = 0; t < c.n; ++t) {
      const float e = sp[t];
      const float* __restrict v = c.V + (c.t0 + t) * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] += e * v[i];
    }
    float* out = c.out + g * c.stride;
    std::copy(acc, acc + d, out);
    out[d] = top, out[d + 1] = sum;
  }
}

class FusedDraft : public torch::CustomClassHolder {
 public:
  // weights: per layer 16 tensors (norm1 w, b; qkv packed, scales, bias; o ...; norm2 w, b; up ...;
  // down ...), then the final norm's w, b, the head's packed, scales, then cos, sin float32[P, d];
  // an absent tensor is a 0-element one. config: layers, hidden, heads, kv_heads, head_dim,
  // intermediate, vocab, rms (1) or layer norm (0), rotary, gated, act, then per layer and
  // projection (qkv, o, up, down) its kind and group, then the head's. floats: eps, scaling.
  FusedDraft(std::vector<Tensor> w, std::vector<int64_t> c, std::vector<double> f)
      : L_(c[0]), H_(c[1]), hq_(c[2]), hk_(c[3]), d_(c[4]), I_(c[5]), V_(c[6]), rms_(c[7] != 0),
        rotary_(c[8] != 0), gated_(c[9] != 0), act_(c[10]), eps_(static_cast<float>(f[0])),
        scale_(static_cast<float>(f[1])) {
    auto opt = [](const Tensor& t) { return t.numel() ? t.contiguous() : Tensor(); };
    size_t k = 0, q = 11;
    auto proj = [&]() {
      Proj p{w[k].contiguous(), w[k + 1].contiguous(), c[q], c[q + 1], floats(w[k + 2])};
      k += 3, q += 2;
      return p;
    };
    auto norm = [&]() {
      Norm n{w[k].contiguous().to(at::kFloat), opt(w[k + 1])};
      if (n.b.defined()) n.b = n.b.to(at::kFloat);
      k += 2;
      return n;
    };
    for (int64_t l = 0; l < L_; ++l) {
      Layer y;
      y.n1 = norm();
      y.qkv = proj();
      y.o = proj();
      y.n2 = norm();
      y.up = proj();
      y.down = proj();
      layers_.push_back(y);
    }
    final_ = norm();
    head_ = Proj{w[k].contiguous(), w[k + 1].contiguous(), c[q], c[q + 1], {}};
    k += 2;
    TORCH_CHECK(d_ <= 512 && hq_ % hk_ == 0, "head size above 512 or query heads not a multiple of kv heads");
    cos_ = opt(w[k]);
    sin_ = opt(w[k + 1]);
  }

  // h float32[b, H]; pos int64[b] (rotary positions); store float32[L, 2, B, hk, C, d]; end: the
  // slots in use after this token's; mask bool[b, end] or a 0-element tensor -> logits float32[b, V]
  Tensor forward(Tensor h, Tensor pos, Tensor store, int64_t end, Tensor mask) {
    TORCH_CHECK(h.dim() == 2 && h.size(1) == H_ && h.scalar_type() == at::kFloat, "h: float32[b, H]");
    TORCH_CHECK(store.is_contiguous() && store.scalar_type() == at::kFloat && store.size(0) == L_,
                "store: contiguous float32[L, 2, B, hk, C, d]");
    TORCH_CHECK(end >= 1 && end <= store.size(4), "end outside the cache");
    const int64_t b = h.size(0);
    h = h.contiguous().clone();
    const bool masked = mask.numel() > 0;
    if (masked) TORCH_CHECK(mask.scalar_type() == at::kBool && mask.size(0) == b && mask.size(1) >= end,
                            "mask: bool[b, end]");
    Tensor m = masked ? mask.contiguous() : mask;
    Tensor p = pos.to(at::kLong).contiguous();
    Tensor x = at::empty({b, H_}, h.options().dtype(at::kBFloat16));
    Tensor o = at::empty({b, hq_ * d_}, x.options());
    Tensor act = at::empty({b, I_}, x.options());
    q_.resize(b * hq_ * d_);
    for (int64_t l = 0; l < L_; ++l) {
      const Layer& y = layers_[l];
      normalize(h, y.n1, x);
      Tensor qkv = y.qkv(x);
      place(qkv, y.qkv.bias, p, store, l, end);
      attend(store, l, end, m, b, o);
      add(h, y.o(o), y.o.bias);
      normalize(h, y.n2, x);
      activate(y.up(x), y.up.bias, act);
      add(h, y.down(act), y.down.bias);
    }
    normalize(h, final_, x);
    return head_(x).to(at::kFloat);
  }

 private:
  // out bfloat16[b, H] = norm(h) (RMS: w * h / rms(h); layer: (h - mean) / std * w + b)
  void normalize(const Tensor& h, const Norm& n, Tensor& out) const {
    const int64_t b = h.size(0);
    const float* w = n.w.data_ptr<float>();
    const float* nb = n.b.defined() ? n.b.data_ptr<float>() : nullptr;
    for (int64_t r = 0; r < b; ++r) {
      const float* x = h.data_ptr<float>() + r * H_;
      Bf16* y = out.data_ptr<Bf16>() + r * H_;
      float mean = 0.f, ss = 0.f;
      if (!rms_) {
#pragma omp simd reduction(+ : mean)
        for (int64_t i = 0; i < H_; ++i) mean += x[i];
        mean /= H_;
      }
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < H_; ++i) ss += (x[i] - mean) * (x[i] - mean);
      const float inv = 1.f / std::sqrt(ss / H_ + eps_);
      for (int64_t i = 0; i < H_; ++i) y[i] = Bf16(w[i] * ((x[i] - mean) * inv) + (nb ? nb[i] : 0.f));
    }
  }

  // qkv bfloat16[b, (hq + 2 hk) d] (+ bias): q (rotated) into q_, k (rotated) and v into the store
  void place(const Tensor& qkv, const std::vector<float>& bias, const Tensor& pos, Tensor& store, int64_t l,
             int64_t end) {
    const int64_t b = qkv.size(0), B = store.size(2), C = store.size(4), w = (hq_ + 2 * hk_) * d_;
    const int64_t half = d_ / 2;
    float* S = store.data_ptr<float>();
    std::vector<float> row(d_);
    for (int64_t r = 0; r < b; ++r) {
      const Bf16* src = qkv.data_ptr<Bf16>() + r * w;
      const float* cs = rotary_ ? cos_.data_ptr<float>() + pos.data_ptr<int64_t>()[r] * d_ : nullptr;
      const float* sn = rotary_ ? sin_.data_ptr<float>() + pos.data_ptr<int64_t>()[r] * d_ : nullptr;
      for (int64_t head = 0; head < hq_ + 2 * hk_; ++head) {
        for (int64_t i = 0; i < d_; ++i) row[i] = static_cast<float>(src[head * d_ + i]) + at_or_0(bias, head * d_ + i);
        float* dst;
        if (head < hq_) {
          dst = q_.data() + (r * hq_ + head) * d_;
        } else {
          const int64_t kv = head < hq_ + hk_ ? 0 : 1, kh = kv ? head - hq_ - hk_ : head - hq_;
          dst = S + ((((l * 2 + kv) * B + r) * hk_ + kh) * C + (end - 1)) * d_;
        }
        if (rotary_ && head < hq_ + hk_) {
          for (int64_t i = 0; i < half; ++i) dst[i] = row[i] * cs[i] - row[i + half] * sn[i];
          for (int64_t i = half; i < d_; ++i) dst[i] = row[i] * cs[i] + row[i - half] * sn[i];
        } else {
          std::copy(row.begin(), row.end(), dst);
        }
      }
    }
  }

  // o bfloat16[b, hq d]: each query head's softmax(q K^T scale) V over slots [0, end). The slots
  // are split into chunks (flash-decoding) so that both threads have work at one row; a job reads
  // each key and value row once for its kv head's whole group of query heads; the chunks' partial
  // (max, sum, weighted values) are merged after.
  void attend(const Tensor& store, int64_t l, int64_t end, const Tensor& mask, int64_t b, Tensor& o) {
    RECORD_FUNCTION("fused_draft::attention", c10::ArrayRef<const c10::IValue>{});
    const int64_t B = store.size(2), C = store.size(4), G = hq_ / hk_;
    const int64_t threads = at::get_num_threads();
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((4 * threads + b * hk_ - 1) / (b * hk_), end / 32));
    const int64_t span = (end + chunks - 1) / chunks, part = d_ + 2;
    part_.resize(b * hq_ * chunks * part);
    const float* S = store.data_ptr<float>();
    const bool* M = mask.numel() ? mask.data_ptr<bool>() : nullptr;
    const int64_t mstride = mask.numel() ? mask.size(1) : 0;
    const float* Q = q_.data();
    float* P = part_.data();
    at::parallel_for(0, b * hk_ * chunks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> scores(G * span);
      for (int64_t job = lo; job < hi; ++job) {
        const int64_t r = job / (hk_ * chunks), kh = (job / chunks) % hk_, c = job % chunks;
        const int64_t t0 = c * span, t1 = std::min(end, t0 + span);
        Chunk ch{S + (((l * 2 + 0) * B + r) * hk_ + kh) * C * d_, S + (((l * 2 + 1) * B + r) * hk_ + kh) * C * d_,
                 Q + (r * hq_ + kh * G) * d_, M ? M + r * mstride : nullptr, t0, std::max<int64_t>(t1 - t0, 0),
                 G, scale_, scores.data(), P + (r * hq_ + kh * G) * chunks * part + c * part, chunks * part};
        if (d_ == 64) chunk_attention<64>(ch);
        else if (d_ == 128) chunk_attention<128>(ch);
        else if (d_ == 32) chunk_attention<32>(ch);
        else chunk_attention<0>(ch, d_);
      }
    });
    Bf16* dst = o.data_ptr<Bf16>();
    std::vector<float> acc(d_);
    for (int64_t job = 0; job < b * hq_; ++job) {
      const float* pp = P + job * chunks * part;
      float top = -std::numeric_limits<float>::infinity(), sum = 0.f;
      for (int64_t c = 0; c < chunks; ++c) top = std::max(top, pp[c * part + d_]);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t c = 0; c < chunks; ++c) {
        const float* pc = pp + c * part;
        if (pc[d_ + 1] == 0.f) continue;
        const float w = fast_exp(pc[d_] - top);
        sum += w * pc[d_ + 1];
        for (int64_t i = 0; i < d_; ++i) acc[i] += w * pc[i];
      }
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      for (int64_t i = 0; i < d_; ++i) dst[job * d_ + i] = Bf16(acc[i] * inv);
    }
  }

  // h float32[b, H] += y bfloat16[b, H] (+ bias)
  void add(Tensor& h, const Tensor& y, const std::vector<float>& bias) const {
    float* dst = h.data_ptr<float>();
    const Bf16* src = y.data_ptr<Bf16>();
    for (int64_t r = 0; r < h.size(0); ++r, dst += H_, src += H_) {
      if (bias.empty()) {
        for (int64_t i = 0; i < H_; ++i) dst[i] += static_cast<float>(src[i]);
      } else {
        for (int64_t i = 0; i < H_; ++i) dst[i] += static_cast<float>(src[i]) + bias[i];
      }
    }
  }

  // out bfloat16[b, I] = act(gate) * up (gated: x = [gate | up]) or act(x), x bfloat16[b, .] (+ bias)
  void activate(const Tensor& x, const std::vector<float>& bias, Tensor& out) {
    const int64_t b = x.size(0), w = x.size(1);
    g_.resize(I_);
    float* g = g_.data();
    for (int64_t r = 0; r < b; ++r) {
      const Bf16* src = x.data_ptr<Bf16>() + r * w;
      Bf16* dst = out.data_ptr<Bf16>() + r * I_;
      for (int64_t i = 0; i < I_; ++i) g[i] = static_cast<float>(src[i]) + at_or_0(bias, i);
      if (act_ == SILU) {
#pragma omp simd
        for (int64_t i = 0; i < I_; ++i) g[i] = g[i] / (1.f + fast_exp(-g[i]));
      } else if (act_ == GELU_TANH) {
#pragma omp simd
        for (int64_t i = 0; i < I_; ++i) g[i] = 0.5f * g[i] * (1.f + tanhf(0.7978845608f * (g[i] + 0.044715f * g[i] * g[i] * g[i])));
      } else {
        for (int64_t i = 0; i < I_; ++i) g[i] = 0.5f * g[i] * (1.f + std::erf(g[i] * 0.7071067812f));
      }
      if (gated_) {
        for (int64_t i = 0; i < I_; ++i) g[i] *= static_cast<float>(src[I_ + i]) + at_or_0(bias, I_ + i);
      }
      for (int64_t i = 0; i < I_; ++i) dst[i] = Bf16(g[i]);
    }
  }

  int64_t L_, H_, hq_, hk_, d_, I_, V_;
  bool rms_, rotary_, gated_;
  int64_t act_;
  float eps_, scale_;
  std::vector<Layer> layers_;
  Norm final_;
  Proj head_;
  Tensor cos_, sin_;
  std::vector<float> q_, g_, part_;
};

}  // namespace

TORCH_LIBRARY(latticedraft, m) {
  m.class_<FusedDraft>("FusedDraft")
      .def(torch::init<std::vector<Tensor>, std::vector<int64_t>, std::vector<double>>())
      .def("forward", &FusedDraft::forward);
}
