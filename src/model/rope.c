/* RoPE inverse-frequency tables (see rope.h). Formulas follow transformers'
 * modeling_rope_utils.py; ../shared/reference/architectures.md §0.2 states
 * them. */
#include "model/rope.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* inv[i] = 1 / base^((2i)/d) in fp32, i < n. */
static void default_inv(float *inv, int n, double base, int d) {
    for (int i = 0; i < n; i++) {
        float e = (float)(2 * i) / (float)d;
        inv[i] = 1.0f / powf((float)base, e);
    }
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

pt_status pt_rope_table_build(const pt_rope_config *r, int hd, int64_t max_pos, const char *what, pt_rope_table *t) {
    memset(t, 0, sizeof *t);
    t->attn_scaling = 1.0f;
    int d;
    if (r->type == PT_ROPE_PROPORTIONAL) d = hd; /* zero frequencies beyond the rotated angles */
    else d = (int)(hd * r->partial_rotary_factor);
    if (d < 2 || d % 2 || d > hd)
        return pt_error(PT_ERR_FORMAT, "%s: RoPE rotary dimension %d (head_dim %d × partial_rotary_factor %g) must be "
                                       "even and in [2, head_dim]",
                        what, d, hd, r->partial_rotary_factor);
    int n = d / 2;
    t->rope_dims = d;
    t->inv_freq = calloc((size_t)n, sizeof(float));
    if (!t->inv_freq) return pt_error(PT_ERR_NOMEM, "out of memory");
    float *inv = t->inv_freq;
    switch (r->type) {
    case PT_ROPE_DEFAULT:
    case PT_ROPE_DYNAMIC: /* dynamic NTK only changes beyond max_position_embeddings */
        default_inv(inv, n, r->theta, d);
        break;
    case PT_ROPE_LINEAR:
        default_inv(inv, n, r->theta, d);
        for (int i = 0; i < n; i++) inv[i] /= (float)r->factor;
        break;
    case PT_ROPE_PROPORTIONAL: {
        int angles = (int)(r->partial_rotary_factor * hd / 2); /* int(p * hd // 2) */
        if (angles > n) angles = n;
        for (int i = 0; i < angles; i++) inv[i] = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)hd);
        for (int i = 0; i < n; i++) inv[i] /= (float)r->factor;
        break;
    }
    case PT_ROPE_LLAMA3: {
        default_inv(inv, n, r->theta, d);
        double old = (double)r->original_max_position_embeddings;
        double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < n; i++) {
            double wl = 2 * M_PI / inv[i];
            if (wl > low_wl) {
                inv[i] = (float)(inv[i] / r->factor);
            } else if (wl >= high_wl) {
                double smooth = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv[i] = (float)((1 - smooth) * inv[i] / r->factor + smooth * inv[i]);
            }
        }
        break;
    }
    case PT_ROPE_YARN: {
        double base = r->theta, f = r->factor;
        double om = r->original_max_position_embeddings ? (double)r->original_max_position_embeddings
                                                        : (max_pos ? (double)max_pos / f : 4096);
        double lo = d * log(om / (r->beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi = d * log(om / (r->beta_slow * 2 * M_PI)) / (2 * log(base));
        if (r->truncate) lo = floor(lo), hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (hi == lo) hi += 0.001;
        for (int i = 0; i < n; i++) {
            float pf = powf((float)base, (float)(2 * i) / (float)d);
            double extra = 1.0 / pf, inter = 1.0 / (f * pf);
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1 - ramp;
            inv[i] = (float)(inter * (1 - extrap) + extra * extrap);
        }
        if (r->attention_factor > 0) t->attn_scaling = (float)r->attention_factor;
        else if (r->mscale > 0 && r->mscale_all_dim > 0)
            t->attn_scaling = (float)(yarn_mscale(f, r->mscale) / yarn_mscale(f, r->mscale_all_dim));
        else t->attn_scaling = (float)yarn_mscale(f, 1.0);
        break;
    }
    case PT_ROPE_LONGROPE: {
        if (r->n_short_factor != n || r->n_long_factor != n) {
            pt_rope_table_free(t);
            return pt_error(PT_ERR_FORMAT, "%s: longrope short_factor/long_factor have %d/%d entries, expected %d "
                                           "(rotary dim / 2)",
                            what, r->n_short_factor, r->n_long_factor, n);
        }
        t->inv_freq_long = calloc((size_t)n, sizeof(float));
        if (!t->inv_freq_long) return pt_error(PT_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) {
            float pf = powf((float)r->theta, (float)(2 * i) / (float)d);
            inv[i] = (float)(1.0 / (r->short_factor[i] * pf));
            t->inv_freq_long[i] = (float)(1.0 / (r->long_factor[i] * pf));
        }
        double om = (double)r->original_max_position_embeddings;
        t->original_max = r->original_max_position_embeddings;
        if (r->attention_factor > 0) t->attn_scaling = (float)r->attention_factor;
        else if (om > 0 && max_pos > 0 && (double)max_pos / om > 1)
            t->attn_scaling = (float)sqrt(1 + log((double)max_pos / om) / log(om));
        break;
    }
    default: pt_rope_table_free(t); return pt_error(PT_ERR_UNSUPPORTED, "%s: RoPE type %d", what, (int)r->type);
    }
    return PT_OK;
}

void pt_rope_table_free(pt_rope_table *t) {
    free(t->inv_freq);
    free(t->inv_freq_long);
    memset(t, 0, sizeof *t);
}
