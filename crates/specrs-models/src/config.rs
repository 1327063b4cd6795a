//! Runtime configuration of the decoders spec-rs runs (Llama, Mistral, Qwen2, Qwen3, Phi-3,
//! InternLM2, Gemma 3, Granite, and the Mixtral, Qwen2-MoE, Qwen3-MoE and GLM-4.5 mixtures of
//! experts), read from a Hugging Face `config.json` or from GGUF metadata.

use serde_json::Value;

use crate::error::{ModelError, Result};

/// The decoder families spec-rs runs as targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama 2/3/3.1 (incl. llama3 rope scaling), SmolLM2, TinyLlama.
    Llama,
    /// Qwen2: bias on the q/k/v projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on queries and keys, no q/k/v bias.
    Qwen3,
    /// Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini: fused q/k/v and gate/up projections, LongRoPE,
    /// partial rotary dims (Phi-4-mini), sliding-window attention.
    Phi3,
    /// Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention, sparse experts plus a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): Qwen3's attention, sparse
    /// experts.
    Qwen3Moe,
    /// Granite 3.x (`GraniteForCausalLM`): Llama's layer with IBM's multipliers on the
    /// embeddings, the residual branches, the attention scores and the logits.
    Granite,
    /// ERNIE 4.5 dense (`Ernie4_5ForCausalLM`, Baidu's 0.3B): Llama's layer with RoPE turning
    /// interleaved pairs of the whole head.
    Ernie4_5,
    /// ERNIE 4.5 MoE (`Ernie4_5_MoeForCausalLM`: 21B-A3B, 300B-A47B): ERNIE 4.5's layer with
    /// experts from `moe_layer_start_index` on, chosen from a softmax plus a correction bias
    /// (`Router::BiasedSoftmax`), and `moe_num_shared_experts` shared experts added ungated.
    Ernie4_5Moe,
    /// Seed-OSS (`SeedOssForCausalLM`, ByteDance Seed-OSS-36B): Llama's layer with q/k/v biases
    /// (`attention_bias`) and an optional one on `o_proj` (`attention_out_bias`).
    SeedOss,
    /// Granite 3.x MoE (`GraniteMoeForCausalLM`, and `GraniteMoeSharedForCausalLM` with an
    /// always-on shared MLP): Granite's multipliers, experts stacked per layer
    /// (`block_sparse_moe.input_linear [E, 2I, H]`, gate rows first, and `output_linear`)
    /// under a router whose top-k logits are softmaxed.
    GraniteMoe,
    /// Gemma 2 (`Gemma2ForCausalLM`): Gemma 3's layer without q/k norms, one RoPE for every
    /// layer, sliding and full attention alternating, and scores and logits soft-capped
    /// (`cap · tanh(x / cap)`).
    Gemma2,
    /// Gemma 3 (text, `Gemma3ForCausalLM`): RMSNorms scaling by `1 + weight`, norms before and
    /// after attention and MLP, q/k norms, GELU-tanh MLP, embeddings scaled by `sqrt(hidden)`,
    /// `query_pre_attn_scalar`, and five sliding-window layers with their own RoPE base to
    /// each full-attention one.
    Gemma3,
    /// Mixtral 8x7B / 8x22B: Llama's attention, every MLP replaced by experts under
    /// `block_sparse_moe` (softmax top-2, renormalised).
    Mixtral,
    /// InternLM2 / InternLM2.5: Llama's layer under other names, q/k/v fused per key-value
    /// group (`attention.wqkv`).
    InternLm2,
    /// gpt-oss (20B, 120B): biased q/k/v/o, a learned attention sink per head, sliding and full
    /// layers alternating, YaRN, and experts stored as MXFP4 with interleaved gate/up rows,
    /// biases and a clamped SwiGLU.
    GptOss,
    /// SmolLM3 (`SmolLM3ForCausalLM`): Llama's layer, every fourth layer without RoPE
    /// (`no_rope_layers`).
    SmolLm3,
    /// OLMo 2 (`Olmo2ForCausalLM`): Llama's layer normalising the attention's and the MLP's
    /// outputs instead of their inputs, and q and k normed across all heads at once.
    Olmo2,
    /// OLMo 3 (`Olmo3ForCausalLM`): OLMo 2's layer, three sliding-window layers to each full
    /// one, the sliding layers turning with the unscaled RoPE.
    Olmo3,
    /// HunYuan dense (`HunYuanDenseV1ForCausalLM`: Hunyuan 0.5B-7B Instruct): Llama's layer with
    /// per-head q/k norms after RoPE (`query_layernorm`, `key_layernorm`) and RoPE's base scaled
    /// by NTK-alpha (`rope_scaling.alpha`).
    HunYuanDense,
    /// HunYuan MoE (`HunYuanMoEV1ForCausalLM`: Hunyuan-A13B): HunYuan dense's attention, softmax
    /// experts in every layer beside an ungated shared MLP.
    HunYuanMoe,
    /// EXAONE 4.0 (`Exaone4ForCausalLM`: 1.2B, 32B): OLMo 2's layer (norms over the attention's
    /// and the MLP's outputs) with per-head q/k norms; with a window, three sliding layers to
    /// each full one, only the sliding ones turning with RoPE.
    Exaone4,
    /// GLM-4-0414 (`Glm4ForCausalLM`: GLM-4-9B/32B-0414, GLM-Z1): q/k/v bias, norms around
    /// attention and MLP as Gemma's (plain weights), fused `gate_up_proj`, and RoPE over half of
    /// each head turning interleaved pairs.
    Glm4,
    /// GLM-4.5 / 4.6 / 4.7 and their Air models: q/k/v bias, optional q/k norm, RoPE over half of
    /// each head, leading dense layers, then DeepSeek-V3-style sigmoid-routed experts with a
    /// shared expert.
    Glm4Moe,
    /// dots.llm1 (`Dots1ForCausalLM`): Qwen3's attention (per-head q/k norms) with DeepSeek-V3's
    /// leading dense layers and sigmoid-routed experts (a correction bias, groups, shared
    /// experts).
    Dots1,
    /// OLMoE (`OlmoeForCausalLM`): Llama's pre-norm layer with q and k normed across all heads
    /// at once (OLMo 2's norms) and softmax-routed experts in every layer.
    Olmoe,
    /// Command-R / R+ / Aya (`CohereForCausalLM`): attention and MLP side by side from one
    /// bias-free LayerNorm, RoPE turning interleaved pairs, logits times `logit_scale`, and
    /// (R+) LayerNorms over each head of q and k with a weight row per head (`use_qk_norm`).
    Cohere,
    /// Command R7B / Command A (`Cohere2ForCausalLM`): Cohere's layer, three sliding-window
    /// layers with RoPE to each full-attention one without.
    Cohere2,
    /// DeepSeek-V2 / V2.5 / V2-Lite (`DeepseekV2ForCausalLM`): DeepSeek-V3's latent attention
    /// and layer, experts chosen from a softmax within the best groups (`Router::GroupedSoftmax`),
    /// an ungated shared expert.
    DeepseekV2,
    /// MiniMax-M2 / M2.1 / M2.5 (`MiniMaxM2ForCausalLM`): Llama's attention with q and k normed
    /// across all heads at once and RoPE over `rotary_dim` of each head, and in every layer
    /// sigmoid-routed experts under Mixtral's names with a correction bias (DeepSeek-V3's router
    /// in one group), no shared expert.
    MiniMaxM2,
    /// DeepSeek-V3 / R1 and its descendants (Kimi K2, Moonlight): multi-head latent attention
    /// (`crate::models::deepseek`), dense MLPs in the first `first_k_dense_replace` layers and
    /// then GLM-4.5's routed experts (sigmoid, group-limited, a correction bias, a shared
    /// expert).
    DeepseekV3,
    /// Llama 4 (`Llama4ForCausalLM`, the text decoder of `Llama4ForConditionalGeneration`:
    /// Scout, Maverick): chunked attention with RoPE and weightless q/k norms in three layers of
    /// four, full attention without positions (queries tempered by position) in the fourth, and
    /// sigmoid-routed experts beside a shared one ([`Llama4Attention`],
    /// [`Router::InputScaledSigmoid`]).
    Llama4,
    /// Arcee (`ArceeForCausalLM`: AFM-4.5B): Llama's layer with an MLP without a gate,
    /// `down(relu(up(x))²)`.
    Arcee,
    /// Apertus (`ApertusForCausalLM`: Swiss AI's 8B and 70B): Llama's layer with RMSNorms over
    /// each head of q and k, norms named `attention_layernorm` / `feedforward_layernorm`, and an
    /// MLP without a gate whose activation, xIELU, has learned parameters in every layer.
    Apertus,
    /// StarCoder2 (`Starcoder2ForCausalLM`: 3B, 7B, 15B): Mistral's sliding-window attention
    /// with biases on every projection (`use_bias`), LayerNorms with bias, and an MLP without a
    /// gate, `c_proj(gelu_tanh(c_fc(x)))`.
    Starcoder2,
    /// StableLM (`StableLmForCausalLM`: StableLM-3B-4E1T, StableLM 2 1.6B / 12B): LayerNorms
    /// with bias, RoPE over the leading quarter of each head, optional q/k/v biases
    /// (`use_qkv_bias`), per-head LayerNorms of q and k (`qk_layernorm`) and attention beside
    /// the MLP (`use_parallel_residual`).
    StableLm,
    /// Phi-1 / 1.5 / 2 (`PhiForCausalLM`): attention beside a tanh-GELU MLP without a gate
    /// (`fc1`, `fc2`) from one LayerNorm with bias, biases on every projection and on `lm_head`,
    /// RoPE over part of each head.
    Phi,
    /// Phi-3.5-MoE (`PhimoeForCausalLM`): Mixtral's layer with LayerNorms with bias, biases on
    /// q, k, v, o and (`lm_head_bias`) `lm_head`, LongRoPE with its own cos/sin scales
    /// (`short_mscale`, `long_mscale`), and experts chosen by sparsemixer
    /// ([`Router::SparseMixer`]).
    PhiMoe,
    /// OLMo 1 (`OlmoForCausalLM`: OLMo-1B / 7B, OLMo 1.7): Llama's layer with LayerNorms that
    /// have neither weight nor bias, and q, k and v clamped to `±clip_qkv` where the config
    /// gives it.
    Olmo,
    /// Gemma (`GemmaForCausalLM`: Gemma 2B / 7B, CodeGemma, Gemma 1.1): Llama's pre-norm layer
    /// with Gemma's norms (`1 + weight`), GeGLU, embeddings times `sqrt(hidden)` and tied
    /// embeddings; no windows, soft caps or norms after attention and MLP (Gemma 2's).
    Gemma,
    /// Nemotron (`NemotronForCausalLM`: Nemotron-4, Minitron, Nemotron-Mini): Llama's layer
    /// with LayerNorm1P (a LayerNorm with bias that scales by `1 + weight`), RoPE over half of
    /// each head, and an MLP without a gate, `down(relu(up(x))²)`.
    Nemotron,
    /// GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, Dolly v2, RedPajama-INCITE): attention beside
    /// the MLP (`use_parallel_residual`), each from its own LayerNorm with bias; q, k and v fused
    /// per head; RoPE over `rotary_pct` of each head; biases everywhere; an exact-GELU MLP
    /// without a gate.
    GptNeoX,
    /// Falcon (`FalconForCausalLM`: Falcon-7B/40B/180B, Falcon2-11B): attention beside the MLP
    /// from one LayerNorm with bias, or (`new_decoder_architecture`'s two) from `ln_attn` and
    /// `ln_mlp`; q, k and v fused in groups (each KV group's queries, then its key, then its
    /// value); multi-query or grouped attention; an exact-GELU MLP without a gate; biases only
    /// where `bias` says.
    Falcon,
    /// GPT-BigCode (`GPTBigCodeForCausalLM`: StarCoder, StarCoderBase, SantaCoder, WizardCoder):
    /// learned absolute positions added to the embeddings and no RoPE; multi-query attention
    /// with q, k and v fused in `c_attn` (or one group per head); LayerNorms with bias; biases
    /// everywhere; a tanh-GELU MLP without a gate.
    GptBigCode,
    /// GPT-2 (`GPT2LMHeadModel`: GPT-2 small to XL, DistilGPT2): GPT-BigCode's block with a
    /// KV head per query head and its weights stored by Conv1D as `[in, out]`.
    Gpt2,
    /// BLOOM (`BloomForCausalLM`: BLOOM 560m to 176B, BLOOMZ, mT0's decoder siblings): ALiBi in
    /// place of positions, a LayerNorm over the embeddings, pre-norm layers of LayerNorms with
    /// bias, q, k and v fused per head, biases everywhere, a tanh-GELU MLP without a gate.
    Bloom,
    /// MPT (`MptForCausalLM`: MPT-7B / 30B and their Instruct / Chat / StoryWriter tunes,
    /// Replit Code v1): ALiBi in place of positions (`alibi_bias_max`), LayerNorms without
    /// bias, q, k and v fused in `Wqkv` (all q, then k, then v) and optionally clamped, no
    /// biases, an exact-GELU MLP without a gate, tied embeddings.
    Mpt,
    /// Baichuan (`BaiChuanForCausalLM`: Baichuan-7B; `BaichuanForCausalLM`: Baichuan-13B,
    /// Baichuan 2 7B / 13B): Llama's layer with q, k and v stacked in `W_pack`; the 13B models
    /// add ALiBi in place of RoPE, and Baichuan 2 normalises `lm_head`'s rows (`NormHead`).
    Baichuan,
    /// GLM-4 as transformers first ported it (`GlmForCausalLM`: GLM-4-9B-Chat-HF, GLM-Edge):
    /// GLM-4-0414's layer (q/k/v biases, fused `gate_up_proj`, interleaved RoPE over half of
    /// each head) with Llama's two norms.
    Glm,
    /// ChatGLM (`ChatGLMModel` / `ChatGLMForConditionalGeneration`: ChatGLM2-6B, ChatGLM3-6B,
    /// GLM-4-9B-Chat as released): [`Self::Glm`]'s layer under THUDM's names, q, k and v
    /// fused in `query_key_value` (all q, then the groups' k, then v), RoPE's base times
    /// `rope_ratio`.
    ChatGlm,
}

