/* shoal's float32 CPU kernels for the LLM decoding step (see __init__.py for how they are
 * built and loaded, and models/llama.py, attention.py for where they run).
 *
 * Each replaces a chain of small torch ops whose dispatch cost more than their arithmetic at the
 * few rows of a decoding step. Contracts: float32, the strides given in elements, single
 * threaded (head_dim <= 512, at most 8 query heads per kv head, else the call refuses). Built with -ffp-contract=off so a product and a sum round as torch's
 * separate mul and add do (rotary embeddings are then bitwise torch's); the reductions
 * (norms, softmax, attention) agree with torch's to float32 rounding, not bitwise.
 */
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIM 512

/* v[i] = exp(v[i]) for i < n, float32, within ~2 ulp; below the smallest normal result it is
 * 0 and above the largest float +inf, as in torch. Three passes that each vectorize: a
 * polynomial of the reduced argument, 2^k added to its exponent field (the bits read as int32:
 * built with -fno-strict-aliasing), then the results out of range. */
static void exp_inplace(float *v, int64_t n) {
    int32_t *bits = (int32_t *)v;
    int32_t k_of[256];
    float given[256];
    for (int64_t first = 0; first < n; first += 256) {
        int64_t count = n - first < 256 ? n - first : 256;
        float *x = v + first;
        for (int64_t i = 0; i < count; i++) {
            given[i] = x[i];
            float a = x[i] < -86.0f ? -86.0f : (x[i] > 88.0f ? 88.0f : x[i]);
            float k = floorf(a * 1.44269504088896341f + 0.5f);
            float r = a - k * 0.693145751953125f;  /* ln 2 in two parts (Cody-Waite) */
            r = r - k * 1.428606765330187045e-06f;
            float p = 1.9875691500e-4f;
            p = p * r + 1.3981999507e-3f;
            p = p * r + 8.3334519073e-3f;
            p = p * r + 4.1665795894e-2f;
            p = p * r + 1.6666665459e-1f;
            p = p * r + 5.0000001201e-1f;
            x[i] = p * r * r + r + 1.0f;
            k_of[i] = (int32_t)k;
        }
        int32_t *xb = bits + first;
        for (int64_t i = 0; i < count; i++) xb[i] += k_of[i] << 23;
        for (int64_t i = 0; i < count; i++) {
            float out = given[i] < -87.33654f ? 0.0f : x[i];
            x[i] = given[i] > 88.72283f ? INFINITY : out;
        }
    }
}

/* max and sum of v[0..n) in 16 lanes, so the loops vectorize without reassociation flags */
static inline float lane_max(const float *v, int64_t n) {
    float lanes[16];
    for (int k = 0; k < 16; k++) lanes[k] = v[0];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) lanes[k] = v[i + k] > lanes[k] ? v[i + k] : lanes[k];
    float top = lanes[0];
    for (int k = 1; k < 16; k++) top = lanes[k] > top ? lanes[k] : top;
    for (; i < n; i++) top = v[i] > top ? v[i] : top;
    return top;
}

static inline float lane_sum(const float *v, int64_t n) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) lanes[k] += v[i + k];
    float total = 0.0f;
    for (int k = 0; k < 16; k++) total += lanes[k];
    for (; i < n; i++) total += v[i];
    return total;
}

/* out[t, :] = weight * (x[t, :] / sqrt(mean(x[t, :]^2) + eps)) for t < rows; x rows are
 * x_stride apart, out is contiguous [rows, n]. (Llama's RMSNorm in float32.) */
void shoal_rms_norm(const float *x, int64_t x_stride, const float *weight, float *out,
                    int64_t rows, int64_t n, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        const float *row = x + t * x_stride;
        float lanes[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) lanes[k] += row[i + k] * row[i + k];
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += lanes[k];
        for (; i < n; i++) sum += row[i] * row[i];
        float inv = 1.0f / sqrtf(sum / (float)n + eps);
        float *o = out + t * n;
        for (i = 0; i < n; i++) o[i] = weight[i] * (row[i] * inv);
    }
}

