// SPDX-License-Identifier: MIT
// The CPU backend's glm_moe_dsa ops (backend.h: layernorm, cache_store, dsa_select,
// mla_attention), kept apart from backend_cpu.c. Internal to core/.
#ifndef LKS_CPU_MLA_H
#define LKS_CPU_MLA_H

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/threadpool.h"

// The CPU backend's thread pool and kernels (backend_cpu.c).
lks_pool *lks__cpu_pool(lks_backend *be);
const lks__cpu_kernels *lks__cpu_kernels_of(lks_backend *be);

int lks__cpu_layernorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor b,
                       float eps);
int lks__cpu_cache_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor x,
                         const lks_attn_rows *rows);
int lks__cpu_dsa_select(lks_backend *be, lks_tensor q, lks_tensor w, const lks_kv_layer *keys,
                        const lks_attn_rows *rows, int n_heads, float q_scale, float w_scale,
                        int topk, int32_t *sel, int32_t *n_sel);
int lks__cpu_mla_attention(lks_backend *be, lks_tensor out, lks_tensor q, lks_tensor wkv_b,
                           const lks_kv_layer *kv, const lks_attn_rows *rows,
                           const lks_mla_dims *d, const int32_t *sel, const int32_t *n_sel,
                           int sel_stride);

#endif
