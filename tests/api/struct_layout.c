/*
 * struct_layout.c: the size of every public struct and the offset and size of each of its fields,
 * as one JSON object, for the test that holds the Python package's ctypes declarations to the C
 * headers (python/tests/test_struct_layout.py). A struct added to a public header is added here.
 */
#include "minference.h"
#include "minference_kv.h"
#include "minference_model.h"
#include "minference_session.h"
#include "minference_tools.h"

#include <stddef.h>
#include <stdio.h>

static int n_structs, n_fields;

static void begin(const char *name, size_t size) {
    printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", n_structs++ ? "," : "", name, size);
    n_fields = 0;
}

static void field(const char *name, size_t offset, size_t size) {
    printf("%s\"%s\": [%zu, %zu]", n_fields++ ? ", " : "", name, offset, size);
}

static void end(void) { printf("}}"); }

/* [offset, size] of field f of the struct T in scope. */
#define F(f) field(#f, offsetof(T, f), sizeof(((T *)0)->f))

int main(void) {
    printf("{");
    {
        typedef mi_context_params T;
        begin("mi_context_params", sizeof(T));
        F(device);
        F(device_id);
        F(n_threads);
        end();
    }
    {
        typedef mi_tensor T;
        begin("mi_tensor", sizeof(T));
        F(data);
        F(dtype);
        F(device);
        F(shape);
        F(stride);
        end();
    }
    {
        typedef mi_head_pattern T;
        begin("mi_head_pattern", sizeof(T));
        F(type);
        F(vertical_size);
        F(slash_size);
        F(n_init);
        F(n_local);
        F(n_last);
        F(top_k);
        F(stride);
        F(threshold);
        F(tau);
        F(dense_local);
        F(block_size);
        F(repr_topk);
        F(chunk_size);
        F(per_head);
        end();
    }
    {
        typedef mi_vs_params T;
        begin("mi_vs_params", sizeof(T));
        F(last_q);
        F(forced_columns);
        F(forced_diagonals);
        F(min_vertical);
        F(min_slash);
        end();
    }
    {
        typedef mi_prefill_params T;
        begin("mi_prefill_params", sizeof(T));
        F(softmax_scale);
        F(vs);
        F(dense_below);
        end();
    }
    {
        typedef mi_vs_index T;
        begin("mi_vs_index", sizeof(T));
        F(batch);
        F(heads);
        F(max_vertical);
        F(max_slash);
        F(vertical_count);
        F(vertical_idx);
        F(slash_count);
        F(slash_idx);
        end();
    }
    {
        typedef mi_sparse_index T;
        begin("mi_sparse_index", sizeof(T));
        F(batch);
        F(heads);
        F(row_blocks);
        F(max_blocks);
        F(max_columns);
        F(block_count);
        F(block_offset);
        F(column_count);
        F(column_index);
        end();
    }
    {
        typedef mi_synth_params T;
        begin("mi_synth_params", sizeof(T));
        F(seed);
        F(n_sinks);
        F(n_verticals);
        F(n_slashes);
        F(slash_distances);
        F(local_window);
        F(n_needles);
        F(strength);
        F(noise);
        end();
    }
    {
        typedef mi_synth_truth T;
        begin("mi_synth_truth", sizeof(T));
        F(vertical_cols);
        F(slash_dists);
        F(needle_rows);
        F(needle_cols);
        end();
    }
    {
        typedef mi_head_metrics T;
        begin("mi_head_metrics", sizeof(T));
        F(recall);
        F(density);
        F(flops);
        F(dense_flops);
        end();
    }
    {
        typedef mi_search_params T;
        begin("mi_search_params", sizeof(T));
        F(candidates);
        F(n_candidates);
        F(mode);
        F(target_density);
        F(target_recall);
        F(error_weight);
        F(max_scale);
        F(min_scale);
        F(iterations);
        F(prefill);
        end();
    }
    {
        typedef mi_rope_scaling T;
        begin("mi_rope_scaling", sizeof(T));
        F(type);
        F(factor);
        F(original_context);
        F(low_freq_factor);
        F(high_freq_factor);
        F(beta_fast);
        F(beta_slow);
        F(attention_factor);
        end();
    }
    {
        typedef mi_model_params T;
        begin("mi_model_params", sizeof(T));
        F(device);
        F(n_threads);
        F(max_context);
        F(mlp_chunk);
        F(device_id);
        F(check_weights);
        F(kv_offload);
        F(kv_pinned);
        end();
    }
    {
        typedef mi_model_shape T;
        begin("mi_model_shape", sizeof(T));
        F(n_layers);
        F(hidden);
        F(n_heads);
        F(n_kv_heads);
        F(head_dim);
        F(ffn);
        F(vocab);
        F(rope_theta);
        F(context_length);
        F(sliding_window);
        F(qkv_bias);
        end();
    }
    {
        typedef mi_model_info T;
        begin("mi_model_info", sizeof(T));
        F(arch);
        F(source);
        F(n_layers);
        F(n_heads);
        F(n_kv_heads);
        F(head_dim);
        F(hidden);
        F(ffn);
        F(vocab);
        F(context_length);
        F(rope_theta);
        F(rms_eps);
        F(rope_scaling);
        F(tied_embeddings);
        F(bos);
        F(eos);
        F(eot);
        F(weight_bytes);
        F(sliding_window);
        end();
    }
    {
        typedef mi_model_timing T;
        begin("mi_model_timing", sizeof(T));
        F(n_tokens);
        F(total_s);
        F(attention_s);
        F(gemm_s);
        F(device_bytes);
        F(device_peak_bytes);
        end();
    }
    {
        typedef mi_model_capture T;
        begin("mi_model_capture", sizeof(T));
        F(on_layer);
        F(user);
        F(token_log_probs);
        end();
    }
    {
        typedef mi_kv_page_layout T;
        begin("mi_kv_page_layout", sizeof(T));
        F(dtype);
        F(page_tokens);
        F(n_kv_heads);
        F(head_dim);
        F(elem_bytes);
        F(has_scales);
        F(row_stride);
        F(head_stride);
        F(k_offset);
        F(v_offset);
        F(scale_offset);
        F(center_offset);
        F(page_bytes);
        F(meta_kinds);
        F(meta_bytes);
        F(bits);
        F(group_size);
        F(k_param_offset);
        F(v_param_offset);
        end();
    }
    {
        typedef mi_kv_pool_params T;
        begin("mi_kv_pool_params", sizeof(T));
        F(n_layers);
        F(n_kv_heads);
        F(head_dim);
        F(dtype);
        F(page_tokens);
        F(capacity_tokens);
        F(capacity_bytes);
        F(meta_kinds);
        F(slab_pages);
        F(alloc);
        F(free);
        F(alloc_user);
        F(quant_group);
        F(quant_residual);
        end();
    }
    {
        typedef mi_kv_pool_stats T;
        begin("mi_kv_pool_stats", sizeof(T));
        F(capacity_pages);
        F(allocated_pages);
        F(used_pages);
        F(shared_pages);
        F(page_bytes);
        F(allocated_bytes);
        F(used_bytes);
        F(live_sequences);
        end();
    }
    {
        typedef mi_kv_cache_params T;
        begin("mi_kv_cache_params", sizeof(T));
        F(kv);
        F(n_layers);
        F(n_heads);
        F(n_kv_heads);
        F(head_dim);
        F(n_threads);
        F(pool_bytes);
        end();
    }
    {
        typedef mi_kv_page_view T;
        begin("mi_kv_page_view", sizeof(T));
        F(data);
        F(page_id);
        F(rows);
        F(meta_rows);
        F(refcount);
        F(first_row);
        F(k_scale);
        F(v_scale);
        F(k_center);
        F(v_center);
        F(key_minmax);
        end();
    }
    {
        typedef mi_kv_seq_stats T;
        begin("mi_kv_seq_stats", sizeof(T));
        F(tokens);
        F(pages);
        F(shared_pages);
        F(bytes);
        F(shared_bytes);
        end();
    }
    {
        typedef mi_kv_model_id T;
        begin("mi_kv_model_id", sizeof(T));
        F(arch);
        F(n_layers);
        F(n_heads);
        F(n_kv_heads);
        F(head_dim);
        F(hidden);
        F(vocab);
        F(weights_hash);
        end();
    }
    {
        typedef mi_kv_residual_view T;
        begin("mi_kv_residual_view", sizeof(T));
        F(first_row);
        F(rows);
        F(stride_rows);
        F(k);
        F(v);
        end();
    }
    {
        typedef mi_kv_attend_params T;
        begin("mi_kv_attend_params", sizeof(T));
        F(first);
        F(end);
        F(scale);
        F(channel_mask);
        F(mask_first);
        F(mask_end);
        end();
    }
    {
        typedef mi_session_params T;
        begin("mi_session_params", sizeof(T));
        F(max_tokens);
        F(pool_bytes);
        F(kv);
        F(kv_dtype);
        end();
    }
    {
        typedef mi_session_stats T;
        begin("mi_session_stats", sizeof(T));
        F(n_tokens);
        F(max_tokens);
        F(bytes);
        F(shared_bytes);
        F(pool_used_bytes);
        F(pool_allocated_bytes);
        F(pool_capacity_bytes);
        F(pool_sessions);
        F(page_tokens);
        F(kv_rows);
        F(kv_device_calls);
        end();
    }
    {
        typedef mi_blend_chunk T;
        begin("mi_blend_chunk", sizeof(T));
        F(tokens);
        F(n_tokens);
        F(cache);
        F(cache_row);
        end();
    }
    {
        typedef mi_blend_params T;
        begin("mi_blend_params", sizeof(T));
        F(recompute_ratio);
        F(check_layer);
        end();
    }
    {
        typedef mi_blend_stats T;
        begin("mi_blend_stats", sizeof(T));
        F(n_tokens);
        F(n_chunk_tokens);
        F(n_recomputed);
        F(seconds);
        end();
    }
    {
        typedef mi_tuning T;
        begin("mi_tuning", sizeof(T));
        F(cpu_engine);
        F(sm90);
        F(sm90_dense);
        F(sm90_sparse);
        F(sm90_a_shape);
        F(sm90_column_copies);
        F(sm90_plan_tiles);
        F(sm90_tma_store);
        F(tri_split);
        F(vs_wgmma);
        F(vs_score_tma);
        F(vs_index_mask);
        F(vs_index_shortcuts);
        F(bs_scores);
        F(bs_wgmma);
        F(bs_score_tma);
        F(bs_bound_slack);
        F(bs_stream);
        F(bs_rows);
        F(bs_wide);
        F(bs_bound);
        F(bs_cap);
        F(bs_split);
        F(bs_mask_append);
        F(bs_pool_vec);
        F(rowmask_two_pass);
        end();
    }
    printf("\n}\n");
    return 0;
}