/* hidden[t, :] += delta[t, :], then out[t, :] = rms_norm(hidden[t, :]): the residual sum and
 * the next norm in one pass. hidden and delta contiguous [rows, n]. */
void shoal_add_rms_norm(float *hidden, const float *delta, const float *weight, float *out,
                        int64_t rows, int64_t n, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        float *h = hidden + t * n;
        const float *d = delta + t * n;
        for (int64_t i = 0; i < n; i++) h[i] = h[i] + d[i];
    }
    shoal_rms_norm(hidden, n, weight, out, rows, n, eps);
}

/* Rotate-half rotary embeddings in place: heads [rows, count, dim] with rows row_stride apart
 * (heads contiguous within a row); position p's cos and signed sin (HF's rotate_half sign
 * folded in: cat(-sin1, sin2)) are rows p of the [table_rows, dim] tables. x' = x * cos +
 * swap(x) * ssin, each product rounded (no FMA), as torch's mul, mul, add. Returns 0, or -1
 * (nothing written) when a position is outside the tables or dim is odd or > MAX_DIM. */
__attribute__((optimize("fp-contract=off"))) int shoal_rotary(
        float *heads, int64_t row_stride, int64_t rows, int64_t count, int64_t dim,
        const int64_t *positions, int64_t table_rows, const float *cos_table,
        const float *ssin_table) {
    if (dim > MAX_DIM || dim % 2) return -1;
    for (int64_t t = 0; t < rows; t++)
        if (positions[t] < 0 || positions[t] >= table_rows) return -1;
    int64_t half = dim / 2;
    float copy[MAX_DIM];
    for (int64_t t = 0; t < rows; t++) {
        const float *c = cos_table + positions[t] * dim;
        const float *s = ssin_table + positions[t] * dim;
        for (int64_t h = 0; h < count; h++) {
            float *x = heads + t * row_stride + h * dim;
            memcpy(copy, x, (size_t)dim * sizeof(float));
            for (int64_t i = 0; i < half; i++) x[i] = copy[i] * c[i] + copy[i + half] * s[i];
            for (int64_t i = half; i < dim; i++)
                x[i] = copy[i] * c[i] + copy[i - half] * s[i];
        }
    }
    return 0;
}

/* out[t, i] = silu(gate_up[t, i]) * gate_up[t, n + i] (SwiGLU), gate_up [rows, 2n]
 * contiguous, out [rows, n]. */
void shoal_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; t++) {
        const float *g = gate_up + t * 2 * n;
        const float *u = g + n;
        float *o = out + t * n;
        for (int64_t i = 0; i < n; i++) o[i] = -g[i];
        exp_inplace(o, n);
        for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + o[i]) * u[i];
    }
}

/* 16 floats in one AVX-512 register (GCC vector extension); loads and stores through memcpy,
 * so any alignment is fine. */
typedef float v16 __attribute__((vector_size(64)));

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* scores[j] = q . kt[:, lo + j] for j < n: keys transposed, kt [dim, width]. Blocks of 64 keys
 * (four independent FMA chains) while within n; the rest in blocks of 32, then 16, each with
 * independent chains too (FMA latency, not bandwidth, bounds a single chain), reading past n
 * while the slot's width allows (at most 31 keys; their scores are scratch, never read:
 * `scores` holds n + 64); then one key at a time. */