impl Architecture {
    /// Hugging Face `architectures[0]` names accepted for each family.
    pub const HF_NAMES: &'static [(&'static str, Architecture)] = &[
        ("LlamaForCausalLM", Architecture::Llama),
        ("MistralForCausalLM", Architecture::Llama),
        ("Qwen2ForCausalLM", Architecture::Qwen2),
        ("MiMoForCausalLM", Architecture::Qwen2),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
        ("Phi3ForCausalLM", Architecture::Phi3),
        ("Qwen2MoeForCausalLM", Architecture::Qwen2Moe),
        ("Qwen3MoeForCausalLM", Architecture::Qwen3Moe),
        ("Glm4ForCausalLM", Architecture::Glm4),
        ("Olmo2ForCausalLM", Architecture::Olmo2),
        ("Olmo3ForCausalLM", Architecture::Olmo3),
        ("Exaone4ForCausalLM", Architecture::Exaone4),
        ("HunYuanDenseV1ForCausalLM", Architecture::HunYuanDense),
        ("HunYuanMoEV1ForCausalLM", Architecture::HunYuanMoe),
        ("OlmoeForCausalLM", Architecture::Olmoe),
        ("SeedOssForCausalLM", Architecture::SeedOss),
        ("Ernie4_5ForCausalLM", Architecture::Ernie4_5),
        ("Ernie4_5_MoeForCausalLM", Architecture::Ernie4_5Moe),
        ("SmolLM3ForCausalLM", Architecture::SmolLm3),
        ("Glm4MoeForCausalLM", Architecture::Glm4Moe),
        ("Dots1ForCausalLM", Architecture::Dots1),
        ("InternLM2ForCausalLM", Architecture::InternLm2),
        ("MixtralForCausalLM", Architecture::Mixtral),
        ("GemmaForCausalLM", Architecture::Gemma),
        ("NemotronForCausalLM", Architecture::Nemotron),
        ("GPTNeoXForCausalLM", Architecture::GptNeoX),
        ("FalconForCausalLM", Architecture::Falcon),
        ("GPTBigCodeForCausalLM", Architecture::GptBigCode),
        ("GPT2LMHeadModel", Architecture::Gpt2),
        ("BloomForCausalLM", Architecture::Bloom),
        ("MptForCausalLM", Architecture::Mpt),
        // MosaicML's own checkpoints name their remote-code class.
        ("MPTForCausalLM", Architecture::Mpt),
        ("BaichuanForCausalLM", Architecture::Baichuan),
        ("BaiChuanForCausalLM", Architecture::Baichuan),
        ("GlmForCausalLM", Architecture::Glm),
        ("ChatGLMModel", Architecture::ChatGlm),
        ("ChatGLMForConditionalGeneration", Architecture::ChatGlm),
        ("Gemma2ForCausalLM", Architecture::Gemma2),
        ("Gemma3ForCausalLM", Architecture::Gemma3),
        ("GraniteForCausalLM", Architecture::Granite),
        ("GraniteMoeForCausalLM", Architecture::GraniteMoe),
        ("GraniteMoeSharedForCausalLM", Architecture::GraniteMoe),
        ("GptOssForCausalLM", Architecture::GptOss),
        ("CohereForCausalLM", Architecture::Cohere),
        ("Cohere2ForCausalLM", Architecture::Cohere2),
        ("DeepseekV2ForCausalLM", Architecture::DeepseekV2),
        ("DeepseekV3ForCausalLM", Architecture::DeepseekV3),
        // GLM-4.7-Flash: DeepSeek-V3's latent attention and GLM-4.5's (= DeepSeek-V3's) router.
        ("Glm4MoeLiteForCausalLM", Architecture::DeepseekV3),
        ("MiniMaxM2ForCausalLM", Architecture::MiniMaxM2),
        ("Llama4ForCausalLM", Architecture::Llama4),
        ("ArceeForCausalLM", Architecture::Arcee),
        ("ApertusForCausalLM", Architecture::Apertus),
        ("Starcoder2ForCausalLM", Architecture::Starcoder2),
        ("StableLmForCausalLM", Architecture::StableLm),
        ("PhiForCausalLM", Architecture::Phi),
        ("PhimoeForCausalLM", Architecture::PhiMoe),
        ("OlmoForCausalLM", Architecture::Olmo),
    ];

    /// GGUF `general.architecture` values accepted for each family.
    pub const GGUF_NAMES: &'static [(&'static str, Architecture)] = &[
        ("llama", Architecture::Llama),
        ("qwen2", Architecture::Qwen2),
        ("qwen3", Architecture::Qwen3),
        ("phi3", Architecture::Phi3),
        ("gemma", Architecture::Gemma),
        ("nemotron", Architecture::Nemotron),
        ("gptneox", Architecture::GptNeoX),
        ("falcon", Architecture::Falcon),
        ("starcoder", Architecture::GptBigCode),
        ("gpt2", Architecture::Gpt2),
        ("bloom", Architecture::Bloom),
        ("mpt", Architecture::Mpt),
        ("chatglm", Architecture::ChatGlm),
        ("baichuan", Architecture::Baichuan),
        ("gemma2", Architecture::Gemma2),
        ("gemma3", Architecture::Gemma3),
        ("qwen2moe", Architecture::Qwen2Moe),
        ("qwen3moe", Architecture::Qwen3Moe),
        ("internlm2", Architecture::InternLm2),
        ("granite", Architecture::Granite),
        ("granitemoe", Architecture::GraniteMoe),
        ("glm4", Architecture::Glm4),
        ("command-r", Architecture::Cohere),
        ("cohere2", Architecture::Cohere2),
        // OLMo 3 too, when the file sets a sliding window (`GgufSource::open`).
        ("olmo2", Architecture::Olmo2),
        ("smollm3", Architecture::SmolLm3),
        ("exaone4", Architecture::Exaone4),
        // llama.cpp writes the NTK-alpha base as `rope.freq_base`.
        ("hunyuan-dense", Architecture::HunYuanDense),
        ("hunyuan-moe", Architecture::HunYuanMoe),
        // DeepSeek-V2 when the file routes by softmax (`GgufSource::open`).
        ("deepseek2", Architecture::DeepseekV3),
        ("glm4moe", Architecture::Glm4Moe),
        ("dots1", Architecture::Dots1),
        ("olmoe", Architecture::Olmoe),
        ("seed_oss", Architecture::SeedOss),
        ("ernie4_5", Architecture::Ernie4_5),
        ("ernie4_5-moe", Architecture::Ernie4_5Moe),
        ("minimax-m2", Architecture::MiniMaxM2),
        // llama.cpp fixes the chunk and the temperature's floor at 8192 (Scout's and Maverick's).
        ("llama4", Architecture::Llama4),
        ("arcee", Architecture::Arcee),
        ("apertus", Architecture::Apertus),
        ("starcoder2", Architecture::Starcoder2),
        ("stablelm", Architecture::StableLm),
        ("phi2", Architecture::Phi),
        ("phimoe", Architecture::PhiMoe),
        ("olmo", Architecture::Olmo),
    ];

    pub fn from_hf_name(name: &str) -> Result<Self> {
        Self::HF_NAMES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a).ok_or_else(|| {
            ModelError::UnknownArchitecture {
                name: name.to_string(),
                supported: Self::HF_NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
        })
    }

    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Self::GGUF_NAMES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a).ok_or_else(|| {
            ModelError::UnknownArchitecture {
                name: name.to_string(),
                supported: Self::GGUF_NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
        })
    }

    /// The canonical Hugging Face class name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Phi3 => "Phi3ForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
            Self::Glm4 => "Glm4ForCausalLM",
            Self::Olmo2 => "Olmo2ForCausalLM",
            Self::Olmo3 => "Olmo3ForCausalLM",
            Self::Exaone4 => "Exaone4ForCausalLM",
            Self::HunYuanDense => "HunYuanDenseV1ForCausalLM",
            Self::HunYuanMoe => "HunYuanMoEV1ForCausalLM",
            Self::Olmoe => "OlmoeForCausalLM",
            Self::SeedOss => "SeedOssForCausalLM",
            Self::Ernie4_5 => "Ernie4_5ForCausalLM",
            Self::Ernie4_5Moe => "Ernie4_5_MoeForCausalLM",
            Self::SmolLm3 => "SmolLM3ForCausalLM",
            Self::Glm4Moe => "Glm4MoeForCausalLM",
            Self::Dots1 => "Dots1ForCausalLM",
            Self::InternLm2 => "InternLM2ForCausalLM",
            Self::Mixtral => "MixtralForCausalLM",
            Self::Gemma2 => "Gemma2ForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
            Self::Granite => "GraniteForCausalLM",
            Self::GraniteMoe => "GraniteMoeForCausalLM",
            Self::GptOss => "GptOssForCausalLM",
            Self::Cohere => "CohereForCausalLM",
            Self::Cohere2 => "Cohere2ForCausalLM",
            Self::DeepseekV2 => "DeepseekV2ForCausalLM",
            Self::DeepseekV3 => "DeepseekV3ForCausalLM",
            Self::MiniMaxM2 => "MiniMaxM2ForCausalLM",
            Self::Llama4 => "Llama4ForCausalLM",
            Self::Arcee => "ArceeForCausalLM",
            Self::Apertus => "ApertusForCausalLM",
            Self::Starcoder2 => "Starcoder2ForCausalLM",
            Self::StableLm => "StableLmForCausalLM",
            Self::Phi => "PhiForCausalLM",
            Self::PhiMoe => "PhimoeForCausalLM",
            Self::Olmo => "OlmoForCausalLM",
            Self::Gemma => "GemmaForCausalLM",
            Self::Nemotron => "NemotronForCausalLM",
            Self::GptNeoX => "GPTNeoXForCausalLM",
            Self::Falcon => "FalconForCausalLM",
            Self::GptBigCode => "GPTBigCodeForCausalLM",
            Self::Gpt2 => "GPT2LMHeadModel",
            Self::Bloom => "BloomForCausalLM",
            Self::Mpt => "MptForCausalLM",
            Self::Baichuan => "BaichuanForCausalLM",
            Self::Glm => "GlmForCausalLM",
            Self::ChatGlm => "ChatGLMModel",
        }
    }

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Qwen2Moe => "qwen2_moe",
            Self::Qwen3Moe => "qwen3_moe",
            Self::Glm4 => "glm4",
            Self::Olmo2 => "olmo2",
            Self::Olmo3 => "olmo3",
            Self::Exaone4 => "exaone4",
            Self::HunYuanDense => "hunyuan_v1_dense",
            Self::HunYuanMoe => "hunyuan_v1_moe",
            Self::Olmoe => "olmoe",
            Self::SeedOss => "seed_oss",
            Self::Ernie4_5 => "ernie4_5",
            Self::Ernie4_5Moe => "ernie4_5_moe",
            Self::SmolLm3 => "smollm3",
            Self::Glm4Moe => "glm4_moe",
            Self::Dots1 => "dots1",
            Self::InternLm2 => "internlm2",
            Self::Mixtral => "mixtral",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3_text",
            Self::Granite => "granite",
            Self::GraniteMoe => "granitemoe",
            Self::GptOss => "gpt_oss",
            Self::Cohere => "cohere",
            Self::Cohere2 => "cohere2",
            Self::DeepseekV2 => "deepseek_v2",
            Self::DeepseekV3 => "deepseek_v3",
            Self::MiniMaxM2 => "minimax_m2",
            Self::Llama4 => "llama4_text",
            Self::Arcee => "arcee",
            Self::Apertus => "apertus",
            Self::Starcoder2 => "starcoder2",
            Self::StableLm => "stablelm",
            Self::Phi => "phi",
            Self::PhiMoe => "phimoe",
            Self::Olmo => "olmo",
            Self::Gemma => "gemma",
            Self::Nemotron => "nemotron",
            Self::GptNeoX => "gpt_neox",
            Self::Falcon => "falcon",
            Self::GptBigCode => "gpt_bigcode",
            Self::Gpt2 => "gpt2",
            Self::Bloom => "bloom",
            Self::Mpt => "mpt",
            Self::Baichuan => "baichuan",
            Self::Glm => "glm",
            Self::ChatGlm => "chatglm",
        }
    }

    /// Qwen2's attention: a bias on q, k and v.
    pub fn qkv_bias_by_default(self) -> bool {
        matches!(self, Self::Qwen2 | Self::Qwen2Moe | Self::GptOss | Self::Glm4 | Self::Glm | Self::SeedOss)
    }

    /// Gemma's norms, GeGLU and embedding scale (`DecoderConfig::gemma`): Gemma, Gemma 2 and
    /// Gemma 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, Self::Gemma | Self::Gemma2 | Self::Gemma3)
    }

    /// Norms that are LayerNorms, with a bias or (OLMo 1) without weights: StarCoder2,
    /// StableLM, Phi, Phi-3.5-MoE, OLMo 1, Nemotron, GPT-NeoX, Falcon, GPT-BigCode, GPT-2 and
    /// BLOOM.
    /// Cohere's bias-free LayerNorms are not among them.
    pub fn has_layer_norms(self) -> bool {
        matches!(
            self,
            Self::Starcoder2
                | Self::StableLm
                | Self::Phi
                | Self::PhiMoe
                | Self::Olmo
                | Self::Nemotron
                | Self::GptNeoX
                | Self::Falcon
                | Self::GptBigCode
                | Self::Gpt2
                | Self::Bloom
        )
    }

    /// GPT-2's block: learned absolute positions and no RoPE, GPT-2's config keys (GPT-2 and
    /// GPT-BigCode).
    pub fn is_gpt2_like(self) -> bool {
        matches!(self, Self::Gpt2 | Self::GptBigCode)
    }

    /// HunYuan's attention: per-head q/k norms after RoPE, NTK-alpha's raised base.
    pub fn is_hunyuan(self) -> bool {
        matches!(self, Self::HunYuanDense | Self::HunYuanMoe)
    }

    /// Qwen3's (and Gemma 3's) attention: an RMSNorm over each head of q and k.
    pub fn has_qk_norm(self) -> bool {
        matches!(
            self,
            Self::Qwen3
                | Self::Qwen3Moe
                | Self::Dots1
                | Self::Gemma3
                | Self::Olmo2
                | Self::Olmo3
                | Self::Olmoe
                | Self::Exaone4
                | Self::Apertus
        )
    }
}

/// Rotary-embedding frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, smooth in between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Explicit per-frequency divisors (GGUF `rope_freqs.weight`), length head_dim / 2.
    FrequencyFactors(Vec<f32>),
    /// Phi-3's LongRoPE: per-frequency divisors for contexts within the pretrained window
    /// (`short_factor`) and past it (`long_factor`), and cos/sin scaled by `attention_factor`.
    /// One set serves the whole context, chosen once for the context the model serves
    /// (`extended`, see [`DecoderConfig::serve_context`]), as llama.cpp chooses: switching sets
    /// mid-sequence, as transformers does, would leave cached keys rotated by the other set.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
        /// Phi-3.5-MoE's own cos/sin scales for the short and long sets (`short_mscale`,
        /// `long_mscale`), in place of `attention_factor`.
        mscales: Option<(f64, f64)>,
        extended: bool,
    },
    /// YaRN: high frequencies kept, low ones divided by the factor, a linear ramp between
    /// (over the dims whose wavelengths fall between `beta_fast` and `beta_slow` rotations of
    /// the pretrained context), cos/sin scaled by `attention_factor`.
    Yarn { params: Yarn, attention_factor: f64 },
}

impl RopeScaling {
    /// Refuses factors no scaling can use: a zero or negative divisor turns every angle into
    /// infinity (or flips it), and the model loads but generates garbage.
    fn check(&self) -> Result<()> {
        let positive = |key: &str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(ModelError::config(format!("rope_scaling.{key}"), format!("must be positive, got {value}")))
            }
        };
        match self {
            Self::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("original_max_position_embeddings", *original_max_position_embeddings)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ModelError::config(
                        "rope_scaling.high_freq_factor",
                        format!("must exceed low_freq_factor ({low_freq_factor}), got {high_freq_factor}"),
                    ));
                }
                Ok(())
            }
            Self::Linear { factor } => positive("factor", *factor),
            Self::FrequencyFactors(factors) => factors.iter().try_for_each(|&f| positive("factors", f.into())),
            Self::LongRope { short_factor, long_factor, .. } => {
                short_factor.iter().try_for_each(|&f| positive("short_factor", f.into()))?;
                long_factor.iter().try_for_each(|&f| positive("long_factor", f.into()))
            }
            Self::Yarn { .. } => Ok(()),
        }
    }

    /// The factor cos and sin are multiplied by (1 except for LongRoPE and YaRN).
    pub fn attention_factor(&self) -> f64 {
        match self {
            Self::LongRope { mscales: Some((short, long)), extended, .. } => {
                if *extended {
                    *long
                } else {
                    *short
                }
            }
            Self::LongRope { attention_factor, .. } | Self::Yarn { attention_factor, .. } => *attention_factor,
            _ => 1.0,
        }
    }
}

/// YaRN's parameters (Qwen2.5 / Qwen3 long context, DeepSeek-V3, gpt-oss), as transformers
/// reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    /// The pretrained context the correction range is measured against.
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Round the correction range outwards to whole dims (gpt-oss sets false).
    pub truncate: bool,
}

fn yarn(rs: &Value, max_position_embeddings: usize) -> Result<RopeScaling> {
    let factor = opt_f64(rs, "factor")
        .filter(|f| *f >= 1.0)
        .ok_or_else(|| ModelError::config("rope_scaling.factor", "YaRN needs a factor of at least 1"))?;
    let original = opt_f64(rs, "original_max_position_embeddings").unwrap_or(max_position_embeddings as f64);
    // transformers: 0.1·mscale·ln(factor) + 1, or DeepSeek's ratio of two such terms.
    let magnitude = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
    let attention_factor = match (opt_f64(rs, "attention_factor"), opt_f64(rs, "mscale"), opt_f64(rs, "mscale_all_dim"))
    {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => magnitude(m) / magnitude(all),
        _ => magnitude(1.0),
    };
    let params = Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: opt_f64(rs, "beta_fast").unwrap_or(32.0),
        beta_slow: opt_f64(rs, "beta_slow").unwrap_or(1.0),
        truncate: rs.get("truncate").and_then(Value::as_bool).unwrap_or(true),
    };
    if params.beta_fast < params.beta_slow {
        return Err(ModelError::config(
            "rope_scaling.beta_fast",
            format!("must be at least beta_slow ({}), got {}", params.beta_slow, params.beta_fast),
        ));
    }
    Ok(RopeScaling::Yarn { params, attention_factor })
}

/// Constant factors some families put on the shared layer's activations.
#[derive(Debug, Clone, PartialEq)]
pub struct Scales {
    /// Embeddings are multiplied by it (Granite's `embedding_multiplier`; Gemma's
    /// `sqrt(hidden)`).
    pub embedding: f64,
    /// Each residual branch (attention's and the MLP's output) is multiplied by it before it
    /// is added (Granite's `residual_multiplier`).
    pub residual: f64,
    /// The softmax scale of the scores, when not `head_dim^-0.5` (Granite's
    /// `attention_multiplier`, Gemma's `query_pre_attn_scalar^-0.5`).
    pub attention: Option<f64>,
    /// Logits are divided by it (Granite's `logits_scaling`).
    pub logits_divisor: f64,
    /// Scaled scores become `cap · tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`).
    pub attention_softcap: Option<f64>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2's `final_logit_softcapping`).
    pub logits_softcap: Option<f64>,
}

impl Default for Scales {
    fn default() -> Self {
        Self {
            embedding: 1.0,
            residual: 1.0,
            attention: None,
            logits_divisor: 1.0,
            attention_softcap: None,
            logits_softcap: None,
        }
    }
}

