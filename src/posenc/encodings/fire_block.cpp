// FIRE's bias on a block of consecutive positions past its threshold, and the gradients of
// that bias, each in one pass over the block (posenc.encodings.position_bias._FireBlock).
//
// The block has n query rows and c keys. Entry (i, j) has the MLP input
//     x = vals[j - i + n - 1] / den,  den = rn[i] for j < left, max(rn[i], cn[j]) otherwise
// (vals: the numerator sign(i - j) psi(|i - j|) by distance; rn, cn: the row and column
// normalisers), and the bias out[h, i, j] = A[h, s] x + C[h, s], s the number of break points
// `order` below x (FIRE.pieces). Along a row x rarely changes segment, so a row is walked as
// runs of one segment: the segment is found once per row by binary search and then moved a
// break at a time, and each run's products and sums are plain loops over its keys. The
// PyTorch version of the same function (FIRE.block_input and _Pieces) is the reference the
// tests compare with, values and gradients.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace {

// rows per group of the backward's sums
constexpr int64_t kGroup = 16;

struct Run {
  int64_t start, stop, seg;
};

// x, the denominator and the runs of segment of row i
template <typename T>
void row(const T* vals, T rn_i, const T* cn, int64_t i, int64_t n, int64_t c, int64_t left, const T* order,
         int64_t W, T* x, T* den, std::vector<Run>& runs) {
  const T* num = vals + (n - 1 - i);  // num[j] = vals[j - i + n - 1]
  const int64_t split = std::min(std::max<int64_t>(left, 0), c);
  const T inv = T(1) / rn_i;
  for (int64_t j = 0; j < split; ++j) {
    x[j] = num[j] * inv;
    den[j] = rn_i;
  }
  for (int64_t j = split; j < c; ++j) {
    den[j] = std::max(rn_i, cn[j]);
    x[j] = num[j] / den[j];
  }
  runs.clear();
  if (c == 0) return;
  const T inf = std::numeric_limits<T>::infinity();
  int64_t j = 0;
  int64_t s = std::lower_bound(order, order + W, x[0]) - order;  // the number of break points below x[0]
  while (true) {
    // segment s holds lo < x <= hi; the run goes on while x stays there (8 keys at a time, then one)
    const T lo = s > 0 ? order[s - 1] : -inf, hi = s < W ? order[s] : inf;
    const int64_t start = j++;
    for (; j + 8 <= c; j += 8) {
      bool inside = true;
      for (int64_t e = 0; e < 8; ++e) inside &= (x[j + e] > lo) & (x[j + e] <= hi);
      if (!inside) break;
    }
    while (j < c && x[j] > lo && x[j] <= hi) ++j;
    runs.push_back({start, j, s});
    if (j == c) return;
    while (s > 0 && !(order[s - 1] < x[j])) --s;  // the segment of x[j], a break at a time
    while (s < W && order[s] < x[j]) ++s;
  }
}

void check(const at::Tensor& vals, const at::Tensor& rn, const at::Tensor& cn, const at::Tensor& order,
           const at::Tensor& A, const at::Tensor& C) {
  const int64_t n = rn.size(0), c = cn.size(0);
  TORCH_CHECK(vals.dim() == 1 && vals.size(0) == n + c - 1, "vals must hold n + c - 1 values");
  TORCH_CHECK(A.dim() == 2 && A.sizes() == C.sizes() && A.size(1) == order.size(0) + 1,
              "A and C must be (H, number of break points + 1)");
  for (const auto* t : {&vals, &rn, &cn, &order, &A, &C}) {
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->scalar_type() == vals.scalar_type(),
                "fire_block takes contiguous CPU tensors of one dtype");
  }
}

at::Tensor fire_block_forward(const at::Tensor& vals, const at::Tensor& rn, const at::Tensor& cn,
                              const at::Tensor& order, const at::Tensor& A, const at::Tensor& C, int64_t left) {
  check(vals, rn, cn, order, A, C);
  const int64_t n = rn.size(0), c = cn.size(0), H = A.size(0), S = A.size(1), W = order.size(0);
  at::Tensor out = at::empty({H, n, c}, vals.options());
  AT_DISPATCH_FLOATING_TYPES(vals.scalar_type(), "fire_block_forward", [&] {
    const scalar_t *v = vals.data_ptr<scalar_t>(), *r = rn.data_ptr<scalar_t>(), *k = cn.data_ptr<scalar_t>(),
                   *o = order.data_ptr<scalar_t>(), *a = A.data_ptr<scalar_t>(), *b = C.data_ptr<scalar_t>();
    scalar_t* y = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 8, [&](int64_t i0, int64_t i1) {
      std::vector<scalar_t> x(c), den(c);
      std::vector<Run> runs;
      for (int64_t i = i0; i < i1; ++i) {
        row(v, r[i], k, i, n, c, left, o, W, x.data(), den.data(), runs);
        for (int64_t h = 0; h < H; ++h) {
          scalar_t* yh = y + (h * n + i) * c;
          for (const Run& u : runs) {
            const scalar_t slope = a[h * S + u.seg], icpt = b[h * S + u.seg];
            for (int64_t j = u.start; j < u.stop; ++j) yh[j] = slope * x[j] + icpt;
          }
        }
      }
    });
  });
  return out;
}