static inline __attribute__((always_inline)) void key_scores(
        const float *q, const float *kt, int64_t width, int64_t lo, int64_t n, float *scores,
        const int64_t dim) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        v16 a = {0}, b = {0}, c = {0}, e = {0};
        for (int64_t d = 0; d < dim; d++) {
            const float *row = kt + d * width + lo + j;
            float qd = q[d];
            a += qd * load16(row);
            b += qd * load16(row + 16);
            c += qd * load16(row + 32);
            e += qd * load16(row + 48);
        }
        store16(scores + j, a);
        store16(scores + j + 16, b);
        store16(scores + j + 32, c);
        store16(scores + j + 48, e);
    }
    if (j + 16 < n && lo + j + 32 <= width) {  /* 32 keys, two chains each */
        v16 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
        int64_t d = 0;
        for (; d + 2 <= dim; d += 2) {
            const float *row = kt + d * width + lo + j;
            a0 += q[d] * load16(row);
            b0 += q[d] * load16(row + 16);
            a1 += q[d + 1] * load16(row + width);
            b1 += q[d + 1] * load16(row + width + 16);
        }
        for (; d < dim; d++) {
            a0 += q[d] * load16(kt + d * width + lo + j);
            b0 += q[d] * load16(kt + d * width + lo + j + 16);
        }
        store16(scores + j, a0 + a1);
        store16(scores + j + 16, b0 + b1);
        j += 32;
    }
    for (; j < n && lo + j + 16 <= width; j += 16) {  /* 16 keys, four chains */
        v16 a[4] = {{0}, {0}, {0}, {0}};
        int64_t d = 0;
        for (; d + 4 <= dim; d += 4)
            for (int k = 0; k < 4; k++)
                a[k] += q[d + k] * load16(kt + (d + k) * width + lo + j);
        for (; d < dim; d++) a[0] += q[d] * load16(kt + d * width + lo + j);
        store16(scores + j, (a[0] + a[1]) + (a[2] + a[3]));
    }
    for (; j < n; j++) {
        float total = 0.0f;
        for (int64_t d = 0; d < dim; d++) total += q[d] * kt[d * width + lo + j];
        scores[j] = total;
    }
}

/* out[:] = sum_j weights[j] * vv[lo + j, :] / sum_j weights[j]... without the division:
 * out = inv * sum_j weights[j] * vv[lo + j, :], vv [width, dim], dim a multiple of 16 (<= 256),
 * two independent sets of accumulators over even and odd j. */
static inline __attribute__((always_inline)) void weighted_values(
        const float *weights, const float *vv, int64_t lo, int64_t n, float inv, float *out,
        const int64_t dim) {
    v16 even[16], odd[16];
    const int64_t lanes = dim / 16;
    for (int64_t i = 0; i < lanes; i++) {
        even[i] = (v16){0};
        odd[i] = (v16){0};
    }
    const float *rows = vv + lo * dim;
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        float w0 = weights[j], w1 = weights[j + 1];
        for (int64_t i = 0; i < lanes; i++) {
            even[i] += w0 * load16(rows + j * dim + 16 * i);
            odd[i] += w1 * load16(rows + (j + 1) * dim + 16 * i);
        }
    }
    if (j < n)
        for (int64_t i = 0; i < lanes; i++) even[i] += weights[j] * load16(rows + j * dim + 16 * i);
    for (int64_t i = 0; i < lanes; i++) store16(out + 16 * i, (even[i] + odd[i]) * inv);
}

/* One query head's attention over n keys from index lo of a kept slot: q [dim] (already
 * scaled), kt [dim, width] (keys transposed), vv [width, dim]; out [dim]; sc scratch of
 * n + 64 floats. */
static inline __attribute__((always_inline)) void attend_one(
        const float *q, const float *kt, const float *vv, int64_t width, int64_t lo, int64_t n,
        float *out, float *sc, const int64_t dim) {
    key_scores(q, kt, width, lo, n, sc, dim);
    float top = lane_max(sc, n);
    for (int64_t j = 0; j < n; j++) sc[j] -= top;
    exp_inplace(sc, n);
    float inv = 1.0f / lane_sum(sc, n);
    if (dim % 16 == 0 && dim <= 256) {
        weighted_values(sc, vv, lo, n, inv, out, dim);
        return;
    }
    float acc[MAX_DIM];
    for (int64_t d = 0; d < dim; d++) acc[d] = 0.0f;
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < dim; d++) acc[d] += sc[j] * vv[(lo + j) * dim + d];
    for (int64_t d = 0; d < dim; d++) out[d] = acc[d] * inv;
}