/// The factors a `config.json` of `architecture` sets.
fn scales(v: &Value, architecture: Architecture, hidden_size: usize, head_dim: usize) -> Result<Scales> {
    Ok(match architecture {
        Architecture::Granite | Architecture::GraniteMoe => Scales {
            embedding: opt_f64(v, "embedding_multiplier").unwrap_or(1.0),
            residual: opt_f64(v, "residual_multiplier").unwrap_or(1.0),
            attention: Some(opt_f64(v, "attention_multiplier").unwrap_or((head_dim as f64).powf(-0.5))),
            logits_divisor: opt_f64(v, "logits_scaling").unwrap_or(1.0),
            ..Scales::default()
        },
        // Gemma 2's caps default on (50 and 30) when its config leaves them out, Gemma 3's
        // off; `null` turns either off.
        Architecture::Gemma | Architecture::Gemma2 | Architecture::Gemma3 => {
            let gemma2 = architecture == Architecture::Gemma2;
            let cap = |key: &str, gemma2_default: f64| match v.get(key) {
                None => gemma2.then_some(gemma2_default),
                Some(x) => x.as_f64(),
            };
            Scales {
                embedding: (hidden_size as f64).sqrt(),
                attention: Some(opt_f64(v, "query_pre_attn_scalar").unwrap_or(head_dim as f64).powf(-0.5)),
                attention_softcap: cap("attn_logit_softcapping", 50.0),
                logits_softcap: cap("final_logit_softcapping", 30.0),
                ..Scales::default()
            }
        }
        // Cohere multiplies its logits by `logit_scale`.
        Architecture::Cohere | Architecture::Cohere2 => {
            let scale = opt_f64(v, "logit_scale").unwrap_or(0.0625);
            if !(scale.is_finite() && scale > 0.0) {
                return Err(ModelError::config("logit_scale", format!("must be positive and finite, got {scale}")));
            }
            Scales { logits_divisor: 1.0 / scale, ..Scales::default() }
        }
        // DeepSeek scales scores by `head_dim^-0.5 · mscale²` under YaRN with `mscale_all_dim`,
        // `mscale = 0.1 · mscale_all_dim · ln(factor) + 1`.
        Architecture::DeepseekV2 | Architecture::DeepseekV3 => {
            let yarn = v
                .get("rope_scaling")
                .filter(|rs| rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str) == Some("yarn"));
            let mscale = match yarn.and_then(|rs| opt_f64(rs, "mscale_all_dim").zip(opt_f64(rs, "factor"))) {
                Some((all_dim, factor)) if all_dim != 0.0 && factor > 1.0 => 0.1 * all_dim * factor.ln() + 1.0,
                _ => 1.0,
            };
            // The expanded head's width, not the cached entry's (`head_dim` here).
            let qk_head_dim = req_usize(v, "qk_nope_head_dim")? + req_usize(v, "qk_rope_head_dim")?;
            Scales { attention: Some((qk_head_dim as f64).powf(-0.5) * mscale * mscale), ..Scales::default() }
        }
        _ => Scales::default(),
    })
}

/// DeepSeek's latent attention from `config.json` (transformers' DeepSeek-V3 defaults for
/// `rope_interleave`; the dims have none and are required).
fn mla_config(v: &Value) -> Result<MlaConfig> {
    let dim = |key: &str| -> Result<usize> {
        match req_usize(v, key)? {
            0 => Err(ModelError::config(key, "must be positive")),
            d => Ok(d),
        }
    };
    let q_lora_rank = match v.get("q_lora_rank") {
        None | Some(Value::Null) => None,
        Some(_) => Some(dim("q_lora_rank")?),
    };
    let m = MlaConfig {
        q_lora_rank,
        kv_lora_rank: dim("kv_lora_rank")?,
        qk_nope_head_dim: dim("qk_nope_head_dim")?,
        qk_rope_head_dim: dim("qk_rope_head_dim")?,
        v_head_dim: dim("v_head_dim")?,
        rope_interleave: v.get("rope_interleave").and_then(Value::as_bool).unwrap_or(true),
    };
    Ok(m)
}

/// ALiBi's distance bias on the attention scores ([`crate::alibi`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alibi {
    /// The slopes' series, `2^(-max_bias · i / heads)` (8 for BLOOM and Falcon-RW; MPT's
    /// `alibi_bias_max`).
    pub max_bias: f64,
    /// Added to the scores before they are scaled, so scaled with them (Falcon-RW), rather
    /// than to the scaled scores (BLOOM, MPT).
    pub before_scaling: bool,
}

impl Alibi {
    /// BLOOM's: slopes from `2^-8`, added to the scaled scores.
    pub const BLOOM: Self = Self { max_bias: 8.0, before_scaling: false };
    /// Falcon-RW's: BLOOM's slopes, added before the scores are scaled.
    pub const FALCON_RW: Self = Self { max_bias: 8.0, before_scaling: true };
}

/// Where a decoder layer's RMSNorms sit, under transformers' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention (`input_layernorm`) and before the MLP (`post_attention_layernorm`):
    /// Llama and most families.
    Pre,
    /// Before and after each: `input_layernorm`, `post_attention_layernorm` over the
    /// attention's output, `pre_feedforward_layernorm`, `post_feedforward_layernorm` (Gemma;
    /// GLM-4-0414 through its aliases).
    Sandwich,
    /// After each only: `post_attention_layernorm` over the attention's output,
    /// `post_feedforward_layernorm` over the MLP's (OLMo 2).
    Post,
    /// One `input_layernorm` feeding attention and MLP side by side, both added to the
    /// residual (Cohere).
    Parallel,
}

/// What Gemma 2 and 3 add to the shared layer (their sliding layers are
/// `DecoderConfig::sliding_layers`).
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// The sliding layers' RoPE base (no scaling); the others turn with the global RoPE
    /// (`rope_theta`, `rope_scaling`). Gemma 2's two RoPEs are the same.
    pub local_rope_theta: f64,
    /// The norms' weights are stored as the scale itself (`1 + weight`), as llama.cpp's
    /// converter writes Gemma, rather than transformers' `weight`.
    pub norms_store_scale: bool,
}

/// Llama 4's attention beside the shared layer's: its RoPE layers (`DecoderConfig::rope_layers`)
/// attend within chunks and norm q and k, its NoPE layers temper their queries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama4Attention {
    /// The RoPE layers see only the keys of their own `attention_chunk_size` positions.
    pub attention_chunk_size: Option<usize>,
    /// The RoPE layers norm each q and k head after RoPE, without weights
    /// (`Llama4TextL2Norm`: `x · rsqrt(mean(x²) + eps)`).
    pub qk_l2_norm: bool,
    /// The NoPE layers' queries are tempered by position (`attn_temperature_tuning`).
    pub query_temperature: Option<QueryTemperature>,
}

/// Llama 4's attention temperature tuning of the NoPE layers' queries (arXiv 2501.19399).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryTemperature {
    pub floor_scale: f64,
    pub attn_scale: f64,
}

impl QueryTemperature {
    /// The factor on a query at `position`: `ln(floor((p + 1) / floor_scale) + 1) · attn_scale
    /// + 1`, so exactly 1 before the first `floor_scale` positions end.
    pub fn factor(&self, position: u32) -> f64 {
        (((f64::from(position) + 1.0) / self.floor_scale).floor() + 1.0).ln() * self.attn_scale + 1.0
    }
}

/// Llama 4's attention from its text config, with `Llama4TextConfig`'s defaults.
fn llama4_attention(v: &Value) -> Result<Llama4Attention> {
    let attention_chunk_size = match v.get("attention_chunk_size") {
        None => Some(8192),
        Some(Value::Null) => None,
        Some(c) => match c.as_u64() {
            Some(c) if c > 0 => Some(c as usize),
            _ => {
                return Err(ModelError::config("attention_chunk_size", format!("must be a positive integer, got {c}")));
            }
        },
    };
    // Scout's released config writes it as a number (4), which transformers reads as truthy.
    let tuning = match v.get("attn_temperature_tuning") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(on)) => *on,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(other) => {
            return Err(ModelError::config("attn_temperature_tuning", format!("must be true or false, got {other}")));
        }
    };
    let query_temperature = match tuning {
        true => {
            let floor_scale = opt_f64(v, "floor_scale").unwrap_or(8192.0);
            if !(floor_scale.is_finite() && floor_scale > 0.0) {
                return Err(ModelError::config("floor_scale", format!("must be positive, got {floor_scale}")));
            }
            Some(QueryTemperature { floor_scale, attn_scale: opt_f64(v, "attn_scale").unwrap_or(0.1) })
        }
        false => None,
    };
    Ok(Llama4Attention {
        attention_chunk_size,
        qk_l2_norm: v.get("use_qk_norm").and_then(Value::as_bool).unwrap_or(true),
        query_temperature,
    })
}

/// Llama 4's experts: `num_local_experts` SwiGLU experts `intermediate_size` wide (stored
/// fused, `experts.gate_up_proj [E, H, 2I]`), the top `num_experts_per_tok` by logit fed the
/// token scaled by their sigmoid, and one shared expert as wide, in the `moe_layers` (default:
/// every `interleave_moe_layer_step`-th layer); the others keep a dense MLP of
/// `intermediate_size_mlp`.
fn llama4_experts(v: &Value) -> Result<MoeConfig> {
    let layers = req_usize(v, "num_hidden_layers")?;
    let width = req_usize(v, "intermediate_size")?;
    let step = v.get("interleave_moe_layer_step").and_then(Value::as_u64).unwrap_or(1) as usize;
    if step == 0 {
        return Err(ModelError::config("interleave_moe_layer_step", "must be positive"));
    }
    // An explicit list (newer configs) names the sparse layers; the step alone says the same.
    let (decoder_sparse_step, mlp_only_layers) = match v.get("moe_layers").filter(|l| !l.is_null()) {
        Some(list) => {
            let sparse = list
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_u64().map(|i| i as usize)).collect::<Option<Vec<_>>>())
                .filter(|l| l.iter().all(|&i| i < layers))
                .ok_or_else(|| ModelError::config("moe_layers", format!("must list layer indices below {layers}")))?;
            (1, (0..layers).filter(|l| !sparse.contains(l)).collect())
        }
        None => (step, Vec::new()),
    };
    Ok(MoeConfig {
        router: Router::InputScaledSigmoid,
        decoder_sparse_step,
        mlp_only_layers,
        shared_expert: Some(SharedExpertConfig { intermediate_size: width, gated: false }),
        ..MoeConfig::softmax_everywhere(
            req_usize(v, "num_local_experts")?,
            req_usize(v, "num_experts_per_tok")?,
            width,
            false,
        )
    })
}

/// `v` with each of `keys` set (a family's config under the keys the shared reader takes).
fn with_keys(v: &Value, keys: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    let mut out = v.clone();
    if let Some(map) = out.as_object_mut() {
        map.extend(keys.into_iter().map(|(k, value)| (k.to_string(), value)));
    }
    out
}

/// Falcon's `new_decoder_architecture` layers norm attention's input (`ln_attn`) and the
/// MLP's (`ln_mlp`) apart unless `num_ln_in_parallel_attn` is 1 (Falcon2-11B).
fn falcon_has_two_norms(v: &Value) -> bool {
    v.get("new_decoder_architecture").and_then(Value::as_bool).unwrap_or(false)
        && v.get("num_ln_in_parallel_attn").and_then(Value::as_u64).unwrap_or(2) == 2
}

/// A Falcon config under the keys the shared reader takes, with `FalconConfig`'s defaults
/// (and the first releases' `n_embed` / `n_head` / `n_layer`): its KV heads as its attention
/// splits them (`num_kv_heads` in the new layout, one for `multi_query`, else one per head),
/// `ffn_hidden_size` (4 × hidden), `bias` on every projection, attention beside the MLP
/// (`parallel_attn`, which the new layout requires). `alibi` (Falcon-RW) is read as it is.
fn with_falcon_keys(v: &Value) -> Result<Value> {
    let flag = |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
    let (new_layout, parallel) = (flag("new_decoder_architecture", false), flag("parallel_attn", true));
    if new_layout && !parallel {
        return Err(ModelError::config(
            "parallel_attn",
            "Falcon's new_decoder_architecture runs attention beside the MLP; set parallel_attn to true",
        ));
    }
    if !new_layout && v.get("num_ln_in_parallel_attn").and_then(Value::as_u64) == Some(2) {
        return Err(ModelError::config(
            "num_ln_in_parallel_attn",
            "two norms per layer (ln_attn, ln_mlp) come with new_decoder_architecture; set new_decoder_architecture \
             to true, or num_ln_in_parallel_attn to 1",
        ));
    }
    let usize_of = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64)).map(|x| x as usize);
    let hidden = usize_of(&["hidden_size", "n_embed"]).unwrap_or(4544);
    let heads = usize_of(&["num_attention_heads", "n_head"]).unwrap_or(71);
    let kv_heads = match (new_layout, flag("multi_query", true)) {
        (true, _) => usize_of(&["num_kv_heads", "n_head_kv"]).unwrap_or(heads),
        (false, true) => 1,
        (false, false) => heads,
    };
    Ok(with_keys(
        v,
        [
            ("hidden_size", Value::from(hidden)),
            ("num_attention_heads", Value::from(heads)),
            ("num_hidden_layers", Value::from(usize_of(&["num_hidden_layers", "n_layer"]).unwrap_or(32))),
            ("num_key_value_heads", Value::from(kv_heads)),
            ("intermediate_size", Value::from(usize_of(&["ffn_hidden_size"]).unwrap_or(4 * hidden))),
            ("vocab_size", Value::from(usize_of(&["vocab_size"]).unwrap_or(65_024))),
            ("max_position_embeddings", Value::from(usize_of(&["max_position_embeddings"]).unwrap_or(2048))),
            ("layer_norm_eps", Value::from(opt_f64(v, "layer_norm_epsilon").unwrap_or(1e-5))),
            ("attention_bias", Value::from(flag("bias", false))),
            ("use_parallel_residual", Value::from(new_layout || parallel)),
            ("tie_word_embeddings", Value::from(flag("tie_word_embeddings", true))),
            ("hidden_act", Value::from(v.get("activation").and_then(Value::as_str).unwrap_or("gelu"))),
        ],
    ))
}

/// A BLOOM config under the keys the shared reader takes, with `BloomConfig`'s defaults:
/// `n_embed` (the first releases' `hidden_size`), `n_layer`, `n_head`, `layer_norm_epsilon`,
/// an MLP 4 × hidden wide, tied embeddings, and as context `seq_length` or the 2048 positions
/// BLOOM trained on (ALiBi has no table to bound it). The residual taken after the input norm
/// (`apply_residual_connection_post_layernorm`) is refused.
fn with_bloom_keys(v: &Value) -> Result<Value> {
    if v.get("apply_residual_connection_post_layernorm").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::config(
            "apply_residual_connection_post_layernorm",
            "BLOOM with the residual taken after the input LayerNorm is not supported; released BLOOM checkpoints \
             set apply_residual_connection_post_layernorm to false",
        ));
    }
    let usize_of = |keys: &[&str], default: usize| {
        keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64)).map_or(default, |x| x as usize)
    };
    let hidden = usize_of(&["hidden_size", "n_embed"], 64);
    Ok(with_keys(
        v,
        [
            ("hidden_size", Value::from(hidden)),
            ("num_attention_heads", Value::from(usize_of(&["num_attention_heads", "n_head"], 8))),
            ("num_hidden_layers", Value::from(usize_of(&["num_hidden_layers", "n_layer"], 2))),
            ("intermediate_size", Value::from(4 * hidden)),
            ("vocab_size", Value::from(usize_of(&["vocab_size"], 250_880))),
            ("max_position_embeddings", Value::from(usize_of(&["max_position_embeddings", "seq_length"], 2048))),
            ("layer_norm_eps", Value::from(opt_f64(v, "layer_norm_epsilon").unwrap_or(1e-5))),
            ("tie_word_embeddings", Value::from(v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(true))),
            ("hidden_act", Value::from("gelu_pytorch_tanh")),
        ],
    ))
}

