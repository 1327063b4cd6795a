//! The built-in architecture registry and the speculator-selection rule.
//!
//! A speculator is one speculative variant of a target architecture: a method (eagle, mtp,
//! ...) paired with the draft checkpoint's architecture name (`None` when the draft heads live
//! inside the target checkpoint, or when the method needs no draft model). Selection matches
//! both halves, so naming a method selects the mechanism that runs rather than whichever one a
//! draft checkpoint happens to fit. The Python registry (which users extend) declares the
//! built-ins from this table and calls [`select_speculator`] for the rule.

use std::fmt;

use crate::config::SpeculativeMethod;

/// The Rust pipeline a (fused) architecture runs; each is a class of the Python extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PipelineKind {
    /// Target only, plain decoding.
    Plain,
    /// Prompt-lookup drafts.
    Ngram,
    /// Suffix-tree drafts over the request's text and earlier outputs.
    Suffix,
    /// EAGLE-1 or EAGLE-3 draft head (the checkpoint says which).
    Eagle,
    /// Multi-token-prediction heads (inside the target checkpoint, or speculators `mtp`).
    Mtp,
    DFlash,
    DFlash2,
    DSpark,
}

impl PipelineKind {
    pub const ALL: [PipelineKind; 8] =
        [Self::Plain, Self::Ngram, Self::Suffix, Self::Eagle, Self::Mtp, Self::DFlash, Self::DFlash2, Self::DSpark];

    /// The extension class name (`spec_rs._spec_rs.<name>`).
    pub fn class_name(self) -> &'static str {
        match self {
            Self::Plain => "PlainPipeline",
            Self::Ngram => "NgramPipeline",
            Self::Suffix => "SuffixPipeline",
            Self::Eagle => "EaglePipeline",
            Self::Mtp => "MtpPipeline",
            Self::DFlash => "DFlashPipeline",
            Self::DFlash2 => "DFlash2Pipeline",
            Self::DSpark => "DSparkPipeline",
        }
    }

    pub fn from_class_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.class_name() == name)
    }

    pub fn method(self) -> Option<SpeculativeMethod> {
        match self {
            Self::Plain => None,
            Self::Ngram => Some(SpeculativeMethod::Ngram),
            Self::Suffix => Some(SpeculativeMethod::Suffix),
            Self::Eagle => Some(SpeculativeMethod::Eagle),
            Self::Mtp => Some(SpeculativeMethod::Mtp),
            Self::DFlash => Some(SpeculativeMethod::Dflash),
            Self::DFlash2 => Some(SpeculativeMethod::Dflash2),
            Self::DSpark => Some(SpeculativeMethod::Dspark),
        }
    }
}

/// A target architecture spec-rs runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchitectureSpec {
    /// The Hugging Face class name (`architectures[0]`).
    pub name: &'static str,
    pub example_repo_ids: &'static [&'static str],
    pub default_weights_format: &'static str,
    pub supports_spec_decode_mixed_batches: bool,
    pub supports_device_graph_capture: bool,
}

/// One speculative variant of a target architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculatorSpec {
    pub name: String,
    pub base: &'static str,
    pub draft_arch: Option<&'static str>,
    pub method: SpeculativeMethod,
    pub pipeline: PipelineKind,
    /// `None` inherits the base's value.
    pub supports_spec_decode_mixed_batches: Option<bool>,
    pub supports_device_graph_capture: Option<bool>,
    /// Whether the draft width comes from the draft checkpoint.
    pub checkpoint_draft_width: bool,
    pub example_repo_ids: Option<&'static [&'static str]>,
}

