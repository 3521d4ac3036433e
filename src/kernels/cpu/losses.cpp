// The cpu backend's losses and their counts (cpu/layers.h): the MLM cross-entropy over logits
// kept as they are (one log-sum-exp a row), the argmax hits, SQuAD's span cross-entropy and the
// regression head's squared error.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/layers.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

namespace {

// The largest entries of row z [V] before and after column t (max_of: vectorised); the target is
// the row's first maximum (as std::max_element finds it) when it is above every entry before it and
// not below any after it.
template <typename T>
struct TargetMaxima {
  T before, after, target;
  bool target_first() const { return before < target && after <= target; }
};
template <typename T>
TargetMaxima<T> maxima_around(const T* z, int t, int V) {
  constexpr T kLowest = -std::numeric_limits<T>::infinity();
  return {max_of(z, t, kLowest), max_of(z + t + 1, V - t - 1, kLowest), z[t]};
}

}  // namespace

template <typename T>
int64_t cross_entropy_logits_forward(T* losses, T* lse, const T* logits, const int32_t* targets,
                                     int N, int V) {
  int64_t hits = 0;
#pragma omp parallel for schedule(static) reduction(+ : hits)
  for (int n = 0; n < N; ++n) {
    const int t = targets[n];
    losses[n] = 0, lse[n] = 0;
    if (t < 0) continue;
    const T* z = logits + static_cast<int64_t>(n) * V;
    const T zt = z[t];
    // The row's maximum and whether the target is its first maximum (count_argmax_hits's rule),
    // in one pass.
    const TargetMaxima<T> around = maxima_around(z, t, V);
    const T mx = std::max({around.before, zt, around.after});
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += exp_of(z[v] - mx);
    lse[n] = mx + std::log(sum);
    losses[n] = lse[n] - zt;
    hits += around.target_first();
  }
  return hits;
}

template <typename T>
void cross_entropy_logits_backward(T* dlogits, const T* logits, const T* lse,
                                   const int32_t* targets, const T* dlosses, int N, int V,
                                   GradWrite mode) {
  const bool add = mode == GradWrite::accumulate;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* d = dlogits + static_cast<int64_t>(n) * V;
    if (targets[n] < 0) {
      if (!add) std::fill(d, d + V, T(0));
      continue;
    }
    const T* z = logits + static_cast<int64_t>(n) * V;
    const T l = lse[n], g = dlosses[n];
#pragma omp simd
    for (int v = 0; v < V; ++v) {
      const T x = exp_of(z[v] - l) * g;
      d[v] = add ? d[v] + x : x;
    }
    d[targets[n]] -= g;
  }
}

template <typename T>
int64_t count_argmax_hits(const T* scores, const int32_t* targets, int N, int V) {
  int64_t hits = 0;
  // Row n is a hit when its target is the row's first maximum.
#pragma omp parallel for schedule(static) reduction(+ : hits)
  for (int n = 0; n < N; ++n) {
    const int t = targets[n];
    if (t < 0) continue;
    hits += maxima_around(scores + static_cast<int64_t>(n) * V, t, V).target_first();
  }
  return hits;
}

template <typename T>
void span_cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* cu_seqlens,
                                const int32_t* targets, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
    losses[s] = 0;
    for (int e = 0; e < 2; ++e) {
      const T* z = logits + 2 * static_cast<int64_t>(a) + e;  // column e, stride 2
      T* p = probs + 2 * static_cast<int64_t>(a) + e;
      T mx = -INFINITY;
      for (int i = 0; i < L; ++i) mx = std::max(mx, z[2 * i]);
      T sum = 0;
      for (int i = 0; i < L; ++i) sum += (p[2 * i] = std::exp(z[2 * i] - mx));
      for (int i = 0; i < L; ++i) p[2 * i] /= sum;
      const int32_t y = targets[2 * s + e];
      if (targets[2 * s] >= 0) losses[s] += -std::log(p[2 * y]) / 2;
    }
  }
}

template <typename T>
void span_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* cu_seqlens,
                                 const int32_t* targets, const T* dlosses, int n_seq) {
  for (int s = 0; s < n_seq; ++s) {
    if (targets[2 * s] < 0) continue;
    const int a = cu_seqlens[s], L = cu_seqlens[s + 1] - a;
    const T g = dlosses[s] / 2;
    for (int e = 0; e < 2; ++e)
      for (int i = 0; i < L; ++i) {
        const int64_t k = 2 * static_cast<int64_t>(a + i) + e;
        dlogits[k] += (probs[k] - (i == targets[2 * s + e] ? T(1) : T(0))) * g;
      }
  }
}

template <typename T>
void squared_error_forward(T* losses, const T* pred, const T* target, int N) {
  for (int n = 0; n < N; ++n) losses[n] = (pred[n] - target[n]) * (pred[n] - target[n]);
}

template <typename T>
void squared_error_backward(T* dpred, T* dtarget, const T* pred, const T* target, const T* dlosses,
                            int N) {
  for (int n = 0; n < N; ++n) {
    const T g = 2 * (pred[n] - target[n]) * dlosses[n];
    dpred[n] += g;
    if (dtarget) dtarget[n] -= g;
  }
}

#define PACKBERT_INSTANTIATE(T)                                                                    \
  template int64_t cross_entropy_logits_forward<T>(T*, T*, const T*, const int32_t*, int, int);    \
  template void cross_entropy_logits_backward<T>(T*, const T*, const T*, const int32_t*, const T*, \
                                                 int, int, GradWrite);                             \
  template int64_t count_argmax_hits<T>(const T*, const int32_t*, int, int);                       \
  template void span_cross_entropy_forward<T>(T*, T*, const T*, const int32_t*, const int32_t*,    \
                                              int);                                                \
  template void span_cross_entropy_backward<T>(T*, const T*, const int32_t*, const int32_t*,       \
                                               const T*, int);                                     \
  template void squared_error_forward<T>(T*, const T*, const T*, int);                             \
  template void squared_error_backward<T>(T*, T*, const T*, const T*, const T*, int);
PACKBERT_INSTANTIATE(float)
PACKBERT_INSTANTIATE(double)
#undef PACKBERT_INSTANTIATE

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