/// An MPT config under the keys the shared reader takes, with `MptConfig`'s defaults:
/// `d_model`, `n_heads`, `n_layers`, `expansion_ratio` × `d_model` as the MLP width,
/// `max_seq_len`, `layer_norm_epsilon`, tied embeddings, and from `attn_config` its
/// `clip_qkv` and `alibi_bias_max` (read by [`mpt_alibi`]). What transformers' MPT does not
/// run is refused by key: learned positions (`alibi: false`), grouped or prefix-LM
/// attention, q/k LayerNorms, a custom softmax scale, biased projections and norms.
fn with_mpt_keys(v: &Value) -> Result<Value> {
    let attn = v.get("attn_config").cloned().unwrap_or(Value::Null);
    let refused = |key: &str, bad: bool, why: &str| match bad {
        true => Err(ModelError::config(key, why.to_string())),
        false => Ok(()),
    };
    let attn_flag = |key: &str| attn.get(key).and_then(Value::as_bool);
    refused(
        "attn_config.alibi",
        attn_flag("alibi") == Some(false),
        "MPT with learned positions in place of ALiBi is not supported; released MPT checkpoints set alibi to true",
    )?;
    let attn_type = attn.get("attn_type").and_then(Value::as_str).unwrap_or("multihead_attention");
    refused(
        "attn_config.attn_type",
        attn_type != "multihead_attention",
        &format!("MPT attention '{attn_type}' is not supported (supported: multihead_attention)"),
    )?;
    refused("attn_config.prefix_lm", attn_flag("prefix_lm") == Some(true), "MPT as a prefix LM is not supported")?;
    refused(
        "attn_config.qk_ln",
        attn_flag("qk_ln") == Some(true),
        "MPT with q/k LayerNorms is not supported; released MPT checkpoints set qk_ln to false",
    )?;
    refused(
        "attn_config.softmax_scale",
        attn.get("softmax_scale").is_some_and(|s| !s.is_null()),
        "MPT with its own softmax_scale is not supported; leave it null for 1/sqrt(head_dim)",
    )?;
    refused(
        "no_bias",
        v.get("no_bias").and_then(Value::as_bool) == Some(false),
        "MPT with biased projections and norms is not supported; released MPT checkpoints set no_bias to true",
    )?;
    let usize_of = |key: &str, default: usize| v.get(key).and_then(Value::as_u64).map_or(default, |x| x as usize);
    let hidden = usize_of("d_model", 2048);
    let expansion = v.get("expansion_ratio").and_then(Value::as_f64).unwrap_or(4.0);
    Ok(with_keys(
        v,
        [
            ("hidden_size", Value::from(hidden)),
            ("num_attention_heads", Value::from(usize_of("n_heads", 16))),
            ("num_hidden_layers", Value::from(usize_of("n_layers", 24))),
            ("intermediate_size", Value::from((expansion * hidden as f64).round() as usize)),
            ("vocab_size", Value::from(usize_of("vocab_size", 50_368))),
            ("max_position_embeddings", Value::from(usize_of("max_seq_len", 2048))),
            ("layer_norm_eps", Value::from(opt_f64(v, "layer_norm_epsilon").unwrap_or(1e-5))),
            ("tie_word_embeddings", Value::from(v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(true))),
            ("hidden_act", Value::from("gelu")),
            ("clip_qkv", attn.get("clip_qkv").cloned().unwrap_or(Value::Null)),
        ],
    ))
}

/// Baichuan 2's vocabulary: its `lm_head` is a `NormHead` (vLLM tells the generations apart
/// the same way).
pub const BAICHUAN2_VOCAB: usize = 125_696;

/// A Baichuan config under the keys the shared reader takes: its context from
/// `max_position_embeddings` or (13B) `model_max_length`, a KV head per head, and `alibi` as
/// Baichuan's two modeling files split them: Baichuan-7B (`BaiChuanForCausalLM`) and Baichuan
/// 2 7B (hidden size 4096) turn RoPE, the 13B models add ALiBi.
fn with_baichuan_keys(v: &Value) -> Result<Value> {
    let name = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).unwrap_or_default();
    let alibi = name != "BaiChuanForCausalLM" && req_usize(v, "hidden_size")? != 4096;
    let context =
        ["max_position_embeddings", "model_max_length"].iter().find_map(|k| v.get(*k).and_then(Value::as_u64));
    Ok(with_keys(
        v,
        [
            ("num_key_value_heads", Value::from(req_usize(v, "num_attention_heads")?)),
            ("max_position_embeddings", Value::from(context.unwrap_or(4096))),
            ("alibi", Value::from(alibi)),
        ],
    ))
}

/// A ChatGLM config under the keys the shared reader takes: `num_layers`, `ffn_hidden_size`,
/// `kv_channels` (the head dim), `multi_query_group_num` KV heads under
/// `multi_query_attention`, `padded_vocab_size`, `seq_length`, `layernorm_epsilon`, the q/k/v
/// bias of `add_qkv_bias`, and RoPE's base 10,000 × `rope_ratio`. ChatGLM-6B's first
/// generation (2D positions) and the options no released ChatGLM2/3 or GLM-4 sets are refused
/// by key.
fn with_chatglm_keys(v: &Value) -> Result<Value> {
    let flag = |key: &str| v.get(key).and_then(Value::as_bool);
    for (key, bad, why) in [
        (
            "position_encoding_2d",
            v.get("position_encoding_2d").is_some(),
            "ChatGLM-6B's first generation (2D positions, GLM blocks) is not supported; ChatGLM2/3 and GLM-4-9B are",
        ),
        (
            "apply_residual_connection_post_layernorm",
            flag("apply_residual_connection_post_layernorm") == Some(true),
            "the residual taken after the input norm is not supported; released ChatGLM checkpoints set it to false",
        ),
        (
            "add_bias_linear",
            flag("add_bias_linear") == Some(true),
            "biased output and MLP projections are not supported; released ChatGLM checkpoints set add_bias_linear to false",
        ),
        ("rmsnorm", flag("rmsnorm") == Some(false), "ChatGLM with LayerNorms is not supported; set rmsnorm to true"),
        ("original_rope", flag("original_rope") == Some(false), "only ChatGLM's original RoPE is supported"),
        ("post_layer_norm", flag("post_layer_norm") == Some(false), "ChatGLM without its final norm is not supported"),
    ] {
        if bad {
            return Err(ModelError::config(key, why));
        }
    }
    let heads = req_usize(v, "num_attention_heads")?;
    let kv_heads = match flag("multi_query_attention") {
        Some(true) => req_usize(v, "multi_query_group_num")?,
        _ => heads,
    };
    let rope_ratio = opt_f64(v, "rope_ratio").unwrap_or(1.0);
    let usize_of = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64)).map(|x| x as usize);
    let hidden = req_usize(v, "hidden_size")?;
    Ok(with_keys(
        v,
        [
            ("num_hidden_layers", Value::from(req_usize(v, "num_layers")?)),
            ("intermediate_size", Value::from(req_usize(v, "ffn_hidden_size")?)),
            ("num_key_value_heads", Value::from(kv_heads)),
            ("head_dim", Value::from(usize_of(&["kv_channels"]).unwrap_or(hidden / heads.max(1)))),
            ("vocab_size", Value::from(usize_of(&["padded_vocab_size", "vocab_size"]).unwrap_or(65_024))),
            ("max_position_embeddings", Value::from(usize_of(&["seq_length"]).unwrap_or(2048))),
            ("rms_norm_eps", Value::from(opt_f64(v, "layernorm_epsilon").unwrap_or(1e-5))),
            ("rope_theta", Value::from(10_000.0 * rope_ratio)),
            ("attention_bias", Value::from(flag("add_qkv_bias").unwrap_or(false))),
            ("tie_word_embeddings", Value::from(flag("tie_word_embeddings").unwrap_or(false))),
        ],
    ))
}

/// MPT's ALiBi: slopes of `attn_config.alibi_bias_max` (8 unless set), added to the scaled
/// scores.
fn mpt_alibi(v: &Value) -> Result<Alibi> {
    match v.get("attn_config").and_then(|a| a.get("alibi_bias_max")) {
        None | Some(Value::Null) => Ok(Alibi::BLOOM),
        Some(b) => match b.as_f64() {
            Some(max_bias) if max_bias.is_finite() && max_bias > 0.0 => Ok(Alibi { max_bias, before_scaling: false }),
            _ => Err(ModelError::config("attn_config.alibi_bias_max", format!("must be a positive number, got {b}"))),
        },
    }
}

/// A GPT-2 or GPT-BigCode config under the keys the shared reader takes, with their
/// configs' defaults: `n_embd` / `n_head` / `n_layer` / `n_positions` / `n_inner` (4 ×
/// hidden), `activation_function`, tied embeddings, and GPT-BigCode's one KV head for
/// `multi_query` (on unless off). Attention without `scale_attn_weights`, or GPT-2's scaled by
/// the inverse layer index, is refused.
fn with_gpt2_keys(v: &Value, architecture: Architecture) -> Result<Value> {
    let flag = |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
    if !flag("scale_attn_weights", true) {
        return Err(ModelError::config(
            "scale_attn_weights",
            "attention without the 1/sqrt(head_dim) scale is not supported; released checkpoints set \
             scale_attn_weights to true",
        ));
    }
    if flag("scale_attn_by_inverse_layer_idx", false) {
        return Err(ModelError::config(
            "scale_attn_by_inverse_layer_idx",
            "GPT-2 attention scaled by 1/(layer + 1) is not supported; released checkpoints set it to false",
        ));
    }
    let multi_query = architecture == Architecture::GptBigCode && flag("multi_query", true);
    let activation = if architecture == Architecture::Gpt2 { "gelu_new" } else { "gelu_pytorch_tanh" };
    let usize_of = |keys: &[&str], default: usize| {
        keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64)).map_or(default, |x| x as usize)
    };
    let hidden = usize_of(&["n_embd", "hidden_size"], 768);
    let heads = usize_of(&["n_head", "num_attention_heads"], 12);
    Ok(with_keys(
        v,
        [
            ("hidden_size", Value::from(hidden)),
            ("num_attention_heads", Value::from(heads)),
            ("num_hidden_layers", Value::from(usize_of(&["n_layer", "num_hidden_layers"], 12))),
            ("max_position_embeddings", Value::from(usize_of(&["n_positions", "max_position_embeddings"], 1024))),
            ("intermediate_size", Value::from(usize_of(&["n_inner"], 4 * hidden))),
            ("num_key_value_heads", Value::from(if multi_query { 1 } else { heads })),
            ("vocab_size", Value::from(usize_of(&["vocab_size"], 50_257))),
            ("layer_norm_eps", Value::from(opt_f64(v, "layer_norm_epsilon").unwrap_or(1e-5))),
            ("tie_word_embeddings", Value::from(flag("tie_word_embeddings", true))),
            ("hidden_act", Value::from(v.get("activation_function").and_then(Value::as_str).unwrap_or(activation))),
        ],
    ))
}

/// A Gemma 3 text config with `Gemma3TextConfig`'s defaults where it leaves keys out (the
/// image-text checkpoints' `text_config` lists only what differs from them).
fn with_gemma3_defaults(v: &Value) -> Value {
    let defaults = serde_json::json!({
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "max_position_embeddings": 131_072, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "rope_local_base_freq": 10_000.0, "tie_word_embeddings": true,
    });
    let mut filled = v.clone();
    if let (Some(out), Some(defaults)) = (filled.as_object_mut(), defaults.as_object()) {
        for (k, d) in defaults {
            if out.get(k).is_none_or(Value::is_null) {
                out.insert(k.clone(), d.clone());
            }
        }
    }
    filled
}

/// Which layers attend within the window: `layer_types` (`sliding_attention` /
/// `full_attention`), else every `sliding_window_pattern`-th layer (`default_pattern` when the
/// config leaves it out) full and the others sliding.
fn sliding_layers(v: &Value, num_hidden_layers: usize, default_pattern: u64) -> Result<Vec<bool>> {
    let sliding_layers = match v.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(ModelError::config(
                    "layer_types",
                    format!("each entry is 'sliding_attention' or 'full_attention', got {t}"),
                )),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => {
            let pattern =
                v.get("sliding_window_pattern").and_then(Value::as_u64).unwrap_or(default_pattern).max(1) as usize;
            (0..num_hidden_layers).map(|i| !(i + 1).is_multiple_of(pattern)).collect()
        }
    };
    if sliding_layers.len() != num_hidden_layers {
        return Err(ModelError::config(
            "layer_types",
            format!("names {} layers, the model has {num_hidden_layers}", sliding_layers.len()),
        ));
    }
    Ok(sliding_layers)
}

/// SmolLM3's and Llama 4's layers that apply RoPE: `no_rope_layers` (1 rotates, 0 does not),
/// else every `no_rope_layer_interval`-th layer (4) without.
fn rope_layers(v: &Value, num_hidden_layers: usize) -> Result<Vec<bool>> {
    // An empty list asks for the default pattern; a longer one covers the layers it reaches.
    let layers = match v.get("no_rope_layers") {
        Some(Value::Array(flags)) if !flags.is_empty() => flags[..flags.len().min(num_hidden_layers)]
            .iter()
            .map(|f| match f.as_u64() {
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                _ => Err(ModelError::config("no_rope_layers", format!("each entry is 0 or 1, got {f}"))),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => {
            let interval = v.get("no_rope_layer_interval").and_then(Value::as_u64).unwrap_or(4).max(1) as usize;
            (0..num_hidden_layers).map(|i| !(i + 1).is_multiple_of(interval)).collect()
        }
    };
    if layers.len() != num_hidden_layers {
        return Err(ModelError::config(
            "no_rope_layers",
            format!("names only {} layers, the model has {num_hidden_layers}", layers.len()),
        ));
    }
    Ok(layers)
}

/// Gemma's, Gemma 2's or 3's additions from its `config.json`, with transformers' defaults:
/// Gemma 2's sliding layers share the global RoPE, Gemma 3's turn at their own base (Gemma has
/// none).
fn gemma_config(v: &Value, architecture: Architecture) -> Result<GemmaConfig> {
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(x) = v.get(key).filter(|x| !x.is_null())
            && x.as_f64().is_none_or(|cap| !(cap.is_finite() && cap > 0.0))
        {
            return Err(ModelError::config(key, format!("must be a positive number or null, got {x}")));
        }
    }
    let gemma2 = architecture == Architecture::Gemma2;
    if let Some(act) = v.get("hidden_activation").and_then(Value::as_str)
        && act != "gelu_pytorch_tanh"
    {
        return Err(ModelError::config(
            "hidden_activation",
            format!("Gemma's MLP runs gelu_pytorch_tanh, got '{act}'"),
        ));
    }
    Ok(GemmaConfig {
        norms_store_scale: false,
        local_rope_theta: if gemma2 || architecture == Architecture::Gemma {
            opt_f64(v, "rope_theta").unwrap_or(10_000.0)
        } else {
            opt_f64(v, "rope_local_base_freq").unwrap_or(10_000.0)
        },
    })
}

/// How a mixture's router turns its logits into the weights of a token's experts.
#[derive(Debug, Clone, PartialEq)]
pub enum Router {
    /// Qwen-MoE: softmax over all experts, the top-k of it.
    Softmax,
    /// DeepSeek-V3 / GLM-4.5: sigmoid scores; experts are chosen by score plus a learned
    /// correction bias (`e_score_correction_bias`) within the `topk_group` best of `n_group`
    /// groups (a group scored by its two best), weighted by their plain scores times
    /// `routed_scaling_factor`.
    GroupedSigmoid { n_group: usize, topk_group: usize, routed_scaling_factor: f64 },
    /// ERNIE 4.5 MoE: softmax probabilities; experts chosen by probability plus a correction
    /// bias (`moe_statics.e_score_correction_bias`), weighted by their probabilities
    /// renormalised.
    BiasedSoftmax,
    /// DeepSeek-V2: softmax probabilities; the top-k within the `topk_group` best of `n_group`
    /// groups (a group scored by its best expert; one group for `greedy`), weighted by their
    /// probabilities times `routed_scaling_factor` (renormalised instead when `norm_topk_prob`).
    GroupedSoftmax { n_group: usize, topk_group: usize, routed_scaling_factor: f64 },
    /// Llama 4: the top-k experts by logit, each fed the token scaled by `sigmoid(logit)`
    /// (the weight scales the expert's input, not its output); no renormalisation.
    InputScaledSigmoid,
    /// Phi-3.5-MoE's sparsemixer at inference: the best expert by logit, weighted by its softmax
    /// among the experts whose logits lie within a relative `2 · jitter_eps` of it; then the
    /// best of the others, weighted the same way among the others.
    SparseMixer { jitter_eps: f64 },
}

/// An always-on expert beside the routed ones.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpertConfig {
    pub intermediate_size: usize,
    /// Qwen2-MoE scales it by `sigmoid(shared_expert_gate(x))` (weights under `shared_expert`);
    /// GLM-4.5 adds it as is (weights under `shared_experts`).
    pub gated: bool,
}

/// The sparse feed-forward of a mixture-of-experts decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Intermediate width of each routed expert.
    pub expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to one.
    pub norm_topk_prob: bool,
    pub router: Router,
    /// Layer `i` is sparse when `i >= first_k_dense_replace`, `(i + 1) % decoder_sparse_step
    /// == 0` and `i` is not in `mlp_only_layers`; other layers keep a dense MLP of
    /// `intermediate_size`.
    pub first_k_dense_replace: usize,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub shared_expert: Option<SharedExpertConfig>,
    pub experts: ExpertKind,
}

/// How a mixture stores and computes its experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertKind {
    /// `experts.{e}.{gate,up,down}_proj` under a `gate` router: SwiGLU, no biases (Mixtral,
    /// Qwen-MoE, GLM-4.5).
    SwiGlu,
    /// Granite MoE: every expert in `input_linear [E, 2I, H]` (gate rows, then up) and
    /// `output_linear [E, H, I]`, SwiGLU, no biases.
    Stacked,
    /// gpt-oss: a biased `router`; every expert in `experts.gate_up_proj` / `experts.down_proj`
    /// (MXFP4 `_blocks` + `_scales`, or dense), gate and up rows interleaved, with biases; the
    /// activation `(clamp(up, ±limit) + 1) · g · σ(1.702 g)`, `g = min(gate, limit)`.
    GptOss { swiglu_limit: f32 },
}