/* attend_one with the common head sizes unrolled. */
static void attend_any(const float *q, const float *kt, const float *vv, int64_t width,
                       int64_t lo, int64_t n, float *out, float *sc, int64_t dim) {
    switch (dim) {
    case 32: attend_one(q, kt, vv, width, lo, n, out, sc, 32); break;
    case 64: attend_one(q, kt, vv, width, lo, n, out, sc, 64); break;
    case 128: attend_one(q, kt, vv, width, lo, n, out, sc, 128); break;
    default: attend_one(q, kt, vv, width, lo, n, out, sc, dim); break;
    }
}

/* The paged pool write of a layer: for t < rows, cache_k[slot_mapping[t]] = key row t and
 * cache_v[slot_mapping[t]] = value row t (row_elems floats each: kv_heads * dim; key/value rows
 * k_stride / v_stride apart). Returns 0, or -1 (nothing written) when a slot is outside
 * [0, total_slots). */
int shoal_store_kv(const float *key, int64_t k_stride, const float *value, int64_t v_stride,
                   int64_t rows, int64_t row_elems, const int64_t *slot_mapping, float *cache_k,
                   float *cache_v, int64_t total_slots) {
    for (int64_t t = 0; t < rows; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= total_slots) return -1;
    size_t bytes = (size_t)row_elems * sizeof(float);
    for (int64_t t = 0; t < rows; t++) {
        memcpy(cache_k + slot_mapping[t] * row_elems, key + t * k_stride, bytes);
        memcpy(cache_v + slot_mapping[t] * row_elems, value + t * v_stride, bytes);
    }
    return 0;
}

/* Decode attention over the kept keys/values (decode_copy.py's layout) with the new tokens
 * written first. For decode row r (of rows), in slot s = slots[r] at position p = positions[r]:
 *   keys_t[s, h, :, p] = key[r, h, :];  values[s, h, p, :] = value[r, h, :]   (h < kv_heads)
 *   out[r, q, :] = softmax(scale * query[r, q, :] . keys_t[s, q / group, :, lo..p]) @ values
 * with lo = max(0, p + 1 - window) (window 0: no window), group = heads / kv_heads.
 * query/key/value rows are *_stride elements apart, heads contiguous within a row; keys_t
 * [C, kv_heads, dim, width] and values [C, kv_heads, width, dim] contiguous; out contiguous
 * [rows, heads, dim]. Returns 0, or -1 (nothing written) when a slot is outside [0, capacity)
 * or a position outside [0, width), heads is not a multiple of kv_heads, or dim > MAX_DIM. */
static int decode_attention_rows(const float *query, int64_t q_stride, const float *key,
                                 int64_t k_stride, const float *value, int64_t v_stride,
                                 float *keys_t, float *values, const int64_t *slots,
                                 const int64_t *positions, const int64_t *row_index,
                                 int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                                 int64_t capacity, int64_t width, int64_t window, float scale,
                                 float *out, int64_t out_stride) {
    int64_t group = heads / kv_heads;
    if (dim > MAX_DIM || group * kv_heads != heads) return -1;
    for (int64_t r = 0; r < rows; r++)
        if (positions[r] >= width || positions[r] < 0 || slots[r] < 0 || slots[r] >= capacity)
            return -1;
    float *scores = malloc((size_t)(width + 64) * sizeof(float));
    if (scores == NULL) return -1;
    float q[MAX_DIM];
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = slots[r], p = positions[r];
        int64_t row = row_index != NULL ? row_index[r] : r;  /* in query/key/value/out */
        int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
        for (int64_t h = 0; h < kv_heads; h++) {
            float *kt = keys_t + (s * kv_heads + h) * dim * width;
            float *vv = values + (s * kv_heads + h) * width * dim;
            const float *k_new = key + row * k_stride + h * dim;
            for (int64_t d = 0; d < dim; d++) kt[d * width + p] = k_new[d];
            memcpy(vv + p * dim, value + row * v_stride + h * dim, (size_t)dim * sizeof(float));
            for (int64_t g = 0; g < group; g++) {
                const float *qr = query + row * q_stride + (h * group + g) * dim;
                for (int64_t d = 0; d < dim; d++) q[d] = qr[d] * scale;
                attend_any(q, kt, vv, width, lo, p + 1 - lo,
                           out + row * out_stride + (h * group + g) * dim, scores, dim);
            }
        }
    }
    free(scores);
    return 0;
}

