//! Errors of the core crate.

use thiserror::Error;

/// A configuration rule was broken. `field` names the offending field when one is to blame,
/// so bindings can point users at it (pydantic `loc`, HTTP error `param`, CLI flag).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct ConfigError {
    pub field: Option<String>,
    pub message: String,
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self { field: None, message: message.into() }
    }

    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: Some(field.into()), message: message.into() }
    }
}

/// Errors reading a YAML configuration file.
#[derive(Debug, Error)]
pub enum ConfigFileError {
    #[error("config file '{path}' not found; pass an existing YAML file to config_file")]
    NotFound { path: String },
    #[error("could not read config file '{path}': {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file '{path}' is not valid YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("config file '{path}' must contain a mapping at its root, found {found}")]
    NotAMapping { path: String, found: &'static str },
    #[error("section '{section}' not found in config file '{path}'; sections present: {available}")]
    MissingSection { path: String, section: String, available: String },
    #[error("section '{section}' of config file '{path}' must be a mapping, found {found}")]
    SectionNotAMapping { path: String, section: String, found: &'static str },
    #[error("'{key}' in config file '{path}' is {value}; give a finite number")]
    NonFinite { path: String, key: String, value: f64 },
}