impl MoeConfig {
    /// Softmax routing in every layer, no shared expert (Mixtral, Qwen3-MoE as llama.cpp runs it).
    pub fn softmax_everywhere(
        num_experts: usize,
        top_k: usize,
        expert_intermediate_size: usize,
        norm_topk_prob: bool,
    ) -> Self {
        Self {
            num_experts,
            top_k,
            expert_intermediate_size,
            norm_topk_prob,
            router: Router::Softmax,
            first_k_dense_replace: 0,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            shared_expert: None,
            experts: ExpertKind::SwiGlu,
        }
    }

    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
            && !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Multi-head latent attention (DeepSeek-V2 / V3): queries through an optional low-rank
/// bottleneck, keys and values expanded per head from one compressed latent, and a decoupled
/// RoPE part whose key is shared by every head. Attention runs absorbed
/// (`crate::models::deepseek`): one KV head (`DecoderConfig::num_key_value_heads` = 1) whose
/// entry is `qk_rope_head_dim + kv_lora_rank` wide (`DecoderConfig::head_dim`, the rotated
/// part leading as the shared RoPE turns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaConfig {
    /// `q_a_proj` → `q_a_layernorm` → `q_b_proj` when set (V3), else one `q_proj` (V2-Lite).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The checkpoint's RoPE pairs are interleaved (`rope_interleave`, DeepSeek's own layout).
    pub rope_interleave: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each query and key head that RoPE rotates; the rest pass through
    /// (`partial_rotary_factor`: 3/4 of the head on Phi-4-mini). Equal to `head_dim` mostly.
    pub rotary_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (Qwen2, some Llama variants).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Projections stored fused: one `qkv_proj` (q rows, then k, then v) and one
    /// `gate_up_proj` (gate rows, then up) per layer (Phi-3).
    pub fused_projections: bool,
    /// Queries see only the last `sliding_window` keys, themselves included: in every layer
    /// (Mistral, Mixtral, Phi-3), or in the `sliding_layers` ([`Self::layer_sliding_window`]).
    pub sliding_window: Option<usize>,
    /// `Some(layers)`: only `layers[i]` attend within `sliding_window`, the others to the whole
    /// context (`layer_types` of Gemma 2 / 3 and gpt-oss).
    pub sliding_layers: Option<Vec<bool>>,
    /// The attention's output projection has a bias (gpt-oss).
    pub attention_output_bias: bool,
    /// The dense MLP's projections have biases (StarCoder2's `use_bias`, Phi's and GPT-NeoX's
    /// always, Llama's, Granite's, Arcee's and Nemotron's `mlp_bias`).
    pub mlp_bias: bool,
    /// Attention and MLP run side by side and both join the residual (Cohere, Phi, StableLM's
    /// and GPT-NeoX's `use_parallel_residual`, Falcon's `parallel_attn`), from one normed input
    /// or each from its own (`parallel_mlp_norm`).
    pub parallel_residual: bool,
    /// Beside attention, the MLP reads its own norm of the residual (`post_attention_layernorm`:
    /// GPT-NeoX's; Falcon's `ln_mlp`) rather than attention's input.
    pub parallel_mlp_norm: bool,
    /// Learned absolute positions (`model.embed_positions.weight`, one row per position) are
    /// added to the token embeddings (GPT-2, GPT-BigCode); such a model turns nothing by RoPE.
    pub learned_positions: bool,
    /// ALiBi's distance bias in every layer's attention (BLOOM, Falcon-RW); such a model turns
    /// nothing by RoPE.
    pub alibi: Option<Alibi>,
    /// A LayerNorm (`model.embed_norm`) over the token embeddings before the first layer
    /// (BLOOM's `word_embeddings_layernorm`).
    pub embedding_norm: bool,
    /// `lm_head` adds a bias (Phi; Phi-3.5-MoE's `lm_head_bias`).
    pub lm_head_bias: bool,
    /// Each `lm_head` row is divided by its L2 norm before it scores (Baichuan 2's
    /// `NormHead`).
    pub lm_head_normalized: bool,
    /// The norms scale by `1 + weight` and the checkpoint stores `weight` (Nemotron's
    /// LayerNorm1P in safetensors; llama.cpp's files store the scale).
    pub layer_norm_1p: bool,
    /// q, k and v are clamped to `±clip_qkv` right after their projections (OLMo 1, MPT), or
    /// after the whole-width q/k norms (OLMoE).
    pub clip_qkv: Option<f32>,
    /// Each attention head has a learned sink logit, `self_attn.sinks` (gpt-oss).
    pub attention_sinks: bool,
    /// `Some(layers)`: only `layers[i]` apply RoPE, the others attend without positions
    /// (SmolLM3's `no_rope_layers`).
    pub rope_layers: Option<Vec<bool>>,
    /// Sparse experts in place of the MLP (Qwen2-MoE, Qwen3-MoE, Mixtral, GLM-4.5).
    pub moe: Option<MoeConfig>,
    /// Latent attention in place of grouped q/k/v projections (DeepSeek-V3); its heads are
    /// expanded to ordinary ones, `num_key_value_heads == num_attention_heads`.
    pub mla: Option<MlaConfig>,
    /// Gemma's layer shape and its interleaved local / global attention.
    pub gemma: Option<GemmaConfig>,
    /// Llama 4's chunked attention, weightless q/k norms and query temperature.
    pub llama4: Option<Llama4Attention>,
    /// Constant factors on the embeddings, residual branches, scores and logits (Granite, Gemma).
    pub scales: Scales,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn req_usize(v: &Value, key: &str) -> Result<usize> {
    let n = v
        .get(key)
        .and_then(Value::as_u64)
        .map(|x| usize::try_from(x).unwrap_or(usize::MAX))
        .ok_or_else(|| ModelError::config(key, "missing or not a non-negative integer in config.json"))?;
    // Layer counts size per-layer tables built while the config is read, before `check`.
    match key {
        "num_hidden_layers" | "num_layers" => check_layer_count(key, n),
        _ => Ok(n),
    }
}

/// Keys whose values are numbers wherever a config sets them (`null` means unset); a value of
/// another type would otherwise read as unset and fall back to a default silently. Every key
/// `opt_f64` reads is here (a test holds the source to it).
const NUMERIC_KEYS: [&str; 32] = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    // Positions.
    "rope_theta",
    "rope_local_base_freq",
    "rope_ratio",
    "rotary_emb_base",
    "rotary_pct",
    "partial_rotary_factor",
    // Norm epsilons, by family.
    "rms_norm_eps",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "layernorm_epsilon",
    "norm_eps",
    "norm_epsilon",
    // Constant scales (Granite, Gemma, Cohere, Llama 4).
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "query_pre_attn_scalar",
    "logit_scale",
    "floor_scale",
    "attn_scale",
    // Experts.
    "routed_scaling_factor",
    "router_jitter_noise",
    "swiglu_limit",
];

/// The numbers of a `rope_scaling` object, checked the same way.
const ROPE_SCALING_NUMERIC_KEYS: [&str; 12] = [
    "factor",
    "original_max_position_embeddings",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "beta_fast",
    "beta_slow",
    "short_mscale",
    "long_mscale",
    "low_freq_factor",
    "high_freq_factor",
    "alpha",
];

fn check_number_types(v: &Value) -> Result<()> {
    let not_a_number =
        |key: String, got: &Value| ModelError::config(key, format!("must be a number in config.json, got {got}"));
    for key in NUMERIC_KEYS {
        match v.get(key) {
            None | Some(Value::Null | Value::Number(_)) => {}
            Some(other) => return Err(not_a_number(key.to_string(), other)),
        }
    }
    if let Some(Value::Object(rs)) = v.get("rope_scaling") {
        for key in ROPE_SCALING_NUMERIC_KEYS {
            match rs.get(key) {
                None | Some(Value::Null | Value::Number(_)) => {}
                Some(other) => return Err(not_a_number(format!("rope_scaling.{key}"), other)),
            }
        }
    }
    Ok(())
}

/// Widest attention head a checkpoint may declare.
pub const MAX_HEAD_DIM: usize = 1 << 14;

/// Most decoder layers a checkpoint may declare: far past any published model (Llama 3.1 405B
/// has 126); more is a corrupt file, whose per-layer tables would take the memory.
pub const MAX_LAYERS: usize = 4096;

/// A declared layer count, refused past [`MAX_LAYERS`].
pub fn check_layer_count(key: &str, n: usize) -> Result<usize> {
    if n > MAX_LAYERS {
        return Err(ModelError::config(
            key,
            format!("{n} layers is past any real model (at most {MAX_LAYERS}): the checkpoint's config is corrupt"),
        ));
    }
    Ok(n)
}

fn opt_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

/// Phi-3's LongRoPE from `config.json`, as transformers reads it: the pretrained window is
/// the top-level `original_max_position_embeddings` (the scale then being the ratio of the
/// context to it), or failing that the context itself with `rope_scaling.factor` as the scale;
/// without an explicit `attention_factor`, cos and sin are scaled by
/// `sqrt(1 + ln(scale) / ln(window))`.
fn long_rope(v: &Value, rs: &Value, max_position_embeddings: usize) -> Result<RopeScaling> {
    let factors = |key: &str| -> Result<Vec<f32>> {
        rs.get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| ModelError::config(format!("rope_scaling.{key}"), "LongRoPE needs a list of numbers"))
    };
    let (short_factor, long_factor) = (factors("short_factor")?, factors("long_factor")?);
    let (window, scale) = match v.get("original_max_position_embeddings").and_then(Value::as_u64) {
        Some(w) => (w as usize, max_position_embeddings as f64 / w as f64),
        None => (max_position_embeddings, opt_f64(rs, "factor").unwrap_or(1.0)),
    };
    if window == 0 {
        return Err(ModelError::config("original_max_position_embeddings", "must be positive"));
    }
    let attention_factor = opt_f64(rs, "attention_factor")
        .unwrap_or_else(|| if scale <= 1.0 { 1.0 } else { (1.0 + scale.ln() / (window as f64).ln()).sqrt() });
    let mscales = match (opt_f64(rs, "short_mscale"), opt_f64(rs, "long_mscale")) {
        (Some(short), Some(long)) => Some((short, long)),
        (None, None) => None,
        _ => {
            return Err(ModelError::config(
                "rope_scaling",
                "LongRoPE's short_mscale and long_mscale come together; give both or neither",
            ));
        }
    };
    // Factor counts are checked with the rest of the shape (`DecoderConfig::check`); the set
    // is chosen by `DecoderConfig::serve_context`.
    Ok(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: window,
        attention_factor,
        mscales,
        extended: false,
    })
}

/// OLMo's `clip_qkv`: a positive bound, or `None` (null or absent).
fn clip_qkv(v: &Value) -> Result<Option<f32>> {
    match v.get("clip_qkv") {
        None | Some(Value::Null) => Ok(None),
        Some(c) => match c.as_f64() {
            Some(c) if c.is_finite() && c > 0.0 => Ok(Some(c as f32)),
            _ => Err(ModelError::config("clip_qkv", format!("must be a positive number or null, got {c}"))),
        },
    }
}

/// HunYuan's per-head q/k norms (`use_qk_norm`, on in every released dense checkpoint);
/// cross-layer attention (`use_cla`, Hunyuan-Large's) is refused by key.
fn hunyuan_qk_norm(v: &Value, architecture: Architecture) -> Result<bool> {
    if !architecture.is_hunyuan() {
        return Ok(false);
    }
    if v.get("use_cla").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::config("use_cla", "HunYuan with cross-layer attention is not supported"));
    }
    Ok(v.get("use_qk_norm").and_then(Value::as_bool).unwrap_or(true))
}

/// HunYuan's RoPE base: `rope_theta · alpha^(d / (d - 2))` under its `dynamic` scaling with an
/// `alpha` (NTK-alpha, fixed at load as HunYuan's rotary embedding computes it), over the `d`
/// rotated dims; `None` otherwise.
fn hunyuan_rope_base(v: &Value, architecture: Architecture, rotary_dim: usize) -> Result<Option<f64>> {
    if !architecture.is_hunyuan() {
        return Ok(None);
    }
    let Some(alpha) = v.get("rope_scaling").and_then(|rs| opt_f64(rs, "alpha")) else { return Ok(None) };
    if !(alpha.is_finite() && alpha > 0.0) || rotary_dim <= 2 {
        return Err(ModelError::config("rope_scaling.alpha", format!("must be positive, got {alpha}")));
    }
    let d = rotary_dim as f64;
    Ok(Some(opt_f64(v, "rope_theta").unwrap_or(10_000.0) * alpha.powf(d / (d - 2.0))))
}

/// HunYuan MoE's experts: `num_experts` SwiGLU experts `moe_intermediate_size` wide in every
/// layer, each token's `moe_topk` by softmax probability renormalised, and with
/// `use_mixed_mlp_moe` an ungated shared MLP `num_shared_expert` times `intermediate_size` wide.
/// The per-layer lists Hunyuan's configs give must hold one value (every released checkpoint's).
fn hunyuan_experts(v: &Value) -> Result<MoeConfig> {
    let uniform = |key: &str| -> Result<Option<usize>> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(values)) => {
                let first = values.first().and_then(Value::as_u64);
                match first.filter(|f| values.iter().all(|x| x.as_u64() == Some(*f))) {
                    Some(f) => Ok(Some(f as usize)),
                    None => Err(ModelError::config(
                        key,
                        "per-layer values must all be equal (layers that differ are not supported)",
                    )),
                }
            }
            Some(_) => req_usize(v, key).map(Some),
        }
    };
    if v.get("moe_layer_num_skipped").and_then(Value::as_u64).unwrap_or(0) != 0 {
        return Err(ModelError::config(
            "moe_layer_num_skipped",
            "HunYuan MoE with leading dense layers is not supported",
        ));
    }
    let width = uniform("moe_intermediate_size")?.map_or_else(|| req_usize(v, "intermediate_size"), Ok)?;
    let top_k = uniform("moe_topk")?.ok_or_else(|| ModelError::config("moe_topk", "missing from config.json"))?;
    let num_experts =
        uniform("num_experts")?.ok_or_else(|| ModelError::config("num_experts", "missing from config.json"))?;
    let shared = match v.get("use_mixed_mlp_moe").and_then(Value::as_bool).unwrap_or(false) {
        true => Some(SharedExpertConfig {
            intermediate_size: req_usize(v, "intermediate_size")? * uniform("num_shared_expert")?.unwrap_or(1),
            gated: false,
        }),
        false => None,
    };
    Ok(MoeConfig { shared_expert: shared, ..MoeConfig::softmax_everywhere(num_experts, top_k, width, true) })
}

/// MiniMax-M2's attention as spec-rs runs it: full attention in every layer (lightning layers
/// and windows refused by key), and whether q and k are normed (`use_qk_norm`, default on)
/// across all heads at once (`qk_norm_type: per_layer`, every released checkpoint's).
fn minimax_m2_attention(v: &Value, architecture: Architecture) -> Result<bool> {
    if architecture != Architecture::MiniMaxM2 {
        return Ok(false);
    }
    if let Some(types) = v.get("attn_type_list").and_then(Value::as_array)
        && types.iter().any(|t| t.as_u64() != Some(1))
    {
        return Err(ModelError::config(
            "attn_type_list",
            "only full attention (1) in every layer is supported; lightning attention (0) is MiniMax-Text-01's",
        ));
    }
    if v.get("attn_window_size").is_some_and(|w| !w.is_null() && w.as_i64().is_none_or(|w| w > 0)) {
        return Err(ModelError::config("attn_window_size", "MiniMax-M2 with windowed layers is not supported"));
    }
    let on = v.get("use_qk_norm").and_then(Value::as_bool).unwrap_or(true);
    match v.get("qk_norm_type").and_then(Value::as_str) {
        Some("per_layer") | None => Ok(on),
        Some(other) => Err(ModelError::config(
            "qk_norm_type",
            format!("'{other}' is not supported (MiniMax-M2 norms q and k per layer: 'per_layer')"),
        )),
    }
}

