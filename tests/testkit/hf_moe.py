"""Tiny Hugging Face mixture-of-experts configs (keyword arguments of transformers'
``Qwen3MoeConfig`` and ``DeepseekV3Config``, whose defaults are the released models' sizes),
shared by the cost-description and trial tests."""

QWEN3_MOE = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    vocab_size=128,
)
DEEPSEEK_V3 = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    num_hidden_layers=4,
    first_k_dense_replace=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    vocab_size=128,
    n_group=2,
    topk_group=1,
)