pub const BUILTIN_ARCHITECTURES: &[ArchitectureSpec] = &[
    ArchitectureSpec {
        name: "LlamaForCausalLM",
        example_repo_ids: &["HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.1-8B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "MistralForCausalLM",
        example_repo_ids: &["mistralai/Mistral-7B-Instruct-v0.3"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Qwen2ForCausalLM",
        example_repo_ids: &["Qwen/Qwen2.5-0.5B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "MiMoForCausalLM",
        example_repo_ids: &["XiaomiMiMo/MiMo-7B-RL"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Qwen3ForCausalLM",
        example_repo_ids: &["Qwen/Qwen3-8B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Mixtures read their routing on the host each layer: no device-graph capture.
    ArchitectureSpec {
        name: "Qwen2MoeForCausalLM",
        example_repo_ids: &["Qwen/Qwen1.5-MoE-A2.7B-Chat", "Qwen/Qwen2-57B-A14B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "Qwen3MoeForCausalLM",
        example_repo_ids: &["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-Coder-30B-A3B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "MixtralForCausalLM",
        example_repo_ids: &["mistralai/Mixtral-8x7B-Instruct-v0.1"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "SmolLM3ForCausalLM",
        example_repo_ids: &["HuggingFaceTB/SmolLM3-3B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Olmo2ForCausalLM",
        example_repo_ids: &["allenai/OLMo-2-1124-7B-Instruct", "allenai/OLMo-2-0425-1B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Per-layer windows and RoPE: one fixed-shape step cannot serve every layer.
    ArchitectureSpec {
        name: "Olmo3ForCausalLM",
        example_repo_ids: &["allenai/Olmo-3-7B-Instruct", "allenai/Olmo-3-32B-Think"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "Glm4ForCausalLM",
        example_repo_ids: &["zai-org/GLM-4-9B-0414", "zai-org/GLM-4-32B-0414"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Glm4MoeForCausalLM",
        example_repo_ids: &["zai-org/GLM-4.5-Air", "zai-org/GLM-4.6"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "GraniteMoeForCausalLM",
        example_repo_ids: &["ibm-granite/granite-3.1-3b-a800m-instruct", "ibm-granite/granite-3.1-1b-a400m-instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "GraniteMoeSharedForCausalLM",
        example_repo_ids: &["ibm-research/moe-7b-1b-active-shared-experts"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "OlmoeForCausalLM",
        example_repo_ids: &["allenai/OLMoE-1B-7B-0125-Instruct", "allenai/OLMoE-1B-7B-0924"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "Ernie4_5ForCausalLM",
        example_repo_ids: &["baidu/ERNIE-4.5-0.3B-PT"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "SeedOssForCausalLM",
        example_repo_ids: &["ByteDance-Seed/Seed-OSS-36B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "CohereForCausalLM",
        example_repo_ids: &["CohereForAI/c4ai-command-r-v01", "CohereForAI/aya-23-8B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Per-layer windows and RoPE: one fixed-shape step cannot serve every layer.
    ArchitectureSpec {
        name: "Cohere2ForCausalLM",
        example_repo_ids: &["CohereForAI/c4ai-command-r7b-12-2024", "CohereLabs/c4ai-command-a-03-2025"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "DeepseekV2ForCausalLM",
        example_repo_ids: &["deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-ai/DeepSeek-V2.5"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "DeepseekV3ForCausalLM",
        example_repo_ids: &[
            "deepseek-ai/DeepSeek-V3",
            "deepseek-ai/DeepSeek-R1",
            "moonshotai/Moonlight-16B-A3B-Instruct",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "Dots1ForCausalLM",
        example_repo_ids: &["rednote-hilab/dots.llm1.inst"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "Ernie4_5_MoeForCausalLM",
        example_repo_ids: &["baidu/ERNIE-4.5-21B-A3B-PT", "baidu/ERNIE-4.5-300B-A47B-PT"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "MiniMaxM2ForCausalLM",
        example_repo_ids: &["MiniMaxAI/MiniMax-M2", "MiniMaxAI/MiniMax-M2.5"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // GLM-4.7-Flash: DeepSeek-V3's layer; routing read on the host.
    ArchitectureSpec {
        name: "Glm4MoeLiteForCausalLM",
        example_repo_ids: &["zai-org/GLM-4.7-Flash"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host, and per-layer windows.
    ArchitectureSpec {
        name: "GptOssForCausalLM",
        example_repo_ids: &["openai/gpt-oss-20b", "openai/gpt-oss-120b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "InternLM2ForCausalLM",
        example_repo_ids: &["internlm/internlm2_5-7b-chat", "internlm/internlm2-chat-1_8b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Per-layer windows (and Gemma 3's RoPE): one fixed-shape step cannot serve every layer.
    ArchitectureSpec {
        name: "GemmaForCausalLM",
        example_repo_ids: &["google/gemma-2b-it", "google/gemma-7b-it", "google/codegemma-7b-it"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Gemma2ForCausalLM",
        example_repo_ids: &["google/gemma-2-2b-it", "google/gemma-2-9b-it"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "Gemma3ForCausalLM",
        example_repo_ids: &["google/gemma-3-1b-it"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Its text decoder: the vision tower is not read.
    ArchitectureSpec {
        name: "Gemma3ForConditionalGeneration",
        example_repo_ids: &["google/gemma-3-4b-it", "google/gemma-3-27b-it"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Its text decoder, a Mistral: the vision tower is not read.
    ArchitectureSpec {
        name: "Mistral3ForConditionalGeneration",
        example_repo_ids: &[
            "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Their text decoders, Qwen2 and Qwen3: the vision towers are not read.
    ArchitectureSpec {
        name: "Qwen2VLForConditionalGeneration",
        example_repo_ids: &["Qwen/Qwen2-VL-7B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Qwen2_5_VLForConditionalGeneration",
        example_repo_ids: &["Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Qwen3VLForConditionalGeneration",
        example_repo_ids: &["Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-4B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "Qwen3VLMoeForConditionalGeneration",
        example_repo_ids: &["Qwen/Qwen3-VL-30B-A3B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "HunYuanDenseV1ForCausalLM",
        example_repo_ids: &["tencent/Hunyuan-7B-Instruct", "tencent/Hunyuan-1.8B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "HunYuanMoEV1ForCausalLM",
        example_repo_ids: &["tencent/Hunyuan-A13B-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Routing read on the host, and chunked attention in its RoPE layers only.
    ArchitectureSpec {
        name: "Llama4ForConditionalGeneration",
        example_repo_ids: &[
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "Llama4ForCausalLM",
        example_repo_ids: &["meta-llama/Llama-4-Scout-17B-16E-Instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Per-layer windows and RoPE where it has sliding layers.
    ArchitectureSpec {
        name: "Exaone4ForCausalLM",
        example_repo_ids: &["LGAI-EXAONE/EXAONE-4.0-1.2B", "LGAI-EXAONE/EXAONE-4.0-32B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    // Granite 4.0 attending in every layer: Granite, or Granite MoE Shared with routing read
    // on the host.
    ArchitectureSpec {
        name: "GraniteMoeHybridForCausalLM",
        example_repo_ids: &["ibm-granite/granite-4.0-micro"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "ArceeForCausalLM",
        example_repo_ids: &["arcee-ai/AFM-4.5B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "ApertusForCausalLM",
        example_repo_ids: &["swiss-ai/Apertus-8B-Instruct-2509", "swiss-ai/Apertus-70B-Instruct-2509"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Starcoder2ForCausalLM",
        example_repo_ids: &["bigcode/starcoder2-3b", "bigcode/starcoder2-7b", "bigcode/starcoder2-15b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "StableLmForCausalLM",
        example_repo_ids: &[
            "stabilityai/stablelm-2-1_6b-chat",
            "stabilityai/stablelm-2-12b-chat",
            "stabilityai/stablelm-3b-4e1t",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "GPT2LMHeadModel",
        example_repo_ids: &["openai-community/gpt2", "openai-community/gpt2-xl", "distilbert/distilgpt2"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "BloomForCausalLM",
        example_repo_ids: &["bigscience/bloom-560m", "bigscience/bloomz-7b1", "bigscience/bloom"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "MptForCausalLM",
        example_repo_ids: &["mosaicml/mpt-7b-instruct", "mosaicml/mpt-30b-chat", "replit/replit-code-v1-3b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "MPTForCausalLM",
        example_repo_ids: &["mosaicml/mpt-7b", "mosaicml/mpt-7b-storywriter"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "BaichuanForCausalLM",
        example_repo_ids: &[
            "baichuan-inc/Baichuan2-7B-Chat",
            "baichuan-inc/Baichuan2-13B-Chat",
            "baichuan-inc/Baichuan-13B-Chat",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "BaiChuanForCausalLM",
        example_repo_ids: &["baichuan-inc/Baichuan-7B"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "GlmForCausalLM",
        example_repo_ids: &["THUDM/glm-4-9b-chat-hf", "THUDM/glm-edge-4b-chat"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "ChatGLMModel",
        example_repo_ids: &["THUDM/glm-4-9b-chat", "THUDM/chatglm3-6b", "THUDM/chatglm2-6b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "ChatGLMForConditionalGeneration",
        example_repo_ids: &["THUDM/chatglm3-6b-32k"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "GPTBigCodeForCausalLM",
        example_repo_ids: &["bigcode/starcoderbase-1b", "bigcode/starcoder", "bigcode/gpt_bigcode-santacoder"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "FalconForCausalLM",
        example_repo_ids: &[
            "tiiuae/falcon-7b-instruct",
            "tiiuae/falcon-40b",
            "tiiuae/falcon-11B",
            "tiiuae/falcon-rw-1b",
        ],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "GPTNeoXForCausalLM",
        example_repo_ids: &["EleutherAI/pythia-1.4b", "EleutherAI/pythia-6.9b", "databricks/dolly-v2-3b"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "NemotronForCausalLM",
        example_repo_ids: &["nvidia/Nemotron-Mini-4B-Instruct", "nvidia/Minitron-8B-Base"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "OlmoForCausalLM",
        example_repo_ids: &["allenai/OLMo-1B-hf", "allenai/OLMo-7B-0424-hf"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    // Routing read on the host.
    ArchitectureSpec {
        name: "PhimoeForCausalLM",
        example_repo_ids: &["microsoft/Phi-3.5-MoE-instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: false,
    },
    ArchitectureSpec {
        name: "PhiForCausalLM",
        example_repo_ids: &["microsoft/phi-2", "microsoft/phi-1_5", "microsoft/phi-1"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "GraniteForCausalLM",
        example_repo_ids: &["ibm-granite/granite-3.3-2b-instruct", "ibm-granite/granite-3.3-8b-instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
    ArchitectureSpec {
        name: "Phi3ForCausalLM",
        example_repo_ids: &["microsoft/Phi-4-mini-instruct", "microsoft/Phi-3.5-mini-instruct"],
        default_weights_format: "safetensors",
        supports_spec_decode_mixed_batches: true,
        supports_device_graph_capture: true,
    },
];

/// Draft-checkpoint architecture names per method. EAGLE drafts come as native EAGLE-3
/// (`LlamaForCausalLMEagle3`, `Eagle3LlamaForCausalLM`), speculators EAGLE-3
/// (`Eagle3DraftModel`, `Eagle3Speculator`) and EAGLE-1 (`LlamaForCausalLM` with one layer,
/// rewritten to `LlamaForCausalLMEagle` as MAX does).
const DRAFTS: &[(SpeculativeMethod, Option<&str>, PipelineKind)] = &[
    (SpeculativeMethod::Ngram, None, PipelineKind::Ngram),
    (SpeculativeMethod::Suffix, None, PipelineKind::Suffix),
    (SpeculativeMethod::Eagle, Some("LlamaForCausalLMEagle3"), PipelineKind::Eagle),
    (SpeculativeMethod::Eagle, Some("Eagle3LlamaForCausalLM"), PipelineKind::Eagle),
    (SpeculativeMethod::Eagle, Some("Eagle3DraftModel"), PipelineKind::Eagle),
    (SpeculativeMethod::Eagle, Some("Eagle3Speculator"), PipelineKind::Eagle),
    (SpeculativeMethod::Eagle, Some("LlamaForCausalLMEagle"), PipelineKind::Eagle),
    (SpeculativeMethod::Mtp, None, PipelineKind::Mtp),
    (SpeculativeMethod::Mtp, Some("MTPDraftModel"), PipelineKind::Mtp),
    (SpeculativeMethod::Dflash, Some("DFlashDraftModel"), PipelineKind::DFlash),
    (SpeculativeMethod::Dflash, Some("DFlashSpeculator"), PipelineKind::DFlash),
    (SpeculativeMethod::Dflash2, Some("DFlash2DraftModel"), PipelineKind::DFlash2),
    (SpeculativeMethod::Dspark, Some("Qwen3DSparkModel"), PipelineKind::DSpark),
    (SpeculativeMethod::Dspark, Some("DSparkDraftModel"), PipelineKind::DSpark),
    (SpeculativeMethod::Dspark, Some("DSparkSpeculator"), PipelineKind::DSpark),
];

fn fused_name(method: SpeculativeMethod, base: &str, draft_arch: Option<&str>) -> String {
    let family = base.strip_suffix("ForCausalLM").unwrap_or(base);
    let method_part = match method {
        SpeculativeMethod::Eagle => "Eagle",
        SpeculativeMethod::Mtp => "MTP",
        SpeculativeMethod::Dflash => "DFlash",
        SpeculativeMethod::Dflash2 => "DFlash2",
        SpeculativeMethod::Dspark => "DSpark",
        SpeculativeMethod::Ngram => "Ngram",
        SpeculativeMethod::Suffix => "Suffix",
    };
    match draft_arch {
        Some(d) => format!("Unified{method_part}{family}ForCausalLM[{d}]"),
        None => format!("Unified{method_part}{family}ForCausalLM"),
    }
}

/// Every built-in speculator, per target in declaration order.
pub fn builtin_speculators() -> Vec<SpeculatorSpec> {
    let mut out = Vec::new();
    for arch in BUILTIN_ARCHITECTURES {
        for &(method, draft_arch, pipeline) in DRAFTS {
            // MTP heads inside the target checkpoint exist for MiMo, GLM-4.5, GLM-4.7-Flash and
            // DeepSeek-V3; speculators MTP drafts attach to any target.
            if method == SpeculativeMethod::Mtp
                && draft_arch.is_none()
                && !matches!(
                    arch.name,
                    "MiMoForCausalLM" | "Glm4MoeForCausalLM" | "Glm4MoeLiteForCausalLM" | "DeepseekV3ForCausalLM"
                )
            {
                continue;
            }
            out.push(SpeculatorSpec {
                name: fused_name(method, arch.name, draft_arch),
                base: arch.name,
                draft_arch,
                method,
                pipeline,
                supports_spec_decode_mixed_batches: None,
                supports_device_graph_capture: None,
                checkpoint_draft_width: method.is_block_draft(),
                example_repo_ids: None,
            });
        }
    }
    out
}

/// No declared speculator of the target runs the method with the draft's architecture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("No speculator for {target} runs '{method}' with draft architecture '{draft}'. Declared: {declared}")]
pub struct SelectionError {
    pub target: String,
    pub method: String,
    pub draft: String,
    pub declared: String,
}

/// Picks the first declared speculator whose method and draft architecture both match.
///
/// `declared` lists `(method, draft_arch)` per speculator of `target`, in declaration order.
/// Returns `Ok(None)` when the target declares no speculators at all.
pub fn select_speculator<M: AsRef<str>, D: AsRef<str>>(
    target: &str,
    method: &str,
    draft_arch: Option<&str>,
    declared: &[(M, Option<D>)],
) -> Result<Option<usize>, SelectionError> {
    if declared.is_empty() {
        return Ok(None);
    }
    let found = declared.iter().position(|(m, d)| m.as_ref() == method && d.as_ref().map(AsRef::as_ref) == draft_arch);
    match found {
        Some(i) => Ok(Some(i)),
        None => Err(SelectionError {
            target: target.to_string(),
            method: method.to_string(),
            draft: draft_arch.map_or_else(|| "None".to_string(), str::to_string),
            declared: declared
                .iter()
                .map(|(m, d)| format!("{}+{}", m.as_ref(), d.as_ref().map_or("None", AsRef::as_ref)))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// MAX's rewrite of draft architecture names before selection: an EAGLE draft saved as a
/// one-layer `LlamaForCausalLM` is EAGLE-1 (`LlamaForCausalLMEagle`), unless it carries a
/// reduced draft vocabulary, which makes it EAGLE-3.
pub fn canonical_draft_arch(method: SpeculativeMethod, draft_arch: &str, has_draft_vocab: bool) -> String {
    match (method, draft_arch) {
        (SpeculativeMethod::Eagle, "LlamaForCausalLM") if has_draft_vocab => "LlamaForCausalLMEagle3".into(),
        (SpeculativeMethod::Eagle, "LlamaForCausalLM") => "LlamaForCausalLMEagle".into(),
        _ => draft_arch.to_string(),
    }
}

impl fmt::Display for PipelineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.class_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_matches_method_and_draft_architecture() {
        let declared = [("eagle", Some("LlamaForCausalLMEagle3")), ("mtp", None), ("ngram", None)];
        assert_eq!(select_speculator("L", "eagle", Some("LlamaForCausalLMEagle3"), &declared), Ok(Some(0)));
        assert_eq!(select_speculator("L", "ngram", None, &declared), Ok(Some(2)));
        let e = select_speculator("L", "eagle", Some("DFlashDraftModel"), &declared).unwrap_err();
        assert_eq!(
            e.to_string(),
            "No speculator for L runs 'eagle' with draft architecture 'DFlashDraftModel'. Declared: eagle+LlamaForCausalLMEagle3, mtp+None, ngram+None"
        );
        let none: [(&str, Option<&str>); 0] = [];
        assert_eq!(select_speculator("L", "eagle", None, &none), Ok(None));
    }

    #[test]
    fn builtins_cover_every_method_for_llama_and_qwen3() {
        let specs = builtin_speculators();
        for target in ["LlamaForCausalLM", "Qwen3ForCausalLM"] {
            for m in [
                SpeculativeMethod::Eagle,
                SpeculativeMethod::Dflash,
                SpeculativeMethod::Dflash2,
                SpeculativeMethod::Dspark,
                SpeculativeMethod::Ngram,
                SpeculativeMethod::Suffix,
                SpeculativeMethod::Mtp,
            ] {
                assert!(specs.iter().any(|s| s.base == target && s.method == m), "{target} {m}");
            }
        }
        for target in ["MiMoForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "DeepseekV3ForCausalLM"] {
            assert!(
                specs.iter().any(|s| s.base == target && s.method == SpeculativeMethod::Mtp && s.draft_arch.is_none()),
                "{target} carries its own MTP heads"
            );
        }
        assert!(specs.iter().filter(|s| s.method.is_block_draft()).all(|s| s.checkpoint_draft_width));
    }

    #[test]
    fn eagle1_llama_drafts_are_rewritten() {
        assert_eq!(canonical_draft_arch(SpeculativeMethod::Eagle, "LlamaForCausalLM", false), "LlamaForCausalLMEagle");
        assert_eq!(canonical_draft_arch(SpeculativeMethod::Eagle, "LlamaForCausalLM", true), "LlamaForCausalLMEagle3");
        assert_eq!(canonical_draft_arch(SpeculativeMethod::Dflash, "DFlashDraftModel", false), "DFlashDraftModel");
    }
}