/// ERNIE 4.5 MoE's experts: `moe_num_experts` SwiGLU experts `moe_intermediate_size` wide in
/// the layers `moe_layer_start_index..=moe_layer_end_index` (-1: the last) at every
/// `moe_layer_interval`-th, chosen by softmax probability plus the correction bias, weighted by
/// their probabilities renormalised, and `moe_num_shared_experts` as one ungated shared MLP.
fn ernie4_5_experts(v: &Value) -> Result<MoeConfig> {
    let layers = req_usize(v, "num_hidden_layers")?;
    let usize_or = |key: &str, default: usize| v.get(key).and_then(Value::as_u64).map_or(default, |x| x as usize);
    if let Some(act) = v.get("moe_gate_act").and_then(Value::as_str).filter(|a| *a != "softmax") {
        return Err(ModelError::config(
            "moe_gate_act",
            format!("'{act}' is not supported (ERNIE 4.5 MoE routes by softmax)"),
        ));
    }
    let width = match v.get("moe_intermediate_size") {
        Some(Value::Array(_)) => {
            return Err(ModelError::config(
                "moe_intermediate_size",
                "per-modality expert widths (ERNIE 4.5 VL) are not supported; the text models give one width",
            ));
        }
        Some(_) => req_usize(v, "moe_intermediate_size")?,
        None => req_usize(v, "intermediate_size")?,
    };
    let start = usize_or("moe_layer_start_index", 1);
    let end = match v.get("moe_layer_end_index").and_then(Value::as_i64) {
        None | Some(-1) => layers.saturating_sub(1),
        Some(e) if e >= 0 => e as usize,
        Some(e) => return Err(ModelError::config("moe_layer_end_index", format!("must be -1 or a layer, got {e}"))),
    };
    Ok(MoeConfig {
        router: Router::BiasedSoftmax,
        first_k_dense_replace: start,
        decoder_sparse_step: usize_or("moe_layer_interval", 1).max(1),
        mlp_only_layers: (end + 1..layers).collect(),
        shared_expert: match usize_or("moe_num_shared_experts", 0) {
            0 => None,
            n => Some(SharedExpertConfig { intermediate_size: n * width, gated: false }),
        },
        ..MoeConfig::softmax_everywhere(req_usize(v, "moe_num_experts")?, req_usize(v, "moe_k")?, width, true)
    })
}

/// MiniMax-M2's experts: `num_local_experts` SwiGLU experts as wide as `intermediate_size`,
/// chosen by sigmoid score plus `e_score_correction_bias`, weighted by their scores
/// renormalised (times `routed_scaling_factor`), no shared expert.
fn minimax_m2_experts(v: &Value) -> Result<MoeConfig> {
    match v.get("scoring_func").and_then(Value::as_str).unwrap_or("sigmoid") {
        "sigmoid" => {}
        other => {
            return Err(ModelError::config(
                "scoring_func",
                format!("'{other}' is not supported (MiniMax-M2 routes by sigmoid scores)"),
            ));
        }
    }
    if !v.get("use_routing_bias").and_then(Value::as_bool).unwrap_or(true) {
        return Err(ModelError::config("use_routing_bias", "MiniMax-M2 without its routing bias is not supported"));
    }
    if v.get("shared_intermediate_size").and_then(Value::as_u64).unwrap_or(0) != 0 {
        return Err(ModelError::config("shared_intermediate_size", "MiniMax-M2 with a shared expert is not supported"));
    }
    Ok(MoeConfig {
        router: Router::GroupedSigmoid {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: opt_f64(v, "routed_scaling_factor").unwrap_or(1.0),
        },
        ..MoeConfig::softmax_everywhere(
            req_usize(v, "num_local_experts")?,
            req_usize(v, "num_experts_per_tok")?,
            req_usize(v, "intermediate_size")?,
            true,
        )
    })
}

/// `mlp_layer_types` (`"dense"` / `"sparse"` per layer) as whether each layer is sparse, when
/// the config lists them.
fn mlp_layer_types(v: &Value) -> Result<Option<Vec<bool>>> {
    let Some(list) = v.get("mlp_layer_types").filter(|l| !l.is_null()) else { return Ok(None) };
    let layers = req_usize(v, "num_hidden_layers")?;
    let types = list.as_array().filter(|a| a.len() == layers).ok_or_else(|| {
        ModelError::config("mlp_layer_types", format!("must list 'dense' or 'sparse' for each of the {layers} layers"))
    })?;
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("dense") => Ok(false),
            Some("sparse") => Ok(true),
            _ => Err(ModelError::config("mlp_layer_types", format!("{t} is neither 'dense' nor 'sparse'"))),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The experts of a Mixtral / Qwen2-MoE / Qwen3-MoE / GLM-4.5 `config.json`, with
/// transformers' defaults.
fn moe_config(v: &Value, architecture: Architecture) -> Result<MoeConfig> {
    let mut mlp_only_layers = match v.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(list) => list
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|i| i as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| ModelError::config("mlp_only_layers", "must be a list of layer indices"))?,
    };
    // GLM-4.7-Flash names each layer's MLP `dense` or `sparse` instead of counting leading dense ones.
    let layer_types = mlp_layer_types(v)?;
    if let Some(types) = &layer_types {
        mlp_only_layers = types.iter().enumerate().filter(|(_, sparse)| !**sparse).map(|(i, _)| i).collect();
    }
    let usize_or = |key: &str, default: usize| v.get(key).and_then(Value::as_u64).map_or(default, |x| x as usize);
    if architecture == Architecture::GraniteMoe {
        // A softmax over each token's top-k logits: the renormalised top-k of the full softmax.
        let shared_width = v.get("shared_intermediate_size").and_then(Value::as_u64).unwrap_or(0) as usize;
        return Ok(MoeConfig {
            experts: ExpertKind::Stacked,
            shared_expert: (shared_width > 0)
                .then_some(SharedExpertConfig { intermediate_size: shared_width, gated: false }),
            ..MoeConfig::softmax_everywhere(
                req_usize(v, "num_local_experts")?,
                req_usize(v, "num_experts_per_tok")?,
                req_usize(v, "intermediate_size")?,
                true,
            )
        });
    }
    if architecture == Architecture::MiniMaxM2 {
        return minimax_m2_experts(v);
    }
    if architecture == Architecture::Ernie4_5Moe {
        return ernie4_5_experts(v);
    }
    if architecture == Architecture::Olmoe {
        // Every layer sparse, experts as wide as `intermediate_size`, no shared expert.
        return Ok(MoeConfig::softmax_everywhere(
            req_usize(v, "num_experts")?,
            req_usize(v, "num_experts_per_tok")?,
            req_usize(v, "intermediate_size")?,
            v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false),
        ));
    }
    if architecture == Architecture::PhiMoe {
        // Every layer sparse, experts as wide as `intermediate_size`, two chosen by sparsemixer.
        let top_k = req_usize(v, "num_experts_per_tok")?;
        if top_k != 2 {
            return Err(ModelError::config(
                "num_experts_per_tok",
                format!("Phi-3.5-MoE's sparsemixer routes each token to 2 experts, got {top_k}"),
            ));
        }
        let jitter_eps = opt_f64(v, "router_jitter_noise").unwrap_or(0.01);
        if !(jitter_eps.is_finite() && jitter_eps >= 0.0) {
            return Err(ModelError::config("router_jitter_noise", format!("must be non-negative, got {jitter_eps}")));
        }
        return Ok(MoeConfig {
            router: Router::SparseMixer { jitter_eps },
            ..MoeConfig::softmax_everywhere(
                req_usize(v, "num_local_experts")?,
                top_k,
                req_usize(v, "intermediate_size")?,
                false,
            )
        });
    }
    if architecture == Architecture::Mixtral {
        // Every layer sparse, experts as wide as `intermediate_size`, weights always renormalised.
        return Ok(MoeConfig::softmax_everywhere(
            req_usize(v, "num_local_experts")?,
            req_usize(v, "num_experts_per_tok")?,
            req_usize(v, "intermediate_size")?,
            true,
        ));
    }
    if architecture == Architecture::GptOss {
        // A softmax over each token's top-k logits: the renormalised top-k of the full softmax.
        let top_k = match v.get("num_experts_per_tok") {
            Some(_) => req_usize(v, "num_experts_per_tok")?,
            None => req_usize(v, "experts_per_token")?,
        };
        let swiglu_limit = opt_f64(v, "swiglu_limit").unwrap_or(7.0);
        if !(swiglu_limit.is_finite() && swiglu_limit > 0.0) {
            return Err(ModelError::config("swiglu_limit", format!("must be positive, got {swiglu_limit}")));
        }
        return Ok(MoeConfig {
            experts: ExpertKind::GptOss { swiglu_limit: swiglu_limit as f32 },
            ..MoeConfig::softmax_everywhere(
                req_usize(v, "num_local_experts")?,
                top_k,
                req_usize(v, "intermediate_size")?,
                true,
            )
        });
    }
    let expert_intermediate_size = req_usize(v, "moe_intermediate_size")?;
    let (router, shared_expert, num_experts) = match architecture {
        Architecture::DeepseekV2 => {
            // `greedy` is one group; `group_limited_greedy` the configured ones.
            let grouped = match v.get("topk_method").and_then(Value::as_str).unwrap_or("greedy") {
                "greedy" => false,
                "group_limited_greedy" => true,
                other => {
                    return Err(ModelError::config(
                        "topk_method",
                        format!("'{other}' is not DeepSeek-V2's (greedy, group_limited_greedy)"),
                    ));
                }
            };
            (
                Router::GroupedSoftmax {
                    n_group: if grouped { usize_or("n_group", 1) } else { 1 },
                    topk_group: if grouped { usize_or("topk_group", 1) } else { 1 },
                    routed_scaling_factor: opt_f64(v, "routed_scaling_factor").unwrap_or(1.0),
                },
                match usize_or("n_shared_experts", 0) {
                    0 => None,
                    n => Some(SharedExpertConfig { intermediate_size: expert_intermediate_size * n, gated: false }),
                },
                req_usize(v, "n_routed_experts")?,
            )
        }
        Architecture::Glm4Moe | Architecture::DeepseekV3 | Architecture::Dots1 => (
            Router::GroupedSigmoid {
                n_group: usize_or("n_group", 1),
                topk_group: usize_or("topk_group", 1),
                routed_scaling_factor: opt_f64(v, "routed_scaling_factor").unwrap_or(1.0),
            },
            // dots.llm1's default is none; GLM-4.5's one.
            match usize_or("n_shared_experts", usize::from(architecture != Architecture::Dots1)) {
                0 => None,
                n => Some(SharedExpertConfig { intermediate_size: expert_intermediate_size * n, gated: false }),
            },
            // GLM-4.5's configs name them as DeepSeek-V3 does.
            match v.get("n_routed_experts") {
                Some(_) => req_usize(v, "n_routed_experts")?,
                None => req_usize(v, "num_experts")?,
            },
        ),
        Architecture::Qwen2Moe => (
            Router::Softmax,
            Some(SharedExpertConfig {
                intermediate_size: req_usize(v, "shared_expert_intermediate_size")?,
                gated: true,
            }),
            req_usize(v, "num_experts")?,
        ),
        _ => (Router::Softmax, None, req_usize(v, "num_experts")?),
    };
    // DeepSeek's `moe_layer_freq` (every released checkpoint: 1) has no counterpart here.
    if matches!(architecture, Architecture::DeepseekV2 | Architecture::DeepseekV3 | Architecture::Dots1)
        && usize_or("moe_layer_freq", 1) != 1
    {
        return Err(ModelError::config(
            "moe_layer_freq",
            "only 1 (every layer past first_k_dense_replace sparse) is supported, as every released DeepSeek sets",
        ));
    }
    Ok(MoeConfig {
        num_experts,
        top_k: req_usize(v, "num_experts_per_tok")?,
        expert_intermediate_size,
        norm_topk_prob: v
            .get("norm_topk_prob")
            .and_then(Value::as_bool)
            .unwrap_or(matches!(architecture, Architecture::Glm4Moe | Architecture::DeepseekV3)),
        router,
        first_k_dense_replace: if layer_types.is_some() { 0 } else { usize_or("first_k_dense_replace", 0) },
        decoder_sparse_step: usize_or("decoder_sparse_step", 1),
        mlp_only_layers,
        shared_expert,
        experts: ExpertKind::SwiGlu,
    })
}

/// InternLM2's `bias` puts a bias on `wqkv` and on `wo`; no released checkpoint sets it, and
/// the output projection here has none.
fn internlm2_bias(v: &Value, architecture: Architecture) -> Result<bool> {
    if architecture == Architecture::InternLm2 && v.get("bias").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::config(
            "bias",
            "InternLM2 with biased projections (bias: true) is not supported; released InternLM2 checkpoints set bias: false",
        ));
    }
    Ok(false)
}