// the gradients of vals, rn, cn, A and C from g, the gradient of the forward's output (H, n, c)
std::vector<at::Tensor> fire_block_backward(const at::Tensor& g_in, const at::Tensor& vals, const at::Tensor& rn,
                                            const at::Tensor& cn, const at::Tensor& order, const at::Tensor& A,
                                            const at::Tensor& C, int64_t left) {
  check(vals, rn, cn, order, A, C);
  const int64_t n = rn.size(0), c = cn.size(0), H = A.size(0), S = A.size(1), W = order.size(0);
  const at::Tensor g = g_in.contiguous();
  TORCH_CHECK(g.dim() == 3 && g.size(0) == H && g.size(1) == n && g.size(2) == c && g.device().is_cpu() &&
                  g.scalar_type() == vals.scalar_type(),
              "the gradient must be (H, n, c), as the output");
  const int64_t V = n + c - 1;
  // sums over rows, in double: per segment (slopes, intercepts), per distance, per key. Each group of
  // kGroup rows sums into its own part and the parts are added in order afterwards, so the result does
  // not depend on the number of threads or on which finishes first
  const int64_t groups = (n + kGroup - 1) / kGroup, P = 2 * H * S + V + c;
  std::vector<double> part(std::max<int64_t>(groups, 1) * P, 0.0);
  at::Tensor drn = at::empty({n}, vals.options());
  AT_DISPATCH_FLOATING_TYPES(vals.scalar_type(), "fire_block_backward", [&] {
    const scalar_t *v = vals.data_ptr<scalar_t>(), *r = rn.data_ptr<scalar_t>(), *k = cn.data_ptr<scalar_t>(),
                   *o = order.data_ptr<scalar_t>(), *a = A.data_ptr<scalar_t>(), *gp = g.data_ptr<scalar_t>();
    scalar_t* drn_p = drn.data_ptr<scalar_t>();
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      std::vector<scalar_t> x(c), den(c), gx(c);
      std::vector<Run> runs;
      for (int64_t i = g0 * kGroup; i < std::min(n, g1 * kGroup); ++i) {
        double* lA = part.data() + (i / kGroup) * P;
        double *lC = lA + H * S, *lv = lC + H * S, *lk = lv + V;
        row(v, r[i], k, i, n, c, left, o, W, x.data(), den.data(), runs);
        std::fill(gx.begin(), gx.end(), scalar_t(0));
        for (int64_t h = 0; h < H; ++h) {
          const scalar_t* gh = gp + (h * n + i) * c;
          for (const Run& u : runs) {
            const scalar_t slope = a[h * S + u.seg];
            scalar_t sg = 0, sgx = 0;
_Pragma("omp simd reduction(+ : sg, sgx)")  // inside a macro's argument: no #pragma
            for (int64_t j = u.start; j < u.stop; ++j) {
              sg += gh[j];
              sgx += gh[j] * x[j];
              gx[j] += gh[j] * slope;  // the gradient of x, summed over heads
            }
            lA[h * S + u.seg] += sgx;
            lC[h * S + u.seg] += sg;
          }
        }
        // x = num / den: d num = gx / den, d den = -gx x / den, to the larger normaliser (half each on a tie)
        double d_row = 0.0;
        double* lv_i = lv + (n - 1 - i);
        const int64_t split = std::min(std::max<int64_t>(left, 0), c);
        _Pragma("omp simd reduction(+ : d_row)")
        for (int64_t j = 0; j < split; ++j) {  // den = rn[i]
          const scalar_t dnum = gx[j] / den[j];
          lv_i[j] += dnum;
          d_row -= dnum * x[j];
        }
        for (int64_t j = split; j < c; ++j) {
          const scalar_t dnum = gx[j] / den[j], dden = -dnum * x[j];
          lv_i[j] += dnum;
          if (r[i] > k[j]) {
            d_row += dden;
          } else if (r[i] < k[j]) {
            lk[j] += dden;
          } else {
            d_row += 0.5 * dden;
            lk[j] += 0.5 * dden;
          }
        }
        drn_p[i] = static_cast<scalar_t>(d_row);
      }
    });
  });
  for (int64_t q = 1; q < groups; ++q) {
    for (int64_t e = 0; e < P; ++e) part[e] += part[q * P + e];
  }
  auto as_tensor = [&](int64_t offset, at::IntArrayRef shape) {
    // a copy even in double: the vector dies here
    return at::from_blob(part.data() + offset, shape, at::kDouble).to(vals.scalar_type(), false, true);
  };
  return {as_tensor(2 * H * S, {V}), drn, as_tensor(2 * H * S + V, {c}), as_tensor(0, {H, S}),
          as_tensor(H * S, {H, S})};
}

}  // namespace

TORCH_LIBRARY(posenc, m) {
  m.def("fire_block_forward(Tensor vals, Tensor rn, Tensor cn, Tensor order, Tensor A, Tensor C, int left) -> Tensor",
        &fire_block_forward);
  m.def("fire_block_backward(Tensor g, Tensor vals, Tensor rn, Tensor cn, Tensor order, Tensor A, Tensor C, "
        "int left) -> Tensor[]",
        &fire_block_backward);
}
