"""Model geometries as data, each with the public config it comes from (SPEC §11).

A preset names one model at one tensor-parallel degree. Its SSM geometry is what one rank holds
(local heads); its attention geometry is global (the page kernels split heads per TP at run time).
`tiny-*` presets are for CPU tests and the embedded default run.
"""

from __future__ import annotations

from dataclasses import dataclass

from states.geometry import AttnGeometry, SSMGeometry


@dataclass(frozen=True)
class Preset:
    name: str
    tp: int
    ssm: SSMGeometry | None
    attn: AttnGeometry | None
    source: str

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(g.family for g in (self.ssm, self.attn) if g is not None)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "qwen3-next",
            tp=1,
            # 48 layers, full_attention_interval 4 -> 36 GDN + 12 full attention.
            ssm=SSMGeometry("gdn", layers=36, key_heads=16, value_heads=32, head_k_dim=128, head_v_dim=128),
            attn=AttnGeometry("gqa", layers=12, kv_heads=2, head_dim=256),
            source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_hidden_layers 48, full_attention_interval 4, "
            "linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128, "
            "linear_conv_kernel_dim 4, num_attention_heads 16, num_key_value_heads 2, head_dim 256",
        ),
        Preset(
            "qwen3.5-tp4",
            tp=4,
            # 64 layers, full_attention_interval 4 -> 48 GDN; 16 key / 48 value heads split over 4 ranks.
            ssm=SSMGeometry("gdn", layers=48, key_heads=4, value_heads=12, head_k_dim=128, head_v_dim=128),
            attn=AttnGeometry("gqa", layers=16, kv_heads=4, head_dim=256),
            source="Qwen/Qwen3.5-27B config.json: num_hidden_layers 64, full_attention_interval 4, "
            "linear_num_key_heads 16, linear_num_value_heads 48, linear_key/value_head_dim 128, "
            "linear_conv_kernel_dim 4, num_attention_heads 24, num_key_value_heads 4, head_dim 256; TP 4",
        ),
        Preset(
            "kimi-linear",
            tp=1,
            # 27 layers; full_attn_layers [4, 8, 12, 16, 20, 24, 27] are MLA, the other 20 are KDA.
            ssm=SSMGeometry("kda", layers=20, key_heads=32, value_heads=32, head_k_dim=128, head_v_dim=128),
            attn=AttnGeometry("mla", layers=7, kv_heads=1, head_dim=576, kv_lora_rank=512, rope_dim=64),
            source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json: num_hidden_layers 27, "
            "linear_attn_config kda_layers (20) / full_attn_layers [4,8,12,16,20,24,27], num_heads 32, head_dim 128, "
            "short_conv_kernel_size 4; MLA kv_lora_rank 512, qk_rope_head_dim 64",
        ),
        Preset(
            "glm-5.3-flash-tp8",
            tp=8,
            # 45 layers; layer i is sparse (MLA) attention when i % 4 == 3 -> 34 KDA + 11 MLA; 64 KDA heads / 8 ranks.
            ssm=SSMGeometry("kda", layers=34, key_heads=8, value_heads=8, head_k_dim=128, head_v_dim=128),
            attn=AttnGeometry("mla", layers=11, kv_heads=1, head_dim=576, kv_lora_rank=512, rope_dim=64),
            source="GLM-5.3-Flash (glm5_next) as served by LightLLM PR #1575 (lightllm/models/glm5_next): "
            "45 layers, layer_types sparse attention at i % 4 == 3, KDA 64 heads x 128, short conv 4, "
            "gate_lower_bound -5.0, MLA kv_lora_rank 512 + rope 64; TP 8",
        ),
        Preset(
            "llama-3-8b",
            tp=1,
            ssm=None,
            attn=AttnGeometry("gqa", layers=32, kv_heads=8, head_dim=128),
            source="meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, num_attention_heads 32, "
            "num_key_value_heads 8, hidden_size 4096 (head_dim 128)",
        ),
        Preset(
            "deepseek-v3",
            tp=1,
            ssm=None,
            attn=AttnGeometry("mla", layers=61, kv_heads=1, head_dim=576, kv_lora_rank=512, rope_dim=64),
            source="deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, kv_lora_rank 512, qk_rope_head_dim 64",
        ),
        # ---- tiny presets: CPU tests, the interpreter and the embedded default run ----
        Preset(
            "tiny-gdn",
            tp=1,
            ssm=SSMGeometry("gdn", layers=2, key_heads=2, value_heads=4, head_k_dim=16, head_v_dim=16),
            attn=AttnGeometry("gqa", layers=2, kv_heads=8, head_dim=16),
            source="synthetic: GDN with grouped value heads (HV = 2H) at CPU-test size",
        ),
        Preset(
            "tiny-kda",
            tp=1,
            ssm=SSMGeometry("kda", layers=2, key_heads=2, value_heads=2, head_k_dim=16, head_v_dim=16),
            attn=AttnGeometry("mla", layers=2, kv_heads=1, head_dim=48, kv_lora_rank=32, rope_dim=16),
            source="synthetic: KDA at CPU-test size",
        ),
    ]
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; a ValueError listing the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def get_ssm_preset(name: str) -> Preset:
    """A preset with linear-attention layers (GDN or KDA)."""
    preset = get_preset(name)
    if preset.ssm is None:
        with_ssm = [p.name for p in PRESETS.values() if p.ssm is not None]
        raise ValueError(f"preset {name!r} has no linear-attention layers; choose one of {', '.join(with_ssm)}")
    return preset


def get_attn_preset(name: str) -> Preset:
    """A preset with attention KV layers (GQA or MLA)."""
    preset = get_preset(name)
    if preset.attn is None:
        with_attn = [p.name for p in PRESETS.values() if p.attn is not None]
        raise ValueError(f"preset {name!r} has no attention KV layers; choose one of {', '.join(with_attn)}")
    return preset