impl DecoderConfig {
    /// Reads a Hugging Face `config.json` value. The family comes from `architectures[0]`.
    pub fn from_hf_json(v: &Value) -> Result<Self> {
        let arch_name = v
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ModelError::config("architectures", "config.json must list the model class in architectures[0]")
            })?;
        let architecture = Architecture::from_hf_name(arch_name)?;
        Self::from_hf_json_as(v, architecture)
    }

    /// Reads a Hugging Face config for a known family (drafters reuse target layer shapes).
    pub fn from_hf_json_as(v: &Value, architecture: Architecture) -> Result<Self> {
        check_number_types(v)?;
        // Families whose configs name or omit keys differently are normalised first (Gemma 3's
        // omit what Gemma 2's list).
        let filled = match architecture {
            Architecture::Gemma3 => Some(with_gemma3_defaults(v)),
            Architecture::Falcon => Some(with_falcon_keys(v)?),
            Architecture::GptBigCode | Architecture::Gpt2 => Some(with_gpt2_keys(v, architecture)?),
            Architecture::Bloom => Some(with_bloom_keys(v)?),
            Architecture::Mpt => Some(with_mpt_keys(v)?),
            Architecture::Baichuan => Some(with_baichuan_keys(v)?),
            Architecture::ChatGlm => Some(with_chatglm_keys(v)?),
            _ => None,
        };
        let v = filled.as_ref().unwrap_or(v);
        let hidden_size = req_usize(v, "hidden_size")?;
        let num_attention_heads = req_usize(v, "num_attention_heads")?;
        let mla = match architecture {
            Architecture::DeepseekV2 | Architecture::DeepseekV3 => Some(mla_config(v)?),
            _ => None,
        };
        // Latent attention caches one entry per token that every query head attends.
        let num_key_value_heads = match mla {
            Some(_) => 1,
            None => v.get("num_key_value_heads").and_then(Value::as_u64).map_or(num_attention_heads, |x| x as usize),
        };
        let head_dim = match mla {
            Some(m) => m.qk_rope_head_dim + m.kv_lora_rank,
            None => v
                .get("head_dim")
                .and_then(Value::as_u64)
                .map_or(hidden_size / num_attention_heads.max(1), |x| x as usize),
        };
        // GLM-4.5 and Nemotron rotate half of each head unless their configs say otherwise.
        let default_rotary = match architecture {
            Architecture::Glm4
            | Architecture::Glm
            | Architecture::ChatGlm
            | Architecture::Glm4Moe
            | Architecture::Nemotron => Some(0.5),
            _ => None,
        };
        // MiniMax-M2 names its rotated dims.
        let minimax_rotary = match architecture {
            Architecture::MiniMaxM2 => v.get("rotary_dim").and_then(Value::as_u64).map(|d| d as f64 / head_dim as f64),
            _ => None,
        };
        // Latent attention rotates its decoupled RoPE part only.
        // GPT-NeoX's older configs name the rotated fraction `rotary_pct`.
        let neox_rotary = match architecture {
            Architecture::GptNeoX => opt_f64(v, "rotary_pct"),
            _ => None,
        };
        let rotary_factor = minimax_rotary.or(opt_f64(v, "partial_rotary_factor")).or(neox_rotary).or(default_rotary);
        let rotary_dim = match (mla, rotary_factor) {
            (Some(m), _) => m.qk_rope_head_dim,
            (None, None) => head_dim,
            (None, Some(f)) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
            (None, Some(f)) => {
                return Err(ModelError::config("partial_rotary_factor", format!("must lie in (0, 1], got {f}")));
            }
        };
        let max_position_embeddings =
            v.get("max_position_embeddings").and_then(Value::as_u64).map_or(4096, |x| x as usize);
        let rope_scaling = match v.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(rs) => {
                let kind = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str).unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: opt_f64(rs, "factor").unwrap_or(8.0),
                        low_freq_factor: opt_f64(rs, "low_freq_factor").unwrap_or(1.0),
                        high_freq_factor: opt_f64(rs, "high_freq_factor").unwrap_or(4.0),
                        original_max_position_embeddings: opt_f64(rs, "original_max_position_embeddings")
                            .unwrap_or(8192.0),
                    }),
                    "linear" => Some(RopeScaling::Linear { factor: opt_f64(rs, "factor").unwrap_or(1.0) }),
                    "yarn" => Some(yarn(rs, max_position_embeddings)?),
                    // Dynamic NTK changes the base only past max_position_embeddings, which
                    // max_model_len never passes: inside the context it is plain RoPE.
                    "dynamic" => None,
                    // "su" is the name Phi-3's first 128k checkpoints gave LongRoPE.
                    "longrope" | "su" => Some(long_rope(v, rs, max_position_embeddings)?),
                    other => {
                        return Err(ModelError::config(
                            "rope_scaling",
                            format!(
                                "rope scaling type '{other}' is not supported (supported: llama3, linear, longrope, yarn, dynamic)"
                            ),
                        ));
                    }
                }
            }
        };
        // Mistral and Phi-3 attend within their window; Qwen2 configs carry a `sliding_window`
        // that only applies with `use_sliding_window`, which no supported checkpoint sets.
        let sliding_window = match architecture {
            Architecture::Llama
            | Architecture::Phi3
            | Architecture::Mixtral
            | Architecture::GptOss
            | Architecture::PhiMoe
            | Architecture::Starcoder2 => v.get("sliding_window").and_then(Value::as_u64),
            Architecture::Olmo3 | Architecture::Cohere2 => {
                Some(v.get("sliding_window").and_then(Value::as_u64).unwrap_or(4096))
            }
            // EXAONE 4.0 without a window (1.2B) attends fully, with RoPE, everywhere.
            Architecture::Exaone4 => v.get("sliding_window").and_then(Value::as_u64),
            // Llama 4's RoPE layers attend within chunks (`Llama4Attention`), not windows.
            Architecture::HunYuanDense
            | Architecture::HunYuanMoe
            | Architecture::Llama4
            | Architecture::Arcee
            | Architecture::Apertus => None,
            Architecture::Glm4
            | Architecture::Glm4Moe
            | Architecture::DeepseekV2
            | Architecture::DeepseekV3
            | Architecture::Cohere
            | Architecture::Olmoe
            | Architecture::SeedOss
            | Architecture::Ernie4_5
            | Architecture::Ernie4_5Moe
            | Architecture::InternLm2
            | Architecture::Granite
            | Architecture::GraniteMoe
            | Architecture::MiniMaxM2
            | Architecture::StableLm
            | Architecture::Phi
            | Architecture::Olmo
            | Architecture::Gemma
            | Architecture::Nemotron
            | Architecture::GptNeoX
            | Architecture::Falcon
            | Architecture::GptBigCode
            | Architecture::Gpt2
            | Architecture::Bloom
            | Architecture::Mpt
            | Architecture::Baichuan
            | Architecture::Glm
            | Architecture::ChatGlm
            | Architecture::Olmo2 => None,
            Architecture::SmolLm3 => {
                if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
                    return Err(ModelError::config(
                        "use_sliding_window",
                        "SmolLM3 with sliding windows is not supported; released checkpoints set use_sliding_window \
                         to false",
                    ));
                }
                None
            }
            // Their window applies to their sliding layers only (`sliding_layers` below).
            Architecture::Gemma2 | Architecture::Gemma3 => {
                Some(v.get("sliding_window").and_then(Value::as_u64).unwrap_or(4096))
            }
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen2Moe
            | Architecture::Qwen3Moe
            | Architecture::Dots1 => {
                if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
                    return Err(ModelError::config(
                        "use_sliding_window",
                        "sliding-window attention on some Qwen layers (max_window_layers) is not supported; \
                         set use_sliding_window to false to run every layer with full attention",
                    ));
                }
                None
            }
        }
        .map(|w| w as usize);
        let gpt_oss = architecture == Architecture::GptOss;
        if matches!(architecture, Architecture::Ernie4_5 | Architecture::Ernie4_5Moe)
            && v.get("use_bias").and_then(Value::as_bool) == Some(true)
        {
            return Err(ModelError::config(
                "use_bias",
                "ERNIE 4.5 with biased projections is not supported; released ERNIE 4.5 checkpoints set use_bias to false",
            ));
        }
        // The activation `Activation::of_dense_mlp` runs for each family: a config naming
        // another would be read by transformers with that one, and silently differ here.
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            let supported: &[&str] = match architecture {
                // Arcee and Nemotron square a ReLU; the GELUs are the tanh approximation under
                // three names.
                Architecture::Arcee | Architecture::Nemotron => &["relu2"],
                Architecture::Apertus => &["xielu"],
                Architecture::Starcoder2
                | Architecture::Phi
                | Architecture::GptBigCode
                | Architecture::Gpt2
                | Architecture::Bloom => &["gelu_pytorch_tanh", "gelu_new", "gelu_fast"],
                Architecture::StableLm => &["silu"],
                Architecture::GptNeoX | Architecture::Falcon | Architecture::Mpt => &["gelu"],
                // Gemma's GeGLU is checked as `hidden_activation`; the first configs' `gelu`
                // here means the tanh GELU.
                Architecture::Gemma | Architecture::Gemma2 | Architecture::Gemma3 => &[act],
                // Every other family's MLP is SwiGLU (transformers' `swish` is SiLU too).
                _ => &["silu", "swish"],
            };
            if !supported.contains(&act) {
                return Err(ModelError::config(
                    "hidden_act",
                    format!(
                        "'{act}' is not supported for {} (supported: {})",
                        architecture.hf_name(),
                        supported.join(", ")
                    ),
                ));
            }
        }
        // StarCoder2's `use_bias` covers every projection, and Phi's projections all have one;
        // Llama's, Granite's and Arcee's MLPs take `mlp_bias`, which the other families' classes
        // do not read.
        let use_bias = v.get("use_bias").and_then(Value::as_bool).unwrap_or(true);
        let flag = |key: &str| v.get(key).and_then(Value::as_bool).unwrap_or(false);
        let mlp_bias = match architecture {
            Architecture::Starcoder2 => use_bias,
            Architecture::Phi
            | Architecture::GptNeoX
            | Architecture::GptBigCode
            | Architecture::Gpt2
            | Architecture::Bloom => true,
            // Falcon's `bias` (read as `attention_bias`) covers its MLP too.
            Architecture::Falcon => flag("attention_bias"),
            Architecture::Llama | Architecture::Granite | Architecture::Arcee | Architecture::Nemotron => {
                v.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false)
            }
            _ if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) => {
                return Err(ModelError::config(
                    "mlp_bias",
                    format!(
                        "biased MLP projections are not supported for {}; its released checkpoints set mlp_bias to false",
                        architecture.hf_name()
                    ),
                ));
            }
            _ => false,
        };
        // Sliding layers among full ones: Gemma 2 and gpt-oss alternate them (sliding first),
        // OLMo 3 runs three and Gemma 3 five to each full one.
        let sliding_layers = match architecture {
            Architecture::Gemma2 | Architecture::GptOss => Some(2),
            Architecture::Olmo3 | Architecture::Cohere2 => Some(4),
            Architecture::Exaone4 if sliding_window.is_some() => {
                if v.get("layer_types").is_none() && v.get("sliding_window_pattern").is_some_and(Value::is_string) {
                    return Err(ModelError::config(
                        "sliding_window_pattern",
                        "a pattern string needs layer_types beside it; give layer_types, or the pattern as every how many \
                         layers one attends fully",
                    ));
                }
                Some(4)
            }
            Architecture::Gemma3 => Some(6),
            _ => None,
        }
        .map(|pattern| sliding_layers(v, req_usize(v, "num_hidden_layers")?, pattern))
        .transpose()?;
        if gpt_oss && sliding_window.is_none() {
            return Err(ModelError::config("sliding_window", "gpt-oss's sliding layers need a positive window"));
        }
        // BLOOM adds ALiBi to the scaled scores; Falcon-RW (`alibi`) before scaling them.
        let alibi = match architecture {
            Architecture::Bloom => Some(Alibi::BLOOM),
            Architecture::Falcon if flag("alibi") => Some(Alibi::FALCON_RW),
            Architecture::Mpt => Some(mpt_alibi(v)?),
            Architecture::Baichuan if flag("alibi") => Some(Alibi::BLOOM),
            _ => None,
        };
        let cfg = Self {
            architecture,
            hidden_size,
            // Llama 4's `intermediate_size` is its experts' width; its dense layers' is its own.
            intermediate_size: match architecture {
                Architecture::Llama4 => req_usize(v, "intermediate_size_mlp")?,
                _ => req_usize(v, "intermediate_size")?,
            },
            num_hidden_layers: req_usize(v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rotary_dim,
            vocab_size: req_usize(v, "vocab_size")?,
            rms_norm_eps: match architecture {
                Architecture::Cohere | Architecture::Cohere2 | Architecture::Mpt => {
                    opt_f64(v, "layer_norm_eps").unwrap_or(1e-5)
                }
                Architecture::Starcoder2 => opt_f64(v, "norm_epsilon").unwrap_or(1e-5),
                Architecture::StableLm
                | Architecture::Phi
                | Architecture::GptNeoX
                | Architecture::Falcon
                | Architecture::GptBigCode
                | Architecture::Gpt2
                | Architecture::Bloom => opt_f64(v, "layer_norm_eps").unwrap_or(1e-5),
                // OLMo 1's LayerNorm fixes its epsilon.
                Architecture::Olmo => 1e-5,
                Architecture::Nemotron => opt_f64(v, "norm_eps").unwrap_or(1e-5),
                _ => opt_f64(v, "rms_norm_eps").unwrap_or(1e-6),
            },
            rope_theta: hunyuan_rope_base(v, architecture, rotary_dim)?
                .or(opt_f64(v, "rope_theta"))
                .or(opt_f64(v, "rotary_emb_base").filter(|_| architecture == Architecture::GptNeoX))
                .unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(
                architecture.is_gemma()
                    || matches!(architecture, Architecture::Cohere | Architecture::Cohere2 | Architecture::Starcoder2),
            ),
            attention_bias: (architecture == Architecture::Starcoder2 && use_bias)
                || matches!(
                    architecture,
                    Architecture::Phi | Architecture::GptBigCode | Architecture::Gpt2 | Architecture::Bloom
                )
                || (architecture == Architecture::GptNeoX && v.get("attention_bias").and_then(Value::as_bool).unwrap_or(true))
                || (architecture == Architecture::StableLm && flag("use_qkv_bias"))
                || (architecture == Architecture::Falcon && flag("attention_bias"))
                || internlm2_bias(v, architecture)?
                || v.get("attention_bias").and_then(Value::as_bool).unwrap_or(architecture.qkv_bias_by_default()),
            qk_norm: architecture.has_qk_norm()
                || (matches!(architecture, Architecture::Glm4Moe | Architecture::Cohere)
                    && v.get("use_qk_norm").and_then(Value::as_bool).unwrap_or(false))
                || (matches!(architecture, Architecture::StableLm | Architecture::Phi) && flag("qk_layernorm"))
                || minimax_m2_attention(v, architecture)?
                || hunyuan_qk_norm(v, architecture)?,
            // GPT-2 and GPT-BigCode add learned positions and turn nothing.
            learned_positions: architecture.is_gpt2_like(),
            alibi,
            embedding_norm: architecture == Architecture::Bloom,
            // GLM-4 fuses gate and up only; q, k and v load separately when stored so.
            fused_projections: matches!(
                architecture,
                Architecture::Phi3 | Architecture::Glm4 | Architecture::Glm | Architecture::ChatGlm
            ),
            sliding_window,
            sliding_layers: sliding_layers.clone(),
            // DeepSeek's `attention_bias` covers its output projection too; Seed-OSS names its own.
            attention_output_bias: (architecture == Architecture::Starcoder2 && use_bias)
                // Nemotron's `attention_bias` covers o_proj too, as GPT-NeoX's (on unless off).
                || (architecture == Architecture::Nemotron && flag("attention_bias"))
                || (architecture == Architecture::GptNeoX && v.get("attention_bias").and_then(Value::as_bool).unwrap_or(true))
                || matches!(
                    architecture,
                    Architecture::Phi | Architecture::GptBigCode | Architecture::Gpt2 | Architecture::Bloom
                )
                // Falcon's `bias` covers every projection.
                || (architecture == Architecture::Falcon && flag("attention_bias"))
                // Phi-3.5-MoE's `attention_bias` covers o_proj too.
                || (architecture == Architecture::PhiMoe && flag("attention_bias"))
                || (gpt_oss && v.get("attention_bias").and_then(Value::as_bool).unwrap_or(true))
                || (mla.is_some() && v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false))
                || (architecture == Architecture::SeedOss
                    && v.get("attention_out_bias").and_then(Value::as_bool).unwrap_or(false)),
            mlp_bias,
            clip_qkv: match architecture {
                Architecture::Olmo | Architecture::Mpt | Architecture::Olmoe => clip_qkv(v)?,
                _ => None,
            },
            layer_norm_1p: architecture == Architecture::Nemotron,
            lm_head_normalized: architecture == Architecture::Baichuan
                && v.get("vocab_size").and_then(Value::as_u64) == Some(BAICHUAN2_VOCAB as u64),
            lm_head_bias: architecture == Architecture::Phi
                || (architecture == Architecture::PhiMoe && flag("lm_head_bias")),
            parallel_residual: match architecture {
                Architecture::Cohere | Architecture::Cohere2 | Architecture::Phi => true,
                Architecture::StableLm => flag("use_parallel_residual"),
                Architecture::GptNeoX => v.get("use_parallel_residual").and_then(Value::as_bool).unwrap_or(true),
                Architecture::Falcon => flag("use_parallel_residual"),
                _ => false,
            },
            parallel_mlp_norm: architecture == Architecture::GptNeoX
                || (architecture == Architecture::Falcon && falcon_has_two_norms(v)),
            attention_sinks: gpt_oss,
            rope_layers: match architecture {
                Architecture::SmolLm3 | Architecture::Llama4 => {
                    Some(rope_layers(v, req_usize(v, "num_hidden_layers")?)?)
                }
                // Command R7B's and EXAONE 4.0's full-attention layers attend without RoPE.
                Architecture::Cohere2 | Architecture::Exaone4 => sliding_layers,
                Architecture::GptBigCode | Architecture::Gpt2 => Some(vec![false; req_usize(v, "num_hidden_layers")?]),
                _ if alibi.is_some() => Some(vec![false; req_usize(v, "num_hidden_layers")?]),
                _ => None,
            },
            moe: match architecture {
                Architecture::Qwen2Moe
                | Architecture::Qwen3Moe
                | Architecture::Glm4Moe
                | Architecture::Dots1
                | Architecture::DeepseekV2
                | Architecture::DeepseekV3
                | Architecture::Mixtral
                | Architecture::Olmoe
                | Architecture::GraniteMoe
                | Architecture::MiniMaxM2
                | Architecture::Ernie4_5Moe
                | Architecture::PhiMoe
                | Architecture::GptOss => Some(moe_config(v, architecture)?),
                Architecture::Llama4 => Some(llama4_experts(v)?),
                Architecture::HunYuanMoe => Some(hunyuan_experts(v)?),
                _ => None,
            },
            mla,
            gemma: match architecture {
                Architecture::Gemma | Architecture::Gemma2 | Architecture::Gemma3 => {
                    Some(gemma_config(v, architecture)?)
                }
                _ => None,
            },
            llama4: match architecture {
                Architecture::Llama4 => Some(llama4_attention(v)?),
                _ => None,
            },
            scales: scales(v, architecture, hidden_size, head_dim)?,
            bos_token_id: token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: token_ids(v.get("eos_token_id")),
        }
        .serve_context(None);
        cfg.check()?;
        Ok(cfg)
    }

    /// Shape invariants every loader relies on.
    pub fn check(&self) -> Result<()> {
        if self.num_hidden_layers == 0 {
            return Err(ModelError::config("num_hidden_layers", "a model needs at least one layer, got 0"));
        }
        if self.max_position_embeddings == 0 {
            return Err(ModelError::config("max_position_embeddings", "the model's context must be at least 1"));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ModelError::config(
                "rope_theta",
                format!("the RoPE base must be a positive number, got {}", self.rope_theta),
            ));
        }
        if let Some(scaling) = &self.rope_scaling {
            scaling.check()?;
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(ModelError::config(
                "rms_norm_eps",
                format!("the norm epsilon must be a non-negative number, got {}", self.rms_norm_eps),
            ));
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return Err(ModelError::config("num_attention_heads", "head counts must be positive"));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(ModelError::config(
                "num_key_value_heads",
                format!(
                    "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        // Published heads are at most a few hundred dims (576 with MLA's latent); a larger one is
        // a corrupt file whose per-row tables would take the memory.
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > MAX_HEAD_DIM {
            return Err(ModelError::config(
                "head_dim",
                format!("head_dim must be even, positive and at most {MAX_HEAD_DIM}, got {}", self.head_dim),
            ));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            return Err(ModelError::config(
                "partial_rotary_factor",
                format!(
                    "the rotary dims ({}) must be even, positive and at most head_dim ({})",
                    self.rotary_dim, self.head_dim
                ),
            ));
        }
        if let Some(RopeScaling::LongRope { short_factor, long_factor, .. }) = &self.rope_scaling
            && (short_factor.len() != self.rotary_dim / 2 || long_factor.len() != self.rotary_dim / 2)
        {
            return Err(ModelError::config(
                "rope_scaling",
                format!(
                    "LongRoPE needs one short and one long factor per rotary frequency ({}), got {} and {}",
                    self.rotary_dim / 2,
                    short_factor.len(),
                    long_factor.len()
                ),
            ));
        }
        if let Some(moe) = &self.moe {
            if moe.num_experts == 0 || moe.top_k == 0 || moe.top_k > moe.num_experts {
                return Err(ModelError::config(
                    "num_experts_per_tok",
                    format!(
                        "each token needs between 1 and num_experts ({}) experts, got {}",
                        moe.num_experts, moe.top_k
                    ),
                ));
            }
            if let Router::GroupedSigmoid { n_group, topk_group, .. }
            | Router::GroupedSoftmax { n_group, topk_group, .. } = moe.router
                && (n_group == 0
                    || !moe.num_experts.is_multiple_of(n_group)
                    || topk_group == 0
                    || topk_group > n_group
                    || moe.num_experts / n_group < 2.min(moe.num_experts))
            {
                return Err(ModelError::config(
                    "n_group",
                    format!(
                        "n_group ({n_group}) must divide the {} experts, and topk_group ({topk_group}) lie in 1..=n_group",
                        moe.num_experts
                    ),
                ));
            }
            if moe.decoder_sparse_step == 0 || moe.expert_intermediate_size == 0 {
                return Err(ModelError::config(
                    "decoder_sparse_step",
                    "decoder_sparse_step and moe_intermediate_size must be positive",
                ));
            }
        }
        let Scales { embedding, residual, attention, logits_divisor, attention_softcap, logits_softcap } = self.scales;
        for (key, value) in [
            ("embedding_multiplier", embedding),
            ("residual_multiplier", residual),
            ("attention_multiplier", attention.unwrap_or(1.0)),
            ("logits_scaling", logits_divisor),
            ("attn_logit_softcapping", attention_softcap.unwrap_or(1.0)),
            ("final_logit_softcapping", logits_softcap.unwrap_or(1.0)),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ModelError::config(key, format!("must be positive and finite, got {value}")));
            }
        }
        if self.sliding_window == Some(0) {
            return Err(ModelError::config("sliding_window", "must be positive (or null for full attention)"));
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            return Err(ModelError::config(
                "hidden_size",
                "hidden_size, intermediate_size and vocab_size must be positive",
            ));
        }
        Ok(())
    }

    /// Where a layer's RMSNorms sit.
    pub fn norm_placement(&self) -> NormPlacement {
        match self.architecture {
            Architecture::Gemma2 | Architecture::Gemma3 => NormPlacement::Sandwich,
            Architecture::Glm4 => NormPlacement::Sandwich,
            Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Exaone4 => NormPlacement::Post,
            _ if self.parallel_residual => NormPlacement::Parallel,
            _ => NormPlacement::Pre,
        }
    }

    /// The dense MLP multiplies a gated branch into `up` (all but Arcee's and Nemotron's
    /// `relu(up)²`, StarCoder2's and Phi's `gelu_tanh(up)` and Apertus's `xielu(up)`).
    pub fn mlp_is_gated(&self) -> bool {
        !matches!(
            self.architecture,
            Architecture::Arcee
                | Architecture::Apertus
                | Architecture::Nemotron
                | Architecture::Starcoder2
                | Architecture::Phi
                | Architecture::GptNeoX
                | Architecture::Falcon
                | Architecture::GptBigCode
                | Architecture::Gpt2
                | Architecture::Bloom
                | Architecture::Mpt
        )
    }

    /// The norms are LayerNorms (Cohere's and MPT's without bias, the others' with): centred
    /// before they are normalised.
    pub fn centered_norms(&self) -> bool {
        matches!(self.architecture, Architecture::Cohere | Architecture::Cohere2 | Architecture::Mpt)
            || self.architecture.has_layer_norms()
    }

    /// The LayerNorms have neither weight nor bias (OLMo 1).
    pub fn norms_weightless(&self) -> bool {
        self.architecture == Architecture::Olmo
    }

    /// The LayerNorms add a bias (`{norm}.bias`): every LayerNorm family's but OLMo 1's
    /// weightless ones (Phi's and StableLM's q/k norms too).
    pub fn norms_have_bias(&self) -> bool {
        self.architecture.has_layer_norms() && !self.norms_weightless()
    }

    /// The per-head q/k norms come after RoPE (HunYuan), not before.
    pub fn qk_norm_after_rope(&self) -> bool {
        self.architecture.is_hunyuan()
    }

    /// The q/k norms scale each head by its own weight row (`[heads, head_dim]`, Cohere,
    /// StableLM).
    pub fn qk_norm_weights_per_head(&self) -> bool {
        matches!(self.architecture, Architecture::Cohere | Architecture::StableLm)
    }

    /// q and k are normed across all heads at once (`[q_dim]` and `[kv_dim]` weights, OLMo 2),
    /// not per head.
    pub fn qk_norm_spans_heads(&self) -> bool {
        matches!(
            self.architecture,
            Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Olmoe | Architecture::MiniMaxM2
        )
    }

    /// The RoPE base the sliding layers turn with when it is not the full layers' RoPE: Gemma
    /// 3's own base, or (OLMo 3, Gemma) the unscaled RoPE where the full layers' is scaled.
    /// `None` when every layer turns alike.
    pub fn sliding_rope_theta(&self) -> Option<f64> {
        let base = match (&self.gemma, self.architecture) {
            (Some(g), _) => g.local_rope_theta,
            (None, Architecture::Olmo3) => self.rope_theta,
            _ => return None,
        };
        (base != self.rope_theta || self.rope_scaling.is_some()).then_some(base)
    }

    /// The norms scale by `1 + weight` and the checkpoint stores `weight` (Gemma's and
    /// Nemotron's safetensors).
    pub fn norms_add_one(&self) -> bool {
        self.gemma.as_ref().map_or(self.layer_norm_1p, |g| !g.norms_store_scale)
    }

    /// The window layer `layer` attends within.
    pub fn layer_sliding_window(&self, layer: usize) -> Option<usize> {
        match &self.sliding_layers {
            Some(layers) => self.sliding_window.filter(|_| layers.get(layer).copied().unwrap_or(false)),
            None => self.sliding_window,
        }
    }

    /// Layer `layer` turns q and k by RoPE (all but the `rope_layers` marked false).
    pub fn layer_rotates(&self, layer: usize) -> bool {
        self.rope_layers.as_ref().is_none_or(|r| r.get(layer).copied().unwrap_or(true))
    }

    /// The chunk Llama 4's RoPE layers attend within.
    pub fn attention_chunk(&self) -> Option<usize> {
        self.llama4.and_then(|l| l.attention_chunk_size)
    }

    /// The window every layer attends within, when they all share one (Mistral, Phi-3); `None`
    /// for full attention and for models whose layers differ ([`Self::layered_window`]).
    pub fn uniform_sliding_window(&self) -> Option<usize> {
        if self.layered_window().is_some() { None } else { self.sliding_window }
    }

    /// The window of the sliding layers of a model that mixes them with full-attention ones
    /// (Gemma 2 / 3, gpt-oss).
    pub fn layered_window(&self) -> Option<usize> {
        self.sliding_layers.as_ref().and(self.sliding_window)
    }

    /// Fixes what depends on the context the model will serve (`max_model_len`, or the
    /// model's whole context when `None`): LongRoPE's factor set, long past the pretrained
    /// window and short within it.
    pub fn serve_context(mut self, context: Option<usize>) -> Self {
        let context = context.unwrap_or(self.max_position_embeddings);
        if let Some(RopeScaling::LongRope { original_max_position_embeddings, extended, .. }) = &mut self.rope_scaling {
            *extended = context > *original_max_position_embeddings;
        }
        self
    }

    /// Weights of one layer's attention projections (biases aside).
    pub fn attention_params(&self) -> usize {
        let (h, nh) = (self.hidden_size, self.num_attention_heads);
        match self.mla {
            Some(m) => {
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                let query = m.q_lora_rank.map_or(h * nh * qk, |r| h * r + r * nh * qk);
                let kv = h * (m.kv_lora_rank + m.qk_rope_head_dim)
                    + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim);
                query + kv + nh * m.v_head_dim * h
            }
            None => h * self.head_dim * (2 * nh + 2 * self.num_key_value_heads),
        }
    }

    /// Bytes of K and V one token occupies across all layers at `dtype_bytes` per element.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> u64 {
        self.num_hidden_layers as u64 * self.kv_bytes_per_token_per_layer(dtype_bytes)
    }

    /// Bytes one token's K and V occupy in one layer: one shared entry under latent attention.
    pub fn kv_bytes_per_token_per_layer(&self, dtype_bytes: usize) -> u64 {
        let tensors = if self.mla.is_some() { 1 } else { 2 };
        (tensors * self.num_key_value_heads * self.head_dim * dtype_bytes) as u64
    }

    /// Hugging Face `hidden_states` indices of the EAGLE-3 default taps {2, L/2, L-3}.
    pub fn default_eagle3_taps(&self) -> [usize; 3] {
        let l = self.num_hidden_layers;
        [2.min(l), l / 2, l.saturating_sub(3)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm2() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "max_position_embeddings": 8192, "tie_word_embeddings": true,
            "bos_token_id": 1, "eos_token_id": 2
        })
    }

    #[test]
    fn reads_smollm2_shape() {
        let c = DecoderConfig::from_hf_json(&smollm2()).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!((c.head_dim, c.num_key_value_heads), (64, 3));
        assert!(c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.default_eagle3_taps(), [2, 15, 27]);
    }

    #[test]
    fn corrupt_sizes_and_constants_are_refused_by_key() {
        for (arch, key, value, message) in [
            ("LlamaForCausalLM", "num_hidden_layers", json!(0), "at least one layer"),
            ("LlamaForCausalLM", "num_hidden_layers", json!(1u64 << 40), "past any real model"),
            // Gemma 2 builds its per-layer window table while the config is read.
            ("Gemma2ForCausalLM", "num_hidden_layers", json!(1u64 << 40), "past any real model"),
            ("LlamaForCausalLM", "head_dim", json!(1u64 << 31), "at most 16384"),
            ("LlamaForCausalLM", "rope_theta", json!(0.0), "RoPE base must be a positive number"),
            ("LlamaForCausalLM", "rope_theta", json!(-1.0), "RoPE base must be a positive number"),
            ("LlamaForCausalLM", "rms_norm_eps", json!(-1e-5), "epsilon must be a non-negative number"),
            ("LlamaForCausalLM", "max_position_embeddings", json!(0), "context must be at least 1"),
            ("LlamaForCausalLM", "rope_scaling", json!({"rope_type": "linear", "factor": 0.0}), "factor"),
            (
                "LlamaForCausalLM",
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
                "must exceed low_freq_factor",
            ),
            // A string used to read as unset, and the default took its place.
            ("LlamaForCausalLM", "rope_theta", json!("abc"), "must be a number"),
            ("LlamaForCausalLM", "max_position_embeddings", json!("big"), "must be a number"),
            ("GraniteForCausalLM", "embedding_multiplier", json!("12"), "must be a number"),
            ("Gemma2ForCausalLM", "query_pre_attn_scalar", json!([256]), "must be a number"),
            (
                "LlamaForCausalLM",
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
                "rope_scaling.factor",
            ),
        ] {
            let mut v = smollm2();
            v["architectures"] = json!([arch]);
            v[key] = value;
            let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(message), "{arch} {key}: {e}");
        }
    }

    /// Every key read through `opt_f64` (a default when unset) is type-checked first, so a
    /// mistyped value is refused instead of silently replaced by the default.
    #[test]
    fn every_defaulted_number_is_type_checked() {
        let source = include_str!("config.rs");
        for (object, listed) in [("v", &NUMERIC_KEYS[..]), ("rs", &ROPE_SCALING_NUMERIC_KEYS[..])] {
            let call = format!("opt_f64({object}, \"");
            let mut seen = 0;
            for rest in source.split(call.as_str()).skip(1) {
                let key = &rest[..rest.find('"').unwrap()];
                assert!(listed.contains(&key), "opt_f64({object}, \"{key}\") is read but not type-checked");
                seen += 1;
            }
            assert!(seen > 5, "found only {seen} opt_f64({object}, ..) calls: has the helper been renamed?");
        }
    }

    #[test]
    fn family_flags_follow_architecture() {
        let mut v = smollm2();
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        assert!(DecoderConfig::from_hf_json(&v).unwrap().attention_bias);
        v["architectures"] = json!(["Qwen3ForCausalLM"]);
        let q3 = DecoderConfig::from_hf_json(&v).unwrap();
        assert!(q3.qk_norm && !q3.attention_bias);
    }

    #[test]
    fn errors_name_the_key() {
        let mut v = smollm2();
        v["architectures"] = json!(["JambaForCausalLM"]);
        let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("JambaForCausalLM") && e.contains("LlamaForCausalLM"), "{e}");
        let mut v = smollm2();
        v.as_object_mut().unwrap().remove("intermediate_size");
        let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("intermediate_size"), "{e}");
        let mut v = smollm2();
        v["num_key_value_heads"] = json!(4);
        assert!(DecoderConfig::from_hf_json(&v).unwrap_err().to_string().contains("multiple"));
    }

    #[test]
    fn swiglu_families_refuse_an_activation_they_would_not_run() {
        for (architecture, act, ok) in [
            ("LlamaForCausalLM", "silu", true),
            ("LlamaForCausalLM", "swish", true),
            ("LlamaForCausalLM", "gelu", false),
            ("Qwen2ForCausalLM", "gelu_new", false),
            ("MixtralForCausalLM", "relu", false),
        ] {
            let mut v = smollm2();
            (v["architectures"], v["hidden_act"]) = (json!([architecture]), json!(act));
            match DecoderConfig::from_hf_json(&v) {
                Ok(_) => assert!(ok, "{architecture} with {act} was accepted"),
                Err(e) => {
                    let e = e.to_string();
                    assert!(!ok, "{architecture} with {act}: {e}");
                    assert!(e.contains("hidden_act") && e.contains(act) && e.contains("silu, swish"), "{e}");
                }
            }
        }
    }

    #[test]
    fn reads_llama3_rope_scaling() {
        let mut v = smollm2();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = DecoderConfig::from_hf_json(&v).unwrap();
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 8.0));
        v["rope_scaling"] = json!({"rope_type": "mrope", "factor": 4.0});
        let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("mrope") && e.contains("yarn"), "{e}");
    }

    #[test]
    fn reads_yarn_as_transformers_does() {
        let mut v = smollm2();
        // Qwen2.5's recommended long-context scaling: the default factor 0.1·ln(4) + 1.
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let Some(RopeScaling::Yarn { params, attention_factor }) =
            DecoderConfig::from_hf_json(&v).unwrap().rope_scaling
        else {
            panic!("YaRN expected")
        };
        assert_eq!((params.factor, params.original_max_position_embeddings, params.truncate), (4.0, 32768.0, true));
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        // DeepSeek-V3's ratio of two magnitudes (equal here, so 1), and gpt-oss's untruncated range.
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "truncate": false, "beta_fast": 32.0, "beta_slow": 1.0});
        let Some(RopeScaling::Yarn { params, attention_factor }) =
            DecoderConfig::from_hf_json(&v).unwrap().rope_scaling
        else {
            panic!("YaRN expected")
        };
        assert_eq!((attention_factor, params.truncate, params.original_max_position_embeddings), (1.0, false, 8192.0));
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 0.5});
        assert!(DecoderConfig::from_hf_json(&v).unwrap_err().to_string().contains("rope_scaling.factor"));
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 2.0, "beta_fast": 0.5});
        assert!(DecoderConfig::from_hf_json(&v).unwrap_err().to_string().contains("beta_fast"));
    }

    /// Phi-4-mini-instruct's config.json, factor lists shortened to their real length of 48.
    fn phi4_mini() -> Value {
        json!({
            "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "vocab_size": 200064, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "sliding_window": 262144,
            "tie_word_embeddings": true, "bos_token_id": 199999, "eos_token_id": 199999,
            "rope_scaling": {"type": "longrope", "short_factor": vec![1.0; 48], "long_factor": vec![2.0; 48]}
        })
    }

    #[test]
    fn reads_phi4_mini_long_rope_and_partial_rotary() {
        let c = DecoderConfig::from_hf_json(&phi4_mini()).unwrap();
        assert_eq!(c.architecture, Architecture::Phi3);
        assert_eq!((c.head_dim, c.rotary_dim, c.sliding_window), (128, 96, Some(262144)));
        assert!(c.fused_projections && c.tie_word_embeddings && !c.attention_bias);
        let Some(RopeScaling::LongRope { attention_factor, original_max_position_embeddings, extended, .. }) =
            c.rope_scaling.clone()
        else {
            panic!("LongRoPE expected: {:?}", c.rope_scaling);
        };
        // transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)).
        assert!((attention_factor - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        assert_eq!(original_max_position_embeddings, 4096);
        assert!(extended, "serving the whole 128k context takes the long factors");
        let served = |n| match c.clone().serve_context(Some(n)).rope_scaling {
            Some(RopeScaling::LongRope { extended, .. }) => extended,
            other => panic!("{other:?}"),
        };
        assert!(!served(4096) && served(4097), "short factors while the context fits the pretrained window");
    }

    #[test]
    fn sliding_windows_are_read_for_mistral_and_phi3_only() {
        let mut v = smollm2();
        v["architectures"] = json!(["MistralForCausalLM"]);
        v["sliding_window"] = json!(4096);
        assert_eq!(DecoderConfig::from_hf_json(&v).unwrap().sliding_window, Some(4096));
        v["sliding_window"] = Value::Null;
        assert_eq!(DecoderConfig::from_hf_json(&v).unwrap().sliding_window, None);
        // Qwen2 configs name a window that applies only with use_sliding_window.
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        v["sliding_window"] = json!(32768);
        v["use_sliding_window"] = json!(false);
        assert_eq!(DecoderConfig::from_hf_json(&v).unwrap().sliding_window, None);
    }
}
