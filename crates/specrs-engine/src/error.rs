//! Errors of the engine.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] specrs_models::ModelError),
    #[error(transparent)]
    Config(#[from] specrs_core::ConfigError),
    #[error(transparent)]
    ModelNotInstalled(#[from] specrs_core::model_alias::ModelNotInstalled),
    /// A model path that names no file or directory.
    #[error("{0}")]
    ModelNotFound(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The request itself is invalid; the message says what to change.
    #[error("{0}")]
    Request(String),
    #[error("engine failure: {0}")]
    Internal(String),
    #[error("the engine has shut down")]
    Shutdown,
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        Self::Internal(specrs_models::error::without_backtrace(e).to_string())
    }
}

impl From<specrs_core::kv_blocks::KvError> for EngineError {
    fn from(e: specrs_core::kv_blocks::KvError) -> Self {
        Self::Internal(e.to_string())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