int shoal_decode_attention(const float *query, int64_t q_stride, const float *key,
                           int64_t k_stride, const float *value, int64_t v_stride,
                           float *keys_t, float *values, const int64_t *slots,
                           const int64_t *positions, int64_t rows, int64_t heads,
                           int64_t kv_heads, int64_t dim, int64_t capacity, int64_t width,
                           int64_t window, float scale, float *out) {
    return decode_attention_rows(query, q_stride, key, k_stride, value, v_stride, keys_t,
                                 values, slots, positions, NULL, rows, heads, kv_heads, dim,
                                 capacity, width, window, scale, out, heads * dim);
}

/* Causal attention of a context span: rows [start, start + n) of the packed q/k/v (rows
 * `stride` apart; queries at 0, keys at q_size, values at q_size + kv_size) attend to the
 * span's keys up to their own; out rows `out_stride` apart. Each kv head's keys are first
 * laid out transposed, as the kept copy keeps them, so attend_any serves both. Returns 0, or
 * -1 when scratch memory cannot be had. */
static int prefill_attention(const float *qkv, int64_t stride, int64_t start, int64_t n,
                             int64_t heads, int64_t kv_heads, int64_t dim, float scale,
                             float *out, int64_t out_stride) {
    int64_t group = heads / kv_heads, q_size = heads * dim, kv_size = kv_heads * dim;
    int64_t width = (n + 15) / 16 * 16;  /* padded with zeros: key_scores reads whole blocks */
    float *kt = calloc((size_t)(2 * width * dim + width + 64), sizeof(float));
    if (kt == NULL) return -1;
    float *vv = kt + width * dim, *scores = vv + width * dim;
    float q[MAX_DIM];
    for (int64_t h = 0; h < kv_heads; h++) {
        for (int64_t j = 0; j < n; j++) {
            const float *row = qkv + (start + j) * stride;
            for (int64_t d = 0; d < dim; d++) kt[d * width + j] = row[q_size + h * dim + d];
            memcpy(vv + j * dim, row + q_size + kv_size + h * dim, (size_t)dim * sizeof(float));
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t g = 0; g < group; g++) {
                int64_t qh = h * group + g;
                const float *qr = qkv + (start + i) * stride + qh * dim;
                for (int64_t d = 0; d < dim; d++) q[d] = qr[d] * scale;
                attend_any(q, kt, vv, width, 0, i + 1,
                           out + (start + i) * out_stride + qh * dim, scores, dim);
            }
    }
    free(kt);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * A whole iteration of a Llama-family model in one call: every layer's RMSNorms, projections
 * (BLAS sgemm, the one torch uses, passed in as a pointer), rotary embeddings, KV writes,
 * attention (decode rows over the kept copy, context spans causally over their own keys) and
 * SwiGLU, then the final norm and the logits of the rows asked for. For iterations of decode
 * rows with kept slots and context spans from position 0 (no extend spans, no sliding
 * windows); the caller has grown the kept copies and gathered the rows that needed it. Saves
 * the ~30 dispatched calls per layer (torch ops and the kernels above) between which the
 * iteration's Python ran.
 */

/* Fortran BLAS sgemm (column-major; LP64 ints), as MKL and OpenBLAS export it */
typedef void (*sgemm_t)(const char *transa, const char *transb, const int *m, const int *n,
                        const int *k, const float *alpha, const float *a, const int *lda,
                        const float *b, const int *ldb, const float *beta, float *c,
                        const int *ldc);

/* out[rows, n] = x[rows, k] @ w (+ bias): w row-major [k, n] (w_is_nk 0: the transposed
 * weights the models keep) or [n, k] (1: a tied embedding used as the output layer) */
static void project(sgemm_t sgemm, const float *x, int rows, int k, const float *w, int n,
                    int w_is_nk, const float *bias, float *out) {
    const float one = 1.0f, zero = 0.0f;
    if (w_is_nk)
        sgemm("T", "N", &n, &rows, &k, &one, w, &k, x, &k, &zero, out, &n);
    else
        sgemm("N", "N", &n, &rows, &k, &one, w, &n, x, &k, &zero, out, &n);
    if (bias != NULL)
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < n; i++) out[(int64_t)t * n + i] += bias[i];
}

enum { L_INPUT_NORM, L_QKV, L_QKV_BIAS, L_OUT, L_OUT_BIAS, L_POST_NORM, L_GATE_UP,
       L_GATE_UP_BIAS, L_DOWN, L_DOWN_BIAS, L_KEYS_T, L_VALUES, L_POOL, L_FIELDS };

/* hidden [rows, hidden_size] (the token embeddings; overwritten) -> logits [n_logits, vocab] of
 * packed rows logits_rows. layer_ptrs [layers, L_FIELDS]: addresses (0 for an absent bias) of
 * each layer's weights, its kept keys_t / values ([capacity, kv_heads, dim, width] /
 * [capacity, kv_heads, width, dim]) and its pool ([2, pool_slots, kv_heads, dim]). Row t is
 * at position positions[t] and writes pool slot slot_mapping[t]; decode row i is packed row
 * decode_index[i], kept in slot slots[i] at position decode_positions[i]; context span i is
 * packed rows [spans[2i], spans[2i + 1]). Returns 0, or -1: an index out of range (nothing
 * written) or a failed allocation (the iteration is then lost). */
int shoal_llama_step(sgemm_t sgemm, int64_t layers, int64_t rows, int64_t hidden_size,
                     int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, int64_t vocab,
                     const int64_t *layer_ptrs, float *hidden, const int64_t *positions,
                     int64_t table_rows, const float *cos_table, const float *ssin_table,
                     const int64_t *slot_mapping, int64_t pool_slots, int64_t n_decode,
                     const int64_t *decode_index, const int64_t *slots,
                     const int64_t *decode_positions, int64_t capacity, int64_t width,
                     int64_t n_spans, const int64_t *spans, int64_t n_logits,
                     const int64_t *logits_rows, float eps, float scale,
                     const float *final_norm, const float *lm_head, int64_t lm_head_nk,
                     float *logits) {
    for (int64_t t = 0; t < rows; t++)
        if (positions[t] < 0 || positions[t] >= table_rows || slot_mapping[t] < 0
            || slot_mapping[t] >= pool_slots)
            return -1;
    for (int64_t i = 0; i < n_decode; i++)
        if (decode_index[i] < 0 || decode_index[i] >= rows || slots[i] < 0
            || slots[i] >= capacity || decode_positions[i] < 0 || decode_positions[i] >= width)
            return -1;
    for (int64_t i = 0; i < n_spans; i++)
        if (spans[2 * i] < 0 || spans[2 * i + 1] > rows || spans[2 * i] >= spans[2 * i + 1])
            return -1;
    if (n_logits > rows) return -1;
    for (int64_t i = 0; i < n_logits; i++)
        if (logits_rows[i] < 0 || logits_rows[i] >= rows) return -1;
    if (dim > MAX_DIM || dim % 2 || heads % kv_heads) return -1;
    int64_t q_size = heads * dim, kv_size = kv_heads * dim, packed = q_size + 2 * kv_size;
    size_t floats = (size_t)rows * (size_t)(2 * hidden_size + packed + q_size + 3 * inter);
    float *scratch = malloc(floats * sizeof(float));
    if (scratch == NULL) return -1;
    float *normed = scratch, *delta = normed + rows * hidden_size;
    float *qkv = delta + rows * hidden_size, *attended = qkv + rows * packed;
    float *gate_up = attended + rows * q_size, *activated = gate_up + rows * 2 * inter;
    int r = (int)rows, h = (int)hidden_size;
    int status = 0;
    for (int64_t l = 0; l < layers && status == 0; l++) {
        const int64_t *p = layer_ptrs + l * L_FIELDS;
        if (l == 0)
            shoal_rms_norm(hidden, hidden_size, (const float *)p[L_INPUT_NORM], normed, rows,
                           hidden_size, eps);
        project(sgemm, normed, r, h, (const float *)p[L_QKV], (int)packed, 0,
                (const float *)p[L_QKV_BIAS], qkv);
        shoal_rotary(qkv, packed, rows, heads + kv_heads, dim, positions, table_rows,
                     cos_table, ssin_table);
        float *pool = (float *)p[L_POOL];
        shoal_store_kv(qkv + q_size, packed, qkv + q_size + kv_size, packed, rows, kv_size,
                       slot_mapping, pool, pool + pool_slots * kv_size, pool_slots);
        if (n_decode > 0)
            status = decode_attention_rows(
                qkv, packed, qkv + q_size, packed, qkv + q_size + kv_size, packed,
                (float *)p[L_KEYS_T], (float *)p[L_VALUES], slots, decode_positions,
                decode_index, n_decode, heads, kv_heads, dim, capacity, width, 0, scale,
                attended, q_size);
        for (int64_t i = 0; i < n_spans && status == 0; i++)
            status = prefill_attention(qkv, packed, spans[2 * i], spans[2 * i + 1] - spans[2 * i],
                                       heads, kv_heads, dim, scale, attended, q_size);
        project(sgemm, attended, r, (int)q_size, (const float *)p[L_OUT], h, 0,
                (const float *)p[L_OUT_BIAS], delta);
        shoal_add_rms_norm(hidden, delta, (const float *)p[L_POST_NORM], normed, rows,
                           hidden_size, eps);
        project(sgemm, normed, r, h, (const float *)p[L_GATE_UP], (int)(2 * inter), 0,
                (const float *)p[L_GATE_UP_BIAS], gate_up);
        shoal_silu_mul(gate_up, activated, rows, inter);
        project(sgemm, activated, r, (int)inter, (const float *)p[L_DOWN], h, 0,
                (const float *)p[L_DOWN_BIAS], delta);
        if (l + 1 < layers)
            shoal_add_rms_norm(hidden, delta, (const float *)layer_ptrs[(l + 1) * L_FIELDS],
                               normed, rows, hidden_size, eps);
        else
            for (int64_t i = 0; i < rows * hidden_size; i++) hidden[i] += delta[i];
    }
    if (status == 0) {
        for (int64_t i = 0; i < n_logits; i++)  /* the rows asked for, packed together */
            memcpy(delta + i * hidden_size, hidden + logits_rows[i] * hidden_size,
                   (size_t)hidden_size * sizeof(float));
        shoal_rms_norm(delta, hidden_size, final_norm, normed, n_logits, hidden_size, eps);
        project(sgemm, normed, (int)n_logits, h, lm_head, (int)vocab, (int)lm_head_nk, NULL,
                logits);
    }
    free(scratch);
    return status;
}
